"""The whole flash backward of a short sequence in one program per (batch, head).

Dao, 2023, Algorithm 2 (the backward), with its two loops collapsed: where all of one head's N query rows fit one
tile (N ≤ ``N_PAD``, a power of two), a program holds that head's Q, dO, delta and lse and its dQ accumulator
(N_PAD × d, float32) and streams K, V in tiles of BLOCK_N3 keys. Each key tile's dK and dV are then complete after
one step, since every query row is in the program, and are stored at once; dQ is stored after the last tile. Five
matrix products per key tile (S, dP, dV, dK, dQ), where the two-kernel backward of :mod:`kernels.flash.kernels`
recomputes S and dP in each of its kernels (seven), and one launch instead of two; no atomics, so bitwise
deterministic for a given configuration. delta = rowsum(dO ∘ O) is formed here from the program's own tiles.

Padded query rows (N ≤ row < N_PAD) read q = dO = O = 0 and lse = +∞, so P = dS = 0 there and they add nothing;
padded keys of the last tile get P = 0.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .kernels import _LOG2E, _TAIL, _dot, _load, _short_tail, _tile_index


@triton.jit
def _short_step(dq, q, do, lse, delta, K_base, V_base, DK_base, DV_base, start_n, N, softmax_scale, qk_scale,
                stride_kn, stride_kd, stride_vn, stride_vd, stride_dkn, stride_dkd, stride_dvn, stride_dvd,
                HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, MASK_N: tl.constexpr,
                BLOCK_N3: tl.constexpr):
    """One key tile: its dK and dV (stored) and its term of dQ (returned)."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    offs_n, offs_d, key_mask, d_mask = _tile_index(start_n, N, BLOCK_N3, HEAD_DIM, HEAD_DIM_PADDED)
    k = _load(K_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, key_mask, d_mask, MASK_N, PAD_D)
    v = _load(V_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, key_mask, d_mask, MASK_N, PAD_D)
    s = _dot(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N3], dtype=tl.float32), IEEE)  # (N_PAD, BLOCK_N3)
    p = tl.math.exp2(s * qk_scale - lse[:, None])
    if MASK_N:
        p = tl.where(offs_n[None, :] < N, p, 0.0)
    dp = _dot(do, tl.trans(v), tl.zeros([do.shape[0], BLOCK_N3], dtype=tl.float32), IEEE)  # (N_PAD, BLOCK_N3)
    ds = p * (dp - delta[:, None])
    dv = _dot(tl.trans(p.to(do.dtype)), do, tl.zeros([BLOCK_N3, HEAD_DIM_PADDED], dtype=tl.float32), IEEE)
    dk = _dot(tl.trans(ds.to(q.dtype)), q, tl.zeros([BLOCK_N3, HEAD_DIM_PADDED], dtype=tl.float32), IEEE)
    dq = _dot(ds.to(k.dtype), k, dq, IEEE)  # (N_PAD, D)
    mask = key_mask & d_mask
    tl.store(DK_base + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             (dk * softmax_scale).to(DK_base.dtype.element_ty), mask=mask)
    tl.store(DV_base + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd, dv.to(DV_base.dtype.element_ty),
             mask=mask)
    return dq


@triton.jit
def flash_bwd_short_kernel(
    Q, K, V, DO, DQ, DK, DV, Out, Lse, softmax_scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N, N_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, N_PAD: tl.constexpr,
    BLOCK_N3: tl.constexpr,
):
    """Grid (B·H,). dQ = scale · dS K, dK = scale · dSᵀ Q, dV = Pᵀ dO for all N ≤ N_PAD rows and keys of one
    (batch, head); q, k, v, dO, out and the gradients through all four strides, lse float32 (B, H, N), natural log.
    ``qk_scale`` = softmax_scale · log2(e). ``N_BUCKET``: autotune key only."""
    softmax_scale, qk_scale = tl.cast(softmax_scale, tl.float32), tl.cast(qk_scale, tl.float32)
    off_bh = tl.program_id(0)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    offs_m, offs_d, row_mask, d_mask = _tile_index(0, N, N_PAD, HEAD_DIM, HEAD_DIM_PADDED)
    q = _load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
              row_mask, d_mask, True, PAD_D)  # (N_PAD, D)
    do = _load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_don
               + offs_d[None, :] * stride_dod, row_mask, d_mask, True, PAD_D)
    o = _load(Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od,
              row_mask, d_mask, True, PAD_D).to(tl.float32)
    delta = tl.sum(o * do.to(tl.float32), 1)  # (N_PAD,) Algorithm 2, line 4
    lse = tl.load(Lse + off_bh.to(tl.int64) * N + offs_m, mask=offs_m < N, other=float("inf")) * _LOG2E
    K_base = K + off_b * stride_kb + off_h * stride_kh
    V_base = V + off_b * stride_vb + off_h * stride_vh
    DK_base = DK + off_b * stride_dkb + off_h * stride_dkh
    DV_base = DV + off_b * stride_dvb + off_h * stride_dvh
    dq = tl.zeros([N_PAD, HEAD_DIM_PADDED], dtype=tl.float32)
    n_full = (N // BLOCK_N3) * BLOCK_N3
    for start_n in range(0, n_full, BLOCK_N3):
        dq = _short_step(dq, q, do, lse, delta, K_base, V_base, DK_base, DV_base, start_n, N, softmax_scale,
                         qk_scale, stride_kn, stride_kd, stride_vn, stride_vd, stride_dkn, stride_dkd, stride_dvn,
                         stride_dvd, HEAD_DIM, HEAD_DIM_PADDED, IEEE, False, BLOCK_N3)
    if _short_tail(n_full, N, BLOCK_N3):  # at most TAIL keys left: a TAIL-wide tile (kernels.py's docstring)
        dq = _short_step(dq, q, do, lse, delta, K_base, V_base, DK_base, DV_base, n_full, N, softmax_scale,
                         qk_scale, stride_kn, stride_kd, stride_vn, stride_vd, stride_dkn, stride_dkd, stride_dvn,
                         stride_dvd, HEAD_DIM, HEAD_DIM_PADDED, IEEE, True, _TAIL)
    elif n_full < N:
        dq = _short_step(dq, q, do, lse, delta, K_base, V_base, DK_base, DV_base, n_full, N, softmax_scale,
                         qk_scale, stride_kn, stride_kd, stride_vn, stride_vd, stride_dkn, stride_dkd, stride_dvn,
                         stride_dvd, HEAD_DIM, HEAD_DIM_PADDED, IEEE, True, BLOCK_N3)
    DQ_base = DQ + off_b * stride_dqb + off_h * stride_dqh
    tl.store(DQ_base + offs_m[:, None] * stride_dqn + offs_d[None, :] * stride_dqd,
             (dq * softmax_scale).to(DQ_base.dtype.element_ty), mask=row_mask & d_mask)
