"""Does the autotuner's measure (configs._bench) rank each kernel's config rows as long steady runs do?

For each shape and kernel, every row of the shipped list is timed three times with configs._bench (the tuner's
measure) and three times steady (5 warm-ups, then 7 rounds of 40 back-to-back launches, median), interleaved.
Run from the repository root: python3 benchmarks/results/h200_20261202_d/tuner_probe.py
"""
import multiprocessing as mp
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import flash_bench as fb

from kernels.flash import configs

SHAPES = [(32, 12, 1024, 64), (8, 12, 4096, 64), (2, 12, 16384, 64), (8, 16, 4096, 128), (256, 12, 197, 64)]
TABLES = {"fwd": configs._FWD, "dkdv": configs._DKDV, "dq": configs._DQ}
# Candidates beyond the shipped rows, chosen by registers and shared memory (Triton 3.6 AOT for sm_90, cuobjdump): each
# fits two programs an SM where the shipped long-N rows at d = 128 fit one, with at most 40 bytes of stack.
EXTRA = {64: {"fwd": [(128, 128, 8, 2, 128)], "dkdv": [], "dq": []},
         128: {"fwd": [(128, 64, 8, 2, 128), (128, 32, 8, 4, 128), (128, 32, 8, 4)],
               "dkdv": [(64, 64, 8, 2, 168)], "dq": [(128, 32, 8, 2, 128), (64, 32, 4, 3, 168)]}}


def rows(which, head_dim):
    cls = configs.head_dim_class(head_dim)
    return list(TABLES[which][cls]) + EXTRA[cls][which]


def steady(fn, n=40, rounds=7):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / n)
    ts.sort()
    return ts[len(ts) // 2]


if __name__ == "__main__":
    jobs = [(w, c, s, "bfloat16") for s in SHAPES for w in TABLES for c in rows(w, s[-1])]
    t0 = time.time()
    with mp.get_context("spawn").Pool(16) as pool:
        errs = [e for e in pool.map(fb._compile_job, jobs, chunksize=1) if e]
    print(f"compiled {len(jobs)} in {time.time() - t0:.0f} s; {len(errs)} failed", errs, flush=True)
    for shape in SHAPES:
        tensors = fb._make_tensors(shape, torch.bfloat16, real=True)
        for which in TABLES:
            fns = {c: fb._run_one(which, fb._single(which, c), tensors) for c in rows(which, shape[-1])}
            tb = {c: [] for c in fns}
            st = {c: [] for c in fns}
            for _ in range(3):
                for c, fn in fns.items():
                    tb[c].append(configs._bench(fn, (0.5,))[0])
                    st[c].append(steady(fn))
            line = "; ".join(f"{c} bench {min(tb[c]):.4f}/{max(tb[c]):.4f} steady {min(st[c]):.4f}/{max(st[c]):.4f}"
                             for c in fns)
            print(f"{shape} {which}: {line}", flush=True)
