"""The FlashAttention-2 forward that also measures each query row's attention: distance and entropy.

Per query row i of P = softmax(q kᵀ · softmax_scale), besides ``out = P v``:

- ``distance_i = Σ_j P_ij · dist_ij``, pixels: ``dist_ij`` is the Euclidean distance between the
  centres of token i's and token j's patches times ``patch_size`` (patch p = token − num_prefix_tokens
  sits at row p // grid_w, column p % grid_w, as PatchEmbed flattens them), computed in the kernel
  from those coordinates: no N×N table is read. The class (prefix) tokens have no position: their
  columns count 0 distance (their weight stays in the normalisation) and their rows are 0. Averaged
  over the patch rows this is the "mean attention distance" of Dosovitskiy et al. 2021 (Fig. 7,
  appendix D.7), as the public reproductions compute it from the full softmax sliced to
  ``P[1:, 1:]`` (keras-io "Investigating Vision Transformer representations"; the paper does not say).
- ``entropy_i = −Σ_j P_ij · ln P_ij``, nats (0: one key; ln N: uniform).
- ``max_logit_i = max_j q_i·k_j · softmax_scale`` (the attention-logit growth of Dehghani et al. 2023).

Online (Dao 2023, Algorithm 1, with base-2 scores s = q·k·scale·log2 e): beside the running max m,
the sum l = Σ exp2(s − m) and the output accumulator, two row sums are kept under the same
rescaling by α = exp2(m_old − m_new): ``A = Σ exp2(s − m)·dist`` and ``S = Σ exp2(s − m)·(s − m)``.
S is kept relative to the running max so that it never cancels at large logits; when m moves, the
old terms shift by (m_old − m_new) each: S ← α·(S + (m_old − m_new)·l) + Σ_tile. At the end
``distance = A / l · patch_size`` and, since ln P_j = (s_j − m − log2 l)·ln 2,
``entropy = (log2 l − S / l)·ln 2``. Memory: O(N) per head (the three (B, H, N) float32 outputs).

Forward only, for analysis and monitoring (no autograd). Limits as :mod:`kernels.flash` (float16,
bfloat16, float32; head_dim 16-256; a CUDA GPU or ``TRITON_INTERPRET=1``). The reference that
materialises P is :func:`kernels.naive.attention_stats`; tests/test_attention_stats.py compares them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..naive import check_grid
from . import _check, configs, device_guard
from .kernels import _LN2, LOG2E, _dot, _load, _tile_and_head, _tile_index

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per head-dim class: the forward's first config with half
# the key tile, for the two extra (BLOCK_M, BLOCK_N) float32 tiles (distances, s − m). Not tuned on a GPU.
_BLOCKS = {64: (64, 32, 4, 3), 128: (64, 32, 4, 3), 256: (32, 32, 4, 2)}
# The GPU's tiles: N ≥ 65 then has full and masked key tiles. (32, 16) took 3.4× as long on the interpreter.
_INTERPRETER_BLOCKS = (64, 32, 4, 1)


@triton.jit
def _coords(tokens, NUM_PREFIX, GRID_W):
    """(row, column) on the patch grid as float32, and whether each token is a patch (not a prefix token)."""
    p = tl.maximum(tokens - NUM_PREFIX, 0)
    return (p // GRID_W).to(tl.float32), (p % GRID_W).to(tl.float32), tokens >= NUM_PREFIX


@triton.jit
def _stats_step(acc, l_i, m_i, a_i, s_i, q, row_y, row_x, row_patch, K_base, V_base, start_n, N, qk_scale,
                stride_kn, stride_kd, stride_vn, stride_vd, offs_n, offs_d, NUM_PREFIX, GRID_W,
                HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, MASK_N: tl.constexpr):
    """One K/V tile: the forward's online softmax step plus the distance and entropy sums (module docstring)."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    cols = start_n + offs_n  # (BLOCK_N,)
    kT = _load(K_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd,
               cols[None, :] < N, offs_d[:, None] < HEAD_DIM, MASK_N, PAD_D)  # (D, BLOCK_N)
    qk = _dot(q, kT, tl.zeros([q.shape[0], kT.shape[1]], dtype=tl.float32), IEEE)  # (BLOCK_M, BLOCK_N)
    if MASK_N:
        qk = tl.where(cols[None, :] < N, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    s = qk * qk_scale - m_new[:, None]  # ≤ 0; −inf at padded keys
    p = tl.math.exp2(s)
    alpha = tl.math.exp2(m_i - m_new)
    if MASK_N:
        s = tl.where(cols[None, :] < N, s, 0.0)  # p = 0 there; keeps 0·(−inf) out of the sum
    shift = (tl.where(l_i > 0, m_i, m_new) - m_new) * l_i  # 0 before the first tile (l = 0, m = −inf)
    s_i = (s_i + shift) * alpha + tl.sum(p * s, 1)
    col_y, col_x, col_patch = _coords(cols, NUM_PREFIX, GRID_W)
    dy, dx = row_y[:, None] - col_y[None, :], row_x[:, None] - col_x[None, :]
    dist = tl.where(row_patch[:, None] & col_patch[None, :], tl.sqrt(dy * dy + dx * dx), 0.0)  # patches
    a_i = a_i * alpha + tl.sum(p * dist, 1)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load(V_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
              cols[:, None] < N, offs_d[None, :] < HEAD_DIM, MASK_N, PAD_D)  # (BLOCK_N, D)
    acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
    return acc, l_i, m_new, a_i, s_i


@triton.jit
def flash_stats_fwd_kernel(
    Q, K, V, Out, Dist, Ent, MaxLogit, qk_scale, patch_size,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N, NUM_PREFIX, GRID_W,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M)·B·H,). ``qk_scale`` = softmax_scale · log2(e); Dist, Ent, MaxLogit float32 (B, H, N)."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    qk_scale, patch_size = tl.cast(qk_scale, tl.float32), tl.cast(patch_size, tl.float32)
    start_m, off_bh = _tile_and_head(N, BLOCK_M)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    K_base = K + off_b * stride_kb + off_h * stride_kh
    V_base = V + off_b * stride_vb + off_h * stride_vh

    offs_m, offs_d, row_mask, d_mask = _tile_index(start_m * BLOCK_M, N, BLOCK_M, HEAD_DIM, HEAD_DIM_PADDED)
    offs_n = tl.arange(0, BLOCK_N)
    q = _load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
              row_mask, d_mask, True, PAD_D)
    row_y, row_x, row_patch = _coords(offs_m, NUM_PREFIX, GRID_W)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    a_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # Σ exp2(s − m)·dist
    s_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # Σ exp2(s − m)·(s − m)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    n_full = (N // BLOCK_N) * BLOCK_N
    for start_n in range(0, n_full, BLOCK_N):
        acc, l_i, m_i, a_i, s_i = _stats_step(acc, l_i, m_i, a_i, s_i, q, row_y, row_x, row_patch, K_base, V_base,
                                              start_n, N, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                                              offs_n, offs_d, NUM_PREFIX, GRID_W, HEAD_DIM, HEAD_DIM_PADDED, IEEE,
                                              False)
    if n_full < N:
        acc, l_i, m_i, a_i, s_i = _stats_step(acc, l_i, m_i, a_i, s_i, q, row_y, row_x, row_patch, K_base, V_base,
                                              n_full, N, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                                              offs_n, offs_d, NUM_PREFIX, GRID_W, HEAD_DIM, HEAD_DIM_PADDED, IEEE,
                                              True)

    row_offs = off_bh.to(tl.int64) * N + offs_m
    tl.store(Dist + row_offs, a_i / l_i * patch_size, mask=offs_m < N)
    tl.store(Ent + row_offs, (tl.math.log2(l_i) - s_i / l_i) * _LN2, mask=offs_m < N)
    tl.store(MaxLogit + row_offs, m_i * _LN2, mask=offs_m < N)
    o = (acc / l_i[:, None]).to(Out.dtype.element_ty)
    tl.store(Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od,
             o, mask=row_mask & d_mask)


def attention_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid_size: tuple[int, int], patch_size: float,
                    num_prefix_tokens: int = 1, softmax_scale: float | None = None):
    """Attention output and per-row distance, entropy and max logit in one pass, O(N) memory.

    Args:
        q, k, v: ``(B, H, N, d)`` float16/bfloat16/float32, one dtype and device, any strides.
        grid_size: ``(grid_h, grid_w)`` patches (a rectangular grid is fine); ``num_prefix_tokens +
            grid_h·grid_w`` must be N.
        patch_size: pixels per patch side; distances are in pixels.
        num_prefix_tokens: class tokens before the patches (1 for ``global_pool='token'``, 0 for ``'avg'``).
        softmax_scale: positive float, default ``d ** -0.5``.

    Returns:
        ``(out, distance, entropy, max_logit)``: out ``(B, H, N, d)`` in q's dtype (laid out as
        ``(B, N, H, d)``), the rest float32 ``(B, H, N)``: pixels, nats, and q·k·softmax_scale
        (definitions in the module docstring; prefix-token rows have distance 0).

    Raises:
        TypeError, ValueError: as :func:`kernels.flash.attention`; a grid that does not add up to N.
        RuntimeError: as :func:`kernels.flash.attention`; gradients requested (forward only: call under
            ``torch.no_grad()``).
    """
    softmax_scale = _check(q, k, v, softmax_scale, instead="stats=naive (analyze.py)")
    B, H, N, d = q.shape
    grid_w = check_grid(N, grid_size, patch_size, num_prefix_tokens)[1]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("attention_stats is forward-only (no backward); call it under torch.no_grad()")
    out = torch.empty(B, N, H, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    distance, entropy, max_logit = (torch.empty(B, H, N, dtype=torch.float32, device=q.device) for _ in range(3))
    block_m, block_n, warps, stages = (_INTERPRETER_BLOCKS if configs.INTERPRETED
                                       else _BLOCKS[configs.head_dim_class(d)])
    grid = (triton.cdiv(N, block_m) * B * H,)
    # Triton launches on the current GPU: q's, when it is another (analyze.py device=cuda:1 sets none)
    with device_guard(q):
        flash_stats_fwd_kernel[grid](
            q, k, v, out, distance, entropy, max_logit, softmax_scale * LOG2E, float(patch_size),
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), H, N, num_prefix_tokens, grid_w,
            HEAD_DIM=d, HEAD_DIM_PADDED=configs.head_dim_padded(d), IEEE=q.dtype == torch.float32,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    return out, distance, entropy, max_logit
