"""The seed's vector-add example: Triton (CPU under TRITON_INTERPRET=1, and GPU) and CUDA C++ (GPU)
against torch.add, on sizes that leave a partial block and on unaligned views."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # must precede the first `import triton` in this process
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from kernels.vector_add import add_cuda, add_torch, add_triton

SIZES = (1, 7, 4097, 100_003)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_matches_torch_add(n, dtype):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.randn(n, device=device).to(dtype) for _ in range(2))
    torch.testing.assert_close(add_triton(a, b), add_torch(a, b), rtol=0, atol=0)


def test_triton_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        add_triton(torch.randn(4), torch.randn(5))


def test_cuda_rejects_cpu_and_float16():
    with pytest.raises(ValueError, match="CUDA tensors"):
        add_cuda(torch.randn(4), torch.randn(4))
    with pytest.raises(TypeError, match="float32"):
        add_cuda(torch.randn(4).half(), torch.randn(4).half())


@pytest.mark.gpu
@pytest.mark.parametrize("n", (*SIZES, 1 << 24))
def test_cuda_matches_torch_add(n):
    a, b = (torch.randn(n, device="cuda") for _ in range(2))
    torch.testing.assert_close(add_cuda(a, b), add_torch(a, b), rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_unaligned_views_and_2d():
    base = torch.randn(2, 10_001, device="cuda")
    a, b = base[0, 1:], base[1, :-1]  # 4-byte offsets: the scalar path
    torch.testing.assert_close(add_cuda(a, b), a + b, rtol=0, atol=0)
    x, y = torch.randn(33, 65, device="cuda"), torch.randn(33, 65, device="cuda")
    torch.testing.assert_close(add_cuda(x, y), x + y, rtol=0, atol=0)
