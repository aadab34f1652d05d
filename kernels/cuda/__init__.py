"""Hand-written CUDA C++ FlashAttention-2 backend (``attention=cuda``), forward and backward.

Source: Dao, 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning", Algorithms 1 (forward) and 2 (backward), written with ``mma.sync`` m16n8k16
tensor-core instructions, ``ldmatrix`` from padded shared memory and ``cp.async`` double buffering
(see ``csrc/fwd.cuh`` and ``csrc/bwd.cuh``). Compute capability 9.0 (H100, H200) also has Hopper
kernels after FlashAttention-3 (Shah et al., 2024): a forward (``csrc/fwd_sm90.cuh``: TMA loads,
``wgmma`` from shared memory, a producer warpgroup feeding two consumer warpgroups through
mbarriers, or three at head_dim 64 where N fills their 192-row tiles) and a backward on the same machinery (``csrc/bwd_sm90.cuh``), both passing the GPU tests on
an H200. ``VIT_CUDA_FWD`` and ``VIT_CUDA_BWD`` (auto, sm80, sm90) choose; ``auto`` runs each Hopper
kernel only where it measured faster (forward and backward at head_dim 64 and 128 and N ≥ 128;
see :func:`ops.fwd_path` and benchmarks/results/cuda_h200.md); ``VIT_CUDA_FWD_SM90``, ``VIT_CUDA_BWD_DQ`` and
``VIT_CUDA_BWD_SM90`` choose among the Hopper kernels' variants (:mod:`.ops`). Eager calls launch the kernels
through the extension's C++ autograd node (:mod:`.eager`), which costs less CPU per call; ``torch.compile`` traces the
``torch.library`` ops (:mod:`.ops`). Both run the same launchers. Contract: see :mod:`kernels`.
Limits of this backend:

- dtypes: float16 and bfloat16 (float32 accumulation); float32 inputs raise TypeError.
- head_dim: kernels exist for 32, 64 and 128; any other head_dim ≤ 128 is zero-padded up to the
  next of these and the result sliced, which costs the padded FLOPs (d=80 runs as d=128: 1.6×).
- any seq_len ≥ 1 (keys past N are masked with −inf; rows past N are never written).
- strided inputs: the last dimension must have stride 1, else one copy is made here; rows must
  start on 16-byte boundaries (strides multiple of 8 elements), else the host code copies once.
- the packed form the ViT calls, :func:`attention_qkvpacked` (``(B, N, 3, H, d)`` qkv): its backward writes
  dq, dk, dv into one gradient of qkv's shape (the kernels store dk, dv through strides, the dq kernel
  writes dq into its slice), where the split form's gradients are stacked by autograd, a copy of the whole qkv.
- dq is accumulated with float32 atomics or TMA reduce-adds across key tiles, so it is not bitwise reproducible
  run to run (dk, dv and out are). ``deterministic=True`` (``attention=cuda attention.deterministic=true``)
  makes it so, on one GPU model: FlashAttention-2's deterministic mode (each of the CTAs of a (batch, head)
  walks its key tiles in order into its own float32 dq slice, and the slices are summed once in order;
  :func:`ops.backward_splits` picks the count that fills whole waves), in the Hopper backward where it runs
  (H200, fwd+bwd: 0.96-1.17× the sequential Hopper backward's time, 1.30-1.35× at (8, 16, 4096, 128)), else in
  the mma.sync one.
  ``VIT_CUDA_BWD_WARPS`` (4 or 8, default 8) sets the backward tile.
- the extension compiles on first use and is cached (30 s with 16 jobs on the H200 machine, a few
  minutes on 2 cores): ``python -m kernels.cuda.build`` builds it ahead of time.

Measured on an H200 (bf16, forward+backward with the defaults, the peers in the same runs,
benchmarks/results/h200_20261207.md): 1.30-1.42× SDPA's FlashAttention-2 backend and 0.75-0.92× its cuDNN
backend at the six ``benchmarks/cuda_bench.py`` shapes.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import split_qkv, tracing
from . import eager, ops

HEAD_DIMS = (32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16)


def _padded_head_dim(head_dim: int) -> int:
    return next(d for d in HEAD_DIMS if d >= head_dim)


def check_inputs(q, k, v, softmax_scale=None) -> None:
    """Validate ``attention``'s arguments without touching the GPU or the extension.

    Raises:
        TypeError: an argument is not a tensor, or dtypes are unsupported or differ.
        ValueError: shapes are not ``(B, H, N, head_dim)`` alike, head_dim > 128, an empty
            dimension, tensors on different or non-CUDA devices, or a softmax_scale that is not > 0.
        RuntimeError: the tensors are on the CPU and no CUDA GPU is visible at all.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention=cuda: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(
                f"attention=cuda supports float16 and bfloat16, but {name} is {t.dtype}; cast with "
                f".to(torch.bfloat16) or train under torch.autocast, or pick attention=sdpa for float32"
            )
        if t.dtype != q.dtype:
            raise TypeError(f"attention=cuda: q, k, v must share one dtype, got q {q.dtype} and {name} {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"attention=cuda: {name} must be (B, H, N, head_dim), got shape {tuple(t.shape)}")
        if t.shape != q.shape:
            raise ValueError(f"attention=cuda: q, k, v must have one shape, got q {tuple(q.shape)} and {name} {tuple(t.shape)}")
    if min(q.shape) < 1:
        raise ValueError(f"attention=cuda: every dimension must be ≥ 1, got shape {tuple(q.shape)}")
    if q.shape[-1] > HEAD_DIMS[-1]:
        raise ValueError(
            f"attention=cuda supports head_dim ≤ {HEAD_DIMS[-1]} (kernels for {HEAD_DIMS}, others padded), "
            f"got {q.shape[-1]}; use attention=sdpa or fewer channels per head"
        )
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"attention=cuda: softmax_scale must be a finite number > 0 or None, got {softmax_scale!r}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"attention=cuda: q is on {q.device} but {name} is on {t.device}; move them to one GPU")
    if q.device.type != "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"attention=cuda runs on NVIDIA GPUs and no CUDA GPU is visible here (inputs are on {q.device}); "
                "run on a GPU machine, or pick attention=sdpa or attention=naive on the CPU"
            )
        raise ValueError(f"attention=cuda needs CUDA tensors, got {q.device}; move them with .cuda()")


def _check_deterministic(deterministic) -> None:
    """A bool, not merely truthy: Hydra passes ``attention.deterministic=off`` on as a string."""
    if not isinstance(deterministic, bool):
        raise TypeError(f"attention=cuda: deterministic must be a bool, got {deterministic!r} "
                        f"({type(deterministic).__name__}); on the command line write attention.deterministic=true")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None, *,
              deterministic: bool = False) -> torch.Tensor:
    """FlashAttention-2 in CUDA C++: ``softmax(q kᵀ · softmax_scale) v``, differentiable.

    Args:
        q, k, v: ``(B, H, N, head_dim)`` float16/bfloat16 CUDA tensors, head_dim ≤ 128.
        softmax_scale: > 0, default ``head_dim ** -0.5``.
        deterministic: a backward whose dq is bitwise the same every run on one GPU model (FlashAttention-2's
            deterministic mode, Dao 2023; its cost: the module docstring).

    Returns:
        ``(B, H, N, head_dim)`` tensor of q's dtype, laid out as ``(B, N, H, head_dim)`` in memory.

    Raises:
        TypeError, ValueError, RuntimeError: see :func:`check_inputs`; TypeError also for a ``deterministic``
        that is not a bool; RuntimeError also when the extension cannot be built (no nvcc: install the CUDA
        toolkit and set CUDA_HOME).
    """
    _check_deterministic(deterministic)
    check_inputs(q, k, v, softmax_scale)
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if softmax_scale is None else float(softmax_scale)
    padded = _padded_head_dim(head_dim)
    if padded != head_dim:  # zero columns change neither q·k nor the kept columns of p·v
        q, k, v = (F.pad(t, (0, padded - head_dim)) for t in (q, k, v))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if tracing(q):  # the torch.library op, which compile traces
        out, _ = ops.attn_fwd(q, k, v, scale, deterministic)  # (B, H, N, padded)
    else:  # the same kernels, less CPU per call
        out = eager.attention(q, k, v, scale, deterministic)  # (B, H, N, padded)
    return out[..., :head_dim] if padded != head_dim else out


def attention_qkvpacked(qkv: torch.Tensor, softmax_scale: float | None = None, *,
                        deterministic: bool = False) -> torch.Tensor:
    """:func:`attention` on a packed ``(B, N, 3, H, head_dim)`` qkv (the ViT's fused projection, reshaped), whose
    backward writes dq, dk, dv into one ``(B, N, 3, H, head_dim)`` gradient instead of stacking three.

    head_dim 32, 64 and 128 run packed; another head_dim is padded as :func:`attention` pads it, which copies q, k
    and v anyway, so it runs :func:`attention` on the three views (the same kernels, gradients stacked).

    Returns and raises as :func:`attention`; ValueError also for a qkv that is not ``(B, N, 3, H, head_dim)``.
    """
    q, k, v = split_qkv(qkv)
    if q.shape[-1] not in HEAD_DIMS or qkv.stride(-1) != 1:
        return attention(q, k, v, softmax_scale, deterministic=deterministic)
    _check_deterministic(deterministic)
    check_inputs(q, k, v, softmax_scale)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    if tracing(qkv):
        return ops.attn_fwd_qkvpacked(qkv, scale, deterministic)[0]  # (B, H, N, d)
    return eager.attention_qkvpacked(qkv, (q, k, v), scale, deterministic)  # (B, H, N, d)


__all__ = ["DTYPES", "HEAD_DIMS", "attention", "attention_qkvpacked", "check_inputs"]
