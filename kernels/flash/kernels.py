"""FlashAttention-2 in Triton: the forward and backward kernels.

Dao, 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
Algorithm 1 (forward) and Algorithm 2 (backward), non-causal.

Forward: one program owns BLOCK_M query rows of one (batch, head) and streams K, V in tiles of
BLOCK_N keys. It keeps a running row max ``m`` and row sum ``l`` (online softmax, in base 2:
``exp(x·scale) = exp2(x·scale·log2 e)``) and the output accumulator in registers, and writes only
``out`` and the natural-log row log-sum-exp ``lse = m + log(l)`` (float32, (B, H, N)).

Backward: two kernels that recompute ``P = exp(Q Kᵀ·scale − lse)`` tile by tile. The dQ kernel runs
first: a program owns a query tile, forms that tile's ``delta = rowsum(dO ∘ O)`` (it holds the tile's
dO already, so this costs one load of O and saves the separate preprocess kernel, its launch and its
second read of dO), writes delta (with fp32_delta, the form consistent with its own dP: :func:`_bwd_dq_rows`),
and loops over all key tiles. The dK, dV kernel then owns a K/V
tile and loops over all query tiles, reading delta. Each output element is written by exactly one
program, so there are no atomics and results are bitwise deterministic for a given block configuration.

Shapes: every kernel takes (B, H, N, d) tensors through all four strides. ``HEAD_DIM`` is the real
head dim, ``HEAD_DIM_PADDED`` the next power of two (at least 16) that ``tl.dot`` works on; the
padded columns are masked on load (read as 0) and on store, so no padded copy is made in HBM.
Sequence ends: the loops run over full tiles without masks and handle the last partial tile in a
separate masked step (padded keys get score −inf, padded query rows read as 0 and are not stored).
A last tile of at most ``TAIL`` = 16 rows or keys is handled as a 16-wide tile instead of a full one
(:func:`_short_tail`): a ViT's N = n_patches + 1 is 64·k + 1 (or 197 = 3·64 + 5), so with full tiles its
class token alone costs a whole 64- or 128-row tile in every kernel, the last query tile of every head
and the last key step of every program (at N = 197 with 64-wide tiles: 256 padded rows and keys where
208 now do).
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x · LOG2E); a float for the launchers
_LOG2E = tl.constexpr(LOG2E)  # the same, as a constexpr the kernels can read
_LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log(x) = log2(x) · ln(2)
TAIL = 16  # rows or keys of a short last tile: tl.dot's smallest extent
_TAIL = tl.constexpr(TAIL)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    """``acc + a @ b``; float32 inputs as true float32 (``ieee``) when IEEE, else tensor-core default."""
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _load(ptrs, row_mask, col_mask, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load a tile; masks are applied (other=0) only where the constexpr flags ask for them."""
    if MASK_ROWS and MASK_COLS:
        return tl.load(ptrs, mask=row_mask & col_mask, other=0.0)
    elif MASK_ROWS:
        return tl.load(ptrs, mask=row_mask, other=0.0)
    elif MASK_COLS:
        return tl.load(ptrs, mask=col_mask, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _ds_dot(ds, b, acc, IEEE: tl.constexpr, SPLIT: tl.constexpr):
    """``acc + ds @ b`` with float32 ``ds`` rounded to ``b``'s dtype, or where SPLIT (fp16/bf16 ``b``) as the sum of two
    products, of its rounding and of the remainder (ds = hi + lo, ~2× the mantissa bits). dS's rows sum to 0
    (Σ_j P_ij (dP_ij − delta_i) = 0), and with huge logits its entries are differences of nearly equal terms: rounding
    each to fp16/bf16 breaks that sum, the error fp32_delta's split removes (interpreter, fp16, (1, 2, 65, 32), logits
    ~2.5e3, seeds 0-299: dq or dk outside the 2× rule on 4 draws, 7 unsplit; scaling the remainder by 2¹¹ against
    fp16's flush of values below 6e-8 changed none of the 300, so it is not scaled. With the consistent delta of
    :func:`_bwd_dq_rows`, seeds 0-899: none split, 1 unsplit, dk at 1.07× the bound)."""
    hi = ds.to(b.dtype)
    acc = _dot(hi, b, acc, IEEE)
    if SPLIT and b.dtype != tl.float32:
        acc = _dot((ds - hi.to(tl.float32)).to(b.dtype), b, acc, IEEE)
    return acc


@triton.jit
def _short_tail(start, N, BLOCK: tl.constexpr):
    """Whether the tile starting at row or key ``start`` is a last one of at most TAIL valid entries
    (then a TAIL-wide tile covers it; see the module docstring)."""
    return (BLOCK > _TAIL) & (N - start <= _TAIL)


@triton.jit
def _tile_index(row0, N, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr):
    """(row offsets (ROWS,), column offsets (HEAD_DIM_PADDED,), row mask (ROWS, 1), column mask (1, HEAD_DIM_PADDED))
    of the tile of rows row0 … row0 + ROWS − 1 of one (batch, head)'s (N, d) q, k, v, out or gradient."""
    offs = row0 + tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    return offs, offs_d, offs[:, None] < N, offs_d[None, :] < HEAD_DIM


@triton.jit
def _tile_and_head(N, BLOCK: tl.constexpr):
    """(tile index along N, batch·head index) of this program on the 1-D grid (cdiv(N, BLOCK)·B·H,).

    One axis, tiles fastest: the grid's second axis would cap B·H at 65535, and tiles of one head
    running side by side share that head's K/V in L2."""
    n_tiles = tl.cdiv(N, BLOCK)
    pid = tl.program_id(0)
    return pid % n_tiles, pid // n_tiles


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fwd_step(acc, l_i, m_i, q, K_base, V_base, start_n, N, qk_scale,
              stride_kn, stride_kd, stride_vn, stride_vd, offs_n, offs_d,
              HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
              MASK_N: tl.constexpr, UNSCALED_MAX: tl.constexpr):
    """One K/V tile of the online softmax (Algorithm 1, lines 8-10). The running max ``m_i`` is of the
    scaled base-2 scores, or of the raw q·k where ``UNSCALED_MAX`` (see flash_fwd_kernel)."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    cols = start_n + offs_n  # (BLOCK_N,)
    kT_ptrs = K_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd  # (D, BLOCK_N)
    kT = _load(kT_ptrs, cols[None, :] < N, offs_d[:, None] < HEAD_DIM, MASK_N, PAD_D)
    qk = _dot(q, kT, tl.zeros([q.shape[0], kT.shape[1]], dtype=tl.float32), IEEE)  # (BLOCK_M, BLOCK_N)
    if MASK_N:
        qk = tl.where(cols[None, :] < N, qk, float("-inf"))
    if UNSCALED_MAX:
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2((qk - m_new[:, None]) * qk_scale)  # exactly 1 at the row max
        alpha = tl.math.exp2((m_i - m_new) * qk_scale)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # base-2 running max
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one FMA per score
        alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v_ptrs = V_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd  # (BLOCK_N, D)
    v = _load(v_ptrs, cols[:, None] < N, offs_d[None, :] < HEAD_DIM, MASK_N, PAD_D)
    acc = _dot(p.to(v.dtype), v, acc, IEEE)
    return acc, l_i, m_new


@triton.jit
def _fwd_rows(Q_base, K_base, V_base, O_base, Lse_base, R_base, row0, N, qk_scale,
              stride_qn, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_on, stride_od,
              HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, STORE_RES: tl.constexpr,
              UNSCALED_MAX: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Algorithm 1 for query rows row0 … row0 + ROWS − 1 of one (batch, head): stream every K/V tile,
    then write those rows' out, lse (and res)."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    offs_m, offs_d, row_mask, d_mask = _tile_index(row0, N, ROWS, HEAD_DIM, HEAD_DIM_PADDED)
    q = _load(Q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd, row_mask, d_mask, True, PAD_D)

    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM_PADDED], dtype=tl.float32)
    n_full = (N // BLOCK_N) * BLOCK_N
    for start_n in range(0, n_full, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, K_base, V_base, start_n, N, qk_scale,
                                  stride_kn, stride_kd, stride_vn, stride_vd, tl.arange(0, BLOCK_N), offs_d,
                                  HEAD_DIM, HEAD_DIM_PADDED, IEEE, False, UNSCALED_MAX)
    if _short_tail(n_full, N, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, K_base, V_base, n_full, N, qk_scale,
                                  stride_kn, stride_kd, stride_vn, stride_vd, tl.arange(0, _TAIL), offs_d,
                                  HEAD_DIM, HEAD_DIM_PADDED, IEEE, True, UNSCALED_MAX)
    elif n_full < N:
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, K_base, V_base, n_full, N, qk_scale,
                                  stride_kn, stride_kd, stride_vn, stride_vd, tl.arange(0, BLOCK_N), offs_d,
                                  HEAD_DIM, HEAD_DIM_PADDED, IEEE, True, UNSCALED_MAX)

    acc = acc / l_i[:, None]
    if UNSCALED_MAX:
        m_i = m_i * qk_scale
    lse = (m_i + tl.math.log2(l_i)) * _LN2  # natural log
    tl.store(Lse_base + offs_m, lse, mask=offs_m < N)
    o_offs = offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    o = acc.to(O_base.dtype.element_ty)
    tl.store(O_base + o_offs, o, mask=row_mask & d_mask)
    if STORE_RES:
        tl.store(R_base + o_offs, (acc - o.to(tl.float32)).to(O_base.dtype.element_ty), mask=row_mask & d_mask)


@triton.jit
def flash_fwd_kernel(
    Q, K, V, Out, Lse, Res, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N, N_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, STORE_RES: tl.constexpr,
    UNSCALED_MAX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M)·B·H,). ``qk_scale`` = softmax_scale · log2(e). ``N_BUCKET``: autotune key only.
    ``STORE_RES``: also write ``Res`` (out's strides) = float32 out − out rounded to out's dtype, which
    the backward adds back when it forms delta (see the module docstring). ``UNSCALED_MAX`` (always
    with ``STORE_RES``): keep the running max of the raw scores and scale the difference,
    ``exp2((qk − m)·scale)``; ``exp2(qk·scale − m)`` compiles to one FMA whose unrounded product leaves
    the row max's p off 1 by up to half an ulp of the scaled logit (0.3 % at logits ~1e5), an error in
    out that the residual would then preserve. Without fp32_delta the FMA form stays: UNSCALED_MAX was no
    faster anywhere (H200, bf16, forward at (8, 16, 4096, 128) 2.30-2.35 ms against 2.26-2.51, at
    (32, 12, 1024, 128) 0.50 against 0.48) and out's bf16 rounding dwarfs the difference."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # Inductor passes Python floats as fp64
    start_m, off_bh = _tile_and_head(N, BLOCK_M)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    Q_base = Q + off_b * stride_qb + off_h * stride_qh
    K_base = K + off_b * stride_kb + off_h * stride_kh
    V_base = V + off_b * stride_vb + off_h * stride_vh
    o_offs = off_b * stride_ob + off_h * stride_oh
    Lse_base = Lse + off_bh.to(tl.int64) * N
    row0 = start_m * BLOCK_M
    if _short_tail(row0, N, BLOCK_M):
        _fwd_rows(Q_base, K_base, V_base, Out + o_offs, Lse_base, Res + o_offs, row0, N, qk_scale,
                  stride_qn, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_on, stride_od,
                  HEAD_DIM, HEAD_DIM_PADDED, IEEE, STORE_RES, UNSCALED_MAX, _TAIL, BLOCK_N)
    else:
        _fwd_rows(Q_base, K_base, V_base, Out + o_offs, Lse_base, Res + o_offs, row0, N, qk_scale,
                  stride_qn, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_on, stride_od,
                  HEAD_DIM, HEAD_DIM_PADDED, IEEE, STORE_RES, UNSCALED_MAX, BLOCK_M, BLOCK_N)


# ---------------------------------------------------------------------------------------------
# Backward preprocess: delta = rowsum(dO ∘ O)   (Algorithm 2, line 4), alone: for the Hopper (TMA)
# kernels of kernels/flash/hopper.py, whose dQ kernel does not form delta itself.
# ---------------------------------------------------------------------------------------------
@triton.jit
def flash_bwd_preprocess_kernel(
    Out, DO, Res, Delta,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    H, N,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, ADD_RES: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M)·B·H,); Delta is float32 (B, H, N). ``ADD_RES``: O = Out + Res (out's strides)."""
    start_m, off_bh = _tile_and_head(N, BLOCK_M)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    mask = (offs_m[:, None] < N) & (offs_d[None, :] < HEAD_DIM)
    o_offs = off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    o = tl.load(Out + o_offs, mask=mask, other=0.0).to(tl.float32)
    if ADD_RES:
        o += tl.load(Res + o_offs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_don
                 + offs_d[None, :] * stride_dod, mask=mask, other=0.0).to(tl.float32)
    tl.store(Delta + off_bh.to(tl.int64) * N + offs_m, tl.sum(o * do, 1), mask=offs_m < N)


# ---------------------------------------------------------------------------------------------
# Backward: dK, dV (one program per K/V tile, looping over query tiles; after the dQ kernel, which writes delta)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _bwd_dkdv_step(dk, dv, k, v, Q_base, DO_base, Lse_base, Delta_base, start_m, N, qk_scale,
                   stride_qn, stride_qd, stride_don, stride_dod, offs_m, offs_d,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
                   MASK_M: tl.constexpr, SPLIT_DS: tl.constexpr):
    """One query tile's contribution to dK, dV (Algorithm 2, lines 11-19, transposed).

    dPᵀ is issued before dV's product. Triton waits for each wgmma right after issuing it, except an accumulating
    one (dV, dK), which it leaves in flight; ptxas then hoists an independent wgmma above the work before its wait.
    In this order the SASS (sm_90) runs dPᵀ's HGMMAs under the exponentials and dV's under dSᵀ; issued after dV
    (as Algorithm 2 writes it), dPᵀ waited for both with nothing under them (the dQ kernel already had its
    exponentials under dP). H200, bf16, dK/dV kernel, best config each: 1.657 → 1.603 ms at (8, 12, 4097, 64),
    3.931 → 3.547 at (8, 16, 4096, 128), 0.259 → 0.258 at (256, 12, 197, 64), 0.423 → 0.431 at (32, 12, 1024, 64)
    (benchmarks/results/h200_20261203_b.md)."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    rows = start_m + offs_m  # (BLOCK_M1,)
    qT = _load(Q_base + rows[None, :] * stride_qn + offs_d[:, None] * stride_qd,
               rows[None, :] < N, offs_d[:, None] < HEAD_DIM, MASK_M, PAD_D)  # (D, BLOCK_M1)
    do = _load(DO_base + rows[:, None] * stride_don + offs_d[None, :] * stride_dod,
               rows[:, None] < N, offs_d[None, :] < HEAD_DIM, MASK_M, PAD_D)  # (BLOCK_M1, D)
    if MASK_M:  # padded rows: lse = +inf makes P = 0 there
        lse = tl.load(Lse_base + rows, mask=rows < N, other=float("inf")) * _LOG2E
        delta = tl.load(Delta_base + rows, mask=rows < N, other=0.0)
    else:
        lse = tl.load(Lse_base + rows) * _LOG2E
        delta = tl.load(Delta_base + rows)
    qkT = _dot(k, qT, tl.zeros([k.shape[0], qT.shape[1]], dtype=tl.float32), IEEE)  # (BLOCK_N1, BLOCK_M1)
    pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
    dpT = _dot(v, tl.trans(do), tl.zeros([v.shape[0], do.shape[0]], dtype=tl.float32), IEEE)
    dv = _dot(pT.to(do.dtype), do, dv, IEEE)
    dsT = pT * (dpT - delta[None, :])
    dk = _ds_dot(dsT, tl.trans(qT), dk, IEEE, SPLIT_DS)
    return dk, dv


@triton.jit
def _bwd_dkdv_cols(Q_base, K_base, V_base, DO_base, DK_base, DV_base, Lse_base, Delta_base, col0, N,
                   softmax_scale, qk_scale, stride_qn, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
                   stride_don, stride_dod, stride_dkn, stride_dkd, stride_dvn, stride_dvd,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
                   SPLIT_DS: tl.constexpr, COLS: tl.constexpr, BLOCK_M1: tl.constexpr):
    """dK, dV of keys col0 … col0 + COLS − 1 of one (batch, head), looping over every query tile."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    offs_n, offs_d, row_mask, d_mask = _tile_index(col0, N, COLS, HEAD_DIM, HEAD_DIM_PADDED)
    k = _load(K_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, row_mask, d_mask, True, PAD_D)
    v = _load(V_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, row_mask, d_mask, True, PAD_D)
    dk = tl.zeros([COLS, HEAD_DIM_PADDED], dtype=tl.float32)  # (COLS, D)
    dv = tl.zeros([COLS, HEAD_DIM_PADDED], dtype=tl.float32)
    m_full = (N // BLOCK_M1) * BLOCK_M1
    for start_m in range(0, m_full, BLOCK_M1):
        dk, dv = _bwd_dkdv_step(dk, dv, k, v, Q_base, DO_base, Lse_base, Delta_base, start_m, N, qk_scale,
                                stride_qn, stride_qd, stride_don, stride_dod, tl.arange(0, BLOCK_M1), offs_d,
                                HEAD_DIM, HEAD_DIM_PADDED, IEEE, False, SPLIT_DS)
    if _short_tail(m_full, N, BLOCK_M1):
        dk, dv = _bwd_dkdv_step(dk, dv, k, v, Q_base, DO_base, Lse_base, Delta_base, m_full, N, qk_scale,
                                stride_qn, stride_qd, stride_don, stride_dod, tl.arange(0, _TAIL), offs_d,
                                HEAD_DIM, HEAD_DIM_PADDED, IEEE, True, SPLIT_DS)
    elif m_full < N:
        dk, dv = _bwd_dkdv_step(dk, dv, k, v, Q_base, DO_base, Lse_base, Delta_base, m_full, N, qk_scale,
                                stride_qn, stride_qd, stride_don, stride_dod, tl.arange(0, BLOCK_M1), offs_d,
                                HEAD_DIM, HEAD_DIM_PADDED, IEEE, True, SPLIT_DS)

    dk = dk * softmax_scale
    mask = row_mask & d_mask
    tl.store(DK_base + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd, dk.to(DK_base.dtype.element_ty),
             mask=mask)
    tl.store(DV_base + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd, dv.to(DV_base.dtype.element_ty),
             mask=mask)


@triton.jit
def flash_bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, Lse, Delta, softmax_scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, N, N_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, SPLIT_DS: tl.constexpr,
    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_N1)·B·H,). dK = scale · Σ dS Q, dV = Σ Pᵀ dO. ``SPLIT_DS`` (fp32_delta's): dSᵀ Q as two
    products (:func:`_ds_dot`)."""
    softmax_scale, qk_scale = tl.cast(softmax_scale, tl.float32), tl.cast(qk_scale, tl.float32)
    start_n, off_bh = _tile_and_head(N, BLOCK_N1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    Q_base = Q + off_b * stride_qb + off_h * stride_qh
    K_base = K + off_b * stride_kb + off_h * stride_kh
    V_base = V + off_b * stride_vb + off_h * stride_vh
    DO_base = DO + off_b * stride_dob + off_h * stride_doh
    DK_base = DK + off_b * stride_dkb + off_h * stride_dkh
    DV_base = DV + off_b * stride_dvb + off_h * stride_dvh
    Lse_base = Lse + off_bh.to(tl.int64) * N
    Delta_base = Delta + off_bh.to(tl.int64) * N
    col0 = start_n * BLOCK_N1
    if _short_tail(col0, N, BLOCK_N1):
        _bwd_dkdv_cols(Q_base, K_base, V_base, DO_base, DK_base, DV_base, Lse_base, Delta_base, col0, N,
                       softmax_scale, qk_scale, stride_qn, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
                       stride_don, stride_dod, stride_dkn, stride_dkd, stride_dvn, stride_dvd,
                       HEAD_DIM, HEAD_DIM_PADDED, IEEE, SPLIT_DS, _TAIL, BLOCK_M1)
    else:
        _bwd_dkdv_cols(Q_base, K_base, V_base, DO_base, DK_base, DV_base, Lse_base, Delta_base, col0, N,
                       softmax_scale, qk_scale, stride_qn, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
                       stride_don, stride_dod, stride_dkn, stride_dkd, stride_dvn, stride_dvd,
                       HEAD_DIM, HEAD_DIM_PADDED, IEEE, SPLIT_DS, BLOCK_N1, BLOCK_M1)


# ---------------------------------------------------------------------------------------------
# Backward: delta and dQ (one program per query tile, looping over key tiles)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _bwd_dq_step(dq, pk, s1, s0, q, do, lse, delta, K_base, V_base, start_n, N, qk_scale,
                 stride_kn, stride_kd, stride_vn, stride_vd, offs_n, offs_d,
                 HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
                 MASK_N: tl.constexpr, SPLIT_DS: tl.constexpr):
    """One key tile's contribution to dQ (Algorithm 2, lines 11-14 and 20). With ``SPLIT_DS`` (fp32_delta's) also
    its terms of the sums that make delta consistent (:func:`_bwd_dq_rows`): ``pk`` += P K, ``s1`` += rowsum(dS),
    ``s0`` += rowsum(P); without, those three pass through unchanged."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    cols = start_n + offs_n  # (BLOCK_N2,)
    kT = _load(K_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd,
               cols[None, :] < N, offs_d[:, None] < HEAD_DIM, MASK_N, PAD_D)  # (D, BLOCK_N2)
    vT = _load(V_base + cols[None, :] * stride_vn + offs_d[:, None] * stride_vd,
               cols[None, :] < N, offs_d[:, None] < HEAD_DIM, MASK_N, PAD_D)
    qk = _dot(q, kT, tl.zeros([q.shape[0], kT.shape[1]], dtype=tl.float32), IEEE)  # (BLOCK_M2, BLOCK_N2)
    p = tl.math.exp2(qk * qk_scale - lse[:, None])
    if MASK_N:
        p = tl.where(cols[None, :] < N, p, 0.0)
    dp = _dot(do, vT, tl.zeros([do.shape[0], vT.shape[1]], dtype=tl.float32), IEEE)
    ds = p * (dp - delta[:, None])
    dq = _ds_dot(ds, tl.trans(kT), dq, IEEE, SPLIT_DS)
    if SPLIT_DS:
        pk = _dot(p.to(kT.dtype), tl.trans(kT), pk, IEEE)
        s1 += tl.sum(ds, 1)
        s0 += tl.sum(p, 1)
    return dq, pk, s1, s0


@triton.jit
def _bwd_dq_rows(Q_base, K_base, V_base, DO_base, DQ_base, O_base, R_base, Lse_base, Delta_base, row0, N,
                 softmax_scale, qk_scale, stride_qn, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
                 stride_don, stride_dod, stride_dqn, stride_dqd, stride_on, stride_od,
                 HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, ADD_RES: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_N2: tl.constexpr):
    """delta and dQ of query rows row0 … row0 + ROWS − 1 of one (batch, head), looping over every key tile.

    ``ADD_RES`` (fp32_delta): the delta written (and used) is delta' = Σⱼ P dP / Σⱼ P of this kernel's own P and dP,
    the delta of SDPA math's softmax backward; rowsum(dO ∘ O) of the float32 O is only its centre c. The loop adds
    ``s1`` = rowsum(P (dP − c)), ``s0`` = rowsum(P) and ``pk`` = P K (one more product per key tile); with
    corr = s1 / s0, dS' = dS − corr·P and dQ' = Σ dS K − corr·(P K). Why: with huge logits P is nearly one-hot, and
    at a row's top key dS = P (dP − delta) is the difference of two float32 dot products of |dP| up to ~20, each
    rounded on its own (errors 1-3e-6 there: dP's d products, and delta); times scale·|k| ≈ 15 those were the dq and
    dk errors of 1-3e-5 that fell outside the 2× rule. In delta' the top key's dP rounding cancels, as in SDPA math
    (whose dP − delta errs by at most 6e-7 there), and O's own error drops out (where a row's P is split, the float32
    O is off by ~1e-4: seed 125, P 0.78/0.22, 1.5e-4, 6e-5 of it from P rounded to fp16 for P V). Interpreter, fp16,
    (1, 2, 65, 32), q and k × 24, check_against_reference against SDPA math: seeds 0-899, 19 draws outside the bound
    before, none after; largest err / bound 0.96 (before, over seeds 300-899: 2.32), 99th percentile over 300-899 0.72
    (1.62). The GPU tests (bf16, max |logit| to 1e5) pass with it (benchmarks/results/h200_20261202_b.md). The dK/dV
    kernel reads delta' and gains where its dP is bitwise this kernel's: on the interpreter its v doᵀ tiles are this
    kernel's do vᵀ tiles transposed, bitwise (and forming them as (do vᵀ)ᵀ there changed none of the 900 results);
    on a GPU, whose two kernels use other tile shapes and MMA instructions, that is unchecked."""
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    offs_m, offs_d, row_mask, d_mask = _tile_index(row0, N, ROWS, HEAD_DIM, HEAD_DIM_PADDED)
    q = _load(Q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd, row_mask, d_mask, True, PAD_D)
    do = _load(DO_base + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod, row_mask, d_mask, True, PAD_D)
    o_offs = offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    o = _load(O_base + o_offs, row_mask, d_mask, True, PAD_D).to(tl.float32)  # (ROWS, D)
    if ADD_RES:
        o += _load(R_base + o_offs, row_mask, d_mask, True, PAD_D).to(tl.float32)
    delta = tl.sum(o * do.to(tl.float32), 1)  # (ROWS,) Algorithm 2, line 4; 0 on padded rows
    if not ADD_RES:  # (with ADD_RES, delta' after the loop)
        tl.store(Delta_base + offs_m, delta, mask=offs_m < N)
    lse = tl.load(Lse_base + offs_m, mask=offs_m < N, other=0.0) * _LOG2E
    dq = tl.zeros([ROWS, HEAD_DIM_PADDED], dtype=tl.float32)
    if ADD_RES:  # the sums that make delta consistent (see the docstring)
        pk = tl.zeros([ROWS, HEAD_DIM_PADDED], dtype=tl.float32)
        s1 = tl.zeros([ROWS], dtype=tl.float32)
        s0 = tl.zeros([ROWS], dtype=tl.float32)
    else:  # unused: _bwd_dq_step passes them through
        pk = 0.0
        s1 = 0.0
        s0 = 0.0
    n_full = (N // BLOCK_N2) * BLOCK_N2
    for start_n in range(0, n_full, BLOCK_N2):
        dq, pk, s1, s0 = _bwd_dq_step(dq, pk, s1, s0, q, do, lse, delta, K_base, V_base, start_n, N, qk_scale,
                                      stride_kn, stride_kd, stride_vn, stride_vd, tl.arange(0, BLOCK_N2), offs_d,
                                      HEAD_DIM, HEAD_DIM_PADDED, IEEE, False, ADD_RES)
    if _short_tail(n_full, N, BLOCK_N2):
        dq, pk, s1, s0 = _bwd_dq_step(dq, pk, s1, s0, q, do, lse, delta, K_base, V_base, n_full, N, qk_scale,
                                      stride_kn, stride_kd, stride_vn, stride_vd, tl.arange(0, _TAIL), offs_d,
                                      HEAD_DIM, HEAD_DIM_PADDED, IEEE, True, ADD_RES)
    elif n_full < N:
        dq, pk, s1, s0 = _bwd_dq_step(dq, pk, s1, s0, q, do, lse, delta, K_base, V_base, n_full, N, qk_scale,
                                      stride_kn, stride_kd, stride_vn, stride_vd, tl.arange(0, BLOCK_N2), offs_d,
                                      HEAD_DIM, HEAD_DIM_PADDED, IEEE, True, ADD_RES)

    if ADD_RES:  # delta' = delta + corr = Σ P dP / Σ P, and dS' = dS − corr·P: dQ −= corr·(P K)
        corr = s1 / s0  # padded rows: s0 > 0 (their q is 0, P = 1 on every valid key)
        dq -= corr[:, None] * pk
        tl.store(Delta_base + offs_m, delta + corr, mask=offs_m < N)
    dq = dq * softmax_scale
    tl.store(DQ_base + offs_m[:, None] * stride_dqn + offs_d[None, :] * stride_dqd, dq.to(DQ_base.dtype.element_ty),
             mask=row_mask & d_mask)


@triton.jit
def flash_bwd_dq_kernel(
    Q, K, V, DO, DQ, Out, Res, Lse, Delta, softmax_scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N, N_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, ADD_RES: tl.constexpr,
    BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M2)·B·H,). Writes Delta = rowsum(dO ∘ O) (float32, (B, H, N); O = Out) and
    dQ = scale · Σ dS K; with ``ADD_RES`` (fp32_delta) Delta = Σ P dP / Σ P, centred on rowsum(dO ∘ (Out + Res)), Res
    laid out as Out (:func:`_bwd_dq_rows`), and dS K as two products (:func:`_ds_dot`)."""
    softmax_scale, qk_scale = tl.cast(softmax_scale, tl.float32), tl.cast(qk_scale, tl.float32)
    start_m, off_bh = _tile_and_head(N, BLOCK_M2)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    Q_base = Q + off_b * stride_qb + off_h * stride_qh
    K_base = K + off_b * stride_kb + off_h * stride_kh
    V_base = V + off_b * stride_vb + off_h * stride_vh
    DO_base = DO + off_b * stride_dob + off_h * stride_doh
    DQ_base = DQ + off_b * stride_dqb + off_h * stride_dqh
    o_offs = off_b * stride_ob + off_h * stride_oh
    Lse_base = Lse + off_bh.to(tl.int64) * N
    Delta_base = Delta + off_bh.to(tl.int64) * N
    row0 = start_m * BLOCK_M2
    if _short_tail(row0, N, BLOCK_M2):
        _bwd_dq_rows(Q_base, K_base, V_base, DO_base, DQ_base, Out + o_offs, Res + o_offs, Lse_base, Delta_base,
                     row0, N, softmax_scale, qk_scale, stride_qn, stride_qd, stride_kn, stride_kd, stride_vn,
                     stride_vd, stride_don, stride_dod, stride_dqn, stride_dqd, stride_on, stride_od,
                     HEAD_DIM, HEAD_DIM_PADDED, IEEE, ADD_RES, _TAIL, BLOCK_N2)
    else:
        _bwd_dq_rows(Q_base, K_base, V_base, DO_base, DQ_base, Out + o_offs, Res + o_offs, Lse_base, Delta_base,
                     row0, N, softmax_scale, qk_scale, stride_qn, stride_qd, stride_kn, stride_kd, stride_vn,
                     stride_vd, stride_don, stride_dod, stride_dqn, stride_dqd, stride_on, stride_od,
                     HEAD_DIM, HEAD_DIM_PADDED, IEEE, ADD_RES, BLOCK_M2, BLOCK_N2)
