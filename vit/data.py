"""Data: ImageNet-style folders, timm transforms, the embedded digits export, synthetic batches.

Every real dataset is a folder ``root/train/<class>/*`` and ``root/val/<class>/*`` read by
:func:`build_imagefolder`. The default, scikit-learn's bundled handwritten digits (1797 8×8 images,
10 classes; no download), is exported once to that same layout (upscaled to 32×32, fixed stratified
80/20 split), so the default run exercises the real image-folder path.

Resumable order: :class:`ResumableSampler` gives the same permutation for a given (seed, epoch), can
start at any position, and yields each index with its augmentation seed, made of (seed, epoch, index);
:class:`SeededDataset` augments the sample under that seed. A run restarted mid-epoch therefore sees
exactly the samples and augmentations the uninterrupted run would have seen, whatever the number of
loader workers, and the workers can live for the whole run (``persistent_workers``): the epoch reaches
them through the indices, not through the dataset object they hold a copy of. With repeated
augmentation (DeiT's RASampler) the sampler yields a virtual index ``i + r·n`` for copy ``r`` of image
``i``, so each copy gets its own seed.

Image folders reach the model in two halves (:func:`build_pipeline`): the workers run timm's transform
up to a uint8 (3, H, W) crop, and the device normalises the batch and erases at random
(:mod:`vit.prefetch`), one batch ahead of the training step.
"""
from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform
from torch.utils.data import Dataset, Sampler, default_collate

from vit.build import resolve_num_workers
from vit.images import ImageFolderLoader, check_same_classes, collate_drop_bad, open_split
from vit.logger import info
from vit.model import img_hw
from vit.prefetch import DeviceLoader, Normalize

DIGITS_SIZE = 32  # 8×8 digits upscaled ×4: with patch_size=4 each patch is one original pixel, N = 65


def default_cache_dir() -> Path:
    """``$VIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/vit-kernels``, else ``~/.cache/vit-kernels``."""
    if os.environ.get("VIT_CACHE_DIR"):
        return Path(os.environ["VIT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vit-kernels"


def export_digits(root: str | os.PathLike | None = None) -> Path:
    """Write sklearn's digits once as PNGs under ``root/{train,val}/<digit>/<index>.png``; return root.

    The split is stratified 80/20 with a fixed seed (1437 train, 360 val images). Images are 8-bit
    grayscale (the loader converts them to RGB), 8×8 upscaled to 32×32 bicubic. The export is
    written to a temporary folder and renamed into place, so concurrent or killed exports never
    leave a half-written dataset. ``root=None`` uses :func:`default_cache_dir` ``/ "digits"``.
    """
    root = Path(root) if root is not None else default_cache_dir() / "digits"
    if (root / ".complete").exists():
        return root
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ValueError(f"data.root={root} is not a digits export: with data.name=digits (the default data, and "
                         f"the data of a checkpoint trained on it) data.root is where the digits are exported, "
                         f"and {root} already holds something else. For an image folder pass data=imagefolder "
                         f"data.root=<folder with train/ and val/> (eval.py: and data.img_size=<the checkpoint's>)")
    info(f"[data] data=digits: exporting scikit-learn's handwritten digits to {root} (once); "
          f"for your own images use data=imagefolder data.root=<folder>")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    images, labels = load_digits(return_X_y=True)  # (1797, 64) in 0..16, (1797,)
    train_idx, val_idx = train_test_split(np.arange(len(labels)), test_size=0.2, stratify=labels, random_state=0)
    tmp = root.with_name(f"{root.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for split, idx in (("train", train_idx), ("val", val_idx)):
        for i in idx:
            pixels = np.clip(images[i].reshape(8, 8) * (255 / 16), 0, 255).round().astype(np.uint8)
            img = Image.fromarray(pixels, mode="L").resize((DIGITS_SIZE, DIGITS_SIZE), Image.BICUBIC)
            folder = tmp / split / str(labels[i])
            folder.mkdir(parents=True, exist_ok=True)
            img.save(folder / f"{i:04d}.png")
    (tmp / ".complete").touch()
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, root)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not (root / ".complete").exists():
            raise
    return root


def build_imagefolder(root: str | os.PathLike, split: str, transform, max_bad_fraction: float = 0.01,
                      verify: bool = False) -> Dataset:
    """The ``root/split/<class>/*`` folder as a dataset of (transformed RGB image, class index).

    Classes are the sub-folder names in sorted order. Decoding, RGB conversion and bad-file handling
    (skipped with one warning each, counted in ``num_bad``) are :class:`vit.images.RobustImageFolder`'s;
    outside ``split='train'`` a bad file's item is None, for loaders built with ``collate_drop_bad``.

    Raises:
        FileNotFoundError: ``root`` or ``root/split`` does not exist.
        ValueError: a class folder holds no image.
        RuntimeError: more than ``max_bad_fraction`` of the files cannot be decoded.
    """
    # Training substitutes the next good image for a bad one (full batches); evaluation drops it
    # (vit.images.collate_drop_bad), so no image is counted twice in a metric.
    return open_split(root, split, transform, max_bad_fraction=max_bad_fraction, verify=verify,
                      substitute_bad=split == "train")


def build_transform(cfg, is_training: bool, uint8: bool = True):
    """timm transform from a ``data`` config: RandomResizedCrop/flip/RandAugment for training,
    resize + center crop (``crop_pct``) for evaluation.

    ``uint8=True`` (the loaders'): timm's ``use_prefetcher`` form, the same transform without ToTensor,
    Normalize and RandomErasing, giving a uint8 (3, H, W) tensor; :class:`vit.prefetch.Normalize` does the
    rest on the device. ``uint8=False``: the whole transform, a normalised float32 (3, H, W) tensor.
    """
    size = cfg.img_size if isinstance(cfg.img_size, int) else img_hw(cfg.img_size)  # an int resizes the short side
    common = {"input_size": size, "interpolation": cfg.interpolation, "mean": tuple(cfg.mean),
              "std": tuple(cfg.std), "use_prefetcher": uint8}
    if not is_training:
        return create_transform(**common, is_training=False, crop_pct=cfg.crop_pct)
    aug = cfg.train_aug
    return create_transform(**common, is_training=True, scale=tuple(aug.scale), ratio=tuple(aug.ratio),
                            hflip=aug.hflip, color_jitter=aug.color_jitter, auto_augment=aug.auto_augment,
                            re_prob=aug.re_prob, re_mode=aug.get("re_mode", "const"), re_count=aug.get("re_count", 1))


@dataclass
class Pipeline:
    """How one split's images reach the model.

    ``transform`` runs in the loader's workers on each RGB PIL image; ``collate`` makes their list a
    batch (train items are ``(image, class, seed)``, eval items ``(image, class)`` or None for a bad file);
    ``on_device(batch, device) -> (x float32 (B, 3, H, W), y int64 (B,))`` runs in the main process on
    :class:`vit.prefetch.DeviceLoader`'s side stream.
    """
    transform: Callable
    collate: Callable
    on_device: Callable


def build_pipeline(cfg, is_training: bool) -> Pipeline:
    """The split's :class:`Pipeline` for a ``data`` config: the one place where the worker-side transform
    and the device-side step are chosen. Workers decode (PIL) and run timm's transform to a uint8 crop;
    the device normalises with ``data.mean``/``data.std`` and, in training, erases at random
    (``data.train_aug.re_*``)."""
    aug = cfg.train_aug
    re = {"re_prob": aug.re_prob, "re_mode": aug.get("re_mode", "const"), "re_count": aug.get("re_count", 1)}
    on_device = Normalize(tuple(cfg.mean), tuple(cfg.std), **(re if is_training else {}))
    return Pipeline(build_transform(cfg, is_training), default_collate if is_training else collate_drop_bad,
                    on_device)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of (virtual) sample ``index`` in ``epoch`` of a run seeded ``seed``."""
    return hash((seed, epoch, index)) % (2**32)  # ints hash deterministically


class SeededDataset(Dataset):
    """Wraps a dataset so item ``(i, seed)`` (what :class:`ResumableSampler` yields) is sample ``i`` augmented
    with RNGs seeded from ``seed``, returned as ``(*sample, seed)``. An index ``i + r·n`` (n = the dataset's
    length; the sampler's repeated copies) is image ``i``.

    The torch, numpy and python RNGs are seeded for the call and restored afterwards, so the
    caller's random streams (dropout, drop-path) are untouched when loading in the main process.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = item
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)
            try:
                return (*self.dataset[index % len(self.dataset)], seed)
            finally:
                random.setstate(py_state)
                np.random.set_state(np_state)


class ResumableSampler(Sampler[tuple[int, int]]):
    """``(index, augmentation seed)`` pairs of one epoch, reproducible from (seed, epoch), startable at any
    position; the seed is :func:`sample_seed` of (seed, epoch, index).

    With ``num_replicas > 1`` the permutation is padded to a multiple of ``num_replicas`` and rank
    ``r`` takes every ``num_replicas``-th index from ``r`` (as ``DistributedSampler``).
    ``position`` counts this rank's samples already consumed in the epoch.

    ``num_repeats=k > 1``: repeated augmentation (Hoffer et al., 2020; DeiT's ``RASampler``, timm's
    ``RepeatAugSampler``, index for index with ``seed + epoch`` as their epoch): each image of the
    permutation appears k times in a row, rank ``r`` takes every ``num_replicas``-th entry from ``r``
    (so the copies land on different ranks, or in one batch on one process), and an epoch stops after
    ``n // selected_round * selected_round / num_replicas`` samples per rank (``selected_round=0``, or
    n < selected_round: ``ceil(n / num_replicas)``), one dataset's worth. Copy ``c`` of image ``i`` is
    yielded as ``i + c·n`` (with that index's seed), which :class:`SeededDataset` maps back to ``i``.
    """

    def __init__(self, num_samples: int, shuffle: bool, seed: int, num_replicas: int = 1, rank: int = 0,
                 num_repeats: int = 1, selected_round: int = 256):
        self.num_samples, self.shuffle, self.seed = num_samples, shuffle, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.num_repeats, self.selected_round = num_repeats, selected_round
        self.epoch, self.position = 0, 0

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        self.epoch, self.position = epoch, position

    def per_rank(self) -> int:
        """Samples this rank takes in one epoch."""
        n, replicas = self.num_samples, self.num_replicas
        if self.num_repeats == 1:
            return -(-n // replicas)
        if self.selected_round and n >= self.selected_round:
            selected = n // self.selected_round * self.selected_round // replicas
        else:
            selected = -(-n // replicas)
        return min(selected, -(-n * self.num_repeats // replicas))

    def __iter__(self):
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=gen)
        else:
            order = torch.arange(self.num_samples)
        if self.num_repeats > 1:  # [a, a+n, a+2n, b, b+n, ...]: the copies of each image, in a row
            k = self.num_repeats
            order = order.repeat_interleave(k) + self.num_samples * torch.arange(k).repeat(self.num_samples)
        total = -(-len(order) // self.num_replicas) * self.num_replicas
        mine = torch.arange(self.rank, total, self.num_replicas)[:self.per_rank()] % len(order)  # pad by wrapping
        for index in order[mine][self.position:].tolist():
            yield index, sample_seed(self.seed, self.epoch, index)

    def __len__(self) -> int:
        return self.per_rank() - self.position

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}


class SyntheticLoader:
    """Random (B, 3, S, S) images and labels made on the device, for throughput runs (no I/O).

    ``num_samples`` per pass, in batches of ``batch_size`` (a last partial batch unless ``drop_last``).
    The labels are random, so accuracy on this data means nothing; time and memory do.
    """

    def __init__(self, num_samples: int, batch_size: int, img_size: int, num_classes: int, device, seed: int,
                 drop_last: bool = True):
        sizes = [batch_size] * (num_samples // batch_size)
        if not drop_last and num_samples % batch_size:
            sizes.append(num_samples % batch_size)
        self.sizes, self.img_hw, self.num_classes = sizes, img_hw(img_size), num_classes
        self.device, self.seed = torch.device(device), seed
        self.dataset = range(sum(sizes))

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self):
        gen = torch.Generator(device=self.device).manual_seed(self.seed)
        for size in self.sizes:
            x = torch.randn(size, 3, *self.img_hw, generator=gen, device=self.device)
            y = torch.randint(0, self.num_classes, (size,), generator=gen, device=self.device)
            yield x, y  # (B, 3, H, W), (B,)


@dataclass
class Data:
    """What training needs from the data side."""
    train_loader: object
    val_loader: object
    classes: list[str]
    sampler: ResumableSampler | None  # None for synthetic data
    train_set: SeededDataset | None

    started: tuple[int, int] | None = None  # (epoch, position) of the train loader's iteration begun by start_epoch

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        """Select epoch ``epoch``'s order and augmentation, starting after ``position`` samples.

        Raises:
            RuntimeError: :meth:`start_epoch` began another epoch's iteration, which the next ``iter()`` would give.
        """
        if self.started is not None:
            if self.started != (epoch, position):
                raise RuntimeError(f"the train loader has begun epoch {self.started[0]} at sample {self.started[1]} "
                                   f"(start_epoch); set_epoch({epoch}, {position}) cannot change it")
            self.started = None
            return
        if self.sampler is not None:
            self.sampler.set_epoch(epoch, position)

    def start_epoch(self, epoch: int) -> None:
        """``set_epoch(epoch)`` and begin the train loader's iteration of it now (its workers, and the GPU decoder,
        start on its first batches), so that they run while the caller validates the epoch before. The next
        ``set_epoch(epoch)`` is then a no-op; the batches are the same as without it. Loaders with no workers
        (synthetic data) have nothing to begin.

        Raises:
            RuntimeError: an epoch begun before was neither taken nor cancelled (:meth:`cancel`).
        """
        if self.sampler is None or not hasattr(self.train_loader, "start"):
            return
        if self.started is not None:
            raise RuntimeError(f"the train loader has begun epoch {self.started[0]} already (start_epoch); "
                               f"take it (set_epoch, iter) or cancel() it before starting epoch {epoch}")
        self.sampler.set_epoch(epoch, 0)
        self.train_loader.start()
        self.started = (epoch, 0)

    def cancel(self) -> None:
        """Stop the train loader's begun (:meth:`start_epoch`) or running iteration: its decode thread ends, e.g. when
        training stops on an error while an iterator of it is still referenced."""
        if hasattr(self.train_loader, "cancel"):
            self.train_loader.cancel()
        self.started = None

    def num_bad(self) -> int:
        """Undecodable image files met so far in train and val (0 for synthetic data)."""
        sets = [getattr(self.train_set, "dataset", None), getattr(self.val_loader, "dataset", None)]
        return sum(getattr(s, "num_bad", 0) for s in sets if s is not None)


def data_root(cfg) -> Path:
    """The dataset folder from a ``data`` config (relative paths are taken from the launch directory);
    digits are exported on first use."""
    from hydra.utils import to_absolute_path

    root = to_absolute_path(cfg.root) if cfg.root else None
    if cfg.name == "digits":
        return export_digits(root)
    if root is None:
        raise ValueError(f"data.root is not set for data={cfg.name}; pass data.root=/path/to/dataset "
                         f"(a folder with train/<class>/ and val/<class>/)")
    return Path(root)


def folder_options(cfg) -> dict:
    """Bad-file options for :func:`build_imagefolder` (defaults for configs that predate them)."""
    return {"max_bad_fraction": cfg.get("max_bad_fraction", 0.01), "verify": cfg.get("verify", False)}


def build_data(cfg, micro_batch: int, eval_batch: int, device, seed: int, num_replicas: int = 1,
               rank: int = 0, num_repeats: int = 1, selected_round: int = 256) -> Data:
    """Loaders for a ``data`` config (``digits``, ``imagefolder`` or ``synthetic``).

    ``num_repeats > 1``: repeated augmentation (see :class:`ResumableSampler`); synthetic data, which
    has no sampler, says so and ignores it.
    With ``num_replicas`` processes, rank ``rank`` trains on its :class:`ResumableSampler` share and
    validates on every ``num_replicas``-th val image from ``rank`` (no padding, so summed counts are
    exact); synthetic data gives each rank ``train_samples // num_replicas`` (and the same share of
    ``val_samples``) drawn from its own seed.

    Raises:
        FileNotFoundError: missing dataset folder.
        ValueError: empty class folder; train and val class folders differ; no root set.
        RuntimeError: too many undecodable files (``data.max_bad_fraction``).
    """
    if cfg.name == "synthetic":
        if num_repeats > 1:
            info(f"[data] repeated_aug.repeats={num_repeats} does not apply to data=synthetic (random images, "
                  f"no sampler): each step draws new ones")
        val_share = cfg.val_samples // num_replicas + (rank < cfg.val_samples % num_replicas)
        train = SyntheticLoader(cfg.train_samples // num_replicas, micro_batch, cfg.img_size, cfg.num_classes, device,
                                seed + 2 * rank)
        val = SyntheticLoader(val_share, eval_batch, cfg.img_size, cfg.num_classes, device, seed + 2 * rank + 1,
                              drop_last=False)
        return Data(train, val, [str(i) for i in range(cfg.num_classes)], None, None)
    root = data_root(cfg)
    folder_args = folder_options(cfg)
    train_pipe, val_pipe = build_pipeline(cfg, is_training=True), build_pipeline(cfg, is_training=False)
    train_set = build_imagefolder(root, "train", train_pipe.transform, **folder_args)
    val_set = build_imagefolder(root, "val", val_pipe.transform, **folder_args)
    check_same_classes(train_set, val_set)
    seeded = SeededDataset(train_set)
    sampler = ResumableSampler(len(seeded), shuffle=True, seed=seed, num_replicas=num_replicas, rank=rank,
                               num_repeats=num_repeats, selected_round=selected_round)
    workers = resolve_num_workers(cfg.num_workers)
    # Workers live for the whole run: the epoch reaches them through the sampler's seeds.
    if check_decode(cfg, device) == "gpu":
        from vit.gpu_decode import gpu_train_loader

        train, seeded = gpu_train_loader(train_set, train_pipe.transform, train_pipe.on_device, device, micro_batch,
                                         sampler, workers, seed)
    else:
        train = image_loader(seeded, train_pipe, device, micro_batch, sampler, workers, seed, drop_last=True,
                             persistent=True)
    val = image_loader(val_set, val_pipe, device, eval_batch, range(rank, len(val_set), num_replicas), workers,
                       seed + 1, persistent=True)
    return Data(train, val, train_set.classes, sampler, seeded)


def check_decode(cfg, device) -> str:
    """``data.decode``: ``cpu`` (PIL in the workers, the default) or ``gpu`` (the train split's JPEGs decoded and
    augmented on the GPU, :mod:`vit.gpu_decode`; validation stays on the CPU). Raises ValueError for another
    value, or ``gpu`` without a CUDA device or without loader workers."""
    decode = cfg.get("decode", "cpu")
    if decode not in ("cpu", "gpu"):
        raise ValueError(f"data.decode={decode!r} is not one of cpu (PIL in the loader workers), gpu (nvJPEG)")
    if decode == "gpu" and torch.device(device).type != "cuda":
        raise ValueError(f"data.decode=gpu decodes JPEGs on a CUDA GPU, but this run's device is {device} "
                         f"(torch.cuda.is_available()={torch.cuda.is_available()}); use data.decode=cpu")
    if decode == "gpu" and resolve_num_workers(cfg.num_workers) == 0:
        raise ValueError(f"data.decode=gpu needs loader workers, but data.num_workers={cfg.num_workers} gives none: "
                         f"without them the files are read and the augmentations drawn (from RNGs seeded per sample) "
                         f"in the decode thread, beside the training step's own draws; set data.num_workers=1 or more")
    return decode


def image_loader(dataset: Dataset, pipeline: Pipeline, device, batch_size: int, sampler, workers: int, seed: int,
                 drop_last: bool = False, persistent: bool = False) -> DeviceLoader:
    """A :class:`vit.prefetch.DeviceLoader` over an :class:`vit.images.ImageFolderLoader` of ``dataset``:
    batches of ``pipeline.collate`` in pinned memory (CUDA), made on the device by ``pipeline.on_device``.
    ``persistent``: the ``workers`` processes (if any) live as long as the loader."""
    cuda = torch.device(device).type == "cuda"
    # An own generator: creating an iterator then draws worker seeds without touching the global RNG,
    # so a resumed run's dropout/drop-path stream matches the uninterrupted run's.
    loader = ImageFolderLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, pin_memory=cuda,
                               collate_fn=pipeline.collate, drop_last=drop_last,
                               persistent_workers=persistent and workers > 0,
                               generator=torch.Generator().manual_seed(seed))
    return DeviceLoader(loader, device, pipeline.on_device)


def build_eval_data(cfg, batch_size: int, device, seed: int = 0, num_replicas: int = 1,
                    rank: int = 0) -> tuple[object, list[str]]:
    """(val loader, class names) for a ``data`` config; only the val split is read.

    With ``num_replicas`` processes, rank ``rank`` gets the share :func:`build_data`'s validation
    gives it: every ``num_replicas``-th image from ``rank`` (no padding, so summed counts are exact),
    or for synthetic data its share of ``val_samples`` from its own seed.
    """
    if cfg.name == "synthetic":
        share = cfg.val_samples // num_replicas + (rank < cfg.val_samples % num_replicas)
        loader = SyntheticLoader(share, batch_size, cfg.img_size, cfg.num_classes, device, seed + 2 * rank + 1,
                                 drop_last=False)
        return loader, [str(i) for i in range(cfg.num_classes)]
    pipeline = build_pipeline(cfg, is_training=False)
    val_set = build_imagefolder(data_root(cfg), "val", pipeline.transform, **folder_options(cfg))
    loader = image_loader(val_set, pipeline, device, batch_size, range(rank, len(val_set), num_replicas),
                          resolve_num_workers(cfg.num_workers), seed)
    return loader, val_set.classes


def spread_images(loader, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) of ``count`` val images spread evenly over the loader's dataset (image folders are sorted
    by class), bad files left out, normalised on the CPU as the loader's device step does; for a loader without
    a dataset (synthetic data), its first batch's first ones.

    Raises:
        ValueError: none of the picked files decodes.
    """
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, Dataset):  # SyntheticLoader's is a range
        x, y = next(iter(loader))
        return x[:count], y[:count]
    picks = np.unique(np.linspace(0, len(dataset) - 1, count).round().astype(int))
    batch = collate_drop_bad([dataset[int(i)] for i in picks])
    if batch is None:
        raise ValueError(f"none of the val images picked ({picks.tolist()}) decodes")
    return loader.prepare(batch, "cpu") if isinstance(loader, DeviceLoader) else (batch[0], batch[1])
