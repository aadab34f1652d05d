"""Checkpoint files: atomic writes, safe loading, newest-complete lookup, keep-last-K, RNG round trip."""
from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from vit.checkpoint import (
    capture_rng_state,
    find_latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_state_dict_file,
    prune_checkpoints,
    restore_rng_state,
    save_best,
    save_checkpoint,
    step_checkpoint_path,
)


def test_keep_best_keeps_the_n_highest_top1(tmp_path):
    """checkpoint.keep_best=3 over epochs of val top-1 50, 70, 60, 80, 65, 70, 70: the 80 and both first 70s
    (the last 70 only ties the lowest kept, so the earlier stays); best.pt is the 80."""
    for step, top1 in enumerate([50.0, 70.0, 60.0, 80.0, 65.0, 70.0, 70.0], start=1):
        save_best(tmp_path, {"step": step}, top1, step, improved=top1 == 80.0 or step == 1, keep_best=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.pt", "top1_70.0000_step_00000002.pt", "top1_70.0000_step_00000006.pt", "top1_80.0000_step_00000004.pt"]
    assert load_checkpoint(tmp_path / "best.pt")["step"] == 4


def test_training_keeps_the_best_epochs_beside_the_last(tmp_path):
    from hydra import compose, initialize_config_dir

    from train import train

    with initialize_config_dir(config_dir=str(Path(__file__).parents[1] / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "data=synthetic", "data.img_size=16", "data.num_classes=4", "data.train_samples=32", "data.val_samples=64",
            "batch_size=16", "epochs=4", "attention=naive", "device=cpu", "progress=false", "logger=none",
            "checkpoint.keep_last=1", "checkpoint.keep_best=2", "optim.lr=0.05", f"out_dir={tmp_path}"])
    result = train(cfg)
    top1 = [h["val_top1"] for h in result["history"]]
    best = sorted(((-t, e) for e, t in enumerate(top1, start=1)))[:2]
    expected = {f"top1_{-t:.4f}_step_{2 * e:08d}.pt" for t, e in best}  # 2 steps per epoch
    names = {p.name for p in (tmp_path / "checkpoints").iterdir()}
    assert names == {"best.pt", "step_00000008.pt", *expected}, (top1, names)
    assert "optimizer" not in load_checkpoint(tmp_path / "checkpoints" / min(expected))


def test_save_is_atomic_and_roundtrips(tmp_path):
    state = {"model": {"w": torch.randn(3, 4)}, "step": 7, "config": {"a": [1, 2]}}
    path = save_checkpoint(tmp_path / "c.pt", state)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temp file left behind
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], state["model"]["w"]) and loaded["step"] == 7
    assert loaded["config"] == {"a": [1, 2]}


def test_malicious_pickle_is_refused(tmp_path):
    """A pickle that would run code on load is refused by weights_only loading; nothing runs."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pt"
    torch.save({"model": Evil()}, path, pickle_module=pickle)
    with pytest.raises(RuntimeError, match="cannot load checkpoint .* safely"):
        load_checkpoint(path)
    assert not marker.exists()


def test_latest_skips_incomplete_and_corrupt(tmp_path):
    for step in (10, 20):
        save_checkpoint(step_checkpoint_path(tmp_path, step), {"step": step})
    (tmp_path / ".step_00000030.pt.tmp123").write_bytes(b"half a checkpoint")  # a write killed midway
    step_checkpoint_path(tmp_path, 40).write_bytes(b"garbage")  # a corrupt file under a final name
    path, state = find_latest_checkpoint(tmp_path)
    assert path.name == "step_00000020.pt" and state["step"] == 20
    assert find_latest_checkpoint(tmp_path / "missing") is None


def test_prune_keeps_last_k(tmp_path):
    for step in (1, 2, 3, 4):
        save_checkpoint(step_checkpoint_path(tmp_path, step), {"step": step})
    save_checkpoint(tmp_path / "best.pt", {"step": 1})
    prune_checkpoints(tmp_path, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003.pt", "step_00000004.pt"]
    assert (tmp_path / "best.pt").exists()


def test_rng_state_roundtrip_through_file(tmp_path):
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    save_checkpoint(tmp_path / "r.pt", {"rng": capture_rng_state()})
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(2)
    random.seed(2)
    np.random.seed(2)
    restore_rng_state(load_checkpoint(tmp_path / "r.pt")["rng"])
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_state_dict_file_formats(tmp_path):
    from safetensors.torch import save_file

    sd = {"head.weight": torch.randn(2, 3)}
    save_file(sd, tmp_path / "w.safetensors")
    torch.save({"state_dict": sd}, tmp_path / "w.pth")
    for name in ("w.safetensors", "w.pth"):
        assert torch.equal(load_state_dict_file(tmp_path / name)["head.weight"], sd["head.weight"])
