"""The image-folder input pipeline (issue 14): uint8 crops from the workers, normalisation and random erasing on
the device one batch ahead, workers that live for the whole run, and exact resume through all of it (CPU)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_train import compose_cfg

from train import train
from vit.checkpoint import list_checkpoints, load_checkpoint
from vit.data import ResumableSampler, SeededDataset, build_data, build_imagefolder, build_transform
from vit.prefetch import DeviceLoader, Normalize


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """3 classes of random RGB JPEGs and PNGs of assorted sizes (not the training size): 8 train, 4 val per class."""
    root = tmp_path_factory.mktemp("pipeline") / "ds"
    rng = np.random.RandomState(0)
    for split, count in (("train", 8), ("val", 4)):
        for c in range(3):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(count):
                h, w = rng.randint(20, 48, size=2)
                pixels = np.clip(rng.randint(0, 200, (h, w, 3)) + 25 * c, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / split / f"c{c}" / f"{i}.{'jpg' if i % 2 else 'png'}")
    return root


def data_cfg(folder: Path, *overrides: str):
    return compose_cfg("train", ["data=imagefolder", f"data.root={folder}", "data.img_size=16", "data.num_workers=0",
                                 *overrides]).data


def all_batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


@pytest.mark.parametrize("aug", [[], ["data.train_aug.auto_augment=rand-m9-mstd0.5-inc1"]], ids=["crop-flip-jitter",
                                                                                              "randaugment"])
def test_uint8_path_equals_todays_float_transform_bit_for_bit(folder, aug):
    """Workers hand over uint8 crops; normalised on the device they equal timm's whole float transform (ToTensor +
    Normalize) run on the same image under the same sample seed, for train and val."""
    cfg = data_cfg(folder, *aug)
    data = build_data(cfg, 8, 8, "cpu", seed=3)
    data.set_epoch(1)
    image, _, _ = data.train_set[(0, 5)]
    assert image.dtype == torch.uint8 and image.shape == (3, 16, 16)  # what crosses to the device
    sampler = ResumableSampler(len(data.train_set), shuffle=True, seed=3)
    sampler.set_epoch(1)
    reference = SeededDataset(build_imagefolder(folder, "train", build_transform(cfg, True, uint8=False)))
    want = [reference[item] for item in list(sampler)[:16]]
    got = all_batches(data.train_loader)[:2]
    assert torch.equal(torch.cat([x for x, _ in got]), torch.stack([w[0] for w in want]))
    assert torch.cat([y for _, y in got]).tolist() == [w[1] for w in want]

    val_ref = build_imagefolder(folder, "val", build_transform(cfg, False, uint8=False))
    val = all_batches(data.val_loader)
    assert torch.equal(torch.cat([x for x, _ in val]), torch.stack([val_ref[i][0] for i in range(len(val_ref))]))


def test_random_erasing_runs_on_the_batch_seeded_by_its_samples(folder):
    """re_prob=1 erases a box of every image on the device (zeros after normalisation, as timm's 'const' mode),
    the same boxes for a loader restarted at that batch (resume), without touching the global RNG streams."""
    data = build_data(data_cfg(folder, "data.train_aug.re_prob=1.0"), 8, 8, "cpu", seed=0)
    data.set_epoch(0)
    torch.manual_seed(1)
    random.seed(1)
    before = (torch.rand(1), random.random())
    torch.manual_seed(1)
    random.seed(1)
    erased = all_batches(data.train_loader)
    assert (torch.rand(1), random.random()) == before
    assert all((x[i] == 0).all(dim=0).sum() > 0 for x, _ in erased for i in range(len(x)))
    plain = build_data(data_cfg(folder), 8, 8, "cpu", seed=0)
    plain.set_epoch(0)
    assert all((x == 0).sum() == 0 for x, _ in all_batches(plain.train_loader))  # no pixel is exactly the mean
    resumed = build_data(data_cfg(folder, "data.train_aug.re_prob=1.0"), 8, 8, "cpu", seed=0)
    resumed.set_epoch(0, position=8)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(all_batches(resumed.train_loader), erased[1:], strict=True))


def test_device_loader_prepares_one_batch_ahead_and_skips_empty_batches():
    """On CPU (no stream) batch k+1 is already taken from the workers when batch k is handed out; a None batch
    (every image of an evaluation batch bad) is skipped."""
    taken = []

    def batches():
        for k in range(4):
            taken.append(k)
            yield None if k == 2 else (torch.full((1, 3, 2, 2), k, dtype=torch.uint8), torch.tensor([k]))

    loader = DeviceLoader(batches(), "cpu", Normalize((0.0, 0.0, 0.0), (1 / 255, 1 / 255, 1 / 255)))
    it = iter(loader)
    x, y = next(it)
    assert taken == [0, 1] and x.dtype == torch.float32 and torch.equal(x, torch.zeros(1, 3, 2, 2)) and int(y) == 0
    assert [int(y) for _, y in it] == [1, 3]


def worker_pids(loader) -> list[int]:
    return [w.pid for w in loader.loader._iterator._workers]


def test_persistent_workers_see_each_epoch_and_a_restarted_loader_agrees(folder):
    """Two worker processes kept over two epochs: epoch 2's batches differ from epoch 1's and equal, from its
    second batch on, those of a fresh loader started there (a resumed run's)."""
    cfg = data_cfg(folder, "data.num_workers=2")
    data = build_data(cfg, 8, 8, "cpu", seed=0)
    data.set_epoch(0)
    epoch1 = all_batches(data.train_loader)
    pids = worker_pids(data.train_loader)
    data.set_epoch(1)
    epoch2 = all_batches(data.train_loader)
    assert worker_pids(data.train_loader) == pids and all(p is not None for p in pids)
    assert not torch.equal(epoch1[0][0], epoch2[0][0])
    fresh = build_data(cfg, 8, 8, "cpu", seed=0)
    fresh.set_epoch(1, position=8)
    for a, b in zip(all_batches(fresh.train_loader), epoch2[1:], strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_start_epoch_begins_the_next_epoch_early_with_the_same_batches(folder):
    """start_epoch(1) after epoch 0 (train.py calls it before validating): the two workers are sent epoch 1's first
    indices at once, the val loader runs meanwhile, and epoch 1's batches equal those of a loader set to epoch 1 the
    usual way. A set_epoch that would change the begun epoch is refused."""
    cfg = data_cfg(folder, "data.num_workers=2")
    data, plain = build_data(cfg, 8, 8, "cpu", seed=0), build_data(cfg, 8, 8, "cpu", seed=0)
    data.set_epoch(0)
    all_batches(data.train_loader)
    data.start_epoch(1)
    begun = data.train_loader.loader._started
    assert begun is not None and begun._send_idx > 0, "no index was sent to the workers"
    all_batches(data.val_loader)
    with pytest.raises(RuntimeError, match="has begun epoch 1"):
        data.set_epoch(2)
    data.set_epoch(1)  # what train.py's loop does next: a no-op now
    plain.set_epoch(1)
    for (x, y), (xp, yp) in zip(all_batches(data.train_loader), all_batches(plain.train_loader), strict=True):
        assert torch.equal(x, xp) and torch.equal(y, yp)
    assert data.train_loader.loader._started is None
    data.set_epoch(2)
    assert len(all_batches(data.train_loader)) == len(data.train_loader)
    data.start_epoch(3)
    with pytest.raises(RuntimeError, match="has begun epoch 3 already"):
        data.start_epoch(4)
    data.cancel()  # what train.py does when validation raises
    assert data.started is None and data.train_loader.loader._started is None
    data.set_epoch(4)
    assert len(all_batches(data.train_loader)) == len(data.train_loader)


def run(folder: Path, out: Path, *extra: str) -> dict:
    return train(compose_cfg("train", [
        "data=imagefolder", f"data.root={folder}", "data.img_size=16", "data.num_workers=2", "data.train_aug.re_prob=0.5",
        "model=debug", "attention=naive", "device=cpu", "epochs=2", "batch_size=4", "eval_batch_size=6",
        "checkpoint.every_steps=2", "checkpoint.keep_last=0", "logger=none", "progress=false", "log_every=1",
        "schedule.warmup_epochs=0", f"out_dir={out}", *extra]))


def step_losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


def test_persistent_workers_and_resume_reproduce_the_uninterrupted_run(folder, tmp_path):
    """2 workers, 2 epochs of 6 steps, device-side random erasing: resumed from the checkpoint at step 8 (epoch 2,
    whose workers the uninterrupted run started in epoch 1), the run ends with the uninterrupted run's weights
    and per-step losses, bit for bit."""
    ref = run(folder, tmp_path / "ref")
    mid = next(p for p in list_checkpoints(tmp_path / "ref" / "checkpoints") if load_checkpoint(p)["step"] == 8)
    assert load_checkpoint(mid)["epoch"] == 1 and load_checkpoint(mid)["step_in_epoch"] == 2 and ref["steps"] == 12
    resumed = run(folder, tmp_path / "resumed", f"resume={mid}")
    a, b = load_checkpoint(ref["checkpoint"])["model"], load_checkpoint(resumed["checkpoint"])["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = step_losses(tmp_path / "ref")
    assert step_losses(tmp_path / "resumed") == {s: v for s, v in losses.items() if s > 8}
    assert resumed["val"]["loss"] == ref["val"]["loss"]


@pytest.mark.gpu
def test_cuda_batches_made_on_the_side_stream_equal_the_cpu_ones(folder):
    """On CUDA the loader pins memory and prepares each batch on its side stream; normalised and erased ('const'
    boxes from python's RNG) there, the batches equal the CPU path's within float rounding (CUDA divides by a
    scalar as a multiply by its reciprocal: H200, 2026-12-01, not bit for bit) and the erased boxes are the same."""
    cfg = data_cfg(folder, "data.train_aug.re_prob=0.5")
    cpu, cuda = build_data(cfg, 8, 8, "cpu", seed=0), build_data(cfg, 8, 8, "cuda", seed=0)
    cpu.set_epoch(1)
    cuda.set_epoch(1)
    pairs = list(zip(all_batches(cpu.train_loader), all_batches(cuda.train_loader), strict=True))
    assert cuda.train_loader.stream is not None and cuda.train_loader.loader.pin_memory
    for (x, y), (xc, yc) in pairs:
        assert xc.is_cuda and torch.equal(y, yc.cpu())
        torch.testing.assert_close(xc.cpu(), x, rtol=1e-6, atol=1e-6)
