"""Attention backends behind one contract, chosen by name.

The contract, shared by every backend::

    attention(q, k, v, softmax_scale=None) -> out

- ``q, k, v``: ``(B, H, N, d)`` tensors (batch, num_heads, seq_len, head_dim), float32, float16 or
  bfloat16, all of the same dtype and on the same device. Strided views are accepted (the ViT's
  fused qkv split produces them).
- ``softmax_scale``: the factor applied to ``q @ kᵀ`` before the softmax; ``None`` means
  ``head_dim ** -0.5`` (Vaswani et al., 2017, "Attention Is All You Need", eq. 1).
- ``out``: ``(B, H, N, d)``, q's dtype, ``softmax(q @ kᵀ · softmax_scale) @ v`` (non-causal).

Every backend's docstring points here and adds only its own limits (dtypes, head dims, devices)
and its source. Backends are imported lazily by :func:`get_attention`, so importing this package
never imports Triton or builds a CUDA extension.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

AttentionFn = Callable[..., torch.Tensor]

# name -> (module, attribute). Imported on first use only.
BACKENDS: dict[str, tuple[str, str]] = {
    "naive": ("kernels.naive", "attention"),
    "sdpa": ("kernels.sdpa", "attention"),
    "flash": ("kernels.flash", "attention"),
    "cuda": ("kernels.cuda", "attention"),
}

# head_dim range (inclusive) each backend runs, as plain numbers so that config checks need neither
# Triton nor the CUDA extension; the backends' own checks agree (tests/test_reliability.py compares).
# naive and sdpa run any head_dim.
HEAD_DIM_LIMITS: dict[str, tuple[int, int]] = {"flash": (16, 256), "cuda": (1, 128)}


def available_backends() -> list[str]:
    """Names accepted by :func:`get_attention`, sorted."""
    return sorted(BACKENDS)


def get_attention(name: str) -> AttentionFn:
    """Return the attention function registered under ``name``.

    Args:
        name: one of :func:`available_backends` (``naive``, ``sdpa``, ``flash``, ``cuda``).

    Returns:
        A callable following the contract in this module's docstring.

    Raises:
        ValueError: ``name`` is not a registered backend; the message lists the valid names.
        RuntimeError: the backend exists but cannot run here (no GPU, no compiler, ...); the
            message says what is missing and how to fix it. There is never a silent fallback.
    """
    if name not in BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; valid backends are: {', '.join(available_backends())} "
            f"(set it with attention=<name>)"
        )
    module_name, attr = BACKENDS[name]
    module = importlib.import_module(module_name)
    return getattr(module, attr)
