"""The CUDA kernels for eager calls: the extension's C++ autograd node (``csrc/eager.cpp``), which launches the same
kernels as the ``torch.library`` ops in :mod:`.ops`, without the op dispatch or a Python autograd.Function.

The op path's CPU cost per call is what a small batch cannot hide. Forward+backward at (256, 12, 197, 64), torch 2.11,
one process each: H200 host, 0.378 ms of CPU through the ops, 0.297 through the Python autograd.Function this node
replaced, 0.203 for SDPA (benchmarks/results/h200_20261204_d/call1_launch.log); H100 host, 0.368 through the ops,
0.159 through this node (packed 0.169), 0.192 for SDPA (benchmarks/results/h100_20261207f/call1_overhead_new.log).
``torch.compile`` still traces the ops (:func:`kernels.tracing`). Results are bitwise the op path's: the same entry
points with the same arguments (tests/test_cuda_eager.py).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import ops


def plan(q: Tensor, deterministic: bool) -> tuple[str, list[int]]:
    """``(forward, backward plan)`` for ``q`` (B, H, N, d) as the kernels get it (head_dim 32, 64 or 128): the forward
    entry point's name (:func:`ops.forward_name`) and the backward's nine integers (:func:`ops.backward_plan`, with
    ``deterministic``'s dq slices, :func:`ops.backward_splits`), picked by the rules the ops follow. Raises as those
    do (ValueError for an unknown ``VIT_CUDA_*`` setting, RuntimeError for a path this GPU or build lacks)."""
    return ops.forward_name(q), ops.backward_plan(q, ops.BWD_WARPS, ops.backward_splits(q, deterministic))


def attention(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, deterministic: bool) -> Tensor:
    """out ``(B, H, N, d)`` (laid out as ``(B, N, H, d)``) of q, k, v ``(B, H, N, d)`` float16/bfloat16 CUDA tensors as
    the kernels take them (head_dim 32, 64 or 128, last stride 1), differentiable once; a second derivative raises
    RuntimeError when it is taken. With no gradient to record (no_grad, inference, no input requiring one) only the
    forward runs, and the backward's settings are not read, as on the op path."""
    if not _records_grad(q, k, v):
        return _forward_only(q, k, v, softmax_scale)
    return ops.extension().attention(q, k, v, softmax_scale, *plan(q, deterministic))


def attention_qkvpacked(qkv: Tensor, views: tuple[Tensor, Tensor, Tensor], softmax_scale: float,
                        deterministic: bool) -> Tensor:
    """:func:`attention` on a packed ``(B, N, 3, H, d)`` qkv, ``views`` its ``split_qkv`` (B, H, N, d) views; the
    gradient is one contiguous ``(B, N, 3, H, d)`` tensor."""
    if not _records_grad(qkv):
        return _forward_only(*views, softmax_scale)
    return ops.extension().attention_qkvpacked(qkv, softmax_scale, *plan(views[0], deterministic))


def _records_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _forward_only(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float) -> Tensor:
    return ops._fwd(q, k, v, softmax_scale)[0]  # (B, H, N, d)
