"""vit/data_wait.py: the once-a-run console line when the loader bounds training, and its wiring in train.py."""
import pytest
import torch
from omegaconf import OmegaConf
from test_train import compose_cfg

import train as train_module
import vit.data_wait as dw
from vit.data_wait import DataWaitCheck, data_bound_message

FOLDER = OmegaConf.create({"name": "imagefolder", "root": "/data/imagenet", "num_workers": 4, "decode": "cpu"})


def test_message_names_the_share_and_what_applies(monkeypatch):
    monkeypatch.setattr(dw, "cores_per_process", lambda: 16)
    assert data_bound_message(25.0, 100.0, FOLDER) is None  # a quarter is not over a quarter
    line = data_bound_message(265.0, 600.0, FOLDER)
    assert "waited 265 ms of 600 ms for data (44%)" in line
    assert "data.num_workers=8 (now 4, 16 cores" in line and "data.decode=gpu" in line
    assert "python -m vit.prepare data.root=/data/imagenet out=<new folder> max_side=<px>" in line
    busy = OmegaConf.merge(FOLDER, {"num_workers": 15, "decode": "gpu"})
    line = data_bound_message(300.0, 600.0, busy)
    assert "num_workers" not in line and "decode" not in line and "vit.prepare" in line
    assert data_bound_message(300.0, 600.0, OmegaConf.merge(FOLDER, {"num_workers": 0}))  # 0 workers: 1 suggested
    assert "data.num_workers=1 " in data_bound_message(300.0, 600.0, OmegaConf.merge(FOLDER, {"num_workers": 0}))
    assert data_bound_message(500.0, 600.0, OmegaConf.create({"name": "synthetic", "num_workers": 0})) is None
    digits = OmegaConf.create({"name": "digits", "root": None, "num_workers": 0, "decode": "cpu"})
    assert data_bound_message(300.0, 600.0, digits).endswith("Try: more loader processes, data.num_workers=1 "
                                                              "(now 0, 16 cores for this process)")
    monkeypatch.setattr(dw, "cores_per_process", lambda: 1)
    assert data_bound_message(300.0, 600.0, digits).endswith("over the last logging window.")


def test_check_says_it_once_and_skips_each_epochs_first_window():
    said = []
    check = DataWaitCheck(FOLDER, torch.device("cuda"), said.append)  # no GPU used: the device type only
    slow, fast = {"data_wait_ms": 300.0, "step_time_ms": 600.0}, {"data_wait_ms": 10.0, "step_time_ms": 600.0}
    check(slow, epoch=0)  # the epoch's first window: worker start-up, not judged
    check(fast, epoch=0)
    assert said == []
    check(slow, epoch=1)  # first of epoch 1
    check(slow, epoch=1)
    check(slow, epoch=1)
    check(slow, epoch=2)
    check(slow, epoch=2)
    assert len(said) == 1 and "(50%)" in said[0]
    on_cpu = DataWaitCheck(FOLDER, torch.device("cpu"), said.append)
    for epoch in (0, 0, 0):
        on_cpu(slow, epoch)
    assert len(said) == 1


def test_train_calls_the_check_after_each_logged_window(tmp_path, monkeypatch):
    calls = []

    class Recorder(DataWaitCheck):
        def __call__(self, window, epoch):
            calls.append((epoch, window["data_wait_ms"] >= 0, window["step_time_ms"] > 0))

    monkeypatch.setattr(train_module, "DataWaitCheck", Recorder)
    train_module.train(compose_cfg("train", [
        "data=synthetic", "data.img_size=16", "data.num_classes=4", "data.train_samples=64", "data.val_samples=16",
        "batch_size=16", "epochs=2", "log_every=2", "attention=naive", "device=cpu", "progress=false", "logger=none",
        f"out_dir={tmp_path}"]))
    assert calls == [(0, True, True), (0, True, True), (1, True, True), (1, True, True)]


@pytest.mark.parametrize("wait,step", [(0.0, 0.0), (1.0, 0.0)])
def test_no_steps_no_message(wait, step):
    assert data_bound_message(wait, step, FOLDER) is None
