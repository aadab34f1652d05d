"""The reference backend: the formula itself, with the N×N score matrix materialised.

``softmax(q @ kᵀ · softmax_scale) @ v`` (Vaswani et al., 2017, eq. 1), computed in float32 (float64
for float64 inputs) from q, k and v as given: both products and the softmax, forward and backward,
with autocast switched off inside, so bf16/fp16 inputs or an enclosing bf16/fp16 autocast never
round the scores or the probabilities. The output is rounded once, to q's dtype. Its error against a
float64 computation on the same inputs is therefore float32 accumulation plus that one rounding, as
for SDPA's math backend (which upcasts the same way): tests/test_backends_ref.py checks that it stays
within 1.5× of SDPA math's at bf16 (N = 197, ordinary logits and logits ~1e4), and the kernel tests
(tests/conftest.py) bound every kernel by 2× naive's error. Float32 matmuls follow torch's float32
matmul precision (TF32 where ``torch.backends.cuda.matmul.allow_tf32`` is set).

Memory is O(N²) per head: the float32 scores at (B=2, H=12, N=16384) take 2·12·16384²·4 bytes = 24 GiB
(autograd keeps the float32 probabilities, one such matrix, for the backward). Any device, any dtype,
any head_dim. Contract: see :mod:`kernels`.
"""
from __future__ import annotations

import contextlib

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None) -> torch.Tensor:
    """Naive attention, ``(B, H, N, d)`` in and out (q's dtype); see the module docstring for its precision."""
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    compute = torch.promote_types(q.dtype, torch.float32)  # float32, or float64 for float64 inputs
    exact = (torch.autocast(q.device.type, enabled=False) if torch.amp.is_autocast_available(q.device.type)
             else contextlib.nullcontext())
    with exact:
        scores = torch.matmul(q.to(compute), k.to(compute).transpose(-2, -1)) * softmax_scale  # (B, H, N, N)
        probs = scores.softmax(dim=-1)  # (B, H, N, N)
        out = torch.matmul(probs, v.to(compute))  # (B, H, N, d)
    return out.to(q.dtype)
