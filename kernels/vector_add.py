"""The seed's worked example: element-wise ``c = a + b`` written twice, in CUDA C++ and in Triton.

Thread-level (CUDA C++, ``kernels/cuda/csrc/vector_add.cu``): each thread finds its global index
from ``blockIdx.x * blockDim.x + threadIdx.x``, guards against running past ``n`` and handles 4
consecutive elements (one 16-byte load per input); the host launches ``ceil(n / 4 / 256)`` blocks of
256 threads. Block-level (Triton, below): each program takes ``BLOCK`` offsets from its
``program_id`` and masks the tail. Both are memory-bound (12 bytes moved per float32 element), so
the ceiling is the device-to-device copy bandwidth (4.16 TB/s measured on the H200 beside these kernels,
benchmarks/results/cuda_h200.md; 4.25 TB/s in ../shared/perf/h200_baseline.md).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # elements per Triton program


@triton.jit
def _add_kernel(A, B, C, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(A + offsets, mask=mask)
    b = tl.load(B + offsets, mask=mask)
    tl.store(C + offsets, a + b, mask=mask)


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"a and b must be tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have one dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"a and b must be on one device, got {a.device} and {b.device}")


def add_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a + b`` with the Triton kernel; any shape and dtype, same for both; returns contiguous.

    Runs on a CUDA GPU, or on the CPU under ``TRITON_INTERPRET=1`` (set before importing triton).
    Raises TypeError/ValueError on mismatched inputs.
    """
    _check(a, b)
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty_like(a)
    n = a.numel()
    if n:
        _add_kernel[(triton.cdiv(n, BLOCK),)](a, b, c, n, BLOCK=BLOCK)
    return c


def add_cuda(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a + b`` with the CUDA C++ kernel; float32 CUDA tensors of one shape; returns contiguous.

    Raises TypeError (not float32), ValueError (shapes/devices differ, not CUDA), RuntimeError (the
    extension cannot be built: no nvcc).
    """
    _check(a, b)
    if a.dtype != torch.float32:
        raise TypeError(f"add_cuda handles float32 only, got {a.dtype}; use add_triton or torch.add")
    if a.device.type != "cuda":
        raise ValueError(f"add_cuda needs CUDA tensors, got {a.device}")
    from kernels.cuda import build

    return build.extension().vector_add(a, b)


def add_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.add(a, b)``: PyTorch's own kernel, the peer in the benchmark."""
    return torch.add(a, b)
