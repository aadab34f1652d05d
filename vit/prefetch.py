"""Batches to the device: uint8 from the loader's workers, normalised (and randomly erased) on the device,
the next batch's copy overlapping the current step.

:class:`DeviceLoader` wraps a ``DataLoader`` as timm's ``PrefetchLoader`` does: while the consumer runs
step k, batch k+1 is already copied (pinned memory, ``non_blocking``) and prepared on a side CUDA stream;
the consumer's stream waits for it only when it takes the batch. On CPU there is no stream and the same
code runs in order. What "prepared" means is the ``on_device(batch, device) -> (x, y)`` step it is given
(:func:`vit.data.build_pipeline` picks it); :class:`Normalize` is the step for images decoded by the workers.

An image crosses to the GPU as uint8 (1 byte a channel) instead of normalised float32 (4 bytes).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import torch
from timm.data.random_erasing import RandomErasing


def erase_seed(seeds: torch.Tensor) -> int:
    """The random-erasing seed of a batch: from its first sample's augmentation seed (``seeds``: (B,) int64),
    so a resumed run erases each batch as the uninterrupted run did."""
    return hash((int(seeds[0]), 1)) % (2**32)  # ints hash deterministically


class Normalize:
    """The device step for uint8 batches: ``(x - mean) / std`` in float32, then timm's batch-mode
    :class:`~timm.data.random_erasing.RandomErasing` if ``re_prob > 0``.

    ``x.float().div(255).sub(mean).div(std)`` are torchvision's ``ToTensor`` + ``Normalize`` ops in the same
    order and dtype, so on the CPU a batch equals the one the float transform makes, bit for bit. On CUDA it
    equals it within one float32 rounding: aten's CUDA division by a scalar multiplies by its reciprocal.
    Erasing draws from python's ``random`` and the device's torch generator, seeded for each batch by
    :func:`erase_seed` and restored afterwards (the training RNG streams are untouched).

    Args:
        mean, std: per-channel, in [0, 1] units (``data.mean``, ``data.std``).
        re_prob, re_mode, re_count: ``data.train_aug.re_*`` (timm's probability, mode, max_count).
    Batch in: ``(x uint8 (B, C, H, W), y int64 (B,)[, seeds int64 (B,)])``; erasing needs the seeds.
    Out: ``(x float32 (B, C, H, W) on device, y on device)``.
    """

    def __init__(self, mean, std, re_prob: float = 0.0, re_mode: str = "const", re_count: int = 1):
        self.mean, self.std = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
        self.re = (re_prob, re_mode, re_count) if re_prob > 0 else None
        self._on: dict[torch.device, tuple] = {}  # device -> (mean, std, RandomErasing or None)

    def _for(self, device: torch.device) -> tuple:
        if device not in self._on:
            erasing = None
            if self.re is not None:
                prob, mode, count = self.re
                erasing = RandomErasing(probability=prob, mode=mode, max_count=count, device=device)
            self._on[device] = (self.mean.to(device), self.std.to(device), erasing)
        return self._on[device]

    def __call__(self, batch, device: torch.device):
        mean, std, erasing = self._for(device)
        x = batch[0].to(device, non_blocking=True)
        y = batch[1].to(device, non_blocking=True)
        x = x.float().div_(255).sub_(mean).div_(std)
        if erasing is not None:
            if len(batch) < 3:
                raise ValueError("random erasing needs the batch's augmentation seeds (x, y, seeds)")
            seeded_erase(erasing, x, erase_seed(batch[2]))
        return x, y


def seeded_erase(erasing: RandomErasing, x: torch.Tensor, seed: int) -> None:
    """``erasing(x)`` in place with python's ``random`` and ``x``'s device generator seeded by ``seed``;
    both are restored afterwards."""
    devices = [x.device] if x.device.type == "cuda" else []
    state = random.getstate()
    with torch.random.fork_rng(devices=devices, device_type=x.device.type if devices else "cuda"):
        random.seed(seed)
        if devices:
            index = x.device.index if x.device.index is not None else torch.cuda.current_device()
            torch.cuda.default_generators[index].manual_seed(seed)
        else:
            torch.default_generator.manual_seed(seed)
        try:
            erasing(x)
        finally:
            random.setstate(state)


class LoaderView:
    """What the training loop reads of a wrapped ``self.loader``: its ``dataset``, ``sampler`` and length."""

    @property
    def dataset(self):
        return self.loader.dataset

    @property
    def sampler(self):
        return self.loader.sampler

    def __len__(self) -> int:
        return len(self.loader)

    def start(self) -> None:
        """Begin the wrapped loader's next iteration now (:meth:`vit.images.ImageFolderLoader.start`)."""
        self.loader.start()

    def cancel(self) -> None:
        """Drop an iteration begun by :meth:`start` and not taken (the next ``iter()`` begins a new one)."""
        self.loader.cancel()


class DeviceLoader(LoaderView):
    """Iterate ``loader`` as ``(x, y)`` on ``device``, each batch made by ``on_device`` one batch ahead.

    On CUDA ``on_device`` runs on one side stream kept for the loader's life (timm's ``PrefetchLoader``
    design); the side stream first waits for the consumer's queued work, since blocks the consumer freed
    may be handed to its allocations. Batches must be used on the stream current when they are taken.
    ``None`` batches (every image of an evaluation batch was a bad file) are skipped.

    The time the consumer spends in ``next()`` is the time it waits for data: the workers' next batch
    (one batch ahead) and issuing its copy, not the copy itself.
    Attributes ``dataset``, ``sampler``, ``loader``, ``device``, ``on_device``; ``len()`` is the loader's.
    """

    def __init__(self, loader, device, on_device: Callable):
        self.loader, self.device, self.on_device = loader, torch.device(device), on_device
        self.stream = None

    def prepare(self, batch, device=None):
        """``on_device(batch, device)`` now, on the current stream (default device: the loader's)."""
        return self.on_device(batch, torch.device(device) if device is not None else self.device)

    def _side_stream(self):
        if self.device.type != "cuda":
            return None
        if self.stream is None:  # one stream for the loader's life: the allocator pools blocks per stream
            self.stream = torch.cuda.Stream(device=self.device)
        return self.stream

    def _next(self, batches: Iterator, stream):
        for batch in batches:
            if batch is None:
                continue
            if stream is None:
                return self.on_device(batch, self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                return self.on_device(batch, self.device)
        return None

    def __iter__(self):
        stream = self._side_stream()
        batches = iter(self.loader)
        pending = self._next(batches, stream)
        while pending is not None:
            if stream is not None:
                torch.cuda.current_stream(self.device).wait_stream(stream)
            ready, pending = pending, self._next(batches, stream)
            yield ready
