"""The CUDA kernels as ``torch.library`` custom ops, with fake (meta) kernels and autograd.

``vit_cuda::attn_fwd(q, k, v, softmax_scale) -> (out, lse)`` and
``vit_cuda::attn_bwd(dout, q, k, v, out, lse, softmax_scale, bwd_warps) -> (dq, dk, dv)``: raw launchers
over ``csrc/api.cpp``. The fake kernels give ``torch.compile`` the output shapes (all outputs
contiguous but out, which is ``(B, N, H, d)`` in memory; lse is float32 ``(B, H, N)``), so a compiled model traces through with no graph break.
Autograd saves q, k, v, out and lse only (FlashAttention-2's recomputation).
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

from .build import extension

# Warps per CTA of the dK/dV kernel (16 key rows each): 4 -> 64 keys per CTA, 2 CTAs per SM
# (247 registers); 8 -> 128 keys per CTA, half the dQ atomics and Q/dO re-reads, 1 CTA per SM.
# H200, bf16, fwd+bwd: 8 warps 6.42 ms vs 4 warps 6.93 ms at (8, 12, 4096, 64); 1.37 ms both at
# (256, 12, 197, 64) (benchmarks/results/cuda_h200.md). Override with VIT_CUDA_BWD_WARPS=4.
BWD_WARPS = int(os.environ.get("VIT_CUDA_BWD_WARPS", "8"))


@torch.library.custom_op("vit_cuda::attn_fwd", mutates_args=())
def attn_fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float) -> tuple[Tensor, Tensor]:
    out, lse = extension().fwd(q, k, v, softmax_scale)
    return out, lse


@attn_fwd.register_fake
def _(q, k, v, softmax_scale):
    B, H, N, d = q.shape  # out is (B, N, H, d) in memory, as api.cpp allocates it
    return q.new_empty((B, N, H, d)).transpose(1, 2), q.new_empty((B, H, N), dtype=torch.float32)


@torch.library.custom_op("vit_cuda::attn_bwd", mutates_args=())
def attn_bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, softmax_scale: float, bwd_warps: int
) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = extension().bwd(dout, q, k, v, out, lse, softmax_scale, bwd_warps)
    return dq, dk, dv


@attn_bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, bwd_warps):
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale = softmax_scale


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attn_bwd(dout, q, k, v, out, lse, ctx.softmax_scale, BWD_WARPS)
    return dq, dk, dv, None


attn_fwd.register_autograd(_backward, setup_context=_setup_context)
