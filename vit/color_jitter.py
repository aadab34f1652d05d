"""The colour jitter of a whole batch in one kernel launch: each image's brightness, contrast and saturation blends
in its own order, as PIL's ``ImageEnhance`` computes them.

``data.decode=gpu`` jitters 256 crops a batch. Written with PyTorch ops (:func:`vit.gpu_decode.jitter_ops`) that is
about 20 elementwise passes over the float32 batch for each of the four positions (a grayscale, a mean, two selects,
a blend), the largest GPU work of the decoder after nvJPEG itself: about 8 ms of its 20 ms for three batches on the
H200 (benchmarks/results/h200_20261202.md, the decoder probe), while the training step runs beside it. Here one
program owns one image: a first pass over its pixels applies the ops before contrast and sums the grayscale (only
where the image has a contrast factor other than 1), a second applies all four and writes uint8.

Arithmetic, per op at its position, on the integer RGB values x (exact in float32):
brightness blends with black, contrast with the grayscale mean, saturation with the grayscale pixel:
``floor(clamp(base + f·(x − base), 0, 255))``, rounded after each of the three operations as separate PyTorch kernels
round (the launch passes ``enable_fp_fusion=False``: a fused multiply-add rounds once and can land a pixel one level
off). The grayscale is PIL's ``convert("L")``, ``(19595 r + 38470 g + 7471 b + 2¹⁵) >> 16``; the contrast mean is
PIL's ``int(mean + 0.5)`` of it, here ``(2·Σ + n) // (2n)`` in integers, exact for any image size. The result is
bitwise the PyTorch version's (tests/test_gpu_decode.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from vit.gpu_decode import position_factors, to_device

BLOCK = 1024  # pixels per step of a program's loop


@triton.jit
def _gray(r, g, b):
    """PIL's ``convert("L")`` of integer-valued float32 channels, as float32."""
    return ((r.to(tl.int32) * 19595 + g.to(tl.int32) * 38470 + b.to(tl.int32) * 7471 + 32768) >> 16).to(tl.float32)


@triton.jit
def _blend(x, base, f):
    return tl.floor(tl.minimum(tl.maximum(base + f * (x - base), 0.0), 255.0))


@triton.jit
def _apply(r, g, b, op, f, mean):
    """One position's op on the three channels: 0 brightness, 1 contrast, 2 saturation (3, hue: f = 1, no change)."""
    gray = _gray(r, g, b)
    base = tl.where(op == 2, gray, tl.where(op == 1, mean, 0.0))
    return _blend(r, base, f), _blend(g, base, f), _blend(b, base, f)


@triton.jit
def _load(X, offs, mask, plane):
    r = tl.load(X + offs, mask=mask, other=0).to(tl.float32)
    g = tl.load(X + plane + offs, mask=mask, other=0).to(tl.float32)
    b = tl.load(X + 2 * plane + offs, mask=mask, other=0).to(tl.float32)
    return r, g, b


@triton.jit
def color_jitter_kernel(X, Out, Order, Factors, PIXELS, BLOCK: tl.constexpr):
    """Grid (B,). X, Out: uint8 (B, 3, H, W) contiguous, PIXELS = H·W; Order: int64 (B, 4) op ids; Factors: float32
    (B, 4), the factor at each position (1 at hue's). The contrast position's mean is of the image after the ops
    before it."""
    img = tl.program_id(0)
    X += img.to(tl.int64) * 3 * PIXELS
    Out += img.to(tl.int64) * 3 * PIXELS
    op0, op1, op2, op3 = tl.load(Order + img * 4), tl.load(Order + img * 4 + 1), tl.load(Order + img * 4 + 2), \
        tl.load(Order + img * 4 + 3)
    f0, f1, f2, f3 = tl.load(Factors + img * 4), tl.load(Factors + img * 4 + 1), tl.load(Factors + img * 4 + 2), \
        tl.load(Factors + img * 4 + 3)
    at = tl.where(op0 == 1, 0, tl.where(op1 == 1, 1, tl.where(op2 == 1, 2, tl.where(op3 == 1, 3, 4))))  # contrast's
    mean = tl.full([], 0.0, tl.float32)
    if (at < 4) & (tl.where(at == 0, f0, tl.where(at == 1, f1, tl.where(at == 2, f2, f3))) != 1.0):
        total = tl.zeros([BLOCK], tl.int32)
        for start in range(0, PIXELS, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < PIXELS
            r, g, b = _load(X, offs, mask, PIXELS)
            if at > 0:
                r, g, b = _apply(r, g, b, op0, f0, mean)
            if at > 1:
                r, g, b = _apply(r, g, b, op1, f1, mean)
            if at > 2:
                r, g, b = _apply(r, g, b, op2, f2, mean)
            total += tl.where(mask, _gray(r, g, b).to(tl.int32), 0)
        s = tl.sum(total.to(tl.int64), 0)
        mean = ((2 * s + PIXELS) // (2 * PIXELS)).to(tl.float32)
    for start in range(0, PIXELS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < PIXELS
        r, g, b = _load(X, offs, mask, PIXELS)
        r, g, b = _apply(r, g, b, op0, f0, mean)
        r, g, b = _apply(r, g, b, op1, f1, mean)
        r, g, b = _apply(r, g, b, op2, f2, mean)
        r, g, b = _apply(r, g, b, op3, f3, mean)
        tl.store(Out + offs, r.to(tl.uint8), mask=mask)
        tl.store(Out + PIXELS + offs, g.to(tl.uint8), mask=mask)
        tl.store(Out + 2 * PIXELS + offs, b.to(tl.uint8), mask=mask)


def color_jitter(x: torch.Tensor, order: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """torchvision's ColorJitter (no hue) as PIL computes it, each image with its own op order and factors; bitwise
    :func:`vit.gpu_decode.jitter_ops`.

    Args:
        x: uint8 (B, 3, H, W), on CUDA (or the CPU under ``TRITON_INTERPRET=1``).
        order: int64 (B, 4): each image's op ids by position (0 brightness, 1 contrast, 2 saturation, 3 hue: skipped),
            a permutation of 0-3 (torchvision's ``get_params``), on the CPU.
        factors: float32 (B, 3): brightness, contrast and saturation factors (1 for an op without a range), on the CPU.

    Returns:
        uint8 (B, 3, H, W) on x's device.

    Raises:
        ValueError: x not uint8 (B, 3, H, W), or order and factors not (B, 4) and (B, 3).
    """
    if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"color_jitter takes a uint8 (B, 3, H, W) batch, got {tuple(x.shape)} {x.dtype}")
    if order.shape != (x.shape[0], 4) or factors.shape != (x.shape[0], 3):
        raise ValueError(f"color_jitter needs order (B, 4) and factors (B, 3) for B = {x.shape[0]}, got "
                         f"{tuple(order.shape)} and {tuple(factors.shape)}")
    f = position_factors(order, factors)
    x = x.contiguous()
    out = torch.empty_like(x)
    color_jitter_kernel[(x.shape[0],)](x, out, to_device(order.contiguous(), x.device),
                                       to_device(f.contiguous(), x.device), x.shape[2] * x.shape[3], BLOCK=BLOCK,
                                       enable_fp_fusion=False)
    return out
