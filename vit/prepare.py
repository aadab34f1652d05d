"""A resized copy of an image folder, made once: ``python -m vit.prepare data.root=IN out=OUT max_side=320``.

Every ``IN/<split>/<class>/...`` image that the training loader would read (torchvision's image extensions,
hidden folders skipped; :class:`vit.images.RobustImageFolder`) is written to the same relative path under OUT,
so the copy has the same splits, class folders and class names:

- an image whose **shorter** side is above ``max_side`` is resized to ``max_side`` on that side (aspect ratio
  kept) with PIL's Lanczos filter, after PIL's JPEG draft mode has decoded it at a power-of-two reduction no
  smaller than twice the target (as ``Image.thumbnail`` does), converted to RGB by the loader's own rules
  (:func:`vit.images.to_rgb`) and saved as JPEG at ``quality``; a resized file whose name is not .jpg/.jpeg gets
  ``.jpg`` appended (``a.png`` -> ``a.png.jpg``), so a name never lies about its content;
- the others are copied byte for byte, after one full decode shows they are whole.

Why the shorter side: timm's RandomResizedCrop draws crops from the whole image, up to all of it, and eval
resizes the shorter side to ``img_size / crop_pct`` (256 at 224); bounding the shorter side keeps every image
at least ``max_side`` on both sides, so neither transform upsamples more than it did on the original (for
``max_side`` ≥ 256 at 224 px). Bounding the longer side would shrink a 3:1 panorama's short side to a third.

Resumable: each file is written to a hidden temporary name in its folder and renamed into place, so a file
that exists is complete; a second run skips those (without decoding them) and writes the rest. A killed run
leaves at most one ``.<name>.part`` per worker, which the next run overwrites and renames (nothing is fsynced:
a power cut, not a kill, can leave a truncated file, which training then counts as bad).

Bad files (what :func:`vit.images.load_rgb` cannot decode) are not written; each is listed with its reason in
``OUT/prepare_bad_files.txt`` and counted. Work is spread over ``num_workers`` processes, with a tqdm bar.
"""
from __future__ import annotations

import os
import shutil
import warnings
from multiprocessing import Pool
from pathlib import Path

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset
from tqdm import tqdm

from vit.build import cores_per_process
from vit.images import DECODE_ERRORS, LAYOUT, to_rgb
from vit.logger import info

JPEG_SUFFIXES = (".jpg", ".jpeg")
BAD_LIST = "prepare_bad_files.txt"


def target_size(width: int, height: int, max_side: int) -> tuple[int, int] | None:
    """(width, height) with the shorter side ``max_side`` and the aspect ratio kept, or None when the shorter
    side is already at most ``max_side``."""
    short = min(width, height)
    if short <= max_side:
        return None
    scale = max_side / short
    return (max_side, max(1, round(height * scale))) if width == short else (max(1, round(width * scale)), max_side)


def resized_name(dst: Path) -> Path:
    """Where a resized (JPEG) copy of ``dst`` goes: ``dst`` itself for .jpg/.jpeg names, else ``dst`` + .jpg."""
    return dst if dst.suffix.lower() in JPEG_SUFFIXES else dst.with_name(dst.name + ".jpg")


def list_images(root: Path) -> tuple[list[Path], list[Path]]:
    """(every class folder, every image) under ``root`` as paths relative to it, in sorted order.

    Splits are root's non-hidden sub-folders that hold class folders; one without (a flat ``test/``) is skipped
    with a message. Raises FileNotFoundError / ValueError naming the expected layout.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"data.root={root} does not exist or is not a folder; expected {LAYOUT}")
    class_dirs, images = [], []
    for split in sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")):
        classes = sorted(e.name for e in os.scandir(root / split) if e.is_dir() and not e.name.startswith("."))
        if not classes:
            info(f"[prepare] skipping {root / split}: no class folders in it")
            continue
        class_dirs += [Path(split, c) for c in classes]
        samples = make_dataset(str(root / split), {c: i for i, c in enumerate(classes)}, IMG_EXTENSIONS,
                               allow_empty=True)
        images += [Path(path).relative_to(root) for path, _ in samples]
    if not class_dirs:
        raise ValueError(f"no split folder with class folders under {root}; expected {LAYOUT}")
    return class_dirs, images


def prepare_file(job: tuple[str, str, int, int]) -> tuple[str, str, str | None]:
    """Write one image's copy: ``job`` = (source path, destination path, max_side, quality).

    Returns (source, outcome, reason): outcome is ``done`` (already written), ``resized``, ``copied`` or ``bad``
    (reason given).
    """
    src, dst, max_side, quality = job
    dst = Path(dst)
    if dst.exists() or resized_name(dst).exists():
        return src, "done", None
    try:
        with warnings.catch_warnings(), open(src, "rb") as f:
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # it is being made smaller
            if os.fstat(f.fileno()).st_size == 0:
                raise ValueError("empty file (0 bytes)")
            img = Image.open(f)
            size = target_size(*img.size, max_side)
            if size is not None and img.format == "JPEG":
                img.draft("RGB", (2 * size[0], 2 * size[1]))
            img.load()  # decodes every byte: a truncated file raises here
            rgb = to_rgb(img).resize(size, Image.Resampling.LANCZOS) if size is not None else None
    except DECODE_ERRORS as e:
        return src, "bad", f"{type(e).__name__}: {e}"
    final = resized_name(dst) if rgb is not None else dst
    tmp = final.with_name(f".{final.name}.part")
    if rgb is not None:
        rgb.save(tmp, format="JPEG", quality=quality)
    else:
        shutil.copyfile(src, tmp)
    os.replace(tmp, final)
    return src, "resized" if rgb is not None else "copied", None


def check_args(cfg: DictConfig) -> tuple[Path, Path]:
    """(data.root, out) as absolute paths. Raises ValueError for a missing or bad value, with the fix."""
    for key, value in (("data.root", cfg.data.root), ("out", cfg.out), ("max_side", cfg.max_side)):
        if value is None:
            raise ValueError(f"{key} is required: python -m vit.prepare data.root=/data/imagenet "
                             f"out=/data/imagenet_320 max_side=320")
    if not isinstance(cfg.max_side, int) or cfg.max_side < 1:
        raise ValueError(f"max_side={cfg.max_side!r} must be a positive integer (pixels of the shorter side)")
    if not isinstance(cfg.quality, int) or not 1 <= cfg.quality <= 95:
        raise ValueError(f"quality={cfg.quality!r} must be an integer in 1..95 (PIL's JPEG quality; above 95 "
                         f"only grows the files)")
    workers = cfg.num_workers
    if not (workers == "auto" or (isinstance(workers, int) and workers >= 0)):
        raise ValueError(f"num_workers={workers!r} must be auto or an integer >= 0")
    root, out = Path(to_absolute_path(cfg.data.root)).resolve(), Path(to_absolute_path(cfg.out)).resolve()
    if out == root or root in out.parents:
        raise ValueError(f"out={out} is data.root or inside it; the copy must go elsewhere (its files would be "
                         f"read as another split)")
    return root, out


def prepare(cfg: DictConfig) -> dict:
    """Write the resized copy (see the module docstring); return the counts ``resized``, ``copied``, ``done``
    (already there), ``bad``, and ``bad_files`` (source path -> reason).

    Raises:
        ValueError: a missing or bad argument, or no class folders under data.root.
        FileNotFoundError: data.root does not exist.
    """
    root, out = check_args(cfg)
    class_dirs, images = list_images(root)
    for folder in class_dirs:
        (out / folder).mkdir(parents=True, exist_ok=True)
    for rel in {p.parent for p in images}:  # images in sub-folders of a class folder
        (out / rel).mkdir(parents=True, exist_ok=True)
    jobs = [(str(root / p), str(out / p), cfg.max_side, cfg.quality) for p in images]
    workers = cores_per_process() if cfg.num_workers == "auto" else cfg.num_workers
    counts, bad = {"resized": 0, "copied": 0, "done": 0, "bad": 0}, {}
    info(f"[prepare] {len(jobs)} images in {len(class_dirs)} class folders: {root} -> {out} (shorter side at "
         f"most {cfg.max_side} px, JPEG quality {cfg.quality}, {workers} processes)")
    with Pool(workers) if workers > 0 else _InProcess() as pool:
        bar = tqdm(pool.imap_unordered(prepare_file, jobs, chunksize=32), total=len(jobs), unit="img",
                   desc="prepare", dynamic_ncols=True)
        for src, outcome, reason in bar:
            counts[outcome] += 1
            if reason is not None:
                bad[src] = reason
    if bad:
        (out / BAD_LIST).write_text("".join(f"{p}\t{r}\n" for p, r in sorted(bad.items())))
        examples = "\n  ".join(f"{p}: {r}" for p, r in sorted(bad.items())[:5])
        info(f"[prepare] {len(bad)} bad files not written (all in {out / BAD_LIST}):\n  {examples}")
    info(f"[prepare] resized {counts['resized']}, copied {counts['copied']}, already there {counts['done']}, "
         f"bad {counts['bad']}; train on it with data=imagefolder data.root={out}")
    return {**counts, "bad_files": bad}


class _InProcess:
    """``Pool``'s ``imap_unordered`` in this process (``num_workers=0``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def imap_unordered(self, fn, jobs, chunksize=1):
        return map(fn, jobs)


@hydra.main(config_path="../configs", config_name="prepare", version_base="1.3")
def main(cfg: DictConfig) -> None:
    prepare(cfg)


if __name__ == "__main__":
    main()
