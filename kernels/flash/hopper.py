"""FlashAttention-2 for Hopper (sm_90): the flash kernels with their tiles through TMA tensor descriptors.

The forward, dK/dV and dQ kernels have the algorithm, arguments and results contract of their pointer
twins in :mod:`kernels.flash.kernels` (Dao 2023, Algorithms 1 and 2); :func:`flash_bwd_fused_tma_kernel`
is the backward in one kernel, with dQ reduce-added (FlashAttention-3's way). None is wired into the
backend: measured on the H200 (benchmarks/results/flash_h200_20261201.md) the TMA kernels were faster only at
N = 4096 (forward −3-4 %, dK/dV −9 % at head_dim 128) and 40-60 % slower at N = 197, and the fused one was 1.02-1.33×
the two-kernel backward's time (flash_native_h200_20261201.md). What differs is how tiles reach shared memory:
each program builds 2-D tensor descriptors ``[N, HEAD_DIM]`` over its (batch, head)'s rows
(``tl.make_tensor_descriptor``), and ``desc.load`` becomes a TMA bulk copy that the compiler pipelines with
mbarriers and can hand to a producer warp (``WARP_SPECIALIZE``: Triton's Hopper warp-specialisation pass). TMA fills
rows past N and columns past HEAD_DIM with zeros, so only the scores of the last key tile need a mask.

Requirements (checked by the launcher): a Hopper GPU, the last stride 1, the other strides and each
head's base address 16-byte aligned. Device-side descriptors need a scratch allocator, which
:func:`ensure_allocator` installs (torch's caching allocator) if none is set.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernels import _LN2, _LOG2E, _dot, _tile_and_head


def _torch_alloc(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Give Triton a device allocator for the in-kernel descriptors (the caching allocator)."""
    triton.set_allocator(_torch_alloc)


@triton.jit
def _fwd_step_tma(acc, l_i, m_i, q, desc_k, desc_v, start_n, N, qk_scale, offs_n,
                  IEEE: tl.constexpr, MASK_N: tl.constexpr, UNSCALED_MAX: tl.constexpr):
    k = desc_k.load([start_n, 0])  # (BLOCK_N, D), zero past N and HEAD_DIM
    qk = _dot(q, tl.trans(k), tl.zeros([q.shape[0], k.shape[0]], dtype=tl.float32), IEEE)  # (BLOCK_M, BLOCK_N)
    if MASK_N:
        qk = tl.where((start_n + offs_n)[None, :] < N, qk, float("-inf"))
    if UNSCALED_MAX:  # as kernels._fwd_step (why: flash_fwd_kernel's docstring)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2((qk - m_new[:, None]) * qk_scale)
        alpha = tl.math.exp2((m_i - m_new) * qk_scale)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = desc_v.load([start_n, 0])  # (BLOCK_N, D)
    acc = _dot(p.to(v.dtype), v, acc, IEEE)
    return acc, l_i, m_new


@triton.jit
def flash_fwd_tma_kernel(
    Q, K, V, Out, Lse, Res, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N, N_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr, STORE_RES: tl.constexpr,
    UNSCALED_MAX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M)·B·H,); arguments as ``flash_fwd_kernel`` (the ``stride_*d`` must be 1)."""
    qk_scale = tl.cast(qk_scale, tl.float32)
    start_m, off_bh = _tile_and_head(N, BLOCK_M)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    desc_q = tl.make_tensor_descriptor(Q + off_b * stride_qb + off_h * stride_qh, shape=[N, HEAD_DIM],
                                       strides=[stride_qn, 1], block_shape=[BLOCK_M, HEAD_DIM_PADDED])
    desc_k = tl.make_tensor_descriptor(K + off_b * stride_kb + off_h * stride_kh, shape=[N, HEAD_DIM],
                                       strides=[stride_kn, 1], block_shape=[BLOCK_N, HEAD_DIM_PADDED])
    desc_v = tl.make_tensor_descriptor(V + off_b * stride_vb + off_h * stride_vh, shape=[N, HEAD_DIM],
                                       strides=[stride_vn, 1], block_shape=[BLOCK_N, HEAD_DIM_PADDED])
    desc_o = tl.make_tensor_descriptor(Out + off_b * stride_ob + off_h * stride_oh, shape=[N, HEAD_DIM],
                                       strides=[stride_on, 1], block_shape=[BLOCK_M, HEAD_DIM_PADDED])
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = desc_q.load([start_m * BLOCK_M, 0])  # (BLOCK_M, D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    n_full = (N // BLOCK_N) * BLOCK_N
    for start_n in tl.range(0, n_full, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        acc, l_i, m_i = _fwd_step_tma(acc, l_i, m_i, q, desc_k, desc_v, start_n, N, qk_scale, offs_n, IEEE, False,
                                      UNSCALED_MAX)
    if n_full < N:
        acc, l_i, m_i = _fwd_step_tma(acc, l_i, m_i, q, desc_k, desc_v, n_full, N, qk_scale, offs_n, IEEE, True,
                                      UNSCALED_MAX)

    acc = acc / l_i[:, None]
    if UNSCALED_MAX:
        m_i = m_i * qk_scale
    lse = (m_i + tl.math.log2(l_i)) * _LN2
    tl.store(Lse + off_bh.to(tl.int64) * N + offs_m, lse, mask=offs_m < N)
    o = acc.to(Out.dtype.element_ty)
    desc_o.store([start_m * BLOCK_M, 0], o)
    if STORE_RES:
        desc_r = tl.make_tensor_descriptor(Res + off_b * stride_ob + off_h * stride_oh, shape=[N, HEAD_DIM],
                                           strides=[stride_on, 1], block_shape=[BLOCK_M, HEAD_DIM_PADDED])
        desc_r.store([start_m * BLOCK_M, 0], (acc - o.to(tl.float32)).to(Out.dtype.element_ty))


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Can :func:`flash_fwd_tma_kernel` read these (B, H, N, d) tensors: unit last stride, the
    other strides and every head's base 16-byte aligned, on a Hopper-or-newer GPU."""
    for t in tensors:
        if t.device.type != "cuda" or torch.cuda.get_device_capability(t.device)[0] < 9 or t.stride(-1) != 1:
            return False
        size = t.element_size()
        if t.data_ptr() % 16 or any((s * size) % 16 for s in t.stride()[:-1]):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Backward (Algorithm 2), TMA loads: dK/dV per key tile, dQ per query tile, as the pointer kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _rows_desc(Base, N, stride_n, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr):
    """A [N, HEAD_DIM] descriptor over one (batch, head)'s rows, loading [BLOCK, HEAD_DIM_PADDED] tiles."""
    return tl.make_tensor_descriptor(Base, shape=[N, HEAD_DIM], strides=[stride_n, 1],
                                     block_shape=[BLOCK, HEAD_DIM_PADDED])


@triton.jit
def _bwd_dkdv_step_tma(dk, dv, k, v, desc_q, desc_do, Lse_base, Delta_base, start_m, N, qk_scale, offs_m,
                       IEEE: tl.constexpr, MASK_M: tl.constexpr, dq_sink=None, DQ_REDUCE: tl.constexpr = 0):
    """One query tile's dK, dV contribution; with ``DQ_REDUCE`` also its dQ partial, added by :func:`_add_dq`."""
    rows = start_m + offs_m
    q = desc_q.load([start_m, 0])  # (BLOCK_M1, D)
    do = desc_do.load([start_m, 0])  # (BLOCK_M1, D)
    if MASK_M:  # padded rows: lse = +inf makes P = 0 there
        lse = tl.load(Lse_base + rows, mask=rows < N, other=float("inf")) * _LOG2E
        delta = tl.load(Delta_base + rows, mask=rows < N, other=0.0)
    else:
        lse = tl.load(Lse_base + rows) * _LOG2E
        delta = tl.load(Delta_base + rows)
    qT = tl.trans(q)
    qkT = _dot(k, qT, tl.zeros([k.shape[0], qT.shape[1]], dtype=tl.float32), IEEE)  # (BLOCK_N1, BLOCK_M1)
    pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
    dpT = _dot(v, tl.trans(do), tl.zeros([v.shape[0], do.shape[0]], dtype=tl.float32), IEEE)  # first: see _bwd_dkdv_step
    dv = _dot(pT.to(do.dtype), do, dv, IEEE)
    dsT = pT * (dpT - delta[None, :])
    dk = _dot(dsT.to(q.dtype), q, dk, IEEE)
    if DQ_REDUCE != 0:
        _add_dq(dq_sink, tl.trans(dsT.to(k.dtype)), k, start_m, rows, N, IEEE, DQ_REDUCE)
    return dk, dv


@triton.jit
def _add_dq(dq_sink, ds, k, start_m, rows, N, IEEE: tl.constexpr, DQ_REDUCE: tl.constexpr):
    """dQ[rows] += scale · dS K for one (query tile, key tile) pair, into float32 DQacc. ``dq_sink`` is
    ``(desc_dqacc, DQacc_base, stride_dqn, HEAD_DIM, softmax_scale)``. DQ_REDUCE 1: ``tl.atomic_add``, an
    element-wise reduction per value (what Triton's interpreter runs); 2: the descriptor's ``atomic_add``, a
    TMA bulk reduce-add of the whole tile (``cp.reduce.async.bulk.tensor``, Hopper), as FlashAttention-3 adds
    its dQ. Either way the order of the adds is not fixed: not bitwise deterministic."""
    desc_dqacc, DQacc_base, stride_dqn, HEAD_DIM, softmax_scale = dq_sink
    dq = _dot(ds, k, tl.zeros([ds.shape[0], k.shape[1]], dtype=tl.float32), IEEE) * softmax_scale  # (BLOCK_M1, D)
    if DQ_REDUCE == 2:
        desc_dqacc.atomic_add([start_m, 0], dq)
    else:
        offs_d = tl.arange(0, dq.shape[1])
        mask = (rows[:, None] < N) & (offs_d[None, :] < HEAD_DIM)
        tl.atomic_add(DQacc_base + rows[:, None] * stride_dqn + offs_d[None, :], dq, mask=mask, sem="relaxed")


@triton.jit
def flash_bwd_dkdv_tma_kernel(
    Q, K, V, DO, DK, DV, Lse, Delta, softmax_scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, N, N_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """Arguments and grid as ``flash_bwd_dkdv_kernel``; the ``stride_*d`` must be 1."""
    _dkdv_tma_program(Q, K, V, DO, DK, DV, Delta, Lse, Delta, softmax_scale, qk_scale,
                      stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                      stride_dob, stride_doh, stride_don, stride_dkb, stride_dkh, stride_dkn,
                      stride_dvb, stride_dvh, stride_dvn, H, N,
                      HEAD_DIM, HEAD_DIM_PADDED, IEEE, BLOCK_M1, BLOCK_N1, WARP_SPECIALIZE, 0)


@triton.jit
def flash_bwd_fused_tma_kernel(
    Q, K, V, DO, DK, DV, DQacc, Lse, Delta, softmax_scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, N, N_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DQ_REDUCE: tl.constexpr,
):
    """The whole backward in five matrix products (FlashAttention-2's Algorithm 2 as written, dQ included): as
    :func:`flash_bwd_dkdv_tma_kernel`, and each (query tile, key tile) pair also adds its scale · dS K to
    ``DQacc``, float32 ``(B, H, N, HEAD_DIM)`` contiguous and zeroed by the caller, through :func:`_add_dq`
    (``DQ_REDUCE`` 1 or 2). Delta comes from :func:`kernels.flash.kernels.flash_bwd_preprocess_kernel`.
    Unwired: not yet measured on a GPU."""
    _dkdv_tma_program(Q, K, V, DO, DK, DV, DQacc, Lse, Delta, softmax_scale, qk_scale,
                      stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                      stride_dob, stride_doh, stride_don, stride_dkb, stride_dkh, stride_dkn,
                      stride_dvb, stride_dvh, stride_dvn, H, N,
                      HEAD_DIM, HEAD_DIM_PADDED, IEEE, BLOCK_M1, BLOCK_N1, WARP_SPECIALIZE, DQ_REDUCE)


@triton.jit
def _dkdv_tma_program(Q, K, V, DO, DK, DV, DQacc, Lse, Delta, softmax_scale, qk_scale,
                      stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                      stride_dob, stride_doh, stride_don, stride_dkb, stride_dkh, stride_dkn,
                      stride_dvb, stride_dvh, stride_dvn, H, N,
                      HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
                      BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                      DQ_REDUCE: tl.constexpr):
    """One program of the two dK/dV kernels above: its key tile's dK and dV, and with ``DQ_REDUCE`` the dQ adds."""
    softmax_scale, qk_scale = tl.cast(softmax_scale, tl.float32), tl.cast(qk_scale, tl.float32)
    start_n, off_bh = _tile_and_head(N, BLOCK_N1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    desc_q = _rows_desc(Q + off_b * stride_qb + off_h * stride_qh, N, stride_qn, BLOCK_M1, HEAD_DIM, HEAD_DIM_PADDED)
    desc_do = _rows_desc(DO + off_b * stride_dob + off_h * stride_doh, N, stride_don, BLOCK_M1, HEAD_DIM,
                         HEAD_DIM_PADDED)
    desc_k = _rows_desc(K + off_b * stride_kb + off_h * stride_kh, N, stride_kn, BLOCK_N1, HEAD_DIM, HEAD_DIM_PADDED)
    desc_v = _rows_desc(V + off_b * stride_vb + off_h * stride_vh, N, stride_vn, BLOCK_N1, HEAD_DIM, HEAD_DIM_PADDED)
    desc_dk = _rows_desc(DK + off_b * stride_dkb + off_h * stride_dkh, N, stride_dkn, BLOCK_N1, HEAD_DIM,
                         HEAD_DIM_PADDED)
    desc_dv = _rows_desc(DV + off_b * stride_dvb + off_h * stride_dvh, N, stride_dvn, BLOCK_N1, HEAD_DIM,
                         HEAD_DIM_PADDED)
    if DQ_REDUCE != 0:
        DQacc_base = DQacc + off_bh.to(tl.int64) * N * HEAD_DIM
        dq_sink = (_rows_desc(DQacc_base, N, HEAD_DIM, BLOCK_M1, HEAD_DIM, HEAD_DIM_PADDED), DQacc_base, HEAD_DIM,
                   HEAD_DIM, softmax_scale)
    else:
        dq_sink = None
    Lse_base = Lse + off_bh.to(tl.int64) * N
    Delta_base = Delta + off_bh.to(tl.int64) * N
    offs_m = tl.arange(0, BLOCK_M1)
    k = desc_k.load([start_n * BLOCK_N1, 0])  # (BLOCK_N1, D)
    v = desc_v.load([start_n * BLOCK_N1, 0])
    dk = tl.zeros([BLOCK_N1, HEAD_DIM_PADDED], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM_PADDED], dtype=tl.float32)
    m_full = (N // BLOCK_M1) * BLOCK_M1
    for start_m in tl.range(0, m_full, BLOCK_M1, warp_specialize=WARP_SPECIALIZE):
        dk, dv = _bwd_dkdv_step_tma(dk, dv, k, v, desc_q, desc_do, Lse_base, Delta_base, start_m, N, qk_scale,
                                    offs_m, IEEE, False, dq_sink, DQ_REDUCE)
    if m_full < N:
        dk, dv = _bwd_dkdv_step_tma(dk, dv, k, v, desc_q, desc_do, Lse_base, Delta_base, m_full, N, qk_scale,
                                    offs_m, IEEE, True, dq_sink, DQ_REDUCE)
    desc_dk.store([start_n * BLOCK_N1, 0], (dk * softmax_scale).to(DK.dtype.element_ty))
    desc_dv.store([start_n * BLOCK_N1, 0], dv.to(DV.dtype.element_ty))


@triton.jit
def _bwd_dq_step_tma(dq, q, do, lse, delta, desc_k, desc_v, start_n, N, qk_scale, offs_n,
                     IEEE: tl.constexpr, MASK_N: tl.constexpr):
    k = desc_k.load([start_n, 0])  # (BLOCK_N2, D)
    v = desc_v.load([start_n, 0])
    qk = _dot(q, tl.trans(k), tl.zeros([q.shape[0], k.shape[0]], dtype=tl.float32), IEEE)  # (BLOCK_M2, BLOCK_N2)
    p = tl.math.exp2(qk * qk_scale - lse[:, None])
    if MASK_N:
        p = tl.where((start_n + offs_n)[None, :] < N, p, 0.0)
    dp = _dot(do, tl.trans(v), tl.zeros([do.shape[0], v.shape[0]], dtype=tl.float32), IEEE)
    ds = p * (dp - delta[:, None])
    return _dot(ds.to(k.dtype), k, dq, IEEE)


@triton.jit
def flash_bwd_dq_tma_kernel(
    Q, K, V, DO, DQ, Lse, Delta, softmax_scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    H, N, N_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """Grid as ``flash_bwd_dq_kernel``; its arguments without Out, Res, out's strides and ADD_RES: Delta is read,
    written before by ``flash_bwd_preprocess_kernel``. The ``stride_*d`` must be 1."""
    softmax_scale, qk_scale = tl.cast(softmax_scale, tl.float32), tl.cast(qk_scale, tl.float32)
    start_m, off_bh = _tile_and_head(N, BLOCK_M2)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    desc_q = _rows_desc(Q + off_b * stride_qb + off_h * stride_qh, N, stride_qn, BLOCK_M2, HEAD_DIM, HEAD_DIM_PADDED)
    desc_do = _rows_desc(DO + off_b * stride_dob + off_h * stride_doh, N, stride_don, BLOCK_M2, HEAD_DIM,
                         HEAD_DIM_PADDED)
    desc_dq = _rows_desc(DQ + off_b * stride_dqb + off_h * stride_dqh, N, stride_dqn, BLOCK_M2, HEAD_DIM,
                         HEAD_DIM_PADDED)
    desc_k = _rows_desc(K + off_b * stride_kb + off_h * stride_kh, N, stride_kn, BLOCK_N2, HEAD_DIM, HEAD_DIM_PADDED)
    desc_v = _rows_desc(V + off_b * stride_vb + off_h * stride_vh, N, stride_vn, BLOCK_N2, HEAD_DIM, HEAD_DIM_PADDED)
    offs_m = start_m * BLOCK_M2 + tl.arange(0, BLOCK_M2)
    offs_n = tl.arange(0, BLOCK_N2)
    q = desc_q.load([start_m * BLOCK_M2, 0])
    do = desc_do.load([start_m * BLOCK_M2, 0])
    lse = tl.load(Lse + off_bh.to(tl.int64) * N + offs_m, mask=offs_m < N, other=0.0) * _LOG2E
    delta = tl.load(Delta + off_bh.to(tl.int64) * N + offs_m, mask=offs_m < N, other=0.0)
    dq = tl.zeros([BLOCK_M2, HEAD_DIM_PADDED], dtype=tl.float32)
    n_full = (N // BLOCK_N2) * BLOCK_N2
    for start_n in tl.range(0, n_full, BLOCK_N2, warp_specialize=WARP_SPECIALIZE):
        dq = _bwd_dq_step_tma(dq, q, do, lse, delta, desc_k, desc_v, start_n, N, qk_scale, offs_n, IEEE, False)
    if n_full < N:
        dq = _bwd_dq_step_tma(dq, q, do, lse, delta, desc_k, desc_v, n_full, N, qk_scale, offs_n, IEEE, True)
    desc_dq.store([start_m * BLOCK_M2, 0], (dq * softmax_scale).to(DQ.dtype.element_ty))
