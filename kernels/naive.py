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


# ---------------------------------------------------------------------------------------------
# Attention statistics, materialised: the reference for kernels/flash/stats.py
# ---------------------------------------------------------------------------------------------
def check_grid(seq_len: int, grid_size: tuple[int, int], patch_size: float, num_prefix_tokens: int) -> tuple[int, int]:
    """``(grid_h, grid_w)`` as ints after checking that ``num_prefix_tokens + grid_h·grid_w == seq_len``.

    Raises:
        ValueError: the grid and prefix do not add up to ``seq_len``, or a size is not positive.
    """
    grid_h, grid_w = (int(s) for s in grid_size)
    if grid_h < 1 or grid_w < 1 or num_prefix_tokens < 0 or not patch_size > 0:
        raise ValueError(f"attention statistics: grid_size={tuple(grid_size)} must be positive, "
                         f"num_prefix_tokens={num_prefix_tokens} ≥ 0 and patch_size={patch_size} > 0")
    if num_prefix_tokens + grid_h * grid_w != seq_len:
        raise ValueError(f"attention statistics: {num_prefix_tokens} prefix tokens + a {grid_h}×{grid_w} patch grid "
                         f"is {num_prefix_tokens + grid_h * grid_w} tokens, but q has seq_len={seq_len}; pass the "
                         f"model's patch grid (img_size / patch_size per side) and its class-token count")
    return grid_h, grid_w


def patch_distances(grid_size: tuple[int, int], patch_size: float, num_prefix_tokens: int = 1,
                    dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """(N, N) Euclidean distance between the centres of the tokens' patches, in pixels.

    Token ``t ≥ num_prefix_tokens`` is patch ``p = t − num_prefix_tokens`` at row ``p // grid_w``, column
    ``p % grid_w`` (row-major, as PatchEmbed flattens). Rows and columns of prefix (class) tokens are 0:
    they have no position. N = num_prefix_tokens + grid_h·grid_w.
    """
    grid_h, grid_w = grid_size
    rows, cols = torch.meshgrid(torch.arange(grid_h, dtype=dtype, device=device),
                                torch.arange(grid_w, dtype=dtype, device=device), indexing="ij")
    yx = torch.stack([rows.flatten(), cols.flatten()], dim=1)  # (grid_h·grid_w, 2)
    n = num_prefix_tokens + grid_h * grid_w
    dist = torch.zeros(n, n, dtype=dtype, device=device)
    dist[num_prefix_tokens:, num_prefix_tokens:] = torch.cdist(yx, yx) * patch_size
    return dist


def attention_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid_size: tuple[int, int], patch_size: float,
                    num_prefix_tokens: int = 1, softmax_scale: float | None = None, return_probs: bool = False):
    """Naive attention plus per-query-row statistics of P = softmax(q kᵀ · softmax_scale), materialised.

    The reference for :func:`kernels.flash.stats.attention_stats` (same arguments and outputs; the
    definitions are in that module's docstring): P is formed in float32 (float64 for float64 inputs),
    as :func:`attention` does, with autocast off.

    Args:
        q, k, v: ``(B, H, N, d)``, one dtype and device.
        grid_size: ``(grid_h, grid_w)`` patches; ``num_prefix_tokens + grid_h·grid_w`` must be N.
        patch_size: pixels per patch side (distances are in pixels).
        num_prefix_tokens: class tokens before the patches (1 for ``global_pool='token'``, else 0).
        return_probs: also return P, ``(B, H, N, N)`` (attention rollout needs it).

    Returns:
        ``(out, distance, entropy, max_logit[, probs])``: out ``(B, H, N, d)`` in q's dtype; the rest
        ``(B, H, N)`` float32 (float64 for float64 inputs): Σ_j P_ij·dist_ij in pixels,
        −Σ_j P_ij·log P_ij in nats, max_j q_i·k_j·softmax_scale.

    Raises:
        ValueError: the grid and prefix do not add up to N (:func:`check_grid`).
    """
    grid = check_grid(q.shape[2], grid_size, patch_size, num_prefix_tokens)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    compute = torch.promote_types(q.dtype, torch.float32)
    exact = (torch.autocast(q.device.type, enabled=False) if torch.amp.is_autocast_available(q.device.type)
             else contextlib.nullcontext())
    with exact:
        scores = torch.matmul(q.to(compute), k.to(compute).transpose(-2, -1)) * softmax_scale  # (B, H, N, N)
        logp = scores.log_softmax(dim=-1)
        probs = logp.exp()
        out = torch.matmul(probs, v.to(compute)).to(q.dtype)
        dist = patch_distances(grid, patch_size, num_prefix_tokens, compute, q.device)
        distance = (probs * dist).sum(-1)
        entropy = -(probs * logp).sum(-1)
        max_logit = scores.amax(-1)
    return (out, distance, entropy, max_logit) + ((probs,) if return_probs else ())
