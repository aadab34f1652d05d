"""Triton FlashAttention-2 backend (``attention=flash``): forward and backward.

Source: Dao, 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning", Algorithms 1 and 2; kernels in :mod:`kernels.flash.kernels`, autotune lists in
:mod:`kernels.flash.configs`, ``torch.library`` ops (what ``torch.compile`` traces) in :mod:`kernels.flash.op`.
Eager calls run the same kernels from C++ (:mod:`kernels.flash.native`: autograd node and direct launches), or,
with ``VIT_FLASH_LAUNCHER=python`` or where that does not build, under the Python ``autograd.Function`` of
:mod:`kernels.flash.op`.

Contract: see :mod:`kernels`. This backend's limits:

- dtypes: float16 and bfloat16 (float32 accumulation), float32 (``ieee`` dots, real float32);
- head_dim 16-256 (non-powers of two such as 80 and 96 are padded inside the kernel);
- any seq_len ≥ 1 and any batch·heads (one flattened grid axis of up to 2³¹−1 programs);
- a CUDA GPU, or any device under ``TRITON_INTERPRET=1`` (Triton's interpreter, slow: for CI).
  The variable must be set before this package is first imported.

Deterministic: no atomics, so for one kernel config the same inputs give bitwise the same out, dq,
dk, dv. Block sizes are autotuned once per process and key (head_dim, dtype, N bucket); another
process may pick other block sizes, which sums in another order and can differ in the last bits.
"""
from __future__ import annotations

import contextlib
import math

import torch

from .. import split_qkv, tracing
from . import configs
from .op import (
    EagerAttention,
    EagerAttentionQKVPacked,
    bwd,
    bwd_qkvpacked,
    fwd,
    fwd_fp32_delta,
    fwd_qkvpacked,
    fwd_qkvpacked_fp32_delta,
)

__all__ = ["attention", "attention_qkvpacked", "bwd", "bwd_qkvpacked", "fwd", "fwd_qkvpacked"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale, names=("q", "k", "v"),
           instead: str = "attention=sdpa or attention=naive") -> float:
    """The checks of :func:`attention`; ``instead``: what a non-GPU error suggests (analyze.py's statistics differ)."""
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flash attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"flash attention: {name} has dtype {t.dtype}; use float16, bfloat16 or float32")
        if t.dim() != 4:
            raise ValueError(f"flash attention: {name} must be 4-D (B, H, N, d), got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"flash attention: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"flash attention: q, k, v must have the same (B, H, N, d) shape, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"flash attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    N, d = q.shape[-2:]
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"flash attention: head_dim={d} is outside [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]; "
                         f"choose embed_dim / num_heads in that range or use attention=sdpa")
    if N < 1:
        raise ValueError(f"flash attention: seq_len must be ≥ 1, got {N}")
    if q.device.type != "cuda" and not configs.INTERPRETED:
        raise RuntimeError(
            f"flash attention needs a CUDA GPU but the inputs are on {q.device}"
            + ("" if torch.cuda.is_available() else " and no CUDA GPU is visible")
            + f"; move them to a GPU, use {instead}, or set TRITON_INTERPRET=1 "
            "before importing kernels.flash to run Triton's (slow) interpreter on the CPU")
    if softmax_scale is None:
        return d ** -0.5
    softmax_scale = float(softmax_scale)
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"flash attention: softmax_scale must be a finite positive number, got {softmax_scale}")
    return softmax_scale


def _check_fp32_delta(fp32_delta) -> None:
    """A bool, not merely truthy: Hydra passes ``attention.fp32_delta=off`` (or ``=no``) on as a string."""
    if not isinstance(fp32_delta, bool):
        raise TypeError(f"flash attention: fp32_delta must be a bool, got {fp32_delta!r} ({type(fp32_delta).__name__}); "
                        f"on the command line write attention.fp32_delta=true or attention.fp32_delta=false")


def _elsewhere(t: torch.Tensor) -> bool:
    """``t`` is on a CUDA device other than the current one, where Triton would launch (``device=cuda:1`` in one
    process: no one called ``torch.cuda.set_device``). The backward needs no check: autograd runs it on t's device."""
    return t.is_cuda and t.get_device() != torch.cuda.current_device()


def device_guard(t: torch.Tensor):
    """A context in which Triton launches on ``t``'s GPU: ``torch.cuda.device(t.device)`` where :func:`_elsewhere`,
    else a no-op."""
    return torch.cuda.device(t.device) if _elsewhere(t) else contextlib.nullcontext()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None, *,
              fp32_delta: bool = False) -> torch.Tensor:
    """FlashAttention-2 ``softmax(q kᵀ · softmax_scale) v``; contract in :mod:`kernels`.

    Args:
        q, k, v: ``(B, H, N, d)`` float16/bfloat16/float32, one dtype and device, any strides.
        softmax_scale: positive float, default ``d ** -0.5``.
        fp32_delta: form the backward's ``delta = rowsum(dO ∘ O)`` (Dao 2023, Algorithm 2, line 4)
            from the float32 output instead of ``out`` rounded to its dtype: the forward also keeps
            the rounding residual (one more out-sized tensor per call, written and read once).
            Without it, dq and dk lose their accuracy when attention logits are huge (|q·k|·scale
            ≳ 10³ in bf16: P is nearly one-hot and dS = P ∘ (dP − delta) is a small difference that
            delta's rounding error swamps); with it they stay within 2× SDPA math's error there
            (measured to max |logit| ≈ 1e5 on the H200, tests/test_flash_fp32_delta.py). It also computes
            the backward's dS·K and dSᵀ·Q as two products each, of dS rounded and of its remainder
            (kernels.flash.kernels._ds_dot), and the dQ kernel forms delta from its own P and dP (the form of
            SDPA math's softmax backward; one more product, P·K: kernels.flash.kernels._bwd_dq_rows): ten matrix
            products in the backward instead of seven.

    Returns:
        ``out``: ``(B, H, N, d)``, q's dtype, laid out as ``(B, N, H, d)`` in memory. Differentiable in q, k, v.

    Raises:
        TypeError: a non-tensor, an unsupported dtype, mixed dtypes, or a non-bool ``fp32_delta``.
        ValueError: shapes differ or are not 4-D, head_dim outside 16-256,
            a non-positive softmax_scale, or tensors on different devices.
        RuntimeError: inputs not on a CUDA GPU and ``TRITON_INTERPRET=1`` was not set; at backward
            time, a second derivative (``create_graph=True`` through the gradient): not implemented.
    """
    softmax_scale = _check(q, k, v, softmax_scale)
    _check_fp32_delta(fp32_delta)
    if tracing(q):  # the torch.library op, which compile traces
        return (fwd_fp32_delta if fp32_delta else fwd)(q, k, v, softmax_scale)[0]
    from . import native  # here, not at import: `python -m kernels.flash.native` runs it as __main__

    eager = native.module()
    if eager is not None:  # the C++ autograd node and launches
        return eager.attention(q, k, v, softmax_scale, fp32_delta)  # (B, H, N, d)
    with device_guard(q):  # (B, H, N, d); same kernels as the op, less CPU
        return EagerAttention.apply(q, k, v, softmax_scale, fp32_delta, torch.is_grad_enabled())


def attention_qkvpacked(qkv: torch.Tensor, softmax_scale: float | None = None, *,
                        fp32_delta: bool = False) -> torch.Tensor:
    """:func:`attention` on a packed ``(B, N, 3, H, d)`` qkv; the packed contract is in :mod:`kernels`.

    Same kernels and result as ``attention(*split_qkv(qkv))``, bitwise; the backward writes dq, dk
    and dv straight into one ``(B, N, 3, H, d)`` gradient instead of three tensors that autograd
    then stacks (two 3·B·N·D copies fewer per attention layer in eager mode: the stack and the
    contiguous copy the qkv projection's backward needs).

    Args:
        qkv: ``(B, N, 3, H, d)`` float16/bfloat16/float32, any strides (q, k, v along dim 2).
        softmax_scale: positive float, default ``d ** -0.5``.
        fp32_delta: as :func:`attention`.

    Returns:
        ``out``: ``(B, H, N, d)``, qkv's dtype, laid out as ``(B, N, H, d)`` in memory. Differentiable
        in ``qkv``; its gradient is a contiguous ``(B, N, 3, H, d)`` tensor.

    Raises:
        TypeError: ``qkv`` is not a tensor, has an unsupported dtype, or ``fp32_delta`` is not a bool.
        ValueError: ``qkv`` is not ``(B, N, 3, H, d)``; otherwise as :func:`attention`.
        RuntimeError: as :func:`attention`.
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"flash attention: qkv must be a torch.Tensor, got {type(qkv).__name__}")
    softmax_scale = _check(*split_qkv(qkv), softmax_scale, names=("qkv",) * 3)
    _check_fp32_delta(fp32_delta)
    if tracing(qkv):
        return (fwd_qkvpacked_fp32_delta if fp32_delta else fwd_qkvpacked)(qkv, softmax_scale)[0]
    from . import native

    eager = native.module()
    if eager is not None:
        return eager.attention_qkvpacked(qkv, softmax_scale, fp32_delta)  # (B, H, N, d)
    with device_guard(qkv):  # (B, H, N, d)
        return EagerAttentionQKVPacked.apply(qkv, softmax_scale, fp32_delta, torch.is_grad_enabled())
