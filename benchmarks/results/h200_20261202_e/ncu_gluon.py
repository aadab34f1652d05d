"""Profile target (run from the repository root with PYTHONPATH=. under ncu --profile-from-start off, args B H N d):
the Gluon forward (128, 64, 3, 8) and the Triton forward, once each after warm-up."""
import sys

import torch

from kernels.flash import gluon_fwd, op

B, H, N, d = map(int, sys.argv[1:5])
q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
s = d ** -0.5
for _ in range(3):
    gluon_fwd.fwd(q, k, v, s, 128, 64, 3, 8); op._fwd(q, k, v, s, True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
gluon_fwd.fwd(q, k, v, s, 128, 64, 3, 8); op._fwd(q, k, v, s, True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done")
