"""The flash backward for Hopper in Gluon, dK/dV and dQ kernels with the elementwise work under the products
(experimental, not wired: on the H200 1.12-1.56× the Triton kernels' time at d = 64, benchmarks/results/h200_20261202_e.md).

Dao, 2023, "FlashAttention-2", Algorithm 2 (the dK, dV half: a program owns a key tile and loops over the query
tiles), with FlashAttention-3's overlap (Shah et al., 2024, Section 3.2) applied to the backward: per query tile i

    Sᵀ = K Qᵢᵀ and dPᵀ = V dOᵢᵀ    issued together
    wait for Sᵀ; Pᵀ = exp2(Sᵀ·scale − lse)     while dPᵀ runs
    dV += Pᵀ dOᵢ                 issued
    wait for dPᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − delta)      while dV's product runs
    dK += dSᵀ Qᵢ                 issued; both waited before the tile's slot is reused

Triton's compiler cannot express those waits (benchmarks/results/flash_notes.md). Q and dO tiles arrive by cp.async
into a ring of STAGES slots, as in :mod:`kernels.flash.gluon_fwd`, whose conventions (16-byte rows, masks, the branch
that keeps ptxas from hoisting a wait) this follows. ``delta`` = rowsum(dO ∘ O) comes ready-made
(:func:`kernels.flash.op.launch_preprocess`). The dQ kernel owns a query tile and loops over the key tiles the same
way: S = Q Kⱼᵀ and dP = dO Vⱼᵀ issued together, P's exponentials while dP runs, dQ += dS Kⱼ issued last. Seven
products in all, as in the Triton backward (kernels/flash/kernels.py), with no atomics: deterministic.

Contract: q, k, v, do ``(B, H, N, d)`` float16/bfloat16, d ≤ 128, last stride 1 and the others multiples of 8
elements; lse (natural log) and delta ``(B, H, N)`` float32 contiguous; writes dk, dv ``(B, H, N, d)`` (last stride 1).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from .configs import head_dim_padded
from .gluon_fwd import (
    _head,
    _issue_pair,
    _issue_tile,
    _kernel,
    _load_layout,
    _mma_layout,
    _program_tile,
    _wait_tile,
    check_inputs,
    check_tensors,
)
from .kernels import LOG2E


@gluon.jit
def _row_stats(Lse, Delta, off_bh, row0, N, BLOCK_M: gl.constexpr, layout: gl.constexpr):
    """lse·log2(e) and delta of one head's query rows row0 …, in ``layout`` (a slice of a tile's layout); padded rows
    get lse = +inf (so P = 0 there) and delta = 0."""
    rows = row0 + gl.arange(0, BLOCK_M, layout=layout)
    offs = off_bh.to(gl.int64) * N + rows
    lse = gl.load(Lse + offs, mask=rows < N, other=float("inf")) * 1.4426950408889634
    return lse, gl.load(Delta + offs, mask=rows < N, other=0.0)


@_kernel
def flash_bwd_dkdv_gluon_kernel(
    Q, K, V, DO, DK, DV, Lse, Delta, softmax_scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_don, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
    H, N,
    HEAD_DIM: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Grid (cdiv(N, BLOCK_N)·B·H,), key tiles fastest. BLOCK_N keys a program, BLOCK_M queries a step; D: head_dim
    padded to a power of two (≥ 16). qk_scale = softmax_scale · log2(e)."""
    dtype: gl.constexpr = Q.dtype.element_ty
    ld_layout: gl.constexpr = _load_layout(D, num_warps)
    s_layout: gl.constexpr = _mma_layout(BLOCK_M, num_warps)  # (keys, queries): Sᵀ, dPᵀ
    kv_layout: gl.constexpr = _mma_layout(D, num_warps)  # (keys, d): dK, dV
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)  # Pᵀ, dSᵀ
    row_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype)
    key_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
    col0, off_bh, off_b, off_h = _program_tile(N, H, BLOCK_N)
    q_base, stride_qn = _head(Q, off_b, off_h, stride_qb, stride_qh, stride_qn)
    k_base, stride_kn = _head(K, off_b, off_h, stride_kb, stride_kh, stride_kn)
    v_base, stride_vn = _head(V, off_b, off_h, stride_vb, stride_vh, stride_vn)
    do_base, stride_don = _head(DO, off_b, off_h, stride_dob, stride_doh, stride_don)

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], key_smem)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], key_smem)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], row_smem)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], row_smem)
    n_tiles = gl.cdiv(N, BLOCK_M)

    # K and V with query tile 0 in the first copy group, then tiles 1 … STAGES − 3.
    _issue_tile(k_smem, k_base, col0, N, stride_kn, HEAD_DIM, BLOCK_N, D, ld_layout)
    _issue_tile(v_smem, v_base, col0, N, stride_vn, HEAD_DIM, BLOCK_N, D, ld_layout)
    for t in gl.static_range(STAGES - 2):
        _issue_pair(q_smem, do_smem, q_base, do_base, t, n_tiles, N, stride_qn, stride_don, HEAD_DIM, BLOCK_M, D,
                    STAGES, ld_layout)

    zero = gl.zeros([BLOCK_N, BLOCK_M], dtype=gl.float32, layout=s_layout)
    dk = gl.zeros([BLOCK_N, D], dtype=gl.float32, layout=kv_layout)
    dv = gl.zeros([BLOCK_N, D], dtype=gl.float32, layout=kv_layout)
    for i in range(n_tiles):
        # After the barrier every warp has waited for tile i − 1's products: tile i − 2's slot is free.
        _wait_tile(STAGES)
        _issue_pair(q_smem, do_smem, q_base, do_base, i + STAGES - 2, n_tiles, N, stride_qn, stride_don, HEAD_DIM,
                    BLOCK_M, D, STAGES, ld_layout)
        q_i = q_smem.index(i % STAGES)
        do_i = do_smem.index(i % STAGES)
        lse, delta = _row_stats(Lse, Delta, off_bh, i * BLOCK_M, N, BLOCK_M, gl.SliceLayout(0, s_layout))
        s_tok = warpgroup_mma(k_smem, q_i.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(v_smem, do_i.permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        p = gl.exp2(s * qk_scale - lse[None, :])  # (keys, queries)
        p_op = gl.convert_layout(p.to(dtype), a_layout)
        dv_tok = warpgroup_mma(p_op, do_i, dv, is_async=True)
        # The branch keeps ptxas from hoisting this wait above the exponentials (see gluon_fwd); qk_scale > 0.
        if qk_scale > 0.0:
            dp, p_op = warpgroup_mma_wait(num_outstanding=1, deps=(dp_tok, p_op))
        else:
            p_op, dp = warpgroup_mma_wait(num_outstanding=1, deps=(p_op, dp_tok))
        ds_op = gl.convert_layout((p * (dp - delta[None, :])).to(dtype), a_layout)
        dk_tok = warpgroup_mma(ds_op, q_i, dk, is_async=True)
        if qk_scale > 0.0:
            dv, dk, p_op, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok, p_op, ds_op))
        else:
            p_op, ds_op, dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(p_op, ds_op, dv_tok, dk_tok))
    cp.wait_group(0)

    rows = col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, kv_layout))
    mask = (rows[:, None] < N) & (cols[None, :] < HEAD_DIM)
    rows = rows[:, None].to(gl.int64)
    gl.store(DK + off_b * stride_dkb + off_h * stride_dkh + rows * stride_dkn + cols[None, :],
             (dk * softmax_scale).to(dtype), mask=mask)
    gl.store(DV + off_b * stride_dvb + off_h * stride_dvh + rows * stride_dvn + cols[None, :], dv.to(dtype), mask=mask)


def _check_stats_and_outputs(q, lse, delta, outputs) -> None:
    """lse and delta contiguous float32 (B, H, N) on q's device; each (name, tensor) of ``outputs`` q's shape, dtype and
    device with a last stride of 1. Raises ValueError naming the first that is not."""
    B, H, N, _ = q.shape
    for name, t in (("lse", lse), ("delta", delta)):
        if t.shape != (B, H, N) or t.dtype != torch.float32 or not t.is_contiguous() or t.device != q.device:
            raise ValueError(f"gluon backward: {name} must be a contiguous float32 {(B, H, N)} tensor on {q.device}, "
                             f"got {tuple(t.shape)} {t.dtype} on {t.device}")
    for name, t in outputs:
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device or t.stride(-1) != 1 \
                or any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
            raise ValueError(f"gluon backward: {name} must be a {tuple(q.shape)} {q.dtype} tensor on {q.device} with "
                             f"a last stride of 1 and no zero strides, got {tuple(t.shape)} {t.dtype} on {t.device}, "
                             f"strides {t.stride()}")


def dkdv(q, k, v, do, lse, delta, softmax_scale: float, dk=None, dv=None, block_m: int | None = None,
         block_n: int = 128, stages: int = 3, num_warps: int = 8):
    """dK, dV of attention by :func:`flash_bwd_dkdv_gluon_kernel`, into ``dk``, ``dv`` (new ones if None).

    Args:
        q, k, v, do: ``(B, H, N, d)`` float16/bfloat16 of one dtype and shape on a Hopper GPU, d ≤ 128, last stride 1,
            the other strides multiples of 8 elements, 16-byte aligned.
        lse, delta: ``(B, H, N)`` float32 contiguous: the forward's natural-log lse and rowsum(dO ∘ O).
        softmax_scale: the scores' scale, a positive float.
        block_m: query rows a step, a multiple of 16; default 64 for d ≤ 64, else 32 (fits without spills: Triton 3.6's
            sm_90 compile, ``python -m benchmarks.flash_gluon_aot``); block_n: keys a program, a multiple of
            16·num_warps.

    Returns:
        ``(dk, dv)``, ``(B, H, N, d)`` in q's dtype.

    Raises:
        RuntimeError: the tensors are not on a Hopper GPU. ValueError: a shape, dtype, stride or tile it does not take.
    """
    block_m = block_m or (64 if q.shape[-1] <= 64 else 32)
    check_inputs((("q", q), ("k", k), ("v", v), ("do", do)), softmax_scale, num_warps, block_n, block_m, stages,
                 2 * block_n + 2 * stages * block_m)
    B, H, N, d = q.shape
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    _check_stats_and_outputs(q, lse, delta, (("dk", dk), ("dv", dv)))
    grid = (triton.cdiv(N, block_n) * B * H,)
    flash_bwd_dkdv_gluon_kernel[grid](
        q, k, v, do, dk, dv, lse, delta, softmax_scale, softmax_scale * LOG2E,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], H, N,
        HEAD_DIM=d, D=head_dim_padded(d), BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
        num_warps=num_warps)
    return dk, dv


@_kernel
def flash_bwd_dq_gluon_kernel(
    Q, K, V, DO, DQ, Lse, Delta, softmax_scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_don, stride_dqb, stride_dqh, stride_dqn,
    H, N,
    HEAD_DIM: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M)·B·H,), query tiles fastest. BLOCK_M queries a program, BLOCK_N keys a step."""
    dtype: gl.constexpr = Q.dtype.element_ty
    ld_layout: gl.constexpr = _load_layout(D, num_warps)
    s_layout: gl.constexpr = _mma_layout(BLOCK_N, num_warps)  # (queries, keys): S, dP
    dq_layout: gl.constexpr = _mma_layout(D, num_warps)  # (queries, d)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)  # dS
    row_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype)
    key_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
    row0, off_bh, off_b, off_h = _program_tile(N, H, BLOCK_M)
    q_base, stride_qn = _head(Q, off_b, off_h, stride_qb, stride_qh, stride_qn)
    k_base, stride_kn = _head(K, off_b, off_h, stride_kb, stride_kh, stride_kn)
    v_base, stride_vn = _head(V, off_b, off_h, stride_vb, stride_vh, stride_vn)
    do_base, stride_don = _head(DO, off_b, off_h, stride_dob, stride_doh, stride_don)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], row_smem)
    do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], row_smem)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], key_smem)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], key_smem)
    n_tiles = gl.cdiv(N, BLOCK_N)

    # Q and dO with key tile 0 in the first copy group, then key tiles 1 … STAGES − 3.
    _issue_tile(q_smem, q_base, row0, N, stride_qn, HEAD_DIM, BLOCK_M, D, ld_layout)
    _issue_tile(do_smem, do_base, row0, N, stride_don, HEAD_DIM, BLOCK_M, D, ld_layout)
    for t in gl.static_range(STAGES - 2):
        _issue_pair(k_smem, v_smem, k_base, v_base, t, n_tiles, N, stride_kn, stride_vn, HEAD_DIM, BLOCK_N, D, STAGES,
                    ld_layout)
    lse, delta = _row_stats(Lse, Delta, off_bh, row0, N, BLOCK_M, gl.SliceLayout(1, s_layout))

    zero = gl.zeros([BLOCK_M, BLOCK_N], dtype=gl.float32, layout=s_layout)
    dq = gl.zeros([BLOCK_M, D], dtype=gl.float32, layout=dq_layout)
    for j in range(n_tiles):
        # After the barrier every warp has waited for tile j − 1's products: tile j − 2's slot is free.
        _wait_tile(STAGES)
        _issue_pair(k_smem, v_smem, k_base, v_base, j + STAGES - 2, n_tiles, N, stride_kn, stride_vn, HEAD_DIM,
                    BLOCK_N, D, STAGES, ld_layout)
        k_j = k_smem.index(j % STAGES)
        s_tok = warpgroup_mma(q_smem, k_j.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do_smem, v_smem.index(j % STAGES).permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        p = gl.where(cols[None, :] < N, gl.exp2(s * qk_scale - lse[:, None]), 0.0)  # keys past N: P = 0
        # The branch keeps ptxas from hoisting this wait above the exponentials (see gluon_fwd); qk_scale > 0.
        if qk_scale > 0.0:
            dp, p = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok, p))
        else:
            p, dp = warpgroup_mma_wait(num_outstanding=0, deps=(p, dp_tok))
        ds_op = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
        dq_tok = warpgroup_mma(ds_op, k_j, dq, is_async=True)
        dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ds_op))
    cp.wait_group(0)

    rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, dq_layout))
    gl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + rows[:, None].to(gl.int64) * stride_dqn + cols[None, :],
             (dq * softmax_scale).to(dtype), mask=(rows[:, None] < N) & (cols[None, :] < HEAD_DIM))


def dq_grad(q, k, v, do, lse, delta, softmax_scale: float, dq=None, block_m: int = 128, block_n: int = 64,
            stages: int = 3, num_warps: int = 8):
    """dQ of attention by :func:`flash_bwd_dq_gluon_kernel`, into ``dq`` (a new one if None); arguments and errors as
    :func:`dkdv`, with block_m the queries a program (a multiple of 16·num_warps) and block_n the keys a step."""
    check_inputs((("q", q), ("k", k), ("v", v), ("do", do)), softmax_scale, num_warps, block_m, block_n, stages,
                 2 * block_m + 2 * stages * block_n)
    B, H, N, d = q.shape
    dq = torch.empty_like(q) if dq is None else dq
    _check_stats_and_outputs(q, lse, delta, (("dq", dq),))
    grid = (triton.cdiv(N, block_m) * B * H,)
    flash_bwd_dq_gluon_kernel[grid](
        q, k, v, do, dq, lse, delta, softmax_scale, softmax_scale * LOG2E,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dq.stride()[:3], H, N,
        HEAD_DIM=d, D=head_dim_padded(d), BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
        num_warps=num_warps)
    return dq


def bwd(do, q, k, v, out, lse, softmax_scale: float):
    """dq, dk, dv of attention from the forward's ``out`` and ``lse``: delta by the Triton preprocess kernel, then the
    two Gluon kernels at their default tiles. Arguments as :func:`dkdv`; ``out`` (B, H, N, d) like q."""
    from . import op

    check_tensors((("q", q), ("k", k), ("v", v), ("do", do)), softmax_scale)  # the tiles: dkdv's and dq_grad's
    _check_stats_and_outputs(q, lse, lse, (("out", out),))  # before the preprocess kernel reads out, writes delta
    delta = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    op.launch_preprocess(out, do, delta, direct=True)
    dk, dv = dkdv(q, k, v, do, lse, delta, softmax_scale)
    return dq_grad(q, k, v, do, lse, delta, softmax_scale), dk, dv
