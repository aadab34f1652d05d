"""The flash forward for Hopper in Gluon, with the softmax overlapped with the P·V product (experimental, not wired).

Shah et al., 2024, "FlashAttention-3", Section 3.2 (intra-warpgroup overlap of GEMMs and softmax), on top of
FlashAttention-2's Algorithm 1 (Dao, 2023). The Triton kernels (:mod:`kernels.flash.kernels`) cannot express that
overlap: Triton waits for every outstanding wgmma before the softmax's exponentials
(benchmarks/results/flash_notes.md). Gluon, Triton's lower-level language, issues ``wgmma`` asynchronously and waits
for a chosen number of them (``warpgroup_mma_wait(num_outstanding=1)``), so in iteration j

    S_j = Q K_jᵀ        issued
    O  += P_{j-1} V_{j-1} issued
    wait for S_j (O's product may still run)
    softmax of S_j: row max, P_j = exp2(S_j·scale − m), α, row sum   (on the exponential and FMA pipes)
    wait for O, then O ·= α_j

K and V tiles arrive by ``cp.async`` into a ring of STAGES shared-memory slots, loaded STAGES − 2 tiles ahead (tile
j − 1's V and tile j's K are in use);
a tile's slot is refilled once every warp has waited for the products that read it (a CTA barrier each step).
Masked loads zero rows past N and columns past head_dim; scores of keys past N are set to −inf.

Contract as :func:`kernels.flash.op._fwd`: q, k, v ``(B, H, N, d)`` float16/bfloat16, d ≤ 128, last stride 1 and the
others multiples of 8 elements, ``softmax_scale``; returns ``out`` (B, H, N, d) laid out as (B, N, H, d) and the natural-log ``lse``
(B, H, N) float32. Needs a Hopper GPU (sm_90). On the H200 it matches float64
(tests/test_flash_gluon.py) and took 1.17-1.41× the Triton forward's time at N = 197-16384, d = 64
(benchmarks/results/h200_20261202_e.md), so it is not wired.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .configs import _next_power_of_2, head_dim_padded
from .kernels import LOG2E

_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # Triton 3.6 names it thread_barrier, 3.8 barrier
# The kernels' decorator: N unspecialised, since Triton would make N = 1 a constant, which fails an LLVM assertion in
# Triton 3.6 (the N = 1 GPU tests).
_kernel = gluon.jit(do_not_specialize=["N"])


@gluon.constexpr_function
def _load_layout(D, num_warps):
    """Rows of D 16-bit elements, 8 (16 bytes, one cp.async) a thread."""
    across = min(D // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // across, across], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _mma_layout(N, num_warps):
    """wgmma accumulator of (rows, N): warps stacked along the rows, 16 rows a warp, instruction (16, N, 16)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, N, 16])


@gluon.jit
def _rows_of_8(stride):
    """``stride`` (a multiple of 8) in a form the compiler knows to be one."""
    return (stride // 8) * 8


@gluon.jit
def _program_tile(N, H, BLOCK: gl.constexpr):
    """(first row of this program's tile, batch·head, batch, head) on the grid (cdiv(N, BLOCK)·B·H,), tiles fastest
    (as kernels._tile_and_head)."""
    n_tiles = gl.cdiv(N, BLOCK)
    pid = gl.program_id(0)
    off_bh = pid // n_tiles
    return (pid % n_tiles) * BLOCK, off_bh, (off_bh // H).to(gl.int64), (off_bh % H).to(gl.int64)


@gluon.jit
def _head(ptr, off_b, off_h, stride_b, stride_h, stride_n):
    """(base, row stride) of one head's (N, d) rows of an input that check_inputs passed. Its strides are multiples of
    8; written as (s // 8)·8 the compiler knows it too (a hint on an argument is lost, and the JIT marks only multiples
    of 16), so each thread's 8 elements are one 16-byte cp.async."""
    return ptr + off_b * _rows_of_8(stride_b) + off_h * _rows_of_8(stride_h), _rows_of_8(stride_n)


@gluon.jit
def _issue_tile(smem, base, row0, N, stride_n, HEAD_DIM, ROWS: gl.constexpr, D: gl.constexpr,
                layout: gl.constexpr):
    """cp.async of rows row0 … row0 + ROWS − 1 of one head's (N, d) tensor into ``smem``, zero past N and head_dim."""
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    ptrs = base + rows[:, None].to(gl.int64) * stride_n + cols[None, :]
    cp.async_copy_global_to_shared(smem, ptrs, mask=(rows[:, None] < N) & (cols[None, :] < HEAD_DIM))


@gluon.jit
def _issue_pair(a_smem, b_smem, a_base, b_base, t, n_tiles, N, stride_an, stride_bn, HEAD_DIM, BLOCK: gl.constexpr,
                D: gl.constexpr, STAGES: gl.constexpr, layout: gl.constexpr):
    """Tile t (if it exists) of two tensors (K and V, or Q and dO) into slot t mod STAGES of their rings, as one copy
    group."""
    if t < n_tiles:
        _issue_tile(a_smem.index(t % STAGES), a_base, t * BLOCK, N, stride_an, HEAD_DIM, BLOCK, D, layout)
        _issue_tile(b_smem.index(t % STAGES), b_base, t * BLOCK, N, stride_bn, HEAD_DIM, BLOCK, D, layout)
    cp.commit_group()


@gluon.jit
def _wait_tile(STAGES: gl.constexpr):
    """Wait for the oldest copy group but STAGES − 3, make it visible to wgmma (async proxy) and to every warp."""
    cp.wait_group(STAGES - 3)
    fence_async_shared()
    _cta_barrier()


@gluon.jit
def _softmax_step(s, m_i, l_i, start_n, N, qk_scale, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Online softmax of one score tile (base 2): returns P, α = exp2(m_old − m_new), the new m and l."""
    cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s = gl.where(cols[None, :] < N, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _first_tile(q_smem, kT_smem, N, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
                s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    """Tile 0: its scores and softmax, no product with V yet. Returns the zero score tile the later products start
    from, P (as the P·V operand), m, l and the zero output accumulator."""
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], dtype=gl.float32, layout=s_layout)
    s = warpgroup_mma(q_smem, kT_smem, s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    p, _, m_i, l_i = _softmax_step(s, m_i, l_i, 0, N, qk_scale, BLOCK_N, s_layout)
    p = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    return s_zero, p, m_i, l_i, gl.zeros([BLOCK_M, D], dtype=gl.float32, layout=o_layout)


@gluon.jit
def _wait_pv(acc_tok, p, qk_scale):
    """Wait for P·V, keeping p (the product reads its registers) alive until then: ``(acc, p)``. In one basic block
    ptxas hoists this wait above the exponentials (SASS: DEPBAR gsb0,0 before MUFU.EX2, Triton 3.6 and 3.8); a branch
    it cannot see through keeps it after them. qk_scale > 0 always (the launchers check softmax_scale)."""
    if qk_scale > 0.0:
        acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p))
    else:
        p, acc = warpgroup_mma_wait(num_outstanding=0, deps=(p, acc_tok))
    return acc, p


@gluon.jit
def _store_out_lse(acc, m_i, l_i, Out, Lse, off_bh, off_b, off_h, row0, N, stride_ob, stride_oh, stride_on,
                   HEAD_DIM: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, s_layout: gl.constexpr,
                   o_layout: gl.constexpr):
    """out = acc / l (rows past N and columns past head_dim not stored) and the natural-log lse of the tile's rows."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = (acc / l_o[:, None]).to(Out.dtype.element_ty)
    rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = Out + off_b * stride_ob + off_h * stride_oh + rows[:, None].to(gl.int64) * stride_on + cols[None, :]
    gl.store(o_ptrs, out, mask=(rows[:, None] < N) & (cols[None, :] < HEAD_DIM))
    lse_rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # natural log
    gl.store(Lse + off_bh.to(gl.int64) * N + lse_rows, lse, mask=lse_rows < N)


@_kernel
def flash_fwd_gluon_kernel(
    Q, K, V, Out, Lse, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    H, N,
    HEAD_DIM: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M)·B·H,), tiles fastest. D: head_dim padded to a power of two (≥ 16); the last strides are
    1. qk_scale = softmax_scale · log2(e)."""
    dtype: gl.constexpr = Q.dtype.element_ty
    ld_layout: gl.constexpr = _load_layout(D, num_warps)
    s_layout: gl.constexpr = _mma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = _mma_layout(D, num_warps)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype)
    kv_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)

    row0, off_bh, off_b, off_h = _program_tile(N, H, BLOCK_M)
    q_base, stride_qn = _head(Q, off_b, off_h, stride_qb, stride_qh, stride_qn)
    k_base, stride_kn = _head(K, off_b, off_h, stride_kb, stride_kh, stride_kn)
    v_base, stride_vn = _head(V, off_b, off_h, stride_vb, stride_vh, stride_vn)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_smem_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_smem_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_smem_layout)
    n_tiles = gl.cdiv(N, BLOCK_N)

    # Prologue: Q with tile 0 in the first copy group, then tiles 1 … STAGES − 3, one group each.
    _issue_tile(q_smem, q_base, row0, N, stride_qn, HEAD_DIM, BLOCK_M, D, ld_layout)
    for t in gl.static_range(STAGES - 2):
        _issue_pair(k_smem, v_smem, k_base, v_base, t, n_tiles, N, stride_kn, stride_vn, HEAD_DIM, BLOCK_N, D, STAGES,
                  ld_layout)

    # Tile 0: its scores and softmax, no product with V yet.
    _wait_tile(STAGES)
    _issue_pair(k_smem, v_smem, k_base, v_base, STAGES - 2, n_tiles, N, stride_kn, stride_vn, HEAD_DIM, BLOCK_N, D,
              STAGES, ld_layout)
    s_zero, p, m_i, l_i, acc = _first_tile(q_smem, k_smem.index(0).permute((1, 0)), N, qk_scale, BLOCK_M, BLOCK_N, D,
                                           s_layout, o_layout, p_layout)

    for j in range(1, n_tiles):
        # After the barrier every warp has waited for P_{j-2} V_{j-2}: tile j − 2's slot takes tile j + STAGES − 2.
        _wait_tile(STAGES)
        _issue_pair(k_smem, v_smem, k_base, v_base, j + STAGES - 2, n_tiles, N, stride_kn, stride_vn, HEAD_DIM, BLOCK_N,
                  D, STAGES, ld_layout)
        s_tok = warpgroup_mma(q_smem, k_smem.index(j % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc_tok = warpgroup_mma(p, v_smem.index((j - 1) % STAGES), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        p_new, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, N, qk_scale, BLOCK_N, s_layout)
        acc, p = _wait_pv(acc_tok, p, qk_scale)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p = gl.convert_layout(p_new.to(dtype), p_layout)

    acc = warpgroup_mma(p, v_smem.index((n_tiles - 1) % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    cp.wait_group(0)
    _store_out_lse(acc, m_i, l_i, Out, Lse, off_bh, off_b, off_h, row0, N, stride_ob, stride_oh, stride_on, HEAD_DIM, D,
                   BLOCK_M, s_layout, o_layout)


SHARED_MEMORY = 232448  # bytes of shared memory one CTA may use on an H100/H200 (227 KiB)


def check_tensors(named, softmax_scale) -> None:
    """``named`` (name, tensor) pairs of one (B, H, N, d) shape and 16-bit dtype on a Hopper GPU, d ≤ 128, rows on
    16-byte boundaries; a positive ``softmax_scale``.

    Raises:
        RuntimeError: the tensors are not on a Hopper (compute capability 9.0) GPU.
        ValueError: anything else the kernels do not take, named in the message.
    """
    (_, first), shape = named[0], named[0][1].shape
    if not first.is_cuda or torch.cuda.get_device_capability(first.device) != (9, 0):
        raise RuntimeError(f"gluon flash kernels: the tensors must be on a Hopper GPU (compute capability 9.0), got "
                           f"{first.device}; use kernels.flash.attention elsewhere")
    for name, t in named:
        if t.dtype not in (torch.float16, torch.bfloat16) or t.dtype != first.dtype:
            raise ValueError(f"gluon flash kernels: {name} must be float16 or bfloat16 like the first, got {t.dtype}")
        if t.shape != shape or shape[-1] > 128:
            raise ValueError(f"gluon flash kernels: the inputs must have one (B, H, N, d) shape with d ≤ 128, got "
                             f"{name} {tuple(t.shape)} against {tuple(shape)}")
        if t.stride(-1) != 1 or any(st % 8 for st in t.stride()[:-1]) or t.data_ptr() % 16:
            raise ValueError(f"gluon flash kernels: {name} needs a last stride of 1, the other strides multiples of 8 "
                             f"elements and a 16-byte aligned start (strides {t.stride()}); .contiguous() on a "
                             "head_dim that is a multiple of 8 gives that")
    if not softmax_scale > 0:
        raise ValueError(f"gluon flash kernels: softmax_scale must be positive, got {softmax_scale}")


def check_inputs(named, softmax_scale, num_warps, block_rows, block_cols, stages, shared_tiles, min_stages=3) -> None:
    """:func:`check_tensors`, and the tiles: block_rows (the products' M) a power of two ≤ 256 and a multiple of
    16·num_warps, block_cols a power of two in [16, 128], at least ``min_stages`` stages, ``shared_tiles`` rows of
    padded head_dim in shared memory within :data:`SHARED_MEMORY`. Raises as :func:`check_tensors`."""
    check_tensors(named, softmax_scale)
    if (num_warps % 4 or block_rows % (16 * num_warps) or block_rows != _next_power_of_2(block_rows)
            or block_rows > 256 or block_cols != _next_power_of_2(block_cols) or not 16 <= block_cols <= 128
            or stages < min_stages):
        raise ValueError(f"gluon flash kernels: num_warps={num_warps} must be a multiple of 4, the row tile "
                         f"{block_rows} a power of two ≤ 256 and a multiple of 16·num_warps, the column tile "
                         f"{block_cols} a power of two in [16, 128], and stages={stages} at least {min_stages}")
    shared = shared_tiles * head_dim_padded(named[0][1].shape[-1]) * 2
    if shared > SHARED_MEMORY:
        raise ValueError(f"gluon flash kernels: these tiles and stages take {shared} bytes of shared memory, more than "
                         f"a Hopper CTA's {SHARED_MEMORY}: use smaller tiles or fewer stages")


def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, block_m: int = 128,
        block_n: int = 64, stages: int = 3, num_warps: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward attention by :func:`flash_fwd_gluon_kernel`: ``(out, lse)`` as :func:`kernels.flash.op._fwd`.

    Args:
        q, k, v: ``(B, H, N, d)`` float16/bfloat16 tensors of one dtype and shape on a Hopper GPU, d ≤ 128, last stride
            1, the other strides multiples of 8 elements, 16-byte aligned.
        softmax_scale: the scale of the scores, a positive float.
        block_m, block_n: query rows and keys a tile (block_m a multiple of 16·num_warps, block_n of 16);
        stages: K/V shared-memory slots (≥ 3); num_warps: a multiple of 4 (whole warpgroups).

    Raises:
        ValueError: a shape, dtype, stride or tile argument the kernel does not take.
        RuntimeError: the tensors are not on a Hopper (compute capability 9.0) GPU.
    """
    check_inputs((("q", q), ("k", k), ("v", v)), softmax_scale, num_warps, block_m, block_n, stages,
                 block_m + 2 * stages * block_n)
    B, H, N, d = q.shape
    D = head_dim_padded(d)
    out = torch.empty((B, N, H, d), dtype=q.dtype, device=q.device).transpose(1, 2)  # (B, H, N, d)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(N, block_m) * B * H,)
    flash_fwd_gluon_kernel[grid](
        q, k, v, out, lse, softmax_scale * LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), out.stride(0), out.stride(1), out.stride(2), H, N,
        HEAD_DIM=d, D=D, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, num_warps=num_warps)
    return out, lse
