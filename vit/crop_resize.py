"""One kernel launch for a whole batch of crops: each image's box cut out, resized with antialias, flipped.

``data.decode=gpu`` decodes a batch into 256 images of 256 sizes. torchvision resizes one image per call, so the
batch cost two kernels an image (the uint8-to-float copy and the resize) and as many Python calls in the decoder
thread, which compete with the training step for SMs and the GIL. Here one Triton program computes a band of
output rows of one (image, channel): the source pixels come from a flat buffer holding every image, found through a
per-image row of ``meta``. Measured on the H200 (2026-12-02, benchmarks/results/h200_20261202.md): 0.87 ms a batch
of 256 against 2.4 ms for the per-image resizes and 1.1 ms for their copies to float, and ViT-B/16 on a JPEG folder
waits 1-3 ms a step for data instead of 10 (nvJPEG's own work, a kernel and a copy an image, remains).

The arithmetic is PyTorch's antialiased ``interpolate`` (``aten/src/ATen/native/cuda/UpSampleBilinear2d.cu``,
``upsample_gen2d_aa``; PIL's resampling filters): for output index i at scale s = in / out, the source span is
centred at s·(i + ½) with support ½·taps·max(s, 1); each weight is filter((j + xmin − centre + ½) / max(s, 1)),
normalised by the span's sum; a row is Σ_x w_x·src, the pixel Σ_y w_y·row. Bicubic uses PIL's a = −0.5. Then the
result is clamped to [0, 255] and rounded half to even, as v2's ``resized_crop`` does on CUDA. The order of the
sums is PyTorch's, but the compilers may fuse multiply-adds differently, so results can differ from it by float
rounding: a pixel sitting at .5 can round the other way (tests/test_gpu_decode.py bounds how often).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from vit.gpu_decode import to_device

ROWS = 8  # output rows per program


@triton.jit
def _filter(x, BICUBIC: tl.constexpr):
    x = tl.abs(x)
    if BICUBIC:
        a = -0.5
        near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
        return tl.where(x < 1.0, near, tl.where(x < 2.0, far, 0.0))
    return tl.where(x < 1.0, 1.0 - x, 0.0)


@triton.jit
def _span(o, size_in, size_out, HALF_TAPS: tl.constexpr):
    """Per output index ``o`` (int32 vector): (start, count, start − centre, 1 / max(s, 1)) of its source span, and
    the program's bound on count."""
    scale = size_in.to(tl.float32) / size_out
    support = tl.where(scale >= 1.0, HALF_TAPS * scale, HALF_TAPS * 1.0)
    invscale = tl.where(scale >= 1.0, 1.0 / scale, 1.0)
    center = scale * (o.to(tl.float32) + 0.5)
    start = tl.maximum((center - support + 0.5).to(tl.int32), 0)
    count = tl.minimum((center + support + 0.5).to(tl.int32), size_in) - start
    bound = (2.0 * support).to(tl.int32) + 2
    return start, count, start.to(tl.float32) - center, invscale, bound


@triton.jit
def _weight_sum(count, start_m_center, invscale, bound, BICUBIC: tl.constexpr):
    total = tl.zeros(count.shape, tl.float32)
    for j in range(bound):
        w = _filter((j + start_m_center + 0.5) * invscale, BICUBIC)
        total += tl.where(j < count, w, 0.0)
    return tl.where(total != 0.0, total, 1.0)


@triton.jit
def crop_resize_kernel(Src, Meta, Out, OUT_H, OUT_W, BICUBIC: tl.constexpr, ROWS: tl.constexpr,
                       COLS: tl.constexpr):
    """Out[b, c, rows] (uint8, (B, 3, OUT_H, OUT_W) contiguous) from image b's channel c in Src (uint8, flat): the
    program's ``ROWS`` output rows × all ``OUT_W <= COLS`` columns. Meta (int64, (B, 8)): offset of image b in Src,
    its height, width, the box's top, left, height, width, and 1 to flip. Separable: each source row the rows need
    is filtered across once (Σ_x w_x·src, all columns), then added into every output row whose span holds it with
    that row's w_y, in ascending source row: PyTorch's order of the sums."""
    bc, tile = tl.program_id(0), tl.program_id(1)
    b, c = bc // 3, bc % 3
    row = Meta + b * 8
    img_h, img_w = tl.load(row + 1), tl.load(row + 2)
    top, left = tl.load(row + 3), tl.load(row + 4)
    box_h, box_w, flip = tl.load(row + 5), tl.load(row + 6), tl.load(row + 7)
    plane = Src + tl.load(row) + c * img_h * img_w + top * img_w + left  # the box's first pixel in channel c
    HALF: tl.constexpr = 2.0 if BICUBIC else 1.0
    oy = tile * ROWS + tl.arange(0, ROWS)  # (ROWS,)
    ox = tl.arange(0, COLS)  # (COLS,)
    rows_ok, cols_ok = oy < OUT_H, ox < OUT_W
    sx = tl.where(flip != 0, OUT_W - 1 - ox, ox)  # a flipped output column reads the mirrored resized column
    y0, ny, y0mc, yinv, ybound = _span(oy, box_h.to(tl.int32), OUT_H, HALF)
    x0, nx, x0mc, xinv, xbound = _span(sx, box_w.to(tl.int32), OUT_W, HALF)
    ysum = _weight_sum(ny, y0mc, yinv, ybound, BICUBIC)
    xsum = _weight_sum(nx, x0mc, xinv, xbound, BICUBIC)
    first = tl.min(tl.where(rows_ok, y0, 1 << 30))
    last = tl.max(tl.where(rows_ok, y0 + ny, 0))
    acc = tl.zeros([ROWS, COLS], tl.float32)
    for r in range(first, last):
        line = plane + r * img_w  # img_w is int64
        across = tl.zeros([COLS], tl.float32)  # source row r filtered across, for every output column
        for jx in range(xbound):
            wx = _filter((jx + x0mc + 0.5) * xinv, BICUBIC) / xsum
            ok = cols_ok & (jx < nx)
            v = tl.load(line + x0 + jx, mask=ok, other=0).to(tl.float32)
            across += tl.where(ok, v * wx, 0.0)
        jy = r - y0  # (ROWS,) source row r's place in each output row's span
        wy = _filter((jy + y0mc + 0.5) * yinv, BICUBIC) / ysum
        wy = tl.where((jy >= 0) & (jy < ny), wy, 0.0)
        acc += wy[:, None] * across[None, :]
    acc = tl.minimum(tl.maximum(acc, 0.0), 255.0)
    low = tl.floor(acc)
    frac = acc - low
    odd = (low.to(tl.int32) % 2) == 1
    rounded = low + tl.where((frac > 0.5) | ((frac == 0.5) & odd), 1.0, 0.0)  # half to even, as torch.round
    out = Out + bc.to(tl.int64) * OUT_H * OUT_W + oy[:, None] * OUT_W + ox[None, :]
    tl.store(out, rounded.to(tl.uint8), mask=rows_ok[:, None] & cols_ok[None, :])


def crop_resize(images: list[torch.Tensor], boxes: list[list[int]], flips: list[bool], size: list[int],
                bicubic: bool) -> torch.Tensor:
    """uint8 (B, 3, H, W) on the images' device: image b's box ``[top, left, height, width]`` resized to ``size``
    (H, W) with antialias (bicubic or bilinear, as PyTorch's ``interpolate(..., antialias=True)``), mirrored left to
    right where ``flips[b]``.

    Args:
        images: B uint8 (3, h, w) tensors on one device (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        boxes: B boxes inside their images, ``[top, left, height, width]`` in pixels.
        flips: B booleans.
        size: ``[H, W]`` of the output.
        bicubic: bicubic (PIL's a = −0.5) if True, else bilinear.

    Raises:
        ValueError: an image that is not uint8 (3, h, w), images on several devices, a box outside its image or
            empty, or list lengths that differ.
    """
    if not (len(images) == len(boxes) == len(flips)) or not images:
        raise ValueError(f"crop_resize needs as many images, boxes and flips (at least one), got {len(images)}, "
                         f"{len(boxes)}, {len(flips)}")
    device = images[0].device
    for img, (top, left, h, w) in zip(images, boxes):
        if img.dtype != torch.uint8 or img.dim() != 3 or img.shape[0] != 3 or img.device != device:
            raise ValueError(f"crop_resize takes uint8 (3, h, w) images on one device, got {tuple(img.shape)} "
                             f"{img.dtype} on {img.device}")
        if h <= 0 or w <= 0 or top < 0 or left < 0 or top + h > img.shape[1] or left + w > img.shape[2]:
            raise ValueError(f"box {[top, left, h, w]} is not inside a {tuple(img.shape[1:])} image")
    flat = torch.cat([img.contiguous().view(-1) for img in images])  # every image, one buffer
    offsets = [0]
    for img in images[:-1]:
        offsets.append(offsets[-1] + img.numel())
    meta = torch.tensor([[o, img.shape[1], img.shape[2], *box, int(f)]
                         for o, img, box, f in zip(offsets, images, boxes, flips)], dtype=torch.int64)
    meta = to_device(meta, device)
    out = torch.empty(len(images), 3, *size, dtype=torch.uint8, device=device)
    grid = (len(images) * 3, triton.cdiv(size[0], ROWS))
    crop_resize_kernel[grid](flat, meta, out, size[0], size[1], BICUBIC=bicubic, ROWS=ROWS,
                             COLS=triton.next_power_of_2(size[1]))
    return out
