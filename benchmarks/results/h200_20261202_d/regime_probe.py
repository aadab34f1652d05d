"""Why rankings differ between measures: the forward's capped 4-warp row against the 8-warp row, timed in short
bursts and sustained, on one input set and on sets rotated call by call.
Run from the repository root: python3 benchmarks/results/h200_20261202_d/regime_probe.py"""
import itertools
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import flash_bench as fb

ROWS = [(64, 64, 4, 3, 112), (128, 64, 8, 3)]


def timed(fns, calls, skip):
    """Median ms per call of calls launches cycling over fns, back to back; the first skip are untimed."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
    for i in range(skip):
        fns[i % len(fns)]()
    for i in range(calls):
        events[i].record()
        fns[i % len(fns)]()
    events[-1].record()
    events[-1].synchronize()
    t = sorted(a.elapsed_time(b) for a, b in itertools.pairwise(events))
    return t[len(t) // 2]


for shape in [(8, 12, 4096, 64), (128, 16, 577, 64)]:
    sets = [fb._make_tensors(shape, torch.bfloat16, real=True) for _ in range(4)]
    tuners = {r: fb._single("fwd", r) for r in ROWS}
    for r in ROWS:
        fb._run_one("fwd", tuners[r], sets[0])()
    torch.cuda.synchronize()
    for rep in range(2):
        for r in ROWS:
            fns = [fb._run_one("fwd", tuners[r], s) for s in sets]
            res = {"burst rotated": timed(fns, 20, 3), "burst fixed": timed(fns[:1], 20, 3),
                   "sustained rotated": timed(fns, 100, 200), "sustained fixed": timed(fns[:1], 100, 200)}
            torch.cuda._sleep(50_000_000)
            print(shape, rep, r, "  ".join(f"{k} {v:.4f}" for k, v in res.items()), flush=True)
