"""The flash forward for Hopper in Gluon with TMA loads by a producer warp (experimental, not wired).

Shah et al., 2024, "FlashAttention-3", Sections 3.1 (producer-consumer warp specialisation with TMA) and 3.2
(intra-warpgroup overlap of the softmax with the next product), on FlashAttention-2's Algorithm 1 (Dao, 2023).
:mod:`kernels.flash.gluon_fwd` has the overlap but loads with ``cp.async`` from the compute warps behind a CTA
barrier each step; here one producer warp issues TMA bulk copies of K and V tiles into a ring of STAGES slots and
the compute warps never wait on each other for loads:

    producer (1 warp)                          consumers (num_warps warps, BLOCK_M query rows)
    Q → q_smem, arrive q_bar (tx bytes)        wait q_bar
    for tile j:                                for tile j:
      wait empty[j mod S] (after the first S)    wait k_ready[j mod S];  S_j = Q K_jᵀ           issued
      K_j → k_ready[j mod S] (tx bytes)          wait v_ready[(j−1) mod S]; O += P_{j−1} V_{j−1}  issued
      V_j → v_ready[j mod S] (tx bytes)          wait for S_j; softmax of S_j (O's product may still run)
                                                 wait for O; every consumer warp done: arrive empty[(j−1) mod S]

The descriptors are 4-D, (B, H, N, d) with the tensors' own strides and a (1, 1, rows, D) box, so strided views
(a packed qkv) load without a copy; TMA fills rows past N and columns past head_dim with zeros, and scores of keys
past N are set to −inf. Contract as :func:`kernels.flash.gluon_fwd.fwd`. On the H200 it matches float64
(tests/test_flash_gluon_ws.py). Its best tiles are 4-warp CTAs with register caps, two or three to an SM; they took
1.06-1.30× the Triton forward's time at d = 64 and the same time at (8, 16, 4096, 128)
(benchmarks/results/h200_20261202_f.md), so it is not wired.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .configs import head_dim_padded
from .gluon_fwd import (
    _cta_barrier,
    _first_tile,
    _kernel,
    _mma_layout,
    _program_tile,
    _softmax_step,
    _store_out_lse,
    _wait_pv,
    check_inputs,
)
from .kernels import LOG2E

PRODUCER_REGISTERS = gl.constexpr(24)  # the load warp holds a few indices and barrier phases


@gluon.jit
def _tile(ring, slot, ROWS: gl.constexpr, D: gl.constexpr):
    """Slot ``slot`` of a ring of (1, 1, ROWS, D) TMA boxes, as the (ROWS, D) matrix wgmma reads."""
    return ring.index(slot).reshape([ROWS, D])


@gluon.jit
def _producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, off_b, off_h, row0,
              n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """The load warp: Q once, then K_j and V_j into slot j mod STAGES once the consumers have released it."""
    mbarrier.expect(q_bar, desc_q.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_q, [off_b, off_h, row0, 0], q_bar, q_smem)
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1, pred=j >= STAGES)
        mbarrier.expect(k_ready.index(slot), desc_k.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [off_b, off_h, j * BLOCK_N, 0], k_ready.index(slot),
                                        k_smem.index(slot))
        mbarrier.expect(v_ready.index(slot), desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_v, [off_b, off_h, j * BLOCK_N, 0], v_ready.index(slot),
                                        v_smem.index(slot))


@gluon.jit
def _release(empty, slot):
    """Every consumer warp has waited for the products that read ``slot``: hand it back to the producer (the arrive
    is one thread's)."""
    _cta_barrier()
    mbarrier.arrive(empty.index(slot), count=1)


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, Out, Lse, off_bh, off_b, off_h, row0, N,
              n_tiles, qk_scale, stride_ob, stride_oh, stride_on, HEAD_DIM: gl.constexpr, D: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """The compute warps: the online softmax over the key tiles the producer brings, then out and lse."""
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _mma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = _mma_layout(D, num_warps)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q = q_smem.reshape([BLOCK_M, D])

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s_zero, p, m_i, l_i, acc = _first_tile(q, _tile(k_smem, 0, BLOCK_N, D).permute((1, 0)), N, qk_scale, BLOCK_M,
                                           BLOCK_N, D, s_layout, o_layout, p_layout)

    for j in range(1, n_tiles):
        slot, prev = j % STAGES, (j - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q, _tile(k_smem, slot, BLOCK_N, D).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(p, _tile(v_smem, prev, BLOCK_N, D), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        p_new, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, N, qk_scale, BLOCK_N, s_layout)
        acc, p = _wait_pv(acc_tok, p, qk_scale)
        _release(empty, prev)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p = gl.convert_layout(p_new.to(dtype), p_layout)

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p, _tile(v_smem, last, BLOCK_N, D), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _store_out_lse(acc, m_i, l_i, Out, Lse, off_bh, off_b, off_h, row0, N, stride_ob, stride_oh, stride_on, HEAD_DIM, D,
                   BLOCK_M, s_layout, o_layout)


@_kernel
def flash_fwd_ws_kernel(
    desc_q, desc_k, desc_v, Out, Lse, qk_scale, stride_ob, stride_oh, stride_on, H, N,
    HEAD_DIM: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M)·B·H,), tiles fastest. desc_q: (1, 1, BLOCK_M, D) boxes of q; desc_k, desc_v:
    (1, 1, BLOCK_N, D) boxes. qk_scale = softmax_scale · log2(e)."""
    dtype: gl.constexpr = desc_q.dtype
    row0, off_bh, off_b, off_h = _program_tile(N, H, BLOCK_M)
    n_tiles = gl.cdiv(N, BLOCK_N)
    q_smem = gl.allocate_shared_memory(dtype, desc_q.block_type.shape, desc_q.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)

    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, Out, Lse, off_bh, off_b, off_h, row0, N,
                     n_tiles, qk_scale, stride_ob, stride_oh, stride_on, HEAD_DIM, D, BLOCK_M, BLOCK_N, STAGES,
                     num_warps)),
        (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty,
                     off_b.to(gl.int32), off_h.to(gl.int32), row0, n_tiles, BLOCK_N, STAGES)),
    ], [1], [PRODUCER_REGISTERS])


def descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A TMA descriptor over ``t`` (B, H, N, d), its own strides, with (1, 1, rows, padded d) boxes."""
    D = head_dim_padded(t.shape[-1])
    block = [1, 1, rows, D]
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float16 if t.dtype == torch.float16 else gl.bfloat16)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, block_m: int = 128,
        block_n: int = 128, stages: int = 2, num_warps: int = 8, maxnreg: int | None = None
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward attention by :func:`flash_fwd_ws_kernel`: ``(out, lse)`` as :func:`kernels.flash.op._fwd`.

    Args:
        q, k, v: ``(B, H, N, d)`` float16/bfloat16 tensors of one dtype and shape on a Hopper GPU, d ≤ 128, last stride
            1, the other strides multiples of 8 elements, 16-byte aligned.
        softmax_scale: the scale of the scores, a positive float.
        block_m, block_n: query rows and keys a tile (block_m a multiple of 16·num_warps, block_n of 16);
        stages: K/V shared-memory slots (≥ 2); num_warps: the compute warps, a multiple of 4 (whole warpgroups),
            besides the one load warp;
        maxnreg: registers a thread at launch (None: as many as one CTA an SM leaves). Triton pads the load warp to a
            warpgroup and gives the compute warps what the load warp's 24 leave of that pool, so 128 lets two 4-warp
            CTAs share an SM.

    Raises:
        ValueError: a shape, dtype, stride or tile argument the kernel does not take.
        RuntimeError: the tensors are not on a Hopper (compute capability 9.0) GPU.
    """
    check_inputs((("q", q), ("k", k), ("v", v)), softmax_scale, num_warps, block_m, block_n, stages,
                 block_m + 2 * stages * block_n, min_stages=2)
    B, H, N, d = q.shape
    out = torch.empty((B, N, H, d), dtype=q.dtype, device=q.device).transpose(1, 2)  # (B, H, N, d)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(N, block_m) * B * H,)
    flash_fwd_ws_kernel[grid](
        descriptor(q, block_m), descriptor(k, block_n), descriptor(v, block_n), out, lse, softmax_scale * LOG2E,
        out.stride(0), out.stride(1), out.stride(2), H, N,
        HEAD_DIM=d, D=head_dim_padded(d), BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, num_warps=num_warps,
        maxnreg=maxnreg)
    return out, lse
