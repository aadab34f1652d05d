"""The input pipeline alone: images/s of torchvision ImageFolder + timm's transform in a DataLoader.

Run through ``python -m benchmarks.train --input-pipeline`` (see benchmarks/README.md). Each worker
count gets one untimed epoch (starts the persistent workers, warms the page cache), then one timed
epoch: images delivered to the main process (pinned, as training reads them) over wall-clock time.
Compare with the model's images/s from ``benchmarks.train`` to see whether data or compute bounds a run.
Without ``--data-dir`` a folder of random smooth JPEGs (10 classes) is generated in the temp directory
(never under ``--out``, which holds only the results).
"""
from __future__ import annotations

import os
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import markdown_header, markdown_table, write_outputs


def _write_jpeg(job: tuple[Path, int, int, int]) -> None:
    from PIL import Image

    path, height, width, seed = job
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)  # smooth, photo-like file size
    noise = rng.integers(-12, 13, size=(height, width, 3))
    pixels = np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, quality=85)


def generate_folder(root: Path, num_images: int, height: int, width: int, num_classes: int = 10) -> Path:
    """Write ``num_images`` random JPEGs as ``root/class_k/img_i.jpg``; reuse a complete earlier folder."""
    jobs = []
    for i in range(num_images):
        path = root / f"class_{i % num_classes}" / f"img_{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            jobs.append((path, height, width, i))
    if jobs:
        with Pool(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            pool.map(_write_jpeg, jobs, chunksize=16)
    return root


def make_dataset(root: Path, transform_kind: str, img_size: int, auto_augment: str):
    """ImageFolder with timm's train (RandomResizedCrop, flip, RandAugment) or eval transform."""
    from timm.data import create_transform
    from torchvision.datasets import ImageFolder

    if not root.is_dir():
        raise ValueError(f"--data-dir {root} is not a directory; give an ImageNet-style folder <class>/<image>")
    if (root / "train").is_dir():
        root = root / "train"
    training = transform_kind == "train"
    transform = create_transform(img_size, is_training=training, auto_augment=(auto_augment or None) if training else None)
    return ImageFolder(str(root), transform=transform), transform


def images_per_s(dataset, batch_size: int, workers: int, pin_memory: bool) -> tuple[float, float]:
    """(images/s of one timed epoch after one untimed epoch, seconds of the timed epoch)."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                         pin_memory=pin_memory, persistent_workers=workers > 0, drop_last=False)
    for _ in loader:  # untimed epoch
        pass
    t0, n = time.perf_counter(), 0
    for x, _ in loader:  # (B, 3, S, S) float32
        n += x.shape[0]
    dt = time.perf_counter() - t0
    return n / dt, dt


COLUMNS = [("transform", "transform", 0), ("workers", "workers", 0), ("batch", "batch", 0), ("images", "images", 0),
           ("images/s", "images_per_s", 0), ("epoch s", "epoch_s", 2), ("status", "status", 0)]


def run_pipeline(args, env) -> dict:
    """Measure every (transform, worker count); write ``<out>/<name>.json`` and ``.md``."""
    from benchmarks.common import error_text

    if args.data_dir is None:
        h, w = args.gen_size
        root = generate_folder(Path(tempfile.gettempdir()) / f"vit_bench_jpegs_{args.num_images}_{h}x{w}",
                               args.num_images, h, w)
        source = f"generated: {args.num_images} random smooth JPEGs of {args.gen_size[0]}×{args.gen_size[1]} px"
    else:
        root, source = args.data_dir, str(args.data_dir)
    batch = args.batch_size or 256
    config = {"data": source, "root": str(root), "batch": batch, "workers": args.workers, "img_size": args.img_size,
              "transforms": args.transforms, "auto_augment": args.auto_augment, "pin_memory": args.device == "cuda"}
    rows = []
    for kind in args.transforms:
        for workers in args.workers:
            row = {"transform": kind, "workers": workers, "batch": batch, "status": "ok"}
            try:
                dataset, transform = make_dataset(root, kind, args.img_size, args.auto_augment)
                row["images"] = len(dataset)
                row["images_per_s"], row["epoch_s"] = images_per_s(dataset, batch, workers, args.device == "cuda")
                config[f"transform_{kind}"] = repr(transform).replace("\n", " ")
            except Exception as exc:  # noqa: BLE001  a failing setting gets a row saying why
                row["status"] = error_text(exc)
            rows.append(row)
            print(f"{kind:<6} workers={workers:<3} {row.get('images_per_s') or float('nan'):8.0f} images/s  "
                  f"{row['status']}", flush=True)
    notes = [(f"Data: {source}; batch {batch}, output {args.img_size} px, pin_memory={config['pin_memory']}, "
             f"shuffle; one untimed epoch, then one timed epoch (wall-clock). CPU cores here: {env['cpu_count']}."),
             (f"train = timm create_transform(is_training=True, auto_augment={args.auto_augment!r}); "
             "eval = resize + center crop.")]
    md = markdown_header("Input pipeline throughput", env, notes) + "\n" + markdown_table(rows, COLUMNS)
    paths = write_outputs(args.out, args.name or "input_pipeline", env, config, rows, md)
    return {"rows": rows, "paths": paths, "config": config}
