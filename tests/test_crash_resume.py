"""A training run SIGKILLed at six points, each time restarted with ``resume=auto``, ends with the
uninterrupted run's weights, EMA weights and per-step losses, bit for bit (CPU).

``python train.py`` runs as a subprocess on a small image folder the test writes (3 classes, 96 train
and 24 val PNGs, 16 px; batch 8: 12 optimizer steps per epoch, 2 epochs, a checkpoint every 3 steps),
with the regularisation recipe on: mixup/cutmix (``mixup=deit``, numpy's RNG), an EMA of the weights and
repeated augmentation (3 copies of each image per epoch, each augmented on its own; 96 samples an epoch).
The kills come from the ``VIT_TEST_CRASH_AT=<event>:<n>`` hook (vit/checkpoint.py ``crash_point``):
the process sends itself SIGKILL the n-th time it reaches the event, so no cleanup code runs.
After every kill the newest complete checkpoint must equal the uninterrupted run's checkpoint of the
same step, and a temp file left by a killed write must never be picked and must be gone later.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit.checkpoint import TEMP_FILE, find_latest_checkpoint, load_checkpoint

REPO = Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH, EPOCHS = 12, 2

# (VIT_TEST_CRASH_AT, where the kill lands, step of the newest complete checkpoint afterwards).
# Events count from each process's start; each row resumes from the previous row's checkpoint.
CRASHES = [
    ("step:5", "inside optimizer step 5 (epoch 1, mid-epoch)", 3),
    ("save:2", "writing step 9's checkpoint: temp file written, not renamed", 6),
    ("val:2", "epoch 1 validation, after its second batch", 9),
    ("saved:2", "right after step 12's epoch-end checkpoint (best.pt written first)", 12),
    ("step:4", "inside optimizer step 16 (epoch 2, mid-epoch)", 15),
    ("val:1", "epoch 2 validation, after its first batch", 21),
]


def make_image_folder(root: Path) -> Path:
    """3 classes of random 16×16 RGB PNGs, class-shifted brightness: 32 train and 8 val per class."""
    rng = np.random.RandomState(0)
    for split, count in (("train", 32), ("val", 8)):
        for c in range(3):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(rng.randint(0, 160, (16, 16, 3)) + 40 * c, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    return root


def run_train(out_dir: Path, data_root: Path, crash_at: str | None = None, resume: bool = False,
              keep_last: int = 2) -> subprocess.CompletedProcess:
    args = [f"out_dir={out_dir}", "data=imagefolder", f"data.root={data_root}", "data.img_size=16",
            "data.num_workers=0", "model=debug", "attention=naive", "device=cpu", f"epochs={EPOCHS}",
            "batch_size=8", "eval_batch_size=8", "checkpoint.every_steps=3", f"checkpoint.keep_last={keep_last}",
            "logger=none", "progress=false", "log_every=1", f"hydra.run.dir={out_dir}/hydra",
            "mixup=deit", "ema=on", "ema.decay=0.9", "repeated_aug.repeats=3", "repeated_aug.selected_round=0",
            "hydra.output_subdir=null"] + (["resume=auto"] if resume else [])
    env = {k: v for k, v in os.environ.items() if k != "VIT_TEST_CRASH_AT"}
    if crash_at:
        env["VIT_TEST_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def assert_same_state(a: dict, b: dict, what: str) -> None:
    assert a["step"] == b["step"] and a["epoch"] == b["epoch"], what
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), f"{what}: weight {k} differs"
    assert a["ema"].keys() == a["model"].keys() and not torch.equal(a["ema"]["head.weight"], a["model"]["head.weight"])
    for k in a["ema"]:
        assert torch.equal(a["ema"][k], b["ema"][k]), f"{what}: EMA weight {k} differs"
    if "optimizer" in a:
        for i, s in a["optimizer"]["state"].items():
            for k, t in s.items():
                assert torch.equal(t, b["optimizer"]["state"][i][k]), f"{what}: optimizer state {i}.{k} differs"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("data") / "ds")


def step_losses(out_dir: Path) -> dict[int, float]:
    """Each optimizer step's train/loss in metrics.jsonl; a step logged again after a resume keeps its last value."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


def test_sigkill_at_six_points_then_resume_auto_is_exact(data_root, tmp_path):
    ref = run_train(tmp_path / "ref", data_root, keep_last=0)
    assert ref.returncode == 0, ref.stderr[-3000:]
    ref_dir = tmp_path / "ref" / "checkpoints"
    final = ref_dir / f"step_{STEPS_PER_EPOCH * EPOCHS:08d}.pt"
    assert final.exists(), sorted(p.name for p in ref_dir.iterdir())

    out_dir = tmp_path / "crashed"
    ckpt_dir = out_dir / "checkpoints"
    for i, (crash_at, where, expect_step) in enumerate(CRASHES):
        proc = run_train(out_dir, data_root, crash_at=crash_at, resume=i > 0)
        assert proc.returncode == -signal.SIGKILL, f"{crash_at} ({where}) did not kill the run:\n{proc.stderr[-3000:]}"
        assert f"VIT_TEST_CRASH_AT={crash_at}: SIGKILL" in proc.stderr
        path, state = find_latest_checkpoint(ckpt_dir)
        assert state["step"] == expect_step, f"after the kill {where}: newest checkpoint is {path.name}"
        assert_same_state(state, load_checkpoint(ref_dir / path.name), f"{path.name} after the kill {where}")
        temps = [p.name for p in ckpt_dir.iterdir() if TEMP_FILE.match(p.name)]
        if crash_at.startswith("save:"):  # the half-written file is there, under a name resume never picks
            assert len(temps) == 1 and temps[0].startswith(".step_00000009.pt.tmp"), temps
        else:
            assert temps == [], f"stale temp files after the kill {where}: {temps}"

    proc = run_train(out_dir, data_root, resume=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"[resume] from {ckpt_dir / f'step_{CRASHES[-1][2]:08d}.pt'}" in proc.stdout
    assert_same_state(load_checkpoint(ckpt_dir / final.name), load_checkpoint(final), "final checkpoint")
    assert_same_state(load_checkpoint(ckpt_dir / "best.pt"), load_checkpoint(ref_dir / "best.pt"), "best.pt")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["best.pt", "step_00000021.pt", final.name]  # keep_last=2
    want = step_losses(tmp_path / "ref")
    assert sorted(want) == list(range(1, STEPS_PER_EPOCH * EPOCHS + 1))
    assert step_losses(out_dir) == want
