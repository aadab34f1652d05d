"""PyTorch's built-in ``F.scaled_dot_product_attention``: the peer we measure against.

PyTorch picks among its FlashAttention-2, cuDNN, memory-efficient and math kernels by device,
dtype and shape; benchmarks pin one with ``torch.nn.attention.sdpa_kernel``.
Contract: see :mod:`kernels`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None) -> torch.Tensor:
    """SDPA attention, ``(B, H, N, d)`` in and out; see :mod:`kernels` for the contract."""
    return F.scaled_dot_product_attention(q, k, v, scale=softmax_scale)  # (B, H, N, d)
