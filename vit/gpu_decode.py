"""``data.decode=gpu``: the workers read file bytes, the GPU decodes the batch and augments it.

The train split only (validation keeps the workers' PIL path). Three parts:

- :class:`BytesFolder` (in the loader's workers) reads each file's bytes and its header (PIL, no decode) and
  draws the sample's augmentation exactly as timm's train transform would for the same seed: the
  RandomResizedCrop box (timm's ``get_params``), the flip (``torch.rand(1) < p``, torchvision's) and the
  ColorJitter order and factors (torchvision's ``get_params``), so for a given sample seed both paths crop,
  flip and jitter alike and differ only in pixel arithmetic. Files the GPU should not get are decoded here
  with PIL by :func:`vit.images.load_rgb`'s rules (not ``torchvision.io.decode_image``, so alpha, CMYK and
  16-bit images come out as on the CPU path): not JPEG by content (PNG...), CMYK/YCCK JPEGs, JPEGs without an
  end-of-image marker (truncated: PIL decides whether they decode) and those the GPU decoder failed on
  before; each is counted once (``num_cpu_decoded``, shared across workers like the bad-file record).
- :class:`GpuDecoder` (the batch step) decodes the JPEG bytes with ``torchvision.io.decode_jpeg(list,
  device=...)`` (nvJPEG), then crops, resizes and flips the batch in one kernel with the arithmetic of torchvision's
  v2 ``resized_crop`` (:func:`resized_crops`; the config's interpolation, antialias on: the operation timm's crop
  does with PIL, on images of any size) and runs the colour jitter in one launch (:func:`jitter`: brightness,
  contrast, saturation blends in each image's own order, rounded to uint8 after each as PIL's are). Output:
  uint8 (B, 3, H, W). Not ``roi_align``: it needs one (N, C, H, W) float tensor, so a batch of 256 images of up
  to 500×500 would be padded to ~770 MB, and its bilinear sampling is not timm's bicubic. A batch that fails to decode is decoded image by image: an image the GPU cannot decode goes to
  PIL (counted as CPU-decoded, and read that way from then on); one PIL cannot decode either is a bad file,
  recorded in the folder's shared record (:class:`vit.images.RobustImageFolder`: one warning, ``num_bad``,
  ``data.max_bad_fraction``), and replaced as the CPU path replaces it: by the next index whose file decodes,
  drawn with the same sample seed, which is also what the workers give in later epochs (they skip marked
  files), so a resumed run matches the uninterrupted one.
- :class:`GpuDecodeLoader` runs the batch step in a **background thread, on its own side CUDA stream**, two
  batches ahead, and the device step (:class:`vit.prefetch.Normalize`: normalisation and random erasing) in the
  consumer's thread when it takes a batch: erasing reseeds the global RNGs for its draws, which in another thread
  would race the training step's dropout and the checkpoints' RNG snapshots. The thread because ``decode_jpeg(device='cuda')`` blocks its caller until the batch is decoded
  (torchvision parses the files on the host and synchronises its own stream before returning), which in the
  training loop would stall the step for the whole decode; PyTorch releases the GIL inside ``torch.ops`` calls,
  so the decode runs beside the loop. The stream keeps the crops and jitter off the training step's stream; the
  consumer's stream waits on each batch's event when it takes the batch.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import queue
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image
from timm.data.transforms import MaybePILToTensor, RandomResizedCropAndInterpolation
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as F

from vit.images import DECODE_ERRORS, RobustImageFolder, TooManyBadFilesError, to_rgb
from vit.prefetch import LoaderView

JPEG_KIND, PIXELS_KIND = 0, 1  # payload: JPEG file bytes | decoded RGB pixels, (H, W, 3) uint8 flattened


class Augment(NamedTuple):
    """The train transform's parts that run on the GPU, taken from the timm transform the CPU path would use."""
    crop: RandomResizedCropAndInterpolation
    flip: float  # probability
    jitter: T.ColorJitter | None  # timm adds one with no ranges for color_jitter=0: drawn from, not applied

    @property
    def jitters(self) -> bool:
        """Whether the colour jitter changes pixels (any of brightness, contrast, saturation has a range)."""
        j = self.jitter
        return j is not None and any(r is not None for r in (j.brightness, j.contrast, j.saturation))


def gpu_augment(transform) -> Augment:
    """The :class:`Augment` of a timm train transform (``vit.data.build_transform(cfg, True)``).

    Raises:
        ValueError: a step the GPU path does not run (RandAugment, AutoAugment, hue jitter, vertical flip...),
            naming it and the fix.
    """
    crop, flip, jitter = None, 0.0, None
    for step in getattr(transform, "transforms", [transform]):
        if isinstance(step, RandomResizedCropAndInterpolation):
            crop = step
        elif isinstance(step, T.RandomHorizontalFlip):
            flip = step.p
        elif isinstance(step, T.ColorJitter) and step.hue is None:
            jitter = step
        elif not isinstance(step, MaybePILToTensor):
            raise ValueError(f"data.decode=gpu runs RandomResizedCrop, horizontal flip and colour jitter (no hue) "
                             f"on the GPU; the train transform also has {step!r}, which runs on PIL images only "
                             f"(RandAugment/AutoAugment: data.train_aug.auto_augment). Use data.decode=cpu for it, "
                             f"or set data.train_aug.auto_augment=null")
    if crop is None:
        raise ValueError(f"data.decode=gpu expects timm's RandomResizedCrop in the train transform, got {transform!r}")
    if isinstance(crop.interpolation, (tuple, list)):
        raise ValueError("data.decode=gpu needs one interpolation (data.interpolation=bicubic or bilinear), "  # noqa: TRY004
                         "not random")
    return Augment(crop, flip, jitter)


def sample_params(size: tuple[int, int], aug: Augment) -> tuple[list[int], bool, list[int], list[float]]:
    """(crop box [top, left, height, width], flip, jitter order (4 op ids), jitter factors [b, c, s]) for an
    image of ``size`` = (width, height), drawn from python's ``random`` and torch's global RNG in the order and
    with the calls of timm's train transform (crop, flip, jitter), so the same seed gives the same values."""
    shape_only = torch.empty(0, size[1], size[0])  # what get_params reads of an image: its size
    box = list(aug.crop.get_params(shape_only, aug.crop.scale, aug.crop.ratio))
    flip = aug.flip > 0 and bool(torch.rand(1) < aug.flip)
    order, factors = [0, 1, 2, 3], [1.0, 1.0, 1.0]
    if aug.jitter is not None:
        j = aug.jitter
        idx, b, c, s, _ = T.ColorJitter.get_params(j.brightness, j.contrast, j.saturation, None)
        order, factors = idx.tolist(), [1.0 if f is None else f for f in (b, c, s)]
    return box, flip, order, factors


def route(data: bytes) -> tuple[str, tuple[int, int]]:
    """('gpu' | 'cpu', (width, height)) of a file's bytes, from its header (PIL, no decode): the GPU gets
    baseline 3- or 1-channel JPEGs that end with an end-of-image marker. Raises one of DECODE_ERRORS for bytes
    that are no image."""
    if not data:
        raise ValueError("empty file (0 bytes)")
    img = Image.open(io.BytesIO(data))
    gpu = img.format == "JPEG" and img.mode in ("RGB", "L") and b"\xff\xd9" in data[-64:]
    return ("gpu" if gpu else "cpu"), img.size


def pil_pixels(data: bytes) -> torch.Tensor:
    """(H, W, 3) uint8 RGB of a file's bytes, decoded fully by PIL with vit.images' rules."""
    img = Image.open(io.BytesIO(data))
    img.load()
    return torch.from_numpy(np.asarray(to_rgb(img)).copy())


class BytesFolder(Dataset):
    """A :class:`vit.images.RobustImageFolder` whose items are undecoded: ``(payload uint8 (L,), meta int64
    (10,), jitter order int64 (4,), jitter factors float32 (3,), class index)``; ``meta`` = [kind, height,
    width, top, left, crop height, crop width, flip, sample index, 0]. See the module docstring.

    A bad file (no image header, or PIL cannot decode one it routes to the CPU) is recorded in ``folder``'s
    shared record and replaced by the next index whose file is not bad, as ``folder`` does.
    Attributes: ``folder``, ``classes``, ``num_bad``, ``num_cpu_decoded``.
    """

    def __init__(self, folder: RobustImageFolder, aug: Augment):
        self.folder, self.aug, self.classes = folder, aug, folder.classes
        self._cpu = torch.zeros(len(folder.samples), dtype=torch.uint8).share_memory_()  # 1 = decode with PIL

    def __len__(self) -> int:
        return len(self.folder)

    @property
    def num_bad(self) -> int:
        return self.folder.num_bad

    @property
    def num_cpu_decoded(self) -> int:
        """Files decoded by PIL instead of the GPU so far, in any worker or the decoder."""
        return int(self._cpu.sum())

    def mark_bad(self, i: int, reason: str) -> None:
        """Record sample ``i``'s file as bad (once); raises TooManyBadFilesError past data.max_bad_fraction."""
        if not self.folder._bad[i]:
            self.folder._bad[i] = 1
            self.folder._record(self.folder.samples[i][0], reason)
            self.folder._check_fraction()

    def mark_cpu(self, i: int) -> None:
        self._cpu[i] = 1

    def __getitem__(self, index: int):
        n = len(self.folder.samples)
        for i in (j % n for j in range(index, index + n)):
            if self.folder._bad[i]:
                continue
            path, target = self.folder.samples[i]
            try:
                with open(path, "rb") as f:
                    data = f.read()
                where, size = route(data)
                if where == "cpu" or self._cpu[i]:
                    pixels = pil_pixels(data)
                    self.mark_cpu(i)
                    payload, kind, size = pixels.flatten(), PIXELS_KIND, (pixels.shape[1], pixels.shape[0])
                else:
                    payload, kind = torch.frombuffer(bytearray(data), dtype=torch.uint8), JPEG_KIND
            except DECODE_ERRORS as e:
                self.mark_bad(i, f"{type(e).__name__}: {e}")
                continue
            box, flip, order, factors = sample_params(size, self.aug)
            meta = torch.tensor([kind, size[1], size[0], *box, int(flip), i, 0], dtype=torch.int64)
            return payload, meta, torch.tensor(order), torch.tensor(factors, dtype=torch.float32), target
        raise RuntimeError(f"no file under {self.folder.root} decodes")


class ByteBatch(NamedTuple):
    """A collated batch of :class:`BytesFolder` items (with the sample seeds appended by the seeding wrapper)."""
    payload: torch.Tensor  # uint8 (sum of L,): every item's payload, concatenated
    offsets: torch.Tensor  # int64 (B + 1,): item b is payload[offsets[b]:offsets[b + 1]]
    meta: torch.Tensor  # int64 (B, 10)
    order: torch.Tensor  # int64 (B, 4)
    factors: torch.Tensor  # float32 (B, 3)
    labels: torch.Tensor  # int64 (B,)
    seeds: torch.Tensor  # int64 (B,)


def collate_bytes(items: list) -> ByteBatch:
    """One :class:`ByteBatch` of ``(payload, meta, order, factors, label, seed)`` items: one payload tensor, so a
    batch crosses from a worker in one shared-memory block (not one per image)."""
    payloads = [it[0] for it in items]
    offsets = torch.zeros(len(items) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor([len(p) for p in payloads]).cumsum(0)
    return ByteBatch(torch.cat(payloads), offsets, torch.stack([it[1] for it in items]),
                     torch.stack([it[2] for it in items]), torch.stack([it[3] for it in items]),
                     torch.tensor([it[4] for it in items]), torch.tensor([it[5] for it in items]))


def _floor_blend(x: torch.Tensor, base: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ``Image.blend(base, x, factor)`` for 8-bit images, in float: clamped to 0..255 and truncated."""
    return (base + factor * (x - base)).clamp_(0, 255).floor_()


def gray(x: torch.Tensor) -> torch.Tensor:
    """PIL's ``convert("L")`` of float (B, 3, H, W) integer RGB values: (B, 1, H, W), rounded as PIL rounds."""
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    return torch.div(r * 19595 + g * 38470 + b * 7471 + 32768, 65536, rounding_mode="floor")  # exact in float32


def gray_mean(g: torch.Tensor) -> torch.Tensor:
    """PIL's contrast base, ``int(mean + 0.5)`` of each grayscale image, from float (B, 1, H, W) integer values:
    (B, 1, 1, 1) float, as ``(2·Σ + n) // (2n)`` in integers (exact at any size; a float32 mean is not)."""
    n = g[0].numel()
    return torch.div(2 * g.to(torch.int64).sum(dim=(1, 2, 3), keepdim=True) + n, 2 * n,
                     rounding_mode="floor").float()


def position_factors(order: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """float32 (B, 4): each image's jitter factor at each position of ``order`` (int64 (B, 4)), from ``factors``
    (B, 3: brightness, contrast, saturation), cast to float32 as PIL's blend alpha is a C float; 1 at hue's position,
    which leaves the image as it is."""
    factors = factors.float()
    return torch.cat([factors, torch.ones_like(factors[:, :1])], 1).gather(1, order)


def jitter_ops(x: torch.Tensor, order: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """torchvision's ColorJitter (no hue) on a uint8 batch, each image with its own op order and factors, as
    PIL's ImageEnhance computes it on each image: brightness blends with black, contrast with the rounded mean
    of the grayscale image, saturation with the grayscale image; truncated to uint8 after each op. PyTorch ops, on
    any device (:func:`jitter` runs :func:`vit.color_jitter.color_jitter` on a GPU, bitwise the same).

    x: uint8 (B, 3, H, W); order: int64 (B, 4) op ids (0 brightness, 1 contrast, 2 saturation, 3 hue: skipped) and
    factors: float32 (B, 3), both on the CPU (as the workers' draws arrive). Returns uint8 (B, 3, H, W), on x's device.
    """
    x = x.float()
    needs_gray = ((order == 1) | (order == 2)).any(0).tolist()  # per position, read on the host
    f = to_device(position_factors(order, factors), x.device).view(*order.shape, 1, 1, 1)  # (B, 4, 1, 1, 1)
    order = to_device(order, x.device)
    for position in range(4):
        op = order[:, position].view(-1, 1, 1, 1)  # (B, 1, 1, 1)
        base = torch.zeros_like(x[:, :1])  # (B, 1, H, W): black, for brightness (and hue)
        if needs_gray[position]:
            g = gray(x)
            base = torch.where(op == 2, g, torch.where(op == 1, gray_mean(g), base))
        # one blend per position, with each image's own base and factor: 5 passes over the batch (18 for a blend per op)
        x = _floor_blend(x, base, f[:, position])
    return x.to(torch.uint8)


def jitter(x: torch.Tensor, order: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """:func:`jitter_ops`' result (same arguments): on a GPU in one launch (:func:`vit.color_jitter.color_jitter`),
    elsewhere with PyTorch ops."""
    if x.is_cuda:
        from vit.color_jitter import color_jitter

        return color_jitter(x, order, factors)
    return jitter_ops(x, order, factors)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor on ``device`` without a host sync: a copy from pageable memory synchronises the stream,
    one from pinned memory is queued on it."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


class GpuDecoder:
    """The batch step: :class:`ByteBatch` -> ``(x uint8 (B, 3, H, W), labels int64 (B,), seeds int64 (B,))`` on
    ``device`` (see the module docstring). Runs on the caller's current stream; ``device='cpu'`` runs the same
    steps with torchvision's CPU decoder (the CPU tests).

    Args:
        folder: the :class:`BytesFolder` the batches come from (its bad-file and CPU-decode records).
        aug: the output size, interpolation and jitter (:func:`gpu_augment`).
        resample: ``resample(index, seed)`` -> the item for ``index`` under sample seed ``seed`` (the seeding
            wrapper's ``__getitem__``): a bad file's replacement, as the workers would give it.
    """

    def __init__(self, folder: BytesFolder, aug: Augment, resample: Callable[[int, int], tuple]):
        self.folder, self.aug, self.resample = folder, aug, resample

    def __call__(self, batch: ByteBatch, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        device = torch.device(device)
        meta, order, factors, labels = batch.meta.clone(), batch.order.clone(), batch.factors.clone(), batch.labels.clone()
        bounds = batch.offsets.tolist()
        parts = [batch.payload[a:b] for a, b in itertools.pairwise(bounds)]
        images = self.decode(parts, meta, device)
        for b, img in enumerate(images):
            while img is None:  # the GPU decoder failed on it
                img = self.repair(b, parts, meta, order, factors, labels, batch.seeds, device)
            images[b] = img
        rows = meta.tolist()
        x = resized_crops(images, [m[3:7] for m in rows], [bool(m[7]) for m in rows], list(self.aug.crop.size),
                          self.aug.crop.interpolation)  # (B, 3, H, W) uint8
        if self.aug.jitters:
            x = jitter(x, order, factors)
        return x, labels, batch.seeds

    def decode(self, parts: list[torch.Tensor], meta: torch.Tensor, device) -> list[torch.Tensor | None]:
        """Each item as uint8 (3, h, w) on ``device``: JPEGs decoded together (one by one if the batch call
        fails; None for those that fail alone), PIL-decoded pixels copied."""
        kinds = meta[:, 0].tolist()
        images: list[torch.Tensor | None] = [None] * len(parts)
        jpegs = [b for b, k in enumerate(kinds) if k == JPEG_KIND]
        if jpegs:
            try:
                out = decode_jpeg([parts[b] for b in jpegs], mode=ImageReadMode.RGB, device=device)
            except RuntimeError:
                out = [decode_one(parts[b], device) for b in jpegs]
            for b, img in zip(jpegs, out):
                images[b] = keep_on_stream(img)
        for b, k in enumerate(kinds):
            if k == PIXELS_KIND:
                images[b] = upload(parts[b], *meta[b, 1:3].tolist(), device)
        return images

    def repair(self, b: int, parts, meta, order, factors, labels, seeds, device) -> torch.Tensor | None:
        """Item ``b``, which the GPU could not decode: PIL's decode of it (counted as CPU-decoded), or if PIL
        cannot either, the file is bad and item ``b`` becomes its replacement (rows of ``parts``, ``meta``,
        ``order``, ``factors``, ``labels`` updated); its image, or None if the replacement fails on the GPU too."""
        index = int(meta[b, 8])
        try:
            pixels = pil_pixels(parts[b].numpy().tobytes())
        except DECODE_ERRORS as e:
            self.folder.mark_bad(index, f"{type(e).__name__}: {e}")
            payload, meta[b], order[b], factors[b], labels[b], _ = self.resample(index, int(seeds[b]))
            parts[b] = payload
            if meta[b, 0] == PIXELS_KIND:
                return upload(payload, *meta[b, 1:3].tolist(), device)
            return keep_on_stream(decode_one(payload, device))
        self.folder.mark_cpu(index)
        return upload(pixels.flatten(), pixels.shape[0], pixels.shape[1], device)


def resized_crops(images: list[torch.Tensor], boxes: list[list[int]], flips: list[bool], size: list[int],
                  mode: T.InterpolationMode) -> torch.Tensor:
    """uint8 (B, 3, H, W): each uint8 (3, h, w) image's box ``[top, left, height, width]`` resized to ``size`` with
    antialias, flipped left to right where ``flips[b]``. On a GPU, for bilinear and bicubic and boxes inside their
    images (timm's always are), one launch for the batch (:func:`vit.crop_resize.crop_resize`: PyTorch's
    antialiased arithmetic, which v2's ``resized_crop`` runs there, up to float rounding); otherwise v2 per image
    (on the CPU it resizes uint8 natively; it pads a box that leaves the image)."""
    inside = all(top >= 0 and left >= 0 and top + h <= img.shape[-2] and left + w <= img.shape[-1]
                 for img, (top, left, h, w) in zip(images, boxes))
    if images[0].is_cuda and mode in (T.InterpolationMode.BILINEAR, T.InterpolationMode.BICUBIC) and inside \
            and len(size) == 2:
        from vit.crop_resize import crop_resize

        return crop_resize(images, boxes, flips, size, bicubic=mode == T.InterpolationMode.BICUBIC)
    crops = [F.resized_crop(img, *box, size, interpolation=mode, antialias=True) for img, box in zip(images, boxes)]
    return torch.stack([c.flip(-1) if f else c for c, f in zip(crops, flips)])


def keep_on_stream(img: torch.Tensor | None) -> torch.Tensor | None:
    """Mark a decoded image as used on the current CUDA stream: torchvision's decoder allocates its outputs on a
    stream of its own (and host-synchronises it), so without this the allocator could hand the block to the next
    batch's decode while this stream's crop still reads it."""
    if img is not None and img.is_cuda:
        img.record_stream(torch.cuda.current_stream(img.device))
    return img


def decode_one(data: torch.Tensor, device) -> torch.Tensor | None:
    """One JPEG's uint8 (3, h, w) on ``device``, or None if the decoder fails on it."""
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return None


def upload(pixels: torch.Tensor, height: int, width: int, device) -> torch.Tensor:
    """Flat (H·W·3,) uint8 RGB pixels as (3, H, W) on ``device``."""
    return pixels.view(height, width, 3).to(device, non_blocking=True).permute(2, 0, 1).contiguous()


class GpuDecodeLoader(LoaderView):
    """Iterate ``loader`` (a DataLoader of :class:`ByteBatch`) as ``(x float32 (B, 3, H, W), y int64 (B,))`` on
    ``device``: ``decoder`` runs in a background thread on one side CUDA stream, up to ``depth`` batches ahead;
    the consumer's current stream waits for a batch's event when it takes it (and the batch's memory is marked
    as used there), then ``on_device`` (normalisation, random erasing) runs there, in the consumer's thread
    (why: the module docstring). On CPU the same thread runs without a stream. An error in the thread (TooManyBadFilesError, a decoder bug) is raised in the consumer.
    Attributes ``dataset``, ``sampler``, ``loader``, ``device``; ``len()`` is the loader's.
    """

    def __init__(self, loader, device, decoder: GpuDecoder, on_device: Callable, depth: int = 2):
        self.loader, self.device, self.decoder, self.on_device = loader, torch.device(device), decoder, on_device
        self.depth = depth
        self.stream = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None

    _started = None  # (queue, stop event, thread) of an iteration begun by start(), not yet taken
    _live = None  # the same of the iteration being taken

    def start(self) -> None:
        """Begin the next iteration now: the workers start reading and the thread decoding its first ``depth``
        batches at once, e.g. while the caller still validates (a decoder that started only with the epoch left
        the epoch's first steps waiting for it); the next ``iter()`` continues this iteration instead of beginning
        one. With workers the sampler is read here; without, in the thread, so it must not change until then. An
        iteration begun before and not taken is stopped first."""
        self.cancel()
        self._started = self._begin()

    def cancel(self) -> None:
        """Stop the iteration begun by :meth:`start` and the one being taken, if any (their threads end), e.g. when
        training stops on an error; the next ``iter()`` begins anew. An iterator taken before must not be used after."""
        for name in ("_started", "_live"):
            if getattr(self, name) is not None:
                _stop(*getattr(self, name))
                setattr(self, name, None)
        self.loader.cancel()

    def _begin(self) -> tuple:
        """The loader's iteration begun in the caller's thread (its workers are forked from there), and a thread
        decoding its batches into a queue."""
        self.loader.start()
        ready: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(iter(self.loader), ready, stop), daemon=True,
                                  name="gpu-decode")
        thread.start()
        return ready, stop, thread

    def __iter__(self):
        live, self._started = (self._started or self._begin()), None
        self._live = live
        ready, stop, thread = live
        try:
            while (item := ready.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                x, y, seeds, event = item
                if event is not None:
                    consumer = torch.cuda.current_stream(self.device)
                    consumer.wait_event(event)
                    x.record_stream(consumer)
                    y.record_stream(consumer)
                yield self.on_device((x, y, seeds), self.device)
        finally:
            _stop(ready, stop, thread)
            if self._live is live:
                self._live = None

    def _produce(self, batches, ready: queue.Queue, stop: threading.Event) -> None:
        try:
            if self.stream is not None:
                torch.cuda.set_device(self.stream.device)  # the thread's own current device; "cuda" has no index
            for batch in batches:
                with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
                    x, y, seeds = self.decoder(batch, self.device)
                    y = to_device(y, self.device)
                    event = self.stream.record_event() if self.stream is not None else None
                if not _put(ready, (x, y, seeds, event), stop):
                    return
            _put(ready, _END, stop)
        except BaseException as e:  # noqa: BLE001  handed to the consumer, which raises it
            _put(ready, self._plain_error(e), stop)

    def _plain_error(self, error: BaseException) -> BaseException:
        """A worker's TooManyBadFilesError arrives as a RuntimeError holding its traceback: the plain one
        instead (the record is shared), as :class:`vit.images.ImageFolderLoader` does."""
        folder = getattr(self.dataset, "dataset", self.dataset)
        message = folder.folder.too_many_bad() if isinstance(folder, BytesFolder) else None
        if isinstance(error, RuntimeError) and not isinstance(error, TooManyBadFilesError) and message:
            return TooManyBadFilesError(message)
        return error


_END = object()


def _stop(ready: queue.Queue, stop: threading.Event, thread: threading.Thread) -> None:
    """Stop a producer thread: set ``stop``, and drain ``ready`` until it ends (a producer blocked on a full queue
    sees the stop)."""
    stop.set()
    while thread.is_alive():
        with contextlib.suppress(queue.Empty):
            ready.get(timeout=0.05)


def _put(ready: queue.Queue, item, stop: threading.Event) -> bool:
    """Put ``item`` unless ``stop`` is set first; whether it was put."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def gpu_train_loader(folder: RobustImageFolder, transform, on_device: Callable, device, batch_size: int, sampler,
                     workers: int, seed: int):
    """(loader, seeded dataset) for ``data.decode=gpu``'s train split: the workers' :class:`BytesFolder` over
    ``folder`` (augmentation from ``transform``, timm's train transform; :func:`gpu_augment`) in a
    :class:`vit.images.ImageFolderLoader` (persistent workers, pinned batches on CUDA, full batches), decoded
    by :class:`GpuDecodeLoader`. Raises ValueError for transform steps the GPU path does not run."""
    from vit.data import SeededDataset
    from vit.images import ImageFolderLoader

    aug = gpu_augment(transform)
    seeded = SeededDataset(BytesFolder(folder, aug))
    loader = ImageFolderLoader(seeded, batch_size=batch_size, sampler=sampler, num_workers=workers,
                               pin_memory=torch.device(device).type == "cuda", collate_fn=collate_bytes,
                               drop_last=True, persistent_workers=workers > 0,
                               generator=torch.Generator().manual_seed(seed))
    decoder = GpuDecoder(seeded.dataset, aug, resample=lambda index, sample_seed: seeded[(index, sample_seed)])
    return GpuDecodeLoader(loader, device, decoder, on_device), seeded
