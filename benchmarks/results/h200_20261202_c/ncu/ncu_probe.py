"""Profile target: tune flash at a shape, then one fwd+bwd between cudaProfilerStart/Stop."""
import sys

import torch

from kernels.flash import attention

B, H, N, d = map(int, sys.argv[1:5])
torch.manual_seed(0)
q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    out = attention(q, k, v)
    out.backward(do)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
out = attention(q, k, v)
out.backward(do)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done", B, H, N, d)
