"""Time the Triton flash backend beside SDPA's FlashAttention-2 and cuDNN backends (bf16, non-causal).

    python3 benchmarks/flash_bench.py            # the baseline table's shapes (../shared/perf/h200_baseline.md)
    python3 benchmarks/flash_bench.py --warm     # first compile every autotune config in parallel processes
    python3 benchmarks/flash_bench.py --sweep    # time wider config lists per kernel (tuning the lists)
    python3 benchmarks/flash_bench.py --fp32-delta   # the table with flash's fp32_delta option as a fourth row
    python3 benchmarks/flash_bench.py --gluon    # the Gluon kernels (Hopper) beside ours and, forward, cuDNN's
    python3 benchmarks/flash_bench.py --gluon-ws # the Gluon TMA producer-warp forward's tiles beside ours and cuDNN's

FLOPs: forward 4·B·H·N²·d, forward+backward 3.5× that. Each time is the median of 20 CUDA-event
timings after 3 warm-ups (events back to back, one sync at the end: GPU time, host launch cost
hidden as in a training loop; the host cost per call is printed last), with inputs rotated over
sets larger than the 60 MB L2. Peak = the
extra memory allocated during forward+backward beyond the inputs.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [(256, 12, 197, 64), (128, 16, 577, 64), (32, 12, 1024, 64), (8, 12, 4096, 64), (2, 12, 16384, 64),
          (8, 16, 4096, 128), (256, 12, 197, 128)]
# Shapes of tests/test_flash.py's GPU tests whose compiled kernels differ (Triton specializes ints on
# divisibility by 16), so --warm fills the cache for them too.
TEST_SHAPES = ([(1, 2, n, d) for n in (197, 4096) for d in (32, 64, 80, 128)] + [(1, 2, 577, 96), (1, 2, 577, 256)]
               + [(2, 2, n, d) for n, d in ((197, 64), (1025, 80), (4096, 128), (577, 32))] + [(2, 12, 4096, 64)])
L2_BYTES = 60 * 2**20


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = getattr(SDPBackend, backend)

    def fn(q, k, v):
        with sdpa_kernel(which):
            return F.scaled_dot_product_attention(q, k, v)

    return fn


def backends(fp32_delta=False):
    import functools

    from kernels.flash import attention

    fns = {"flash (ours)": attention, "sdpa flash": _sdpa("FLASH_ATTENTION"), "sdpa cudnn": _sdpa("CUDNN_ATTENTION")}
    if fp32_delta:
        fns["flash fp32_delta"] = functools.partial(attention, fp32_delta=True)
    return fns


def _median_ms(step, n_sets, reps=20, warmup=3):
    """Median GPU time of ``step(i)``: events recorded back to back and read after one final sync
    (as ``triton.testing.do_bench``), so host-side launch cost overlaps the previous iteration."""
    for i in range(warmup):
        step(i % n_sets)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (start, end) in enumerate(events):
        start.record()
        step(i % n_sets)
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[len(times) // 2]


def host_overhead_us(fns, shape=(1, 1, 128, 64), calls=200):
    """Host time per call at a tiny shape, where the GPU work is negligible: launch overhead."""
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    lines = []
    for name, fn in fns.items():
        for label, call in (("fwd", lambda fn=fn: fn(q, k, v)),
                            ("fwd+bwd", lambda fn=fn: torch.autograd.grad(fn(*leaves), leaves, do))):
            call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
            lines.append(f"{name} {label}: {(time.perf_counter() - start) / calls * 1e6:.0f} us")
    return "host time per call at (1, 1, 128, 64): " + "; ".join(lines)


def _n_sets(shape) -> int:
    """Input sets to rotate over at ``shape``: at least 2, and together 3× the L2 (four 16-bit (B, H, N, d) tensors a
    set), so no call finds its inputs in L2."""
    B, H, N, d = shape
    return max(2, math.ceil(3 * L2_BYTES / (4 * B * H * N * d * 2)))


def bench_shape(shape, fns, dtype=torch.bfloat16):
    B, H, N, d = shape
    n_sets = _n_sets(shape)
    sets = [[torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4)] for _ in range(n_sets)]
    flops = 4 * B * H * N * N * d
    rows = []
    for name, fn in fns.items():
        fn(*sets[0][:3])  # first call: autotuning, compile
        ms_fwd = _median_ms(lambda i, fn=fn: fn(*sets[i][:3]), n_sets)
        leaves = [[t.detach().requires_grad_(True) for t in s[:3]] + [s[3]] for s in sets]

        def fwd_bwd(i, fn=fn, leaves=leaves):
            q, k, v, do = leaves[i]
            torch.autograd.grad(fn(q, k, v), (q, k, v), do)

        fwd_bwd(0)
        ms_fb = _median_ms(fwd_bwd, n_sets)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fwd_bwd(0)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
        rows.append((name, ms_fwd, flops / ms_fwd / 1e9, ms_fb, 3.5 * flops / ms_fb / 1e9, peak))
    return rows


def table(shapes, fp32_delta=False):
    fns = backends(fp32_delta)
    lines = ["| B | H | N | d | backend | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | peak MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for shape in shapes:
        rows = bench_shape(shape, fns)
        for name, ms_f, tf_f, ms_fb, tf_fb, peak in rows:
            lines.append(f"| {' | '.join(map(str, shape))} | {name} | {ms_f:.3f} | {tf_f:.0f} | {ms_fb:.3f} | "
                         f"{tf_fb:.0f} | {peak:.0f} |")
        ours, flash, cudnn = rows[:3]
        ratios.append(f"{shape}: fwd {ours[2] / flash[2]:.2f}x flash, {ours[2] / cudnn[2]:.2f}x cudnn; "
                      f"fwd+bwd {ours[4] / flash[4]:.2f}x flash, {ours[4] / cudnn[4]:.2f}x cudnn")
        print(*lines[-len(rows):], sep="\n", flush=True)
    print("\n".join(lines))
    print("\nours / peer TFLOP/s:\n" + "\n".join(ratios))
    print("\n" + host_overhead_us(fns))


GLUON_TILES = [(128, 64, 3, 8), (128, 128, 3, 8), (64, 64, 4, 4), (128, 64, 4, 8)]  # block_m, block_n, stages, warps
# The TMA producer-warp forward: block_m, block_n, stages, compute warps, register cap (None: one CTA an SM; 128 lets
# two 4-warp CTAs share an SM, 80 three).
GLUON_WS_TILES = [(128, 128, 3, 8, None), (64, 128, 2, 4, 128), (64, 128, 3, 4, 128), (64, 64, 3, 4, 104),
                  (64, 64, 3, 4, 80), (64, 64, 4, 4, 80), (64, 32, 4, 4, 80)]
GLUON_DKDV_TILES = [(None, 128, 3, 8), (None, 64, 3, 4), (None, 128, 4, 8)]  # block_m (None: by d), block_n, ...
GLUON_DQ_TILES = [(128, 64, 3, 8), (128, 64, 4, 8), (64, 64, 3, 4)]  # block_m, block_n, stages, warps


def _gluon_cells(fns, sets, flops, reference):
    """'name ms (TF/s, diff)' for each of ``fns`` (called on a set), timed over the rotated ``sets``."""
    cells = []
    for name, fn in fns.items():
        try:
            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(fn(sets[0]), reference))
            ms = _median_ms(lambda i, fn=fn: fn(sets[i]), len(sets))
            cells.append(f"{name} {ms:.3f} ms ({flops / ms / 1e9:.0f} TF/s, diff {diff:.1e})")
        except Exception as e:  # noqa: BLE001  reported in the line: a tile that does not fit is one cell
            cells.append(f"{name}: {type(e).__name__}: {str(e)[:100]}")
    return "; ".join(cells)


def gluon_table(shapes):
    """kernels/flash/gluon_fwd.py's forward and gluon_bwd.py's dK/dV and dQ kernels at several tiles, beside ours
    (Triton) and cuDNN's forward, on the same rotated inputs, with each result's largest difference from ours (Hopper
    only). The Triton dQ kernel's time includes forming delta, which the Gluon one reads."""
    for shape in shapes:
        _gluon_shape(shape)


def gluon_ws_table(shapes):
    """kernels/flash/gluon_ws.py's forward at several tiles beside ours (Triton) and cuDNN's, on the same rotated
    inputs, with each result's largest difference from ours (Hopper only)."""
    from kernels.flash import attention, gluon_ws

    cudnn = _sdpa("CUDNN_ATTENTION")
    for shape in shapes:
        B, H, N, d = shape
        sets = [[torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
                for _ in range(_n_sets(shape))]
        fwd = {"flash (ours)": lambda s: (attention(*s),), "sdpa cudnn": lambda s: (cudnn(*s),)}
        for t in GLUON_WS_TILES:
            fwd[f"gluon-ws {t}"] = lambda s, t=t, scale=d ** -0.5: (gluon_ws.fwd(*s, scale, *t)[0],)
        cells = _gluon_cells(fwd, sets, 4 * B * H * N * N * d, fwd["flash (ours)"](sets[0]))
        print(f"gluon-ws forward {shape}: {cells}", flush=True)


def _gluon_shape(shape):
    from kernels.flash import attention, configs, gluon_bwd, gluon_fwd, op

    B, H, N, d = shape
    scale = d ** -0.5
    sets = []
    for _ in range(_n_sets(shape)):
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        out, lse = op._fwd(q, k, v, scale)
        delta = torch.empty_like(lse)
        op.launch_preprocess(out, do, delta)
        sets.append((q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v), out, torch.empty_like(q)))
    cudnn = _sdpa("CUDNN_ATTENTION")
    fwd = {"flash (ours)": lambda s: (attention(*s[:3]),), "sdpa cudnn": lambda s: (cudnn(*s[:3]),)}
    for t in GLUON_TILES:
        fwd[f"gluon {t}"] = lambda s, t=t: (gluon_fwd.fwd(*s[:3], scale, *t)[0],)
    flops = 4 * B * H * N * N * d
    print(f"gluon forward {shape}: " + _gluon_cells(fwd, sets, flops, fwd["flash (ours)"](sets[0])), flush=True)
    tuner = configs.DKDV[configs.head_dim_class(d)]

    def triton_dkdv(s):
        op.launch_dkdv(tuner, *s[:4], s[6], s[7], s[4], s[5], scale, direct=True)
        return s[6], s[7]

    bwd = {"triton dk/dv": triton_dkdv}
    for t in GLUON_DKDV_TILES:
        bwd[f"gluon dk/dv {t}"] = lambda s, t=t: gluon_bwd.dkdv(*s[:6], scale, None, None, *t)
    reference = [x.clone() for x in triton_dkdv(sets[0])]
    print(f"gluon dk/dv {shape}: " + _gluon_cells(bwd, sets, 2 * flops, reference), flush=True)
    dq_tuner = configs.DQ[configs.head_dim_class(d)]

    def triton_dq(s):  # forms delta itself, rewriting the set's (the same rowsum(dO ∘ O), to rounding)
        op.launch_dq(dq_tuner, *s[:4], s[9], s[8], s[4], s[5], scale, direct=True)
        return (s[9],)

    dq_fns = {"triton dq": triton_dq}
    for t in GLUON_DQ_TILES:
        dq_fns[f"gluon dq {t}"] = lambda s, t=t: (gluon_bwd.dq_grad(*s[:6], scale, None, *t),)
    reference = [x.clone() for x in triton_dq(sets[0])]
    print(f"gluon dq {shape}: " + _gluon_cells(dq_fns, sets, 1.5 * flops, reference), flush=True)


# ---------------------------------------------------------------------------------------------
# Parallel compilation (--warm) and config sweeps (--sweep)
# ---------------------------------------------------------------------------------------------
SWEEP = {  # (block_a, block_b, num_warps, num_stages[, maxnreg]) candidates per kernel; the deeper pipelines (stages
    # 4-5) and 8-warp 64-row tiles are around the 2026-12-01 winners, the register caps around the 2026-12-02 ones; the
    # capped 8-warp rows (two CTAs an SM by the register file, sharing one Q/dO or K/V tile per two warpgroups) are new
    "fwd": [(128, 64, 4, 2), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3),
            (128, 32, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 4, 4), (64, 32, 4, 4),
            (128, 64, 8, 4), (64, 64, 4, 4), (64, 128, 4, 4), (64, 64, 4, 3, 112), (64, 64, 4, 3, 96),
            (64, 32, 4, 3, 80), (128, 32, 8, 3, 128), (128, 64, 8, 2, 128), (128, 32, 8, 2), (64, 64, 4, 3, 128),
            (64, 64, 4, 3, 136), (128, 64, 8, 3, 128), (64, 32, 4, 3, 104)],
    "dkdv": [(32, 128, 4, 2), (32, 128, 4, 3), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 3),
             (64, 64, 4, 3), (32, 64, 4, 3), (16, 128, 4, 3),
             (64, 64, 4, 4), (64, 64, 4, 5), (64, 64, 8, 3), (128, 64, 8, 3), (32, 64, 4, 4), (32, 64, 4, 3, 128),
             (32, 64, 4, 3, 120), (64, 64, 4, 3, 168), (64, 64, 4, 2, 168), (64, 64, 4, 3, 160),
             (32, 128, 8, 2, 128), (32, 128, 8, 3, 128), (32, 128, 8, 4, 128), (64, 128, 8, 3, 168)],
    "dq": [(128, 32, 4, 3), (128, 32, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3),
           (64, 32, 4, 3), (128, 128, 8, 2), (64, 128, 8, 2),
           (128, 64, 8, 4), (128, 64, 4, 3), (64, 64, 4, 4), (128, 32, 4, 4), (64, 32, 4, 3, 96),
           (64, 64, 4, 3, 128), (128, 32, 8, 3, 128)],
}
# The Hopper (TMA descriptor) kernels of kernels/flash/hopper.py: (block_a, block_b, warps, stages, warp_specialize)
_TMA_TILES = {"fwd_tma": [(64, 64, 4), (128, 64, 8), (128, 128, 8), (64, 128, 4), (128, 64, 4), (64, 32, 4)],
              "dkdv_tma": [(32, 128, 4), (64, 128, 8), (64, 64, 4), (32, 64, 4), (128, 128, 8)],
              "dq_tma": [(128, 32, 4), (128, 64, 8), (64, 64, 4), (64, 32, 4), (128, 128, 8)],
              # the whole backward in one kernel, dQ by TMA reduce-add (hopper.flash_bwd_fused_tma_kernel, DQ_REDUCE=2):
              # compare with dkdv + dq (the two-kernel backward) at the same shape
              "bwd_fused_tma": [(64, 64, 4), (64, 128, 8), (32, 128, 4), (128, 128, 8), (64, 64, 8)]}
SWEEP.update({which: [(*t, stages, ws) for t in tiles for stages in (2, 3, 4) for ws in (False, True)]
              for which, tiles in _TMA_TILES.items()})
SWEEP_SHAPES = [(256, 12, 197, 64), (8, 12, 4096, 64), (256, 12, 197, 128), (8, 16, 4096, 128)]
_NAMES = {"fwd": ("BLOCK_M", "BLOCK_N"), "dkdv": ("BLOCK_M1", "BLOCK_N1"), "dq": ("BLOCK_M2", "BLOCK_N2")}
_NAMES.update({f"{w}_tma": n for w, n in list(_NAMES.items())})
_NAMES["bwd_fused_tma"] = _NAMES["dkdv"]


def _single(which, cfg):
    import triton

    from kernels.flash import configs, hopper
    from kernels.flash import kernels as K

    kernel = {"fwd": K.flash_fwd_kernel, "dkdv": K.flash_bwd_dkdv_kernel, "dq": K.flash_bwd_dq_kernel,
              "fwd_tma": hopper.flash_fwd_tma_kernel, "dkdv_tma": hopper.flash_bwd_dkdv_tma_kernel,
              "dq_tma": hopper.flash_bwd_dq_tma_kernel, "bwd_fused_tma": hopper.flash_bwd_fused_tma_kernel}[which]
    tma = which.endswith("_tma")
    config = configs._cfgs(_NAMES[which], [cfg[:4] if tma else cfg])[0]  # a pointer kernel's 5th number: its cap
    if tma:
        hopper.ensure_allocator()
        config.kwargs["WARP_SPECIALIZE"] = cfg[4]
    if which == "bwd_fused_tma":
        config.kwargs["DQ_REDUCE"] = 2
    return triton.autotune([config], key=["N_BUCKET", "HEAD_DIM"])(kernel)


def _make_tensors(shape, dtype, real):
    """q, k, v, dO, out, lse, delta and two gradient buffers; ``real``: out and lse from the forward
    (for timing), else random stand-ins (enough to compile, and no autotuning in the worker)."""
    from kernels.flash import op

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    if real:
        out, lse = op.fwd(q, k, v, shape[-1] ** -0.5)
    else:
        out, lse = torch.randn_like(q), torch.randn(shape[:-1], device="cuda", generator=g) + math.log(shape[-2])
    delta = torch.empty_like(lse)
    op.launch_preprocess(out, do, delta)
    return q, k, v, do, out, lse, delta, torch.empty_like(q), torch.empty_like(q)


def _run_one(which, tuner, tensors):
    """A closure that launches one kernel once through ``tuner``."""
    from kernels.flash import configs, op
    from kernels.flash.kernels import LOG2E

    q, k, v, do, out, lse, delta, g1, g2 = tensors
    scale = q.shape[-1] ** -0.5
    N = q.shape[2]
    dkdv_ints = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *g1.stride(), *g2.stride(), q.shape[1], N,
                 configs.n_bucket(N))
    if which == "bwd_fused_tma":  # dk, dv and dQ's reduce-adds into a float32 buffer (timed without re-zeroing it)
        dqacc = torch.zeros(q.shape, device=q.device)
        return lambda: op._launch(tuner, "BLOCK_N1", "bwd fused", q, (q, k, v, do, g1, g2, dqacc, lse, delta),
                                  (scale, scale * LOG2E), dkdv_ints, lambda: op._meta(q), True)
    if which == "dkdv_tma":  # launch_dkdv's arguments, without the pointer kernel's SPLIT_DS (fp32_delta's)
        return lambda: op._launch(tuner, "BLOCK_N1", "bwd dk/dv", q, (q, k, v, do, g1, g2, lse, delta),
                                  (scale, scale * LOG2E), dkdv_ints, lambda: op._meta(q), True)
    if which == "dq_tma":  # takes delta ready-made, where the pointer dQ kernel forms it from out and dO
        ints = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *g1.stride(), q.shape[1], N, configs.n_bucket(N))
        return lambda: op._launch(tuner, "BLOCK_M2", "bwd dq", q, (q, k, v, do, g1, lse, delta), (scale, scale * LOG2E),
                                  ints, lambda: op._meta(q), True)
    which = which.removesuffix("_tma")  # direct=True: the eager launch path, without Python's launch cost
    if which == "fwd":
        lse2 = torch.empty_like(lse)
        return lambda: op.launch_fwd(tuner, q, k, v, g1, lse2, scale, direct=True)
    if which == "dkdv":
        return lambda: op.launch_dkdv(tuner, q, k, v, do, g1, g2, lse, delta, scale, direct=True)
    return lambda: op.launch_dq(tuner, q, k, v, do, g1, out, lse, delta, scale, direct=True)


def _compile_job(job):
    which, cfg, shape, dtype_name = job
    try:
        _run_one(which, _single(which, cfg), _make_tensors(shape, getattr(torch, dtype_name), real=False))()
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001  out of shared memory etc.: reported, the timing run skips it
        return f"{job}: {type(e).__name__}: {str(e)[:120]}"


def _tuned_jobs(shapes, dtype_names):
    from kernels.flash import configs

    tables = {"fwd": configs._FWD, "dkdv": configs._DKDV, "dq": configs._DQ}
    return [(w, cfg, s, dt) for s in shapes for dt in dtype_names for w, t in tables.items()
            for cfg in t[configs.head_dim_class(s[-1])]]


def compile_parallel(jobs, workers=None):
    start = time.time()
    workers = workers or min(16, os.cpu_count() or 1)
    with mp.get_context("spawn").Pool(workers) as pool:
        errors = [e for e in pool.map(_compile_job, jobs, chunksize=1) if e]
    print(f"compiled {len(jobs)} kernel configs in {time.time() - start:.1f} s with {workers} processes; "
          f"{len(errors)} failed", flush=True)
    for e in errors:
        print("  ", e)


def sweep(kernels=None, shapes=None):
    from kernels.flash import configs

    sweep_ = {w: c for w, c in SWEEP.items() if not kernels or w in kernels}
    shapes = shapes or SWEEP_SHAPES
    jobs = [(w, cfg, s, "bfloat16") for s in shapes for w, cfgs in sweep_.items() for cfg in cfgs]
    compile_parallel(jobs)
    for shape in shapes:
        B, H, N, d = shape
        flops = {"fwd": 4 * B * H * N * N * d, "dkdv": 8 * B * H * N * N * d, "dq": 6 * B * H * N * N * d}
        flops.update({f"{w}_tma": f for w, f in list(flops.items())}, bwd_fused_tma=10 * B * H * N * N * d)
        tensors = _make_tensors(shape, torch.bfloat16, real=True)
        for which, cfgs in sweep_.items():
            results = []
            for cfg in cfgs:
                try:
                    ms = configs._bench(_run_one(which, _single(which, cfg), tensors), (0.5,))[0]  # the tuner's measure
                    results.append((ms, cfg))
                except Exception as e:  # noqa: BLE001
                    print(f"  {which} {cfg}: {type(e).__name__}")
            results.sort()
            best = ", ".join(f"{c} {ms:.3f} ms ({flops[which] / ms / 1e9:.0f} TF/s)" for ms, c in results)
            print(f"sweep {shape} {which}: {best}", flush=True)
        print(f"sweep {shape} cudnn fwd {_cudnn_fwd_ms(tensors):.3f} ms", flush=True)


def _cudnn_fwd_ms(tensors):
    import triton.testing

    q, k, v = tensors[:3]
    return triton.testing.do_bench(lambda: _sdpa("CUDNN_ATTENTION")(q, k, v), warmup=10, rep=50, return_mode="median")


def main():
    from benchmarks.attention import parse_shapes  # one --shapes syntax for the benchmark scripts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm", action="store_true", help="compile all autotune configs in parallel first")
    parser.add_argument("--warm-tests", action="store_true", help="also compile for tests/test_flash.py's shapes")
    parser.add_argument("--sweep", action="store_true", help="time the wider candidate lists per kernel")
    parser.add_argument("--kernels", default="", help="with --sweep: comma-separated subset of " + ",".join(SWEEP))
    parser.add_argument("--shapes", type=parse_shapes, default=None, metavar="'B,H,N,d;B,H,N,d'",
                        help="the shapes to time in the sweep or the table (default: the sweep's '" + ";".join(
                            ",".join(map(str, s)) for s in SWEEP_SHAPES) + "', the table's " + ";".join(
                            ",".join(map(str, s)) for s in SHAPES) + ")")
    parser.add_argument("--no-table", action="store_true")
    parser.add_argument("--fp32-delta", action="store_true", help="also time flash with fp32_delta=True")
    parser.add_argument("--gluon", action="store_true", help="time the Gluon kernels' tiles (Hopper) instead")
    parser.add_argument("--gluon-ws", action="store_true", help="time the Gluon TMA producer-warp forward instead")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("flash_bench.py needs a CUDA GPU")
    import triton

    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}", flush=True)
    if args.warm or args.warm_tests:
        jobs = _tuned_jobs(SHAPES, ["bfloat16"])
        if args.warm_tests:
            jobs += _tuned_jobs(TEST_SHAPES, ["bfloat16", "float16"])
        compile_parallel(sorted(set(jobs), key=lambda j: -j[2][-1]))
    if args.sweep:
        sweep([k for k in args.kernels.split(",") if k], args.shapes)
    if args.gluon_ws:
        gluon_ws_table(SHAPES)
    elif args.gluon:
        gluon_table(SHAPES)
    elif not args.no_table:
        table(args.shapes or SHAPES, args.fp32_delta)


if __name__ == "__main__":
    main()
