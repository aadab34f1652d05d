"""Where a training step's GPU time goes: attention, matmuls, the rest, from the PyTorch profiler.

    python -m benchmarks.profile_step                                  # ViT-B/16, 224 px, batch 256, flash, compiled
    python -m benchmarks.profile_step --attention sdpa --eager --batch-size 64
    python -m benchmarks.profile_step --timm                           # timm's ViT with its fused SDPA
    python -m benchmarks.profile_step --model vit_base_patch16_1024 --top 12   # and its 12 longest kernels
    python -m benchmarks.profile_step --gaps 8                         # and where the GPU waits longest

The step is benchmarks/train.py's (bf16 autocast, cross-entropy, backward, fused AdamW) on synthetic
data on the GPU. After warm-up (which includes compilation), ``--steps`` steps are profiled and each CUDA
kernel's time is put in one bucket by its name (:data:`BUCKETS`, first match wins); the table gives the
bucket's share of the summed kernel time and its ms per step. Kernel time summed is not wall time. Two
differences are printed: wall minus kernels, which includes the profiler's own start and stop, and the GPU's
idle time between the first kernel and the last (the GPU waiting for the CPU). On the H200 (timm's ViT-B/16
at 1024 px, batch 8, compiled, 2026-12-03) the first read 17 ms a step and the second 1.3 ms. ``--gaps`` lists
those idle stretches, summed by the pair of kernels around them: which launch the GPU waited for. The
profiler's own CPU cost lengthens gaps, so compare two runs of this script, not with train.py.
"""
from __future__ import annotations

import argparse
import re
import time

import torch

from benchmarks.train import MODELS, build, train_step

# bucket -> regex on the kernel name; first match wins, "other" takes the rest.
BUCKETS = {
    "attention": r"flash|fmha|attn|sdpa|cudnn.*(mha|attention)|vit_cuda",
    "matmul": r"gemm|xmma|nvjet|cutlass|^triton_tem|sm90_|sm80_|ampere_|hopper_|wgmma",
    "optimizer": r"adam|multi_tensor|foreach",
    "norm / softmax / elementwise (fused by Inductor)": r"^triton_",
    "elementwise (eager)": r"elementwise|vectorized|reduce|layer_norm|softmax|gelu|copy|fill",
}


def bucket(name: str) -> str:
    for label, pattern in BUCKETS.items():
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def idle_gaps(spans: list[tuple[str, float, float]], steps: int) -> list[tuple[str, str, float, float]]:
    """Idle time between kernels: ``spans`` are (name, start, end) of every kernel, µs, one stream or several.

    Returns (kernel before, kernel after, idle ms per step, occurrences per step), the most idle pair first. A gap is
    the time from the latest end so far to the next kernel's start, when positive (kernels that overlap leave none)."""
    pairs: dict[tuple[str, str], list[float]] = {}
    last_end, last_name = None, None
    for name, start, end in sorted(spans, key=lambda span: span[1]):
        if last_end is not None and start > last_end:
            total = pairs.setdefault((last_name, name), [0.0, 0])
            total[0] += start - last_end
            total[1] += 1
        if last_end is None or end > last_end:
            last_end, last_name = end, name
    rows = [(a, b, us / 1e3 / steps, n / steps) for (a, b), (us, n) in pairs.items()]
    return sorted(rows, key=lambda row: -row[2])


def profile(model, opt, x, y, steps: int):
    """-> (bucket -> kernel ms per step, wall ms per step, (kernel, ms per step, launches per step) longest first,
    :func:`idle_gaps`' rows) over ``steps`` profiled steps."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            train_step(model, opt, x, y, None, "cuda")
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    totals: dict[str, float] = {}
    kernels = []
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            label = bucket(event.key)
            ms = event.device_time_total / 1e3 / steps
            totals[label] = totals.get(label, 0.0) + ms
            kernels.append((event.key, ms, event.count / steps))
    spans = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    return totals, wall, sorted(kernels, key=lambda kernel: -kernel[1]), idle_gaps(spans, steps)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=list(MODELS), default="vit_base_patch16_224")
    p.add_argument("--attention", default="flash", help="our backend (ignored with --timm)")
    p.add_argument("--timm", action="store_true", help="profile timm's model instead of ours")
    p.add_argument("--eager", action="store_true", help="no torch.compile")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=0, help="also list this many of the longest kernels")
    p.add_argument("--gaps", type=int, default=0, help="also list this many of the longest idle stretches (by pair)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.profile_step profiles CUDA kernels; run it on a machine with a CUDA GPU")
    spec = MODELS[args.model]
    B, S = args.batch_size or spec["batch"], spec["img_size"]
    model = build("timm" if args.timm else args.attention, spec, "cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=True)
    step_model = model if args.eager else torch.compile(model)
    x, y = torch.randn(B, 3, S, S, device="cuda"), torch.randint(0, 1000, (B,), device="cuda")
    for _ in range(args.warmup):
        train_step(step_model, opt, x, y, None, "cuda")
    totals, wall, kernels, gaps = profile(step_model, opt, x, y, args.steps)
    kernel = sum(totals.values())
    what = "timm + SDPA" if args.timm else f"ours, {args.attention}"
    print(f"{args.model}, batch {B}, {what}, {'eager' if args.eager else 'compiled'}: "
          f"{B / wall * 1e3:.0f} img/s, {wall:.1f} ms per step, {kernel:.1f} ms of kernels per step")
    for label, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {label:50s} {ms:7.2f} ms  {100 * ms / kernel:5.1f} %")
    print(f"  {'wall - kernels (profiler start and stop included)':50s} {wall - kernel:7.2f} ms")
    print(f"  {'GPU idle between the first and last kernel':50s} {sum(g[2] for g in gaps):7.2f} ms")
    for name, ms, calls in kernels[:args.top]:
        print(f"  {ms:7.2f} ms  {calls:4.0f}×  {bucket(name)[:12]:12s}  {name[:110]}")
    if args.gaps:
        print("  longest idle stretches, by the kernels around them:")
    for before, after, ms, count in gaps[:args.gaps]:
        print(f"  {ms:7.2f} ms  {count:4.0f}×  after {before[:60]}  before {after[:60]}")


if __name__ == "__main__":
    main()
