"""Where ``data.decode=gpu``'s time goes, on one CUDA GPU: its parts alone, a profile, and the loader beside a load.

    python -m benchmarks.decoder_probe                          # a generated folder of ImageNet-like JPEG sizes
    python -m benchmarks.decoder_probe --data-dir /path/to/imagenet --workers 15

Prints, for batches of ``--batch`` train images at 224 px (the default train transform: crop, flip, colour jitter):
1. the colour jitter alone at (batch, 3, 224, 224): the one-launch kernel (:mod:`vit.color_jitter`) against the
   PyTorch-op version (:func:`vit.gpu_decode.jitter_ops`), GPU time (CUDA events) and whether they are bitwise equal;
2. ``decode_jpeg`` of 8 collated batches alone, then the whole decoder step (decode, crops, flips, jitter), both on
   a side stream as the loader runs them, in images/s;
3. a profile of 3 decoder steps (``torch.profiler``, the 14 kernels and ops with the most CUDA time);
4. the whole loader alone, and beside a thread running 8192² bf16 matrix products (a stand-in for the training step),
   with that load's TFLOP/s alone and beside it.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.input_pipeline import CONFIG, generate_folder, image_sizes, images_per_s, make_loader


def jitter_times(batch: int, reps: int = 10) -> None:
    """Part 1: the jitter kernel against the PyTorch ops on smooth random images with random orders and factors."""
    import vit.gpu_decode as gd
    from vit.color_jitter import color_jitter

    g = torch.Generator().manual_seed(0)
    y, x = torch.meshgrid(torch.linspace(0, 1, 224), torch.linspace(0, 1, 224), indexing="ij")
    img = torch.rand(batch, 3, 1, 1, generator=g) * 150 + 40 + 60 * torch.stack([x, y, x * y])[None]
    img = (img + 8 * torch.randn(batch, 3, 224, 224, generator=g)).clamp(0, 255).to(torch.uint8).cuda()
    order = torch.stack([torch.randperm(4, generator=g) for _ in range(batch)])
    factors = 0.6 + 0.8 * torch.rand(batch, 3, generator=g)
    a, b = color_jitter(img, order, factors), gd.jitter_ops(img, order, factors)
    print(f"jitter: bitwise equal {torch.equal(a, b)}, pixels that differ {int((a != b).sum())}, "
          f"pixels the jitter changed {float((a != img).float().mean()):.3f}", flush=True)
    for name, fn in (("jitter_ops (PyTorch ops)", gd.jitter_ops), ("color_jitter (one launch)", color_jitter)):
        for _ in range(3):
            fn(img, order, factors)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            fn(img, order, factors)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        print(f"{name}: median {sorted(times)[reps // 2]:.3f} ms, min {min(times):.3f} ms "
              f"(batch {batch}, 224 px)", flush=True)


def decoder_parts(loader, device: torch.device) -> None:
    """Parts 2 and 3: decode_jpeg alone, the decoder step alone, a profile of 3 steps."""
    from torchvision.io import ImageReadMode, decode_jpeg

    batches = list(itertools.islice(iter(loader.loader), 8))
    side = torch.cuda.Stream()

    def parts(b):
        return [b.payload[x:y] for x, y in itertools.pairwise(b.offsets.tolist())]

    for label, fn in (("decode_jpeg batched", lambda b: decode_jpeg(parts(b), mode=ImageReadMode.RGB, device=device)),
                      ("decoder step (decode, crops, flips, jitter)", lambda b: loader.decoder(b, device))):
        with torch.cuda.stream(side):
            for b in batches[:2]:
                fn(b)
            torch.cuda.synchronize()
            t0, n = time.perf_counter(), 0
            for b in batches * 3:
                fn(b)
                n += len(b.labels)
            torch.cuda.synchronize()
        print(f"{label} alone: {n / (time.perf_counter() - t0):.0f} images/s", flush=True)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof, torch.cuda.stream(side):
        for b in batches[:3]:
            loader.decoder(b, device)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14), flush=True)


@contextlib.contextmanager
def matmul_load(device: torch.device):
    """A thread running 8192² bf16 matrix products until the block ends; yields a function giving their TFLOP/s so
    far (counted at each synchronisation, every 20 products)."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    w = torch.randn_like(a)
    count, stop = [0], threading.Event()

    def load():
        while not stop.is_set():
            for _ in range(20):
                torch.mm(a, w)
            torch.cuda.synchronize()
            count[0] += 20

    thread = threading.Thread(target=load)
    t0 = time.perf_counter()
    thread.start()
    try:
        yield lambda: count[0] * 2 * 8192 ** 3 / (time.perf_counter() - t0) / 1e12
    finally:
        stop.set()
        thread.join()


def beside_a_load(loader, device: torch.device, seconds: float = 3.0) -> None:
    """Part 4: the loader alone, a matmul load alone, then both together."""
    n, s = images_per_s(loader, "cuda")
    print(f"whole loader alone: {n / s:.0f} images/s", flush=True)
    with matmul_load(device) as tflops:
        time.sleep(seconds)
        print(f"matmul load alone: {tflops():.0f} TFLOP/s", flush=True)
    with matmul_load(device) as tflops:
        t0, n = time.perf_counter(), 0
        for x, _ in loader:
            n += x.shape[0]
        torch.cuda.synchronize()
        print(f"whole loader beside the load: {n / (time.perf_counter() - t0):.0f} images/s; the load "
              f"{tflops():.0f} TFLOP/s", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, help="folder with train/<class>/<image> (default: generate one)")
    p.add_argument("--num-images", type=int, default=3000, help="images in the generated folder")
    p.add_argument("--workers", type=int, default=15, help="DataLoader workers reading the file bytes")
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks.decoder_probe needs a machine with a CUDA GPU (data.decode=gpu decodes there)")
    device = torch.device("cuda")
    cfg = OmegaConf.load(CONFIG)
    cfg.img_size = 224
    jitter_times(args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data_dir or generate_folder(Path(tmp) / "jpeg", image_sizes(args.num_images))
        loader = make_loader("gpu", root, cfg, "cuda", args.batch, args.workers)
        decoder_parts(loader, device)
        beside_a_load(loader, device)


if __name__ == "__main__":
    main()
