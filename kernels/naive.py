"""The reference backend: the formula itself, with the N×N score matrix materialised.

``softmax(q @ kᵀ · softmax_scale) @ v`` (Vaswani et al., 2017, eq. 1). The softmax runs in
float32 whatever the input dtype, then probabilities are cast back to v's dtype for the second
product, as timm's explicit-softmax path does. Memory is O(N²) per head: at (B=2, H=12, N=16384)
the scores alone take 2·12·16384²·4 bytes = 24 GiB. Any device, any dtype, any head_dim.
Contract: see :mod:`kernels`.
"""
from __future__ import annotations

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None) -> torch.Tensor:
    """Naive attention, ``(B, H, N, d)`` in and out; see :mod:`kernels` for the contract."""
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-2, -1)).float() * softmax_scale  # (B, H, N, N) float32
    probs = scores.softmax(dim=-1).to(v.dtype)  # (B, H, N, N)
    return torch.matmul(probs, v)  # (B, H, N, d)
