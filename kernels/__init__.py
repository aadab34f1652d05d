"""Attention backends behind one contract, chosen by name.

The contract, shared by every backend::

    attention(q, k, v, softmax_scale=None) -> out

- ``q, k, v``: ``(B, H, N, d)`` tensors (batch, num_heads, seq_len, head_dim), float32, float16 or
  bfloat16, all of the same dtype and on the same device. Strided views are accepted (the ViT's
  fused qkv split produces them).
- ``softmax_scale``: the factor applied to ``q @ kᵀ`` before the softmax; ``None`` means
  ``head_dim ** -0.5`` (Vaswani et al., 2017, "Attention Is All You Need", eq. 1).
- ``out``: ``(B, H, N, d)``, q's dtype, ``softmax(q @ kᵀ · softmax_scale) @ v`` (non-causal).

The packed form, which the ViT calls::

    attention_qkvpacked(qkv, softmax_scale=None) -> out

- ``qkv``: ``(B, N, 3, H, d)``, the fused qkv projection's output reshaped (q, k, v along dim 2).
- ``out``: as above. The gradient of ``qkv`` is one ``(B, N, 3, H, d)`` tensor. A backend whose
  backward writes it directly (``flash``) exports its own ``attention_qkvpacked``; for the others
  :func:`get_attention_qkvpacked` splits ``qkv`` into strided views and calls ``attention``, and
  autograd then stacks three separate gradients into one (a 3·B·N·D copy and buffer).

Every backend's docstring points here and adds only its own limits (dtypes, head dims, devices)
and its source. Backends are imported lazily by :func:`get_attention`, so importing this package
never imports Triton or builds a CUDA extension.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import is_fake

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


def _with_options(name: str, fn: AttentionFn, options: dict) -> AttentionFn:
    """``fn`` with backend-specific keyword options bound; unknown ones raise ``ValueError``."""
    if not options:
        return fn
    valid = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"attention backend {name!r} has no option {', '.join(unknown)}; its options are: "
                         f"{', '.join(valid) or 'none'} (set them with attention.<option>=<value>)")
    return functools.partial(fn, **options)


def get_attention(name: str, **options) -> AttentionFn:
    """Return the attention function registered under ``name``.

    Args:
        name: one of :func:`available_backends` (``naive``, ``sdpa``, ``flash``, ``cuda``).
        **options: the backend's own keyword-only options (e.g. flash's ``fp32_delta``), bound.

    Returns:
        A callable following the contract in this module's docstring.

    Raises:
        ValueError: ``name`` is not a registered backend (the message lists the valid names), or an
            option the backend does not take (the message lists those it takes).
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
    return _with_options(name, getattr(module, attr), options)


def tracing(t: torch.Tensor) -> bool:
    """torch.compile / export or torch.jit.trace is recording, or ``t`` is a fake tensor (FakeTensorMode, in which
    compile and export propagate shapes): a backend calls its ``torch.library`` ops, whose fake kernels give the
    shapes, instead of its eager path. (``make_fx`` sets neither flag; trace it under ``torch.compile``, or call
    the ops.)"""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or is_fake(t)


def split_qkv(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a packed ``(B, N, 3, H, d)`` qkv into three ``(B, H, N, d)`` strided views (no copy).

    Raises:
        ValueError: ``qkv`` is not 5-D with size 3 in dim 2.
    """
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"packed qkv must be (B, N, 3, H, d), got shape {tuple(qkv.shape)}; reshape the fused "
                         f"projection's (B, N, 3·H·d) output with .reshape(B, N, 3, num_heads, head_dim)")
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 × (B, H, N, d)


def _split_then(attention: AttentionFn, qkv: torch.Tensor, softmax_scale: float | None = None) -> torch.Tensor:
    return attention(*split_qkv(qkv), softmax_scale=softmax_scale)


def get_attention_qkvpacked(name: str, **options) -> AttentionFn:
    """Return the packed-qkv form of backend ``name`` (see this module's docstring).

    The backend's own ``attention_qkvpacked`` if it has one, else :func:`split_qkv` followed by its
    ``attention``; ``options`` as :func:`get_attention`. Raises what :func:`get_attention` raises.
    """
    attention = get_attention(name, **options)
    packed = getattr(importlib.import_module(BACKENDS[name][0]), "attention_qkvpacked", None)
    return _with_options(name, packed, options) if packed else functools.partial(_split_then, attention)
