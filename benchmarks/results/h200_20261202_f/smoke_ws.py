"""Call V's smoke check of the TMA producer-warp forward against the Triton forward (ran as .device/smoke_ws.py)."""
import time

import torch

from kernels.flash import gluon_ws, op

for shape in [(1, 1, 300, 64), (2, 3, 4096, 64), (2, 3, 1025, 128), (1, 2, 1, 64)]:
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    t = time.time()
    out, lse = gluon_ws.fwd(q, k, v, 0.125)
    torch.cuda.synchronize()
    ro, rl = op._fwd(q, k, v, 0.125)
    print(shape, "max |out diff|", (out.float() - ro.float()).abs().max().item(), "lse", (lse - rl).abs().max().item(), f"{time.time()-t:.1f}s", flush=True)
