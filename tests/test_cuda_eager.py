"""attention=cuda's eager path (kernels.cuda.eager: the extension's C++ autograd node) against its torch.library ops, which torch.compile traces: the
same kernels with the same arguments, so out, dk and dv are bitwise equal, and dq too in the deterministic mode
(with atomic or TMA-added dq, the float32 adds' order may differ: within one bfloat16 rounding)."""
from __future__ import annotations

import pytest
import torch
from conftest import make_qkv, pack_qkv

from kernels import split_qkv
from kernels.cuda import attention, attention_qkvpacked

SHAPES = [(2, 3, 197, 64), (64, 12, 197, 64), (1, 2, 1025, 128), (2, 2, 17, 32), (1, 1, 1, 64)]


def _out_and_grads(fn, inputs, do):
    """out and (dq, dk, dv) of ``fn()``; a packed ``(B, N, 3, H, d)`` gradient is split into its three views."""
    out = fn()
    grads = torch.autograd.grad(out, inputs, do)
    return out.detach(), grads if len(grads) == 3 else split_qkv(grads[0])


def _assert_same(eager, op, deterministic):
    (out_e, (dq_e, dk_e, dv_e)), (out_o, (dq_o, dk_o, dv_o)) = eager, op
    assert torch.equal(out_e, out_o) and torch.equal(dk_e, dk_o) and torch.equal(dv_e, dv_o)
    if deterministic:
        assert torch.equal(dq_e, dq_o), "dq differs in the deterministic mode"
    else:
        bound = 2**-7 * dq_o.abs().max().item()  # one bfloat16 rounding of the largest element
        assert (dq_e.float() - dq_o.float()).abs().max().item() <= bound


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("B, H, N, head_dim", SHAPES)
def test_eager_path_equals_the_op_path(B, H, N, head_dim, deterministic):
    q, k, v = make_qkv(B, H, N, head_dim, dtype=torch.bfloat16, device="cuda")
    do = torch.randn(B, H, N, head_dim, device="cuda", dtype=torch.bfloat16)
    scale = head_dim**-0.5
    eager = _out_and_grads(lambda: attention(q, k, v, deterministic=deterministic), (q, k, v), do)
    op = _out_and_grads(lambda: torch.ops.vit_cuda.attn_fwd(q, k, v, scale, deterministic)[0], (q, k, v), do)
    _assert_same(eager, op, deterministic)
    assert attention(q, k, v).grad_fn.name().endswith("::Attention>")  # csrc/eager.cpp's node, not the op's


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("B, H, N, head_dim", SHAPES)
def test_packed_eager_path_equals_the_op_path(B, H, N, head_dim, deterministic):
    qkv = pack_qkv(*make_qkv(B, H, N, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=False))
    qkv = qkv.contiguous().requires_grad_()  # (B, N, 3, H, d), as the ViT's fused projection makes it
    do = torch.randn(B, H, N, head_dim, device="cuda", dtype=torch.bfloat16)
    scale = head_dim**-0.5
    eager = _out_and_grads(lambda: attention_qkvpacked(qkv, deterministic=deterministic), (qkv,), do)
    op = _out_and_grads(lambda: torch.ops.vit_cuda.attn_fwd_qkvpacked(qkv, scale, deterministic)[0], (qkv,), do)
    _assert_same(eager, op, deterministic)
    assert attention_qkvpacked(qkv).grad_fn.name().endswith("::AttentionQKVPacked>")


@pytest.mark.gpu
def test_eager_second_derivative_raises_when_taken():
    """The node's gradients are once differentiable, as the op path's: the first derivative with create_graph=True
    is returned, a second one raises."""
    q, k, v = make_qkv(2, 3, 197, 64, dtype=torch.bfloat16, device="cuda")
    out = attention(q, k, v)
    (dq,) = torch.autograd.grad(out.float().square().sum(), (q,), create_graph=True)
    assert torch.isfinite(dq).all()
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.float().sum().backward()
