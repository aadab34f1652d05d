"""Hopper forward schedules (sequential, pingpong, wide, persistent) against cuDNN's forward, bf16, CUDA events,
median of 3 runs of 20 after warm-up; ViT shapes (batch such that B*N ~ 50k tokens) and the long ones."""
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.cuda import build

ext = build.extension()


def cudnn(q, k, v, s):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, scale=s)


def ms(fn, reps=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


shapes = [(256, 12, 197, 64), (128, 12, 401, 64), (64, 12, 577, 64), (32, 12, 785, 64), (32, 12, 1025, 64),
          (16, 12, 2048, 64), (8, 12, 4096, 64), (256, 12, 197, 128), (64, 12, 577, 128), (32, 12, 1025, 128),
          (16, 12, 2048, 128), (8, 16, 4096, 128)]
print("| B | H | N | d | cudnn | sequential | pingpong | wide | persistent |")
for B, H, N, d in shapes:
    qkv = torch.randn(B, N, 3, H, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    s = d**-0.5
    row = [ms(lambda q=q, k=k, v=v, s=s: cudnn(q, k, v, s))]
    for name in ("fwd_sm90", "fwd_sm90_pingpong", "fwd_sm90_wide", "fwd_sm90_persistent"):
        fn = getattr(ext, name)
        row.append(ms(lambda f=fn, q=q, k=k, v=v, s=s: f(q, k, v, s)) if not (name.endswith("wide") and d != 64) else float("nan"))
    print(f"| {B} | {H} | {N} | {d} | " + " | ".join(f"{t:.3f}" for t in row) + " |", flush=True)
