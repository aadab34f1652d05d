"""Per-kernel config timing two ways: do_bench (L2 flushed, the autotuner's way) and steady back-to-back launches."""
import multiprocessing as mp
import os
import sys
import time

import torch
import triton
import triton.testing

sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import flash_bench as fb

D64 = {"fwd": [(64, 64, 4, 3, 112), (64, 64, 4, 3, 104), (64, 64, 4, 3, 96), (128, 64, 8, 3), (128, 64, 8, 3, 80),
               (64, 32, 4, 3, 96), (64, 32, 4, 3, 80), (64, 64, 4, 3)],
       "dkdv": [(32, 64, 4, 3, 128), (32, 64, 4, 3, 120), (32, 64, 4, 3, 104), (32, 64, 4, 4, 128), (64, 64, 4, 3, 168),
                (64, 64, 4, 2, 168), (64, 64, 4, 2, 128), (32, 128, 4, 3, 168), (32, 128, 4, 3, 128), (32, 64, 4, 3)],
       "dq": [(64, 32, 4, 3, 96), (64, 32, 4, 3, 80), (128, 64, 8, 3), (128, 64, 8, 3, 80), (64, 64, 4, 3, 128),
              (64, 64, 4, 3, 104), (64, 32, 4, 4, 96)]}
D128 = {"fwd": [(128, 32, 8, 3), (128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3, 128), (128, 32, 8, 4),
                (128, 64, 8, 3, 128)],
        "dkdv": [(32, 64, 4, 3), (64, 128, 8, 3), (64, 128, 8, 3, 128), (32, 128, 8, 3, 128), (32, 64, 8, 3),
                 (32, 64, 4, 3, 200), (64, 64, 8, 3)],
        "dq": [(128, 32, 4, 3), (128, 64, 8, 3), (128, 64, 8, 3, 128), (128, 32, 8, 3, 128), (64, 64, 4, 3),
               (128, 32, 4, 3, 200)]}
SHAPES = [(256, 12, 197, 64), (128, 16, 577, 64), (32, 12, 1024, 64), (8, 12, 4096, 64), (256, 12, 197, 128), (8, 16, 4096, 128)]

def single(which, cfg):
    from kernels.flash import kernels as K
    kernel = {"fwd": K.flash_fwd_kernel, "dkdv": K.flash_bwd_dkdv_kernel, "dq": K.flash_bwd_dq_kernel}[which]
    kw = dict(zip(fb._NAMES[which], cfg[:2]))
    c = triton.Config(kw, num_warps=cfg[2], num_stages=cfg[3], maxnreg=cfg[4] if len(cfg) > 4 else None)
    return triton.autotune([c], key=["N_BUCKET", "HEAD_DIM"])(kernel)

def job(j):
    which, cfg, shape = j
    try:
        fb._run_one(which, single(which, cfg), fb._make_tensors(shape, torch.bfloat16, real=False))()
        torch.cuda.synchronize(); return None
    except Exception as e:  # noqa: BLE001  reported
        return f"{j}: {type(e).__name__}: {str(e)[:100]}"

def steady(fn, n=40, rounds=7):
    for _ in range(5): fn()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for _ in range(n): fn()
        b.record(); b.synchronize(); ts.append(a.elapsed_time(b) / n)
    ts.sort(); return ts[len(ts) // 2]

if __name__ == "__main__":
    shapes = SHAPES if len(sys.argv) < 2 else [tuple(map(int, s.split(","))) for s in sys.argv[1:]]
    jobs = [(w, c, s) for s in shapes for w, cs in (D64 if s[-1] == 64 else D128).items() for c in cs]
    t = time.time()
    with mp.get_context("spawn").Pool(16) as pool:
        errs = [e for e in pool.map(job, jobs, chunksize=1) if e]
    print(f"compiled {len(jobs)} in {time.time()-t:.0f} s; {len(errs)} failed", flush=True)
    for e in errs: print("  ", e)
    for shape in shapes:
        tensors = fb._make_tensors(shape, torch.bfloat16, real=True)
        for which, cs in (D64 if shape[-1] == 64 else D128).items():
            rows = []
            for c in cs:
                try:
                    fn = fb._run_one(which, single(which, c), tensors)
                    fl = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
                    st = steady(fn)
                    rows.append((st, fl, c))
                except Exception as e:  # noqa: BLE001  reported
                    print(f"  {shape} {which} {c}: {type(e).__name__}", flush=True)
            rows.sort()
            print(f"{shape} {which}: " + "; ".join(f"{c} steady {s:.4f} flushed {f:.4f}" for s, f, c in rows), flush=True)
