"""ImageNet-style image folders that survive bad files: `root/<split>/<class>/*.jpg` through torchvision.

Decoding (PIL) turns everything decodable into 8-bit RGB:
- CMYK, grayscale, 1-bit, YCbCr: Pillow's `convert("RGB")` (CMYK by its naive formula, ICC profiles ignored);
- 16-bit grayscale (modes I;16*, and mode I, assumed to hold 16-bit samples): scaled by 255/65535 and rounded,
  so 32768 -> 128 (Pillow's own convert clips such images to white);
- alpha (RGBA, LA, PA, palette or L/RGB with a tRNS transparency): composited over `background`
  (default white), so transparent pixels get a defined colour instead of whatever RGB they hide;
- the format is sniffed from the content, so a PNG named .JPEG decodes as a PNG.

A file that cannot be decoded (not an image, zero bytes, truncated or corrupt) is *bad*. Truncated files
are bad: `PIL.ImageFile.LOAD_TRUNCATED_IMAGES` is never set here (a warning is given if something else set it).
Each bad file gives one `BadImageWarning` (Python `warnings`, category subclassing UserWarning) naming the path
and the reason, is counted in `num_bad`, and is never opened again. Files whose extension is not an image
extension (README.txt, .DS_Store) are ignored as torchvision does, and so are hidden folders (.ipynb_checkpoints).

When bad files are found:
- `verify=False` (default, lazy): on first load inside `__getitem__`, which then returns the next index (in
  order, wrapping) whose file decodes: deterministic, and the same after a resume. Costs nothing up front;
  the count grows as the epoch reaches the bad files, and a class whose files are all bad is not noticed.
- `verify=True`: every file is decoded once up front (threads, tqdm bar) and bad ones are dropped from
  `samples`, so `len()` and the count are exact before training and no sample is duplicated. This costs
  one full decode of the dataset (minutes to hours for ImageNet-1k).

DataLoader workers: the bad-file record is a shared-memory uint8 tensor (one byte per sample), so marks made
in any worker are seen by the main process and by later workers: `num_bad` is exact across workers of one
process group, and a file warns once in total (twice at worst, if two workers hit it at the same moment).
Warnings issued in workers go to their stderr. Under DDP each rank holds its own dataset and its own count.
PIL's DecompressionBombWarning (an image above `PIL.Image.MAX_IMAGE_PIXELS`) is shown once per dataset, not once
per worker and epoch: the first process to create a claim file in the temp directory shows it.
"""
from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import uuid
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFile
from torch.utils.data import DataLoader, default_collate
from torchvision.datasets import ImageFolder
from tqdm import tqdm

LAYOUT = "root/train/<class>/*.jpg and root/val/<class>/*.jpg (one folder per class, the same classes in both)"
# What PIL raises on undecodable input; anything else (a bug in a transform, say) propagates.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError)


class BadImageWarning(UserWarning):
    """One file that could not be decoded and is skipped; the message names the path and the reason."""


class TooManyBadFilesError(RuntimeError):
    """More than ``max_bad_fraction`` of a folder's files cannot be decoded; the message gives counts and examples."""


def to_rgb(img: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Any PIL image -> 8-bit RGB (H, W, 3) as described in the module docstring; alpha over `background`."""
    if img.mode.startswith("I;16") or img.mode == "I":
        a = np.clip(np.asarray(img).astype(np.float64), 0, 65535)
        img = Image.fromarray(np.round(a * (255 / 65535)).astype(np.uint8), "L")  # (H, W) uint8
    if img.mode in ("P", "L", "RGB") and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (*background, 255)), rgba).convert("RGB")
    return img.convert("RGB")


def load_rgb(path: str, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Fully decode the image at `path` to RGB. Raises one of DECODE_ERRORS if it is not a whole image."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError("empty file (0 bytes)")
        img = Image.open(f)
        img.load()  # decodes every byte: a truncated file raises OSError here
    return to_rgb(img, background)


def _check_file(path: str, background: tuple[int, int, int]) -> str | None:
    """The reason `path` is bad, or None if it decodes."""
    try:
        load_rgb(path, background)
    except DECODE_ERRORS as e:
        return f"{type(e).__name__}: {e}"
    return None


def _claim(path: str) -> bool:
    """Whether this process is the first of all to create ``path``: the file is created exclusively, so of several
    worker processes that meet a DecompressionBombWarning at once exactly one shows it (a shared flag alone is
    check-then-set: two workers can both pass it)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _remove_claim(path: str, owner: int) -> None:
    if os.getpid() == owner:  # the dataset's own process, not a worker holding a copy of it
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


class RobustImageFolder(ImageFolder):
    """torchvision `ImageFolder` over `root/<class>/*` that decodes to RGB and skips bad files.

    Args:
        root: the split folder, e.g. `data/imagenet/train`, holding one sub-folder per class.
        transform: applied to the RGB PIL image (e.g. timm's `create_transform`); target_transform to the label.
        max_bad_fraction: the most bad files tolerated, as a fraction of all files found (config
            `data.max_bad_fraction`); more raises RuntimeError, as soon as the count passes it.
        verify: decode every file up front and drop bad ones (config `data.verify`); see the module docstring.
        background: RGB (0-255) that transparent pixels are composited over.
        substitute_bad: True (training): a bad file's item is the next good one, so batches stay full.
            False (evaluation): a bad file's item is None, which :func:`collate_drop_bad` drops, so no image
            is counted twice in a validation metric.
    Items: `(transform(image), class_index)`; without a transform the image is an RGB PIL image.
    Attributes: `classes`, `class_to_idx`, `samples` (as ImageFolder), `num_files` (files found),
        `num_bad`, `bad_files` (their paths, sorted), `bad_reasons` (path -> reason, as seen by this process).
    Raises:
        FileNotFoundError: `root` missing or not a folder.
        ValueError: no class folders, or a class folder without any image file (or, with verify, any good one).
        RuntimeError: more than `max_bad_fraction` of the files are bad (with counts, examples and the fix).
    """

    def __init__(self, root: str | Path, transform: Callable | None = None,
                 target_transform: Callable | None = None, *, max_bad_fraction: float = 0.01,
                 verify: bool = False, background: tuple[int, int, int] = (255, 255, 255),
                 substitute_bad: bool = True):
        if not 0.0 <= max_bad_fraction <= 1.0:
            raise ValueError(f"max_bad_fraction={max_bad_fraction} must be in [0, 1] (a fraction of the files)")
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"image folder {root} does not exist or is not a folder; expected {LAYOUT}")
        if ImageFile.LOAD_TRUNCATED_IMAGES:
            warnings.warn("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set: truncated images will decode partly "
                          "(grey bottom) instead of being skipped as bad", BadImageWarning, stacklevel=2)
        self.max_bad_fraction, self.background = max_bad_fraction, tuple(background)
        self.substitute_bad = substitute_bad
        super().__init__(str(root), transform, target_transform, loader=self._load, allow_empty=True)
        self.num_files = len(self.samples)
        self.bad_reasons: dict[str, str] = {}
        self._dropped: list[str] = []  # bad files removed from samples by verify
        if verify:
            self._verify()
        self._bad = torch.zeros(len(self.samples), dtype=torch.uint8).share_memory_()  # 1 = known bad
        self._bomb_claim = os.path.join(tempfile.gettempdir(), f"vit-bomb-warning-{uuid.uuid4().hex}")
        weakref.finalize(self, _remove_claim, self._bomb_claim, os.getpid())
        self._check_fraction()
        counts = np.bincount(np.asarray(self.targets, dtype=np.int64), minlength=len(self.classes))
        empty = [str(root / c) for c, n in zip(self.classes, counts) if n == 0]
        if empty:
            raise ValueError(f"{len(empty)} class folder(s) hold no {'decodable ' if verify else ''}image file "
                             f"(extensions {', '.join(self.extensions)}): {empty[:5]}; add images or remove "
                             f"the folder (in train and val alike); expected {LAYOUT}")

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        """Sorted non-hidden sub-folders of `directory` as classes. Raises ValueError if there are none."""
        classes = sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise ValueError(f"no class folders in {directory}; expected {LAYOUT}")
        return classes, {c: i for i, c in enumerate(classes)}

    def _load(self, path: str) -> Image.Image:
        """The RGB image; PIL's DecompressionBombWarning (an image of more than ``Image.MAX_IMAGE_PIXELS``)
        is shown once per dataset, whichever worker or epoch meets it first."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", Image.DecompressionBombWarning)
            img = load_rgb(path, self.background)
        for w in caught:
            if not issubclass(w.category, Image.DecompressionBombWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
            elif _claim(self._bomb_claim):
                warnings.warn(f"{path}: {w.message} Shown once for {self.root}; PIL.Image.MAX_IMAGE_PIXELS sets "
                              f"the limit", Image.DecompressionBombWarning, stacklevel=2)
        return img

    def _verify(self) -> None:
        """Decode every file once (threads: PIL releases the GIL while decoding); drop and count bad ones."""
        paths = [p for p, _ in self.samples]
        with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
            reasons = list(tqdm(pool.map(lambda p: _check_file(p, self.background), paths), total=len(paths),
                                desc=f"verify {self.root}", unit="img"))
        for path, reason in zip(paths, reasons):
            if reason is not None:
                self._record(path, reason)
                self._dropped.append(path)
        self.samples = [s for s, r in zip(self.samples, reasons) if r is None]
        self.imgs, self.targets = self.samples, [t for _, t in self.samples]

    def _record(self, path: str, reason: str) -> None:
        self.bad_reasons[path] = reason
        warnings.warn(f"skipping bad image {path}: {reason}", BadImageWarning, stacklevel=2)

    @property
    def bad_files(self) -> list[str]:
        """Paths of all bad files found so far, in any DataLoader worker of this process group."""
        marked = [self.samples[i][0] for i in torch.nonzero(self._bad).flatten().tolist()]
        return sorted(self._dropped + marked)

    @property
    def num_bad(self) -> int:
        """Number of bad files found so far (exact up front when verify=True)."""
        return len(self._dropped) + int(self._bad.sum())

    def too_many_bad(self) -> str | None:
        """The error message if more than ``max_bad_fraction`` of the files are bad (as recorded by any
        DataLoader worker so far), else None."""
        n_bad = self.num_bad
        if n_bad <= self.max_bad_fraction * self.num_files:
            return None
        examples = "\n  ".join(f"{p}: {self.bad_reasons.get(p) or _check_file(p, self.background)}"
                               for p in self.bad_files[:5])
        return (f"{n_bad} of {self.num_files} image files under {self.root} are bad ({n_bad / self.num_files:.2%}), "
                f"more than data.max_bad_fraction={self.max_bad_fraction}. Examples:\n  {examples}\n"
                f"Fix: delete or re-encode those files, or raise data.max_bad_fraction.")

    def _check_fraction(self) -> None:
        message = self.too_many_bad()
        if message is not None:
            raise TooManyBadFilesError(message)

    def __getitem__(self, index: int):
        """(image, class_index) for `index`; if its file is bad, the next index whose file decodes
        (`substitute_bad=True`) or None (`substitute_bad=False`)."""
        n = len(self.samples)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for {n} samples")
        for i in (j % n for j in range(index, index + n)):
            if self._bad[i]:
                if not self.substitute_bad:
                    return None
                continue
            path, target = self.samples[i]
            try:
                img = self.loader(path)
            except DECODE_ERRORS as e:
                if not self._bad[i]:  # another worker may have just marked it
                    self._bad[i] = 1
                    self._record(path, f"{type(e).__name__}: {e}")
                    self._check_fraction()
                if not self.substitute_bad:
                    return None
                continue
            img = self.transform(img) if self.transform is not None else img
            target = self.target_transform(target) if self.target_transform is not None else target
            return img, target
        raise RuntimeError(f"no file under {self.root} decodes; expected {LAYOUT}")


class ImageFolderLoader(DataLoader):
    """A ``DataLoader`` over a :class:`RobustImageFolder` (or a dataset wrapping one as ``.dataset``) that
    raises :class:`TooManyBadFilesError` from the main process, with its own message and traceback.

    Raised in a worker, the error would reach the main process as a RuntimeError whose message holds the
    worker's whole traceback (torch re-raises it as text, 80+ lines); the bad-file record is shared, so the
    main process re-checks it and raises the plain error instead.
    """

    _started = None  # an iteration begun by start(), which the next iter() continues

    def start(self) -> None:
        """Begin the next iteration now, for the sampler as it is set (it is read here): the workers start on its
        first batches (``prefetch_factor`` each) at once, e.g. while the caller still validates; the next
        ``iter()`` continues this iteration instead of beginning one. Without workers nothing would run ahead, and
        nothing is begun."""
        self._started = super().__iter__() if self.num_workers > 0 else None

    def cancel(self) -> None:
        """Drop an iteration begun by :meth:`start` and not taken (the next ``iter()`` begins anew; persistent workers
        drop what they prefetched for it)."""
        self._started = None

    def __iter__(self):
        folder = getattr(self.dataset, "dataset", self.dataset)
        batches, self._started = (self._started if self._started is not None else super().__iter__()), None
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except RuntimeError:
                message = folder.too_many_bad() if isinstance(folder, RobustImageFolder) else None
                if message is None:
                    raise
                raise TooManyBadFilesError(message) from None
            yield batch


def collate_drop_bad(batch: list):
    """`default_collate` over the items that are not None (bad files of an evaluation split); None if
    every item of the batch was bad."""
    batch = [item for item in batch if item is not None]
    return default_collate(batch) if batch else None


def open_split(root: str | Path, split: str, transform: Callable | None = None, **kwargs) -> RobustImageFolder:
    """`RobustImageFolder(root/split, transform, **kwargs)` with errors that name the dataset layout.

    Raises FileNotFoundError if `root` or `root/split` is missing; see RobustImageFolder for the rest.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"dataset root {root} does not exist (set data.root); expected {LAYOUT}")
    if not (root / split).is_dir():
        found = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise FileNotFoundError(f"split folder {root / split} does not exist (folders in {root}: {found}); "
                                f"expected {LAYOUT}")
    return RobustImageFolder(root / split, transform, **kwargs)


def check_same_classes(train_ds: ImageFolder, val_ds: ImageFolder) -> None:
    """Raise ValueError listing the classes found only in train or only in val (labels would not match)."""
    train, val = set(train_ds.classes), set(val_ds.classes)
    if train != val:
        raise ValueError(
            f"train ({train_ds.root}) and val ({val_ds.root}) have different class folders; "
            f"only in train: {sorted(train - val)[:20]}, only in val: {sorted(val - train)[:20]} "
            f"({len(train - val)} and {len(val - train)} in all). Give both splits the same class folders "
            f"(an empty class folder is an error too); expected {LAYOUT}")


def class_difference(a: list[str], b: list[str], a_name: str = "a", b_name: str = "b", limit: int = 20) -> str:
    """How class lists ``a`` and ``b`` differ, for error messages; ``""`` when they are equal.

    Names the classes only in each (at most ``limit`` of each, with the totals), or, for the same
    names in another order, the first index where the label order differs.
    """
    if list(a) == list(b):
        return ""
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if not only_a and not only_b:
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is None:
            return f"the same names, {len(a)} entries in {a_name} and {len(b)} in {b_name}"
        return f"the same {len(a)} names in another order (label {i} is {a[i]!r} in {a_name}, {b[i]!r} in {b_name})"
    return (f"only in {a_name}: {only_a[:limit]}{' ...' if len(only_a) > limit else ''} ({len(only_a)}), "
            f"only in {b_name}: {only_b[:limit]}{' ...' if len(only_b) > limit else ''} ({len(only_b)})")
