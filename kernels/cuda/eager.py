"""The CUDA kernels for eager calls: ``torch.autograd.Function``s that launch the same kernels as the
``torch.library`` ops in :mod:`.ops`, without the op dispatch.

The op path's CPU cost per call is what a small batch cannot hide. H200 host, torch 2.11, forward+backward at
(256, 12, 197, 64): 0.378 ms of CPU through the ops, 0.297 through these Functions, 0.203 for SDPA, in one process;
cProfile put ``torch/_library/custom_ops.py`` ``backend_impl`` first on the op path
(benchmarks/results/h200_20261204_d/call1_launch.log). ``torch.compile`` still traces the ops
(:func:`kernels.tracing`). Results are bitwise the op path's: the same launchers with the same arguments.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import ops


class EagerAttention(torch.autograd.Function):
    """``ops.attn_fwd`` and ``ops.attn_bwd``'s kernels. ``apply(q, k, v, softmax_scale, deterministic) -> out``:
    q, k, v ``(B, H, N, d)`` float16/bfloat16 CUDA tensors as the kernels take them (head_dim 32, 64 or 128, last
    stride 1); out ``(B, H, N, d)``, laid out as ``(B, N, H, d)``. The backward is that of :func:`ops._backward`."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, deterministic: bool) -> Tensor:
        out, lse = ops._fwd(q, k, v, softmax_scale)  # (B, H, N, d), (B, H, N) float32
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.softmax_scale, ctx.deterministic = softmax_scale, deterministic
        return out

    @staticmethod
    @once_differentiable  # the kernels' gradients are not themselves differentiable: fail, not wrong
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        splits = ops.backward_splits(q, ctx.deterministic)
        dq, dk, dv = ops._bwd_into(ops.extension(), dout, q, k, v, out, lse, ctx.softmax_scale, ops.BWD_WARPS,
                                   splits, None)
        return dq, dk, dv, None, None


class EagerAttentionQKVPacked(torch.autograd.Function):
    """:class:`EagerAttention` on a packed ``(B, N, 3, H, d)`` qkv (``ops.attn_fwd_qkvpacked``'s kernels):
    ``apply(qkv, views, softmax_scale, deterministic) -> out`` (B, H, N, d), ``views`` the caller's
    ``split_qkv(qkv)`` (split once, not in each pass); the gradient is one contiguous ``(B, N, 3, H, d)`` tensor."""

    @staticmethod
    def forward(ctx, qkv: Tensor, views: tuple[Tensor, Tensor, Tensor], softmax_scale: float,
                deterministic: bool) -> Tensor:
        out, lse = ops._fwd(*views, softmax_scale)  # (B, H, N, d), (B, H, N) float32
        ctx.save_for_backward(qkv, *views, out, lse)
        ctx.softmax_scale, ctx.deterministic = softmax_scale, deterministic
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: Tensor):
        qkv, q, k, v, out, lse = ctx.saved_tensors
        splits = ops.backward_splits(q, ctx.deterministic)
        dqkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)  # (B, N, 3, H, d)
        ops._bwd_into(ops.extension(), dout, q, k, v, out, lse, ctx.softmax_scale, ops.BWD_WARPS, splits, dqkv)
        return dqkv, None, None, None
