"""attention=cuda with the default rules at head_dim 128, N = 1025 and 4096 (sm90 forward; backward with the column-split dQ added
by TMA reduce-add, the default since 2026-12-04) vs float64.

Run from the repository root on an H100/H200: python benchmarks/results/cuda_gpu_auto128_check.py
"""
import sys

sys.path[:0] = ["tests", "."]

import torch
from conftest import check_against_reference, make_qkv

from kernels.cuda import attention, ops

for n in (1025, 4096):
    q, k, v = make_qkv(1, 2, n, 128, dtype=torch.bfloat16, device="cuda")
    assert (ops.fwd_path(q), ops.bwd_path(q), ops.BWD_DQ) == ("sm90", "sm90", "auto")
    assert ops.sm90_bwd_options(q) == (True, False, False, True, False)  # columns-tma
    print(n, check_against_reference(attention, q, k, v), flush=True)
print("auto128 ok")
