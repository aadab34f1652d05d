"""Autotune configurations for the flash kernels, one short list per head-dim class.

Each kernel is wrapped by one ``triton.autotune`` per head-dim class (≤64, 128, 256 after padding
to a power of two), keyed on ``(N_BUCKET, HEAD_DIM)``, the flags that change a kernel's work (fp32_delta's) and the
tensors' dtypes (Triton adds those).
``N_BUCKET`` is the next power of two of N, clamped to [128, 8192], so a new image resolution
reuses the tuning of its bucket instead of re-tuning for its exact N. The lists are short because
every config is compiled once per (head dim, dtype) on first use; the candidates and the measured
winners are in benchmarks/results/flash_notes.md.

Under ``TRITON_INTERPRET=1`` (CPU CI) each kernel gets one small config: nothing to time, and
small tiles keep the interpreter fast while still covering full tiles and a masked tail.
"""
from __future__ import annotations

import time

import torch
import triton

from . import kernels

INTERPRETED = not isinstance(kernels.flash_fwd_kernel, triton.runtime.JITFunction)

# Tuning measure: each config's launches back to back, _ROUNDS rounds of about _ROUND_MS, as the kernels run inside a
# training step. triton.testing.do_bench (its default) times single launches after flushing L2; on the H200 that
# ranking picked configs 8-9 % slower in back-to-back runs, the forward and the dQ kernel at (32, 12, 1024, 64)
# (benchmarks/results/h200_20261202_c.md, one round). Each round starts behind a GPU sleep twice as long as the host
# took to queue the round before, so the host queues its launches (at most _CALLS) while the GPU waits and the events
# time the kernels, not the host's launch cost. A CUDA graph would do the same, but its capture fails CUDA random draws
# in other threads (a loader's).
_ROUNDS, _ROUND_MS, _CALLS = 5, 5.0, 50


def _bench(kernel_call, quantiles):
    """The autotuner's measure (its ``do_bench`` contract): ``kernel_call``'s GPU time per launch in ms, at each of
    ``quantiles`` over _ROUNDS rounds of back-to-back launches (after one warm-up round)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def elapsed_ms(work) -> float:
        start.record()
        work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    kernel_call()  # compiles
    cycles_per_ms = 1e6 / elapsed_ms(lambda: torch.cuda._sleep(1_000_000))
    calls = max(1, min(_CALLS, round(_ROUND_MS / max(elapsed_ms(kernel_call), 1e-3))))
    times, host_ms = [], _ROUND_MS
    for _ in range(_ROUNDS + 1):
        torch.cuda._sleep(int(2 * host_ms * cycles_per_ms))
        start.record()
        queued = time.perf_counter()
        for _ in range(calls):
            kernel_call()
        host_ms = max(0.5, (time.perf_counter() - queued) * 1e3)  # the host's time to queue the round
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    times = sorted(times[1:])
    return [times[min(len(times) - 1, int(q * len(times)))] for q in quantiles]


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()  # plain Python: triton.next_power_of_2 costs µs per call (a jit wrapper)


def n_bucket(seq_len: int) -> int:
    """Autotune bucket of a sequence length: next power of two, clamped to [128, 8192]."""
    return min(max(_next_power_of_2(seq_len), 128), 8192)


def head_dim_padded(head_dim: int) -> int:
    """The power of two ≥ max(head_dim, 16) that the kernels' tiles use."""
    return max(16, _next_power_of_2(head_dim))


def _cfgs(names, rows):
    """triton.Configs of (block_a, block_b, num_warps, num_stages[, maxnreg]) rows."""
    return [triton.Config(dict(zip(names, r[:2])), num_warps=r[2], num_stages=r[3],
                          maxnreg=r[4] if len(r) > 4 else None) for r in rows]


# (block_a, block_b, num_warps, num_stages[, maxnreg]) per kernel and head-dim class. The 64 and 128 lists are the
# best of wider sweeps on the H200 (bf16) at N = 197, 577, 1024 and 4096 (benchmarks/results/h200_20261202_c.md,
# back-to-back GPU time). maxnreg caps the registers a thread, so that by the register file's arithmetic (65536 an SM)
# more programs fit an SM: dK/dV (32, 64, 4, 3) took 153 registers (ncu), 0.281 ms at (256, 12, 197, 64), and 0.265
# capped at 128. Caps that spill more lose: (32, 64, 4, 3) capped at 104 took 0.446 ms at N = 197; with dPᵀ issued
# before dV (kernels._bwd_dkdv_step) (64, 64, 4, 3) capped at 168 spills 88 bytes (Triton 3.8, sm_90) and lost its
# N = 1024-4096 place to the rows below (benchmarks/results/h200_20261203_b.md). Each list keeps a row without a cap for
# fp32_delta's flag variants, which need more registers (their capped dQ rows spill 288-624 bytes:
# benchmarks/results/h200_20261202_c/res_usage_triton38_sm90.txt). Under torch.compile the traced forward is tuned by
# Inductor, which (as read in torch 2.14) keeps block sizes, warps and stages only, no cap, and times them itself; the
# packed backward is an opaque op and tuned here. The 256 list is unswept (smaller tiles to fit shared memory). Forward,
# d = 128: (64, 64, 4, 3) took 2.072 ms at (8, 16, 4096, 128) against 2.166 for (128, 64, 8, 3) and 2.370 for
# (128, 32, 4, 3), the row it replaced, which had also lost N = 197 to (128, 32, 8, 3), 0.307 against 0.288 ms
# (h200_20261203_b/sweep_orig.log, h200_20261202_c.md).
_FWD = {  # (BLOCK_M, BLOCK_N)
    64: [(64, 64, 4, 3, 112), (128, 64, 8, 3), (64, 32, 4, 3, 80)],
    128: [(128, 32, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)],  # (64, 64, 4, 3): h200_20261203_b/sweep_orig.log
    256: [(64, 64, 4, 2), (128, 32, 8, 2), (64, 32, 4, 2)],
}
_DKDV = {  # (BLOCK_M1, BLOCK_N1)
    64: [(32, 64, 4, 3, 128), (32, 128, 4, 3), (32, 64, 4, 3)],  # h200_20261203_b.md, with dPᵀ issued before dV
    128: [(32, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3)],
    256: [(32, 64, 8, 2), (16, 64, 4, 2), (32, 32, 4, 2)],
}
_DQ = {  # (BLOCK_M2, BLOCK_N2)
    64: [(128, 64, 8, 3), (64, 32, 4, 3, 96), (64, 64, 4, 3, 128)],
    128: [(128, 32, 8, 3, 128), (128, 64, 8, 3), (128, 32, 4, 3)],
    256: [(64, 32, 4, 2), (32, 64, 4, 2), (32, 32, 4, 2)],
}
_INTERPRETER = {"fwd": (128, 64, 4, 1), "dkdv": (64, 128, 4, 1), "dq": (128, 64, 4, 1)}
PREPROCESS_BLOCK_M = 64 if INTERPRETED else 128


# The constexpr flags that change a kernel's work (fp32_delta's residual, raw max and split dS): tuned apart (a kernel's
# autotuner skips the names it does not take).
_FLAGS = ("STORE_RES", "UNSCALED_MAX", "ADD_RES", "SPLIT_DS")


def _tuned(kernel, names, table, which):
    tuners = {}
    for cls, rows in table.items():
        rows = [_INTERPRETER[which]] if INTERPRETED else rows
        tuners[cls] = triton.autotune(_cfgs(names, rows), key=["N_BUCKET", "HEAD_DIM", *_FLAGS],
                                      do_bench=_bench)(kernel)
    return tuners


FWD = _tuned(kernels.flash_fwd_kernel, ("BLOCK_M", "BLOCK_N"), _FWD, "fwd")
DKDV = _tuned(kernels.flash_bwd_dkdv_kernel, ("BLOCK_M1", "BLOCK_N1"), _DKDV, "dkdv")
DQ = _tuned(kernels.flash_bwd_dq_kernel, ("BLOCK_M2", "BLOCK_N2"), _DQ, "dq")


def head_dim_class(head_dim: int) -> int:
    """Which config list a head dim uses: 64 (d ≤ 64), 128 or 256."""
    return max(64, head_dim_padded(head_dim))
