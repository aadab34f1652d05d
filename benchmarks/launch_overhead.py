"""Is a backend's call bound by the GPU or by the Python that launches it? CPU time vs GPU time per call.

    python -m benchmarks.launch_overhead            # CUDA only
    python -m benchmarks.launch_overhead --profile  # and where the CPU time of each flash and cuda case goes (cProfile, torch.profiler)

For each shape, each flash op and each autograd forward+backward (flash, flash packed, cuda, cuda packed, cuda through
its ``torch.library`` op as ``torch.compile`` calls it, SDPA; flash's
eager calls through the C++ launcher, the default, and through the Python one, ``VIT_FLASH_LAUNCHER=python``)
is called 50 times back to back after 5 warm-up calls, in ``--rounds`` interleaved rounds; the median round
is printed, and the fastest round's CPU time (``cpu min``: on a shared host the median moves with other work). ``cpu`` is the wall time of enqueuing those calls (no synchronisation inside the loop, so the
GPU runs behind), ``gpu`` the CUDA-event time of the same calls. ``cpu ≈ gpu`` means the GPU waited on
Python: the call costs its launch overhead, not its kernels. Shapes run in the order given, ViT-S/16
repeated after ViT-B/16, to show the spread of one process.
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(256, 6, 197, 64), (256, 12, 197, 64), (256, 6, 197, 64), (32, 12, 1024, 64)]  # (B, H, N, d)


def cpu_and_gpu_ms(fn, calls: int = 50, warmup: int = 5) -> tuple[float, float]:
    """(CPU ms, GPU ms) per call of ``fn``, over ``calls`` back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    cpu = (time.perf_counter() - t0) / calls * 1e3
    end.record()
    torch.cuda.synchronize()
    return cpu, start.elapsed_time(end) / calls


def _launcher(mode: str, fn):
    """``fn`` run with the flash eager launcher in ``mode`` (kernels.flash.native)."""
    from kernels.flash import native

    def call():
        previous = native.set_mode(mode)
        try:
            return fn()
        finally:
            native.set_mode(previous)
    return call


def cases(B: int, H: int, N: int, d: int, dtype=torch.bfloat16) -> dict:
    """name -> zero-argument callable, on fresh random inputs of one shape."""
    from kernels import cuda
    from kernels.flash import attention, attention_qkvpacked, op

    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=dtype) for _ in range(3))  # (B, H, N, d)
    qkv = torch.randn(B, N, 3, H, d, device="cuda", dtype=dtype)  # (B, N, 3, H, d)
    softmax_scale = d ** -0.5
    fwd = functools.cache(lambda: op.fwd(q, k, v, softmax_scale))  # (out, lse), once a bwd case runs
    fwd_packed = functools.cache(lambda: op.fwd_qkvpacked(qkv, softmax_scale))
    do = torch.randn(B, H, N, d, device="cuda", dtype=dtype)  # (B, H, N, d)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    qkvg = qkv.clone().requires_grad_()
    return {
        "fwd op": lambda: op.fwd(q, k, v, softmax_scale),
        "fwd_qkvpacked op": lambda: op.fwd_qkvpacked(qkv, softmax_scale),
        "bwd op": lambda: op.bwd(do, q, k, v, *fwd(), softmax_scale),
        "bwd_qkvpacked op": lambda: op.bwd_qkvpacked(do, qkv, *fwd_packed(), softmax_scale),
        "attention fwd+bwd": lambda: torch.autograd.grad(attention(qg, kg, vg), (qg, kg, vg), do),
        "packed fwd+bwd": lambda: torch.autograd.grad(attention_qkvpacked(qkvg), (qkvg,), do),
        "attention, py launch": _launcher("python", lambda: torch.autograd.grad(attention(qg, kg, vg), (qg, kg, vg), do)),
        "packed, py launch": _launcher("python", lambda: torch.autograd.grad(attention_qkvpacked(qkvg), (qkvg,), do)),
        "cuda fwd+bwd": lambda: torch.autograd.grad(cuda.attention(qg, kg, vg), (qg, kg, vg), do),
        "cuda packed fwd+bwd": lambda: torch.autograd.grad(cuda.attention_qkvpacked(qkvg), (qkvg,), do),
        "cuda op fwd+bwd": lambda: torch.autograd.grad(cuda.ops.attn_fwd(qg, kg, vg, softmax_scale, False)[0],
                                                      (qg, kg, vg), do),
        "sdpa fwd+bwd": lambda: torch.autograd.grad(F.scaled_dot_product_attention(qg, kg, vg), (qg, kg, vg), do),
    }


def profile(fn, calls: int = 200, top: int = 12) -> None:
    """Print the ``top`` Python functions by own CPU time over ``calls`` calls of ``fn`` (cProfile, after warm-up),
    then the ``top`` ATen ops and CUDA runtime calls by own CPU time (torch.profiler, the C++ side)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as ops:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    print(ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=top), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", action="store_true", help="also cProfile each flash and cuda case at the first shape")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the cases; the median is printed")
    p.add_argument("--cases", default="", help="comma-separated parts of case names to run (e.g. 'cuda,sdpa'); "
                   "default all")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.launch_overhead times CUDA launches; run it on a machine with a CUDA GPU")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be ≥ 1, got {args.rounds}")
    wanted = [part for part in args.cases.split(",") if part]

    def selected(shape) -> dict:
        every = cases(*shape)
        chosen = {name: fn for name, fn in every.items() if not wanted or any(part in name for part in wanted)}
        if not chosen:
            raise SystemExit(f"--cases {args.cases!r} matches none of {list(every)}")
        return chosen

    for B, H, N, d in SHAPES:
        shape_cases = selected((B, H, N, d))
        times: dict[str, list] = {name: [] for name in shape_cases}
        for _ in range(args.rounds):
            for name, fn in shape_cases.items():
                times[name].append(cpu_and_gpu_ms(fn))
        for name, runs in times.items():
            cpu = statistics.median(c for c, _ in runs)
            gpu = statistics.median(g for _, g in runs)
            fastest = min(c for c, _ in runs)  # the round least disturbed by other work on a shared host
            print(f"B={B} H={H} N={N} d={d}  {name:20s} cpu {cpu:6.3f} ms/call  gpu {gpu:6.3f} ms/call  "
                  f"cpu min {fastest:6.3f}", flush=True)
    if args.profile:
        for name, fn in selected(SHAPES[0]).items():
            if not name.startswith("sdpa"):
                print(f"\n## cProfile, 200 calls of {name} at (B, H, N, d) = {SHAPES[0]}", flush=True)
                profile(fn)


if __name__ == "__main__":
    main()
