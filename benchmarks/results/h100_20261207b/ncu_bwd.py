"""One cuda-backend forward+backward at (4, 12, 4096, 64) and (2, 16, 4096, 128), bf16, after warm-up, for ncu -k bwd_sm90."""
import torch

from kernels import get_attention

cuda = get_attention("cuda")
for shape in ((4, 12, 4096, 64), (2, 16, 4096, 128)):
    q, k, v, do = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    for _ in range(2):
        torch.autograd.grad(cuda(q, k, v), (q, k, v), do)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    torch.autograd.grad(cuda(q, k, v), (q, k, v), do)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
