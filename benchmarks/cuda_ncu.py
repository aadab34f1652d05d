"""One forward and one backward per dK/dV variant at (8, 12, 4096, 64) bf16, for Nsight Compute:

    ncu --clock-control none --kernel-name regex:'fwd_kernel|bwd_kernel' --section SpeedOfLight \
        --section Occupancy --section WarpStateStats python benchmarks/cuda_ncu.py
"""
import torch

from kernels.cuda import attention, ops

q, k, v, do = (torch.randn(8, 12, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
q, k, v = (t.requires_grad_() for t in (q, k, v))
for warps in (4, 8):
    ops.BWD_WARPS = warps
    torch.autograd.grad(attention(q, k, v), (q, k, v), do)
torch.cuda.synchronize()
