"""Shared test helpers: markers, random inputs, the float64 reference and the error rule.

Error rule (flash-attention's): a kernel's max abs error against the float64 reference may be at
most 2× the naive backend's error at the same dtype, plus a floor at the rounding level: a small
per-dtype constant plus ``ACCUM_ROUNDING`` float32 epsilons of the reference's magnitude. Every
kernel accumulates in float32 in its own summation order, so at float32 inputs both errors are pure
rounding and the kernel's can exceed 2× naive's by a few epsilons: measured up to 2.35 eps·max|ref|
for flash's dk over 60 random (2, 1, 33, 32) float32 draws. At fp16/bf16 the term is negligible
beside the dtype's own error; there the floor adds half a unit in the last place of max|ref| in
the output dtype, the rounding that storing any result in that dtype costs. Naive computes both
products and the softmax in float32 and rounds once (kernels/naive.py), while a FlashAttention-2
kernel rounds P and dS to fp16/bf16 for its products: flash's fp16 error on the interpreter reaches 2.7×
naive's, and the floor covers that. Measured over 384 draws of (1, 2, N, d), N ∈ {17, 65, 128, 197},
d ∈ {16, 32, 64, 80}: err / (2·naive + floor) at most 0.80 (dq; 99th percentile 0.68) in fp16, 0.39
in fp32.
"""
from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
# Triton picks interpreter or compiler once, at its first import, and importing timm (via torch._dynamo)
# imports it: without a GPU, select the interpreter here, before any test module is collected.
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
ERROR_FLOOR = {torch.float32: 1e-6, torch.float16: 1e-5, torch.bfloat16: 1e-4, torch.float64: 1e-12}
ACCUM_ROUNDING = 8  # float32 epsilons of max|ref| (see the module docstring)


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def is_hopper() -> bool:
    """Whether a compute capability 9.0 GPU (H100, H200) is present: the Hopper kernels' tests need one."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def make_qkv(B, H, N, d, dtype=torch.float32, device="cpu", scale=1.0, requires_grad=True, seed=None):
    """Fresh random ``(B, H, N, d)`` q, k, v (never zeros or constants); optionally seeded."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed if seed is not None else torch.seed() % (2**63))
    out = []
    for _ in range(3):
        t = (torch.randn(B, H, N, d, generator=gen) * scale).to(device=device, dtype=dtype)
        out.append(t.requires_grad_(requires_grad))
    return out


def reference_attention(q, k, v, softmax_scale=None):
    """float64 ``softmax(q kᵀ · scale) v``; inputs are upcast, the result stays float64."""
    q, k, v = (t.detach().double().requires_grad_(t.requires_grad) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    p = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    return p @ v, (q, k, v)


def forward_backward(fn, q, k, v, do, softmax_scale=None):
    """Run ``fn`` forward and backward with upstream grad ``do``; returns (out, dq, dk, dv)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, softmax_scale=softmax_scale)
    out.backward(do.to(out.dtype))
    return out.detach(), q.grad, k.grad, v.grad


def pack_qkv(q, k, v):
    """Three (B, H, N, d) tensors as one packed (B, N, 3, H, d) view (the inverse of ``kernels.split_qkv``)."""
    return torch.stack((q, k, v), dim=2).transpose(1, 3)


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


def error_floor(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The error rule's floor (module docstring) for a result stored in ``dtype`` against the float64 ``ref``: the
    dtype's constant, ACCUM_ROUNDING float32 epsilons and half a unit in the last place of max|ref|."""
    return ERROR_FLOOR[dtype] + ref.abs().max().item() * (
        ACCUM_ROUNDING * torch.finfo(torch.float32).eps + 0.5 * torch.finfo(dtype).eps)


def check_against_reference(fn, q, k, v, softmax_scale=None, baseline=None, bound_factor=1.0):
    """Compare ``fn``'s forward and dq, dk, dv with float64; bound = 2× ``baseline``'s error + floor, times
    ``bound_factor`` (1 but for draws a test names as sitting at the bound).

    ``baseline`` defaults to the naive backend at the same dtype and device. Returns the dict of
    errors; raises AssertionError naming the worst tensor otherwise.
    """
    from kernels.naive import attention as naive

    baseline = baseline or naive
    ref_out, (rq, rk, rv) = reference_attention(q, k, v, softmax_scale)
    do = torch.randn_like(ref_out)
    ref_out.backward(do)
    refs = (ref_out.detach(), rq.grad, rk.grad, rv.grad)
    got = forward_backward(fn, q, k, v, do, softmax_scale)
    base = forward_backward(baseline, q, k, v, do, softmax_scale)
    report = {}
    for name, r, g, b in zip(("out", "dq", "dk", "dv"), refs, got, base):
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        floor = error_floor(r, q.dtype)
        err, base_err = max_err(g, r), max_err(b, r)
        report[name] = (err, base_err)
        assert err <= bound_factor * (2 * base_err + floor), (
            f"{name}: max error {err:.3e} > {bound_factor:g} × (2 × baseline error {base_err:.3e} + floor {floor:.1e}) "
            f"(shape {tuple(q.shape)}, dtype {q.dtype})"
        )
    return report
