import sys

import torch

from kernels.cuda import attention

B, H, N, d = (int(x) for x in sys.argv[1:5])
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
do = torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g)
for _ in range(3):
    out = attention(q, k, v)
    out.backward(do)
torch.cuda.synchronize()
