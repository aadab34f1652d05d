"""The input pipeline alone: images/s of the training loader, per path and worker count.

Run through ``python -m benchmarks.train --input-pipeline`` (see benchmarks/README.md). Paths (``--paths``):

- ``cpu``: today's default: PIL decode + timm's train transform to a uint8 crop in the workers, normalised on the
  device one batch ahead (:func:`vit.data.image_loader`);
- ``gpu``: ``data.decode=gpu``: the workers read bytes, nvJPEG decodes and the GPU crops (:mod:`vit.gpu_decode`);
- ``prepared`` and ``prepared-gpu``: the same two on a copy made by ``python -m vit.prepare`` (shorter side at
  most ``--max-side``), whose one-time cost is reported too.

Every path runs the train transform of ``configs/data/imagefolder.yaml`` (RandomResizedCrop, flip, colour jitter
0.4; ``--auto-augment`` adds RandAugment, which the GPU paths refuse with a row saying so) at ``--img-size`` and
hands the model what training gets: normalised float32 batches on the device. Each (path, workers) gets one
untimed epoch (starts the persistent workers, warms the page cache and the decoder), then one timed epoch
(wall-clock, synchronised at the end). The GPU paths are skipped, with the reason, without CUDA.
Without ``--data-dir`` a folder of random smooth JPEGs of ImageNet-like sizes (``--gen-size`` for one fixed size)
is generated in the temp directory (never under ``--out``, which holds only the results).
"""
from __future__ import annotations

import os
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from benchmarks.common import markdown_header, markdown_table, write_outputs
from vit.build import cores_per_process

PATHS = ("cpu", "gpu", "prepared", "prepared-gpu")
# (width, height, share) of ImageNet-1k train-like sizes: mostly 500×375 / 375×500 / 500×333, some large.
IMAGENET_SIZES = [(500, 375, 0.62), (375, 500, 0.15), (500, 333, 0.18), (800, 600, 0.03), (1600, 1200, 0.02)]
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "data" / "imagefolder.yaml"


def _write_jpeg(job: tuple[Path, int, int, int]) -> None:
    from PIL import Image

    path, height, width, seed = job
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)  # smooth, photo-like file size
    noise = rng.integers(-12, 13, size=(height, width, 3))
    pixels = np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, quality=85)


def image_sizes(num_images: int, fixed: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """(height, width) of each generated image: ``fixed``, or :data:`IMAGENET_SIZES` in their shares (seeded)."""
    if fixed is not None:
        return [tuple(fixed)] * num_images
    rng = np.random.default_rng(0)
    picks = rng.choice(len(IMAGENET_SIZES), size=num_images, p=[s for _, _, s in IMAGENET_SIZES])
    return [(IMAGENET_SIZES[k][1], IMAGENET_SIZES[k][0]) for k in picks]


def generate_folder(root: Path, sizes: list[tuple[int, int]], num_classes: int = 10) -> Path:
    """Write one random JPEG per (height, width) as ``root/train/class_k/img_i.jpg``; reuse files already there."""
    jobs = []
    for i, (h, w) in enumerate(sizes):
        path = root / "train" / f"class_{i % num_classes}" / f"img_{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            jobs.append((path, h, w, i))
    if jobs:
        with Pool(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            pool.map(_write_jpeg, jobs, chunksize=16)
    return root


def train_split(root: Path) -> Path:
    """``root`` if it holds ``train/``; raises ValueError for a missing folder or one without ``train/``."""
    if not root.is_dir():
        raise ValueError(f"--data-dir {root} is not a directory; give an ImageNet-style folder with train/<class>/")
    if not (root / "train").is_dir():
        raise ValueError(f"--data-dir {root} has no train/ folder; expected train/<class>/<image>")
    return root


def make_loader(path: str, root: Path, cfg, device: str, batch: int, workers: int):
    """The train loader of ``path`` over ``root/train`` (:func:`vit.data.build_data`'s pieces)."""
    from vit.data import ResumableSampler, SeededDataset, build_imagefolder, build_pipeline, image_loader

    pipe = build_pipeline(cfg, is_training=True)
    folder = build_imagefolder(root, "train", pipe.transform, max_bad_fraction=cfg.max_bad_fraction)
    sampler = ResumableSampler(len(folder), shuffle=True, seed=0)
    if path.endswith("gpu"):
        from vit.gpu_decode import gpu_train_loader

        return gpu_train_loader(folder, pipe.transform, pipe.on_device, device, batch, sampler, workers, seed=0)[0]
    return image_loader(SeededDataset(folder), pipe, device, batch, sampler, workers, seed=0, drop_last=True,
                        persistent=True)


def images_per_s(loader, device: str) -> tuple[int, float]:
    """(images, seconds) of one timed epoch after one untimed epoch; images arrive normalised on ``device``."""
    for _ in loader:  # untimed epoch
        pass
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0, n = time.perf_counter(), 0
    for x, _ in loader:  # (B, 3, S, S) float32 on the device
        n += x.shape[0]
    sync()
    return n, time.perf_counter() - t0


def prepare_copy(root: Path, max_side: int) -> tuple[Path, float]:
    """(the ``vit.prepare`` copy of ``root`` with its shorter sides at most ``max_side``, seconds it took; 0 when
    it was there already)."""
    from vit.prepare import prepare

    out = root.with_name(f"{root.name}_prepared_{max_side}")
    t0 = time.perf_counter()
    result = prepare(OmegaConf.create({"data": {"root": str(root)}, "out": str(out), "max_side": max_side,
                                       "quality": 90, "num_workers": "auto"}))
    return out, (time.perf_counter() - t0) if result["done"] == 0 else 0.0


COLUMNS = [("path", "path", 0), ("workers", "workers", 0), ("batch", "batch", 0), ("images", "images", 0),
           ("images/s", "images_per_s", 0), ("epoch s", "epoch_s", 2), ("status", "status", 0)]


def data_config(args):
    """configs/data/imagefolder.yaml at ``--img-size`` (``--auto-augment`` if given)."""
    cfg = OmegaConf.load(CONFIG)
    cfg.img_size = args.img_size
    cfg.train_aug.auto_augment = args.auto_augment or None
    return cfg


def run_pipeline(args, env) -> dict:
    """Measure every (path, worker count); write ``<out>/<name>.json`` and ``.md``."""
    from benchmarks.common import error_text

    batch = args.batch_size or 256
    if args.data_dir is None and args.num_images < batch:
        raise ValueError(f"--num-images {args.num_images} is below the batch size {batch}: the loader keeps full "
                         f"batches only, so nothing would be timed; give --batch-size {args.num_images} or less, or "
                         f"more images")
    if args.data_dir is None:
        sizes = image_sizes(args.num_images, args.gen_size)
        mean_h, mean_w = np.mean(sizes, axis=0)
        tag = "x".join(map(str, args.gen_size)) if args.gen_size else "imagenet"
        root = generate_folder(Path(tempfile.gettempdir()) / f"vit_bench_jpegs_{args.num_images}_{tag}", sizes)
        source = (f"generated: {args.num_images} random smooth JPEGs (quality 85), mean {mean_w:.0f}×{mean_h:.0f} px"
                  f" ({'all ' + tag if args.gen_size else ', '.join(f'{w}×{h} {s:.0%}' for w, h, s in IMAGENET_SIZES)})")
    else:
        root, source = train_split(args.data_dir), str(args.data_dir)
    cfg = data_config(args)
    config = {"data": source, "root": str(root), "batch": batch, "workers": args.workers, "img_size": args.img_size,
              "paths": args.paths, "max_side": args.max_side, "transform": None, "prepare_s": None}
    roots, rows = {"cpu": root, "gpu": root}, []
    for path in args.paths:
        if path.startswith("prepared") and "prepared" not in roots:
            roots["prepared"], config["prepare_s"] = prepare_copy(root, args.max_side)
        for workers in args.workers:
            row = {"path": path, "workers": workers, "batch": batch, "status": "ok"}
            if path.endswith("gpu") and args.device != "cuda":
                row["status"] = "skipped: no CUDA GPU here (the GPU decoder needs one)"
            else:
                try:
                    loader = make_loader(path, roots[path.split("-")[0]], cfg, args.device, batch, workers)
                    config["transform"] = repr(loader.dataset.dataset.folder.transform if path.endswith("gpu") else
                                               loader.dataset.dataset.transform).replace("\n", " ")
                    row["images"], row["epoch_s"] = images_per_s(loader, args.device)
                    row["images_per_s"] = row["images"] / row["epoch_s"]
                    del loader
                except Exception as exc:  # noqa: BLE001  a failing setting gets a row saying why
                    row["status"] = error_text(exc)
            rows.append(row)
            print(f"{path:<13} workers={workers:<3} {row.get('images_per_s') or float('nan'):8.0f} images/s  "
                  f"{row['status']}", flush=True)
    prep = (f"; the prepared copy (python -m vit.prepare max_side={args.max_side}) took {config['prepare_s']:.1f} s "
            f"with {cores_per_process()} processes" if config["prepare_s"] else "")
    notes = [(f"Data: {source}; batch {batch}, output {args.img_size} px, normalised float32 on {args.device}, "
              f"shuffled; one untimed epoch, then one timed epoch (wall-clock). CPU cores here: {env['cpu_count']}{prep}."),
             f"Train transform (configs/data/imagefolder.yaml): `{config['transform']}`"]
    md = markdown_header("Input pipeline throughput", env, notes) + "\n" + markdown_table(rows, COLUMNS)
    paths = write_outputs(args.out, args.name or "input_pipeline", env, config, rows, md)
    return {"rows": rows, "paths": paths, "config": config}
