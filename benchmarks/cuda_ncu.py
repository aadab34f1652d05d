"""One forward and one backward per kernel variant at (8, 12, 4096, 64) bf16, for Nsight Compute:
mma.sync with 4- and 8-warp dK/dV tiles and, on compute capability 9.0, the Hopper kernels.

    ncu --clock-control none --kernel-name regex:'fwd_kernel|bwd_kernel|fwd_sm90_kernel|bwd_sm90_kernel' \
        --section SpeedOfLight --section Occupancy --section WarpStateStats python benchmarks/cuda_ncu.py
"""
import torch

from kernels.cuda import attention, ops

q, k, v, do = (torch.randn(8, 12, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
q, k, v = (t.requires_grad_() for t in (q, k, v))
variants = [("sm80", 4), ("sm80", 8)] + ([("sm90", 8)] if torch.cuda.get_device_capability() == (9, 0) else [])
for path, warps in variants:
    ops.FWD_PATH, ops.BWD_PATH, ops.BWD_WARPS = path, path, warps
    torch.autograd.grad(attention(q, k, v), (q, k, v), do)
torch.cuda.synchronize()
