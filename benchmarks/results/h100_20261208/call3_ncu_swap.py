"""One backward each at (8, 16, 4096, 128) bf16: the ping-pong columns-tma kernel (auto's), the sequential columns-tma
kernel and the 80-row swap-tma kernel, for Nsight Compute."""
import torch

from kernels.cuda import attention, ops

q, k, v, do = (torch.randn(8, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
q, k, v = (t.requires_grad_() for t in (q, k, v))
ops.FWD_PATH, ops.BWD_PATH = "sm90", "sm90"
for dq, sched in (("columns-tma", "pingpong"), ("columns-tma", "sequential"), ("swap-tma", "sequential")):
    ops.BWD_DQ, ops.BWD_SM90 = dq, sched
    torch.autograd.grad(attention(q, k, v), (q, k, v), do)
torch.cuda.synchronize()
