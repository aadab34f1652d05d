"""attention=cuda's eager path (kernels.cuda.eager: the extension's C++ autograd node) against its torch.library ops, which torch.compile traces: the
same kernels with the same arguments, so out, dk and dv are bitwise equal, and dq too in the deterministic mode
(with atomic or TMA-added dq, the float32 adds' order may differ: within one bfloat16 rounding)."""
from __future__ import annotations

import pytest
import torch
from conftest import make_qkv, pack_qkv

from kernels import split_qkv
from kernels.cuda import attention, attention_qkvpacked, ops

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


@pytest.mark.gpu
@pytest.mark.parametrize("B, H, N, head_dim", [(64, 12, 197, 64), (2, 3, 577, 64), (1, 2, 1025, 128), (2, 2, 17, 32)])
def test_eager_node_runs_the_entry_points_the_rules_pick(B, H, N, head_dim):
    """The node's forward and deterministic backward against the extension's entry points called directly, with the
    arguments built from ops' rules one by one (not through the shared plan): bitwise equal."""
    q, k, v = make_qkv(B, H, N, head_dim, dtype=torch.bfloat16, device="cuda")
    do = torch.randn(B, H, N, head_dim, device="cuda", dtype=torch.bfloat16)
    scale, ext = head_dim**-0.5, ops.extension()
    out = attention(q, k, v, deterministic=True)
    grads = torch.autograd.grad(out, (q, k, v), do)
    with torch.no_grad():
        forward = getattr(ext, ops.sm90_forward(q) if ops.fwd_path(q) == "sm90" else "fwd")
        ref_out, lse = forward(q, k, v, scale)
        splits = ops.backward_splits(q, True)
        if ops.bwd_path(q) == "sm90":
            ref = ext.bwd_sm90(do, q, k, v, ref_out, lse, scale, None, *ops.sm90_bwd_options(q, deterministic=True),
                               0, splits)
        else:
            ref = ext.bwd(do, q, k, v, ref_out, lse, scale, ops.BWD_WARPS, splits, None)
    assert torch.equal(out, ref_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref))


@pytest.mark.gpu
def test_eager_forward_without_grad_reads_no_backward_setting(monkeypatch):
    """Under no_grad (and for inputs that need no gradient) only the forward runs: a backward setting that would
    raise is not read, as on the op path; the output is the recorded path's, bitwise."""
    q, k, v = make_qkv(4, 3, 197, 64, dtype=torch.bfloat16, device="cuda")
    recorded = attention(q, k, v)
    monkeypatch.setattr(ops, "BWD_SM90", "no-such-mode")
    with torch.no_grad():
        assert torch.equal(attention(q, k, v), recorded.detach())
    assert torch.equal(attention(*(t.detach() for t in (q, k, v))), recorded.detach())
    if ops.bwd_path(q) == "sm90":  # the recorded path reads it
        with pytest.raises(ValueError, match="VIT_CUDA_BWD_SM90 must be one of"):
            attention(q, k, v)
