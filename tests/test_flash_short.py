"""The one-program-per-head backward of short sequences (kernels/flash/short.py) against float64.

Each of its tuned rows is pinned in turn (the autotuner would test only the winner), at sequence lengths that reach
its branches: N = 1, 2 (a TAIL-wide last key tile and a mostly padded query tile), 17 (one past TAIL), 65, 197
(ViT at 224 px: 3·64 + 5) and 256 = SHORT_MAX_N (N_PAD = N: no padded rows); head_dim 32 (padded columns inside a
64-wide class) and 64. The interpreter runs the CPU cases in float32 and float16 at a few of them.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import triton
from conftest import check_against_reference, make_qkv

from kernels.flash import configs, op

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class ShortBackward(torch.autograd.Function):
    """The flash forward, then the short backward through ``tuner``: out (B, H, N, d)."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, tuner):
        out, lse = op._fwd(q, k, v, softmax_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.softmax_scale, ctx.tuner = softmax_scale, tuner
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        op.launch_short(ctx.tuner, q, k, v, do.contiguous(), dq, dk, dv, out, lse, ctx.softmax_scale)
        return dq, dk, dv, None, None


def _pinned(row):
    return triton.autotune(configs.short_configs([row]), key=["N_BUCKET", "HEAD_DIM"])(
        configs.short.flash_bwd_short_kernel)


def _short_fn(tuner):
    def fn(q, k, v, softmax_scale=None):
        return ShortBackward.apply(q, k, v, q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale, tuner)
    return fn


@pytest.mark.parametrize("seq_len, head_dim, dtype", [(1, 32, torch.float32), (17, 64, torch.float16),
                                                      (40, 32, torch.float16), (65, 64, torch.float32)])
def test_short_backward_matches_float64_interpreted(seq_len, head_dim, dtype):
    if DEVICE == "cuda":
        pytest.skip("the interpreter's case; the GPU runs test_gpu_short_backward_matches_float64")
    q, k, v = make_qkv(2, 3, seq_len, head_dim, dtype=dtype)
    check_against_reference(_short_fn(configs.SHORT[64]), q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("row", range(len(configs._SHORT[64])))
@pytest.mark.parametrize("seq_len", [1, 2, 17, 65, 197, 256])
@pytest.mark.parametrize("head_dim, dtype", [(64, torch.bfloat16), (32, torch.float16), (64, torch.float16)])
def test_gpu_short_backward_matches_float64(row, seq_len, head_dim, dtype):
    q, k, v = make_qkv(3, 5, seq_len, head_dim, dtype=dtype, device="cuda")
    check_against_reference(_short_fn(_pinned(configs._SHORT[64][row])), q, k, v)


@pytest.mark.gpu
def test_gpu_short_backward_is_deterministic_and_near_the_two_kernel_one():
    q, k, v = make_qkv(64, 12, 197, 64, dtype=torch.bfloat16, device="cuda", requires_grad=False)
    do = torch.randn_like(q)
    scale = 64 ** -0.5
    out, lse = op._fwd(q, k, v, scale)
    runs = []
    for _ in range(3):
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        op.launch_short(configs.SHORT[64], q, k, v, do, *grads, out, lse, scale)
        runs.append(grads)
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))
    two = op._bwd(do, q, k, v, out, lse, scale)
    for name, a, b in zip(("dq", "dk", "dv"), runs[0], two):
        assert (a.float() - b.float()).abs().max().item() <= 0.02 * b.float().abs().max().item(), name
