"""The flash backward for short sequences: one program per (batch, head), all keys on chip, five products.

Dao, 2023, Algorithm 2 (non-causal), with its loops arranged for N of a few hundred: a program owns one head's
whole K and V (``KEYS`` rows, N padded to a power of two) and walks its query tiles once. Each query tile's
scores against every key are in hand at once, so the tile's dQ = scale · dS K is complete when the tile is done and
is stored straight away; dK and dV accumulate across the walk in registers. Per tile: Sᵀ = K Qᵀ, Pᵀ, dV += Pᵀ dO,
dPᵀ = V dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − delta), dK += dSᵀ Q, dQ = dS K: five matrix products where the two-kernel
backward of :mod:`kernels.flash.kernels` does seven (it recomputes S and dP in its dQ kernel), one read of Q, dO, O
and K, V, one launch, and still no atomics: each output element is written by one program, so the results are
bitwise deterministic for a given config. delta = rowsum(dO ∘ O) is formed per tile from O and dO, as the dQ kernel
does.

Padding: keys past N load as zero rows of K and V; their scores are 0, not −inf, but they only ever meet K and V
rows of zeros (dQ's dS K) or rows of dK and dV that are not stored, so nothing they produce is read. Query rows past
N load q = dO = O = 0 and lse = +inf: P = 0 there. A last query tile of at most ``TAIL`` rows runs 16 wide, as in
the other kernels.

Where: ``KEYS · HEAD_DIM_PADDED`` bounded by the register file (dK and dV are two float32 (KEYS, D) accumulators),
and only where it measures faster than the two kernels; :func:`kernels.flash.configs.short_keys` decides. Not with
fp32_delta (its consistent delta needs the dQ kernel's extra sums): those calls keep the two kernels.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.flash.kernels import _LOG2E, _TAIL, _dot, _load, _short_tail


@triton.jit
def _short_step(dk, dv, k, v, Q_base, DO_base, O_base, DQ_base, Lse_base, row0, N, softmax_scale, qk_scale,
                stride_qn, stride_qd, stride_don, stride_dod, stride_on, stride_od, stride_dqn, stride_dqd,
                offs_m, offs_d, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
                MASK_M: tl.constexpr):
    """One query tile: its dQ stored, its terms of dK and dV added (keys along the rows: the transposed tiles)."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    rows = row0 + offs_m  # (ROWS,)
    row_mask = rows[:, None] < N
    d_mask = offs_d[None, :] < HEAD_DIM
    q = _load(Q_base + rows[:, None] * stride_qn + offs_d[None, :] * stride_qd, row_mask, d_mask, MASK_M, PAD_D)
    do = _load(DO_base + rows[:, None] * stride_don + offs_d[None, :] * stride_dod, row_mask, d_mask, MASK_M, PAD_D)
    o = _load(O_base + rows[:, None] * stride_on + offs_d[None, :] * stride_od, row_mask, d_mask, MASK_M, PAD_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # (ROWS,) Algorithm 2, line 4
    if MASK_M:  # padded rows: lse = +inf makes P = 0 there
        lse = tl.load(Lse_base + rows, mask=rows < N, other=float("inf")) * _LOG2E
    else:
        lse = tl.load(Lse_base + rows) * _LOG2E
    qkT = _dot(k, tl.trans(q), tl.zeros([k.shape[0], q.shape[0]], dtype=tl.float32), IEEE)  # (KEYS, ROWS)
    pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
    dv = _dot(pT.to(do.dtype), do, dv, IEEE)  # (KEYS, D)
    dpT = _dot(v, tl.trans(do), tl.zeros([v.shape[0], do.shape[0]], dtype=tl.float32), IEEE)  # (KEYS, ROWS)
    dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
    dk = _dot(dsT, q, dk, IEEE)  # (KEYS, D)
    dq = _dot(tl.trans(dsT), k, tl.zeros([q.shape[0], k.shape[1]], dtype=tl.float32), IEEE)  # (ROWS, D)
    tl.store(DQ_base + rows[:, None] * stride_dqn + offs_d[None, :] * stride_dqd,
             (dq * softmax_scale).to(DQ_base.dtype.element_ty), mask=row_mask & d_mask)
    return dk, dv


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
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, KEYS: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Grid (B·H,); KEYS ≥ N a power of two ≥ 16. Writes dQ = scale · dS K, dK = scale · dSᵀ Q, dV = Pᵀ dO of one
    (batch, head); Out is the forward's output and Lse its natural-log lse. ``N_BUCKET``: autotune key only."""
    softmax_scale, qk_scale = tl.cast(softmax_scale, tl.float32), tl.cast(qk_scale, tl.float32)
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    off_bh = tl.program_id(0)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    Q_base = Q + off_b * stride_qb + off_h * stride_qh
    DO_base = DO + off_b * stride_dob + off_h * stride_doh
    O_base = Out + off_b * stride_ob + off_h * stride_oh
    DQ_base = DQ + off_b * stride_dqb + off_h * stride_dqh
    Lse_base = Lse + off_bh.to(tl.int64) * N

    offs_n = tl.arange(0, KEYS)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    key_mask = offs_n[:, None] < N
    d_mask = offs_d[None, :] < HEAD_DIM
    k = _load(K + off_b * stride_kb + off_h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
              key_mask, d_mask, True, PAD_D)  # (KEYS, D)
    v = _load(V + off_b * stride_vb + off_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
              key_mask, d_mask, True, PAD_D)
    dk = tl.zeros([KEYS, HEAD_DIM_PADDED], dtype=tl.float32)
    dv = tl.zeros([KEYS, HEAD_DIM_PADDED], dtype=tl.float32)

    m_full = (N // BLOCK_M) * BLOCK_M
    for row0 in range(0, m_full, BLOCK_M):
        dk, dv = _short_step(dk, dv, k, v, Q_base, DO_base, O_base, DQ_base, Lse_base, row0, N, softmax_scale,
                             qk_scale, stride_qn, stride_qd, stride_don, stride_dod, stride_on, stride_od, stride_dqn,
                             stride_dqd, tl.arange(0, BLOCK_M), offs_d, HEAD_DIM, HEAD_DIM_PADDED, IEEE, False)
    if _short_tail(m_full, N, BLOCK_M):
        dk, dv = _short_step(dk, dv, k, v, Q_base, DO_base, O_base, DQ_base, Lse_base, m_full, N, softmax_scale,
                             qk_scale, stride_qn, stride_qd, stride_don, stride_dod, stride_on, stride_od, stride_dqn,
                             stride_dqd, tl.arange(0, _TAIL), offs_d, HEAD_DIM, HEAD_DIM_PADDED, IEEE, True)
    elif m_full < N:
        dk, dv = _short_step(dk, dv, k, v, Q_base, DO_base, O_base, DQ_base, Lse_base, m_full, N, softmax_scale,
                             qk_scale, stride_qn, stride_qd, stride_don, stride_dod, stride_on, stride_od, stride_dqn,
                             stride_dqd, tl.arange(0, BLOCK_M), offs_d, HEAD_DIM, HEAD_DIM_PADDED, IEEE, True)

    mask = key_mask & d_mask
    tl.store(DK + off_b * stride_dkb + off_h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             (dk * softmax_scale).to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + off_b * stride_dvb + off_h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=mask)
