"""End to end on the embedded digits: train 2 epochs, resume exactly, evaluate, read the W&B run back.

One 2-epoch run (module fixture) feeds the resume, eval and W&B tests; the error tests stop before
any training. W&B runs offline into a temporary WANDB_DIR.
"""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

import kernels
from eval import evaluate_checkpoint
from train import train
from vit.checkpoint import list_checkpoints, load_checkpoint
from vit.data import export_digits
from vit.recipe import Recipe

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")
TRAIN_KEYS = ["train/loss", "train/lr", "train/images_per_s", "train/tokens_per_s", "train/step_time_ms",
              "train/data_wait_ms", "train/peak_mem_allocated_mb", "train/peak_mem_reserved_mb"]
VAL_KEYS = ["val/loss", "val/top1", "val/top5"]


def compose_cfg(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory):
    return export_digits(tmp_path_factory.mktemp("cache") / "digits")


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, digits_root):
    """2 epochs, naive attention, mid-epoch checkpoints every 15 steps, all checkpoints kept, W&B offline."""
    tmp = tmp_path_factory.mktemp("run_a")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(tmp / "wandb_dir"))
        mp.setenv("WANDB_SILENT", "true")
        cfg = compose_cfg("train", ["epochs=2", f"out_dir={tmp / 'out'}", f"data.root={digits_root}",
                                    "attention=naive", "logger=wandb", "checkpoint.keep_last=0",
                                    "checkpoint.every_steps=15", "log_every=5", "progress=false",
                                    "schedule.warmup_epochs=0.5"])
        return train(cfg)


def step_ckpts(result) -> list[Path]:
    return list_checkpoints(Path(result["out_dir"]) / "checkpoints")


def resume_run(tmp_path, digits_root, ckpt: Path | str):
    cfg = compose_cfg("train", ["epochs=2", f"out_dir={tmp_path}", f"data.root={digits_root}", "attention=naive",
                                "logger=none", f"resume={ckpt}", "progress=false", "schedule.warmup_epochs=0.5"])
    return train(cfg)


def assert_same_weights(a: Path, b: Path):
    sa, sb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs"


def test_two_epoch_run_learns_and_writes_checkpoints(run_a):
    hist = run_a["history"]
    assert [h["epoch"] for h in hist] == [1, 2]
    assert hist[1]["train_loss"] < hist[0]["train_loss"]
    assert hist[1]["val_loss"] < hist[0]["val_loss"] < math.log(10)  # below chance-level loss
    assert run_a["val"]["top1"] > 15.0  # chance is 10 % ± 1.6 % (1 sd over 360 images); measured 18.9 %
    ckpt = load_checkpoint(run_a["checkpoint"])
    assert ckpt["epoch"] == 2 and ckpt["step_in_epoch"] == 0 and ckpt["step"] == run_a["steps"]
    assert ckpt["config"]["model"]["size"] == "debug" and ckpt["config"]["attention"]["name"] == "naive"
    assert {"torch", "numpy", "python"} <= ckpt["rng"].keys() and "optimizer" in ckpt
    assert ckpt["classes"] == [str(i) for i in range(10)]
    best = load_checkpoint(Path(run_a["out_dir"]) / "checkpoints" / "best.pt")
    assert best["metrics"]["top1"] == run_a["best_top1"] and "optimizer" not in best


def test_resume_from_epoch_1_reproduces_epoch_2_exactly(run_a, digits_root, tmp_path):
    per_epoch = run_a["steps"] // 2
    epoch1 = [p for p in step_ckpts(run_a) if load_checkpoint(p)["step"] == per_epoch]
    assert len(epoch1) == 1 and load_checkpoint(epoch1[0])["epoch"] == 1
    (tmp_path / "checkpoints").mkdir()
    shutil.copy(epoch1[0], tmp_path / "checkpoints" / epoch1[0].name)
    (tmp_path / "checkpoints" / ".step_00000999.pt.tmp1").write_bytes(b"a write killed midway")
    resumed = resume_run(tmp_path, digits_root, "auto")  # finds the epoch-1 checkpoint in out_dir
    assert [h["epoch"] for h in resumed["history"]] == [2]
    assert resumed["history"][0]["train_loss"] == run_a["history"][1]["train_loss"]  # exact, CPU is deterministic
    assert resumed["history"][0]["val_loss"] == run_a["history"][1]["val_loss"]
    assert_same_weights(resumed["checkpoint"], run_a["checkpoint"])


def test_resumed_run_continues_its_wandb_run_metrics_and_clock(run_a, digits_root, tmp_path, monkeypatch):
    """Resume run_a's folder from its epoch-1 checkpoint: the W&B run id is kept, metrics.jsonl holds each step
    once (the lines past step 44 are dropped, then logged again with the same losses), time adds up."""
    out = tmp_path / "out"
    shutil.copytree(run_a["out_dir"], out, ignore=shutil.ignore_patterns("wandb"))
    epoch1 = next(p for p in list_checkpoints(out / "checkpoints") if load_checkpoint(p)["step"] == 44)
    ckpt = load_checkpoint(epoch1)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_cfg("train", ["epochs=2", f"out_dir={out}", f"data.root={digits_root}", "attention=naive",
                                "logger=wandb", f"resume={epoch1}", "progress=false", "schedule.warmup_epochs=0.5",
                                "log_every=5", "checkpoint.every_steps=15", "checkpoint.keep_last=0"])
    resumed = train(cfg)
    run_id = Path(run_a["wandb_dir"]).name.rsplit("-", 1)[1]
    assert ckpt["wandb_id"] == run_id and Path(resumed["wandb_dir"]).name.endswith(f"-{run_id}")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    original = [json.loads(line) for line in (Path(run_a["out_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "val/top1" in r) for r in lines] == [(r["step"], "val/top1" in r) for r in original]
    assert [r.get("train/loss") for r in lines] == [r.get("train/loss") for r in original]  # CPU: exact
    assert 0 < ckpt["train_seconds"] < resumed["train_seconds"]
    assert json.loads((out / "summary.json").read_text())["train_seconds"] == resumed["train_seconds"]
    assert load_checkpoint(resumed["checkpoint"])["train_seconds"] == pytest.approx(resumed["train_seconds"], abs=1)


def test_mid_epoch_resume_reproduces_final_weights(run_a, digits_root, tmp_path):
    mid = [p for p in step_ckpts(run_a) if load_checkpoint(p)["step_in_epoch"] > 0]
    assert mid, "checkpoint.every_steps=15 should have written mid-epoch checkpoints"
    state = load_checkpoint(mid[-1])
    assert state["sampler"]["position"] == state["step_in_epoch"] * state["config"]["batch_size"]
    resumed = resume_run(tmp_path, digits_root, mid[-1])
    assert resumed["val"]["loss"] == run_a["val"]["loss"]
    assert_same_weights(resumed["checkpoint"], run_a["checkpoint"])
    # the epoch's mean train loss covers its steps before the resume too, in the history and summary.csv
    assert resumed["history"][-1]["train_loss"] == run_a["history"][-1]["train_loss"]
    rows = [list(csv.DictReader((Path(r["out_dir"]) / "summary.csv").open()))[-1] for r in (resumed, run_a)]
    assert rows[0]["epoch"] == rows[1]["epoch"] == "2" and rows[0]["train_loss"] == rows[1]["train_loss"]


def test_resume_with_a_longer_schedule_is_refused_unless_allowed(run_a, digits_root, tmp_path):
    """epochs=2 -> 3 on resume recomputes the cosine over 3 epochs, so the LR at the resumed step rises again:
    refused naming the key and the option; with allow_schedule_change=true, a warning gives the old and new LR
    at the resumed step and the run continues on the new curve."""
    from omegaconf import OmegaConf

    from vit.build import ConfigWarning
    from vit.resume import lr_curve

    overrides = ["epochs=3", f"out_dir={tmp_path}", f"data.root={digits_root}", "attention=naive", "logger=none",
                 f"resume={run_a['checkpoint']}", "progress=false", "schedule.warmup_epochs=0.5", "log_every=1"]
    with pytest.raises(ValueError, match=r"epochs: 2 -> 3 change the learning-rate schedule: at the resumed step "
                                         r"88 .* set allow_schedule_change=true"):
        train(compose_cfg("train", overrides))
    assert not list_checkpoints(tmp_path / "checkpoints")
    cfg = compose_cfg("train", [*overrides, "allow_schedule_change=true"])
    old_cfg = OmegaConf.create(load_checkpoint(run_a["checkpoint"])["config"])
    ([was], _, _), ([now, after, end], _, total) = lr_curve(old_cfg, 44, [88]), lr_curve(cfg, 44, [88, 89, 132])
    assert total == 132  # 3 epochs of 1437 // 32 = 44 steps
    assert now > 10 * was  # the cosine over 3 epochs is far from its end at step 88
    with pytest.warns(ConfigWarning, match=rf"the LR was {was:.4g} under the checkpoint's schedule and is "
                                           rf"{now:.4g} under this run's; .* {end:.4g} at step 132 \(end\)"):
        resumed = train(cfg)
    first = json.loads((Path(resumed["out_dir"]) / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 89 and first["train/lr"] == pytest.approx(after, rel=1e-6)  # the LR for step 90
    assert resumed["steps"] == 132


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_eval_reproduces_training_top1(run_a, digits_root, tmp_path, attention):
    cfg = compose_cfg("eval", [f"checkpoint={run_a['checkpoint']}", f"attention={attention}", "logger=none",
                               f"out_dir={tmp_path}"])
    metrics = evaluate_checkpoint(cfg)
    assert metrics["backend"] == attention and metrics["images"] == 360
    assert abs(metrics["top1"] - run_a["val"]["top1"]) <= 0.1
    assert abs(metrics["loss"] - run_a["val"]["loss"]) <= 1e-4
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["top1"] == metrics["top1"]


def read_wandb_records(path: Path) -> list:
    """Records of a ``.wandb`` file: W&B's LevelDB-style log (7-byte file header, 32 KiB blocks, 7-byte
    record headers: crc32c, little-endian length, type FULL=1/FIRST=2/MIDDLE=3/LAST=4) of protobuf
    ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, block, pending, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_run_holds_throughput_and_memory(run_a):
    run_dir = Path(run_a["wandb_dir"])
    assert run_dir.parent.parent == Path(run_a["out_dir"]) and run_dir.name.startswith("offline-run-")
    records = read_wandb_records(next(run_dir.glob("run-*.wandb")))
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    summary = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
               for r in records if r.WhichOneof("record_type") == "summary" for i in r.summary.update}
    config = {i.key: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "run"
              for i in r.run.config.update}
    train_rows = [h for h in history if "train/loss" in h]
    assert len(train_rows) >= run_a["steps"] // 5
    for key in TRAIN_KEYS:
        assert all(key in h for h in train_rows), f"{key} missing from the W&B history"
    assert all(h["train/images_per_s"] > 0 and h["train/tokens_per_s"] == pytest.approx(65 * h["train/images_per_s"])
               for h in train_rows)
    assert all(h["train/peak_mem_allocated_mb"] == 0 for h in train_rows)  # CPU run
    val_rows = [h for h in history if "val/top1" in h]
    assert [h["epoch"] for h in val_rows] == [1, 2] and all(k in val_rows[0] for k in VAL_KEYS)
    assert val_rows[-1]["val/top1"] == pytest.approx(run_a["val"]["top1"])
    assert summary["backend"] == "naive" and summary["final/val_top1"] == pytest.approx(run_a["val"]["top1"])
    assert config["env"]["backend"] == "naive" and config["model"]["size"] == "debug"
    assert not any("API_KEY" in json.dumps(v) for v in config.values())


def test_console_lines_reach_the_run_folders_train_log(tmp_path):
    """`python train.py` under Hydra: the console shows the lines as they are, Hydra's train.log in the run dir
    holds them with time and level (it was empty), warnings included; out_dir elsewhere gets its own train.log."""
    import subprocess
    import sys

    overrides = ["data=synthetic", "data.img_size=16", "data.num_classes=4", "data.train_samples=32",
                 "data.val_samples=16", "batch_size=16", "epochs=1", "attention=naive", "device=cpu", "progress=false",
                 "logger=none", f"hydra.run.dir={tmp_path / 'hydra'}", f"out_dir={tmp_path / 'out'}"]
    run = subprocess.run([sys.executable, "train.py", *overrides], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parents[1], check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("\n[run] ") == 1 and run.stdout.count("\nfinal val top-1 ") == 1  # each line once
    assert "[INFO]" not in run.stdout
    for log in (tmp_path / "hydra" / "train.log", tmp_path / "out" / "train.log"):
        text = log.read_text()
        assert "][INFO] [run] " in text and "][INFO] [val   epoch 1/1] step 2 " in text and "final val top-1" in text
    assert "never leaves warm-up" in (tmp_path / "hydra" / "train.log").read_text()  # a ConfigWarning


def test_multirun_sweep_is_one_wandb_group_with_runs_named_by_their_overrides(tmp_path):
    """`python train.py -m attention=naive,sdpa ...`: both W&B runs share the sweep's group, each is named by its
    overrides and tagged with the value of the swept key."""
    import subprocess
    import sys

    overrides = ["-m", "attention=naive,sdpa", "data=synthetic", "data.img_size=16", "data.num_classes=4",
                 "data.train_samples=16", "data.val_samples=8", "batch_size=16", "epochs=1", "device=cpu",
                 "schedule.warmup_epochs=0", "progress=false", "logger=wandb", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    run = subprocess.run([sys.executable, "train.py", *overrides], capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).parents[1], env=env, check=False)
    assert run.returncode == 0, run.stderr
    runs = {}
    for job in (tmp_path / "sweep").glob("[0-9]"):
        [record] = [r.run for r in read_wandb_records(next(job.glob("wandb/offline-run-*/run-*.wandb")))
                    if r.WhichOneof("record_type") == "run"]
        runs[record.display_name] = (record.run_group, list(record.tags))
    group = str(tmp_path / "sweep")
    assert runs == {"attention=naive": (group, ["attention=naive"]), "attention=sdpa": (group, ["attention=sdpa"])}


def test_unknown_backend_is_a_clear_error():
    cfg = compose_cfg("train", ["attention.name=flashy"])
    with pytest.raises(ValueError, match=r"attention.name='flashy'.*auto, cuda, flash, naive, sdpa"):
        train(cfg)


def test_unavailable_backend_never_falls_back(monkeypatch, tmp_path):
    monkeypatch.setitem(kernels.BACKENDS, "flash", ("kernels._not_built_yet", "attention"))
    cfg = compose_cfg("train", ["attention=flash", f"out_dir={tmp_path}", "logger=none"])
    with pytest.raises(RuntimeError, match=r"'flash' is not available.*no automatic fallback"):
        train(cfg)


def test_missing_dataset_path_is_a_clear_error(tmp_path):
    cfg = compose_cfg("train", ["data=imagefolder", f"data.root={tmp_path / 'nope'}", "logger=none",
                                f"out_dir={tmp_path / 'out'}", "attention=naive"])
    with pytest.raises(FileNotFoundError, match=r"nope does not exist \(set data.root\)"):
        train(cfg)


def make_folder(root: Path, layout: dict[str, dict[str, int]]) -> Path:
    """``layout = {"train": {"cat": 2, ...}, ...}``: that many random 8×8 PNGs per class folder."""
    for split, classes in layout.items():
        for cls, count in classes.items():
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(torch.randint(0, 255, (8, 8, 3), dtype=torch.uint8).numpy()).save(
                    root / split / cls / f"{i}.png")
    return root


def test_empty_class_folder_is_a_clear_error(tmp_path):
    root = make_folder(tmp_path / "ds", {"train": {"cat": 2, "dog": 0}, "val": {"cat": 1, "dog": 1}})
    cfg = compose_cfg("train", ["data=imagefolder", f"data.root={root}", "data.img_size=32", "logger=none",
                                f"out_dir={tmp_path / 'out'}", "attention=naive", "model=debug"])
    with pytest.raises(ValueError, match=r"class folder\(s\) hold no image file.*dog"):
        train(cfg)


def test_class_mismatch_between_splits_is_a_clear_error(tmp_path):
    root = make_folder(tmp_path / "ds", {"train": {"cat": 1, "dog": 1}, "val": {"cat": 1, "emu": 1}})
    cfg = compose_cfg("train", ["data=imagefolder", f"data.root={root}", "data.img_size=32", "logger=none",
                                f"out_dir={tmp_path / 'out'}", "attention=naive"])
    with pytest.raises(ValueError, match=r"only in train: \['dog'\], only in val: \['emu'\]"):
        train(cfg)


def test_checkpoint_of_another_model_size_is_a_clear_error(run_a, digits_root, tmp_path):
    cfg = compose_cfg("train", ["model=tiny", f"data.root={digits_root}", "logger=none", f"out_dir={tmp_path}",
                                "attention=naive", f"resume={run_a['checkpoint']}"])
    with pytest.raises(RuntimeError, match=r"size: debug in checkpoint, tiny in this run"):
        train(cfg)
    cfg = compose_cfg("eval", [f"checkpoint={run_a['checkpoint']}", "model=tiny", "logger=none",
                               f"out_dir={tmp_path}"])
    with pytest.raises(RuntimeError, match=r"does not fit the model"):
        evaluate_checkpoint(cfg)


class _Logger:
    rank = 0

    def __init__(self):
        self.lines = []

    def print(self, msg):
        self.lines.append(msg)

    def log(self, metrics, step, prefix=""):
        pass


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_nonfinite_loss_policy(policy):
    """A NaN batch at step 2: 'stop' raises naming step 2; 'skip' leaves the weights untouched on the
    bad steps and stops once more than max_skips steps were skipped."""
    from timm.scheduler import CosineLRScheduler

    from vit.engine import NonFiniteLossError, TrainState, train_epoch
    from vit.model import create_model

    torch.manual_seed(0)
    model = create_model("debug", img_size=8, patch_size=4, num_classes=3)
    good = (torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0]))
    bad = (torch.full((4, 3, 8, 8), float("nan")), good[1])
    loader = [good, bad, bad, bad, good]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = CosineLRScheduler(optimizer, t_initial=5, t_in_epochs=False)
    state, logger = TrainState(), _Logger()
    kwargs = {"device": torch.device("cpu"), "amp_dtype": None, "grad_accum": 1, "clip_grad": 1.0,
              "recipe": Recipe(torch.nn.functional.cross_entropy), "steps_per_epoch": 5, "world_size": 1,
              "log_every": 10,
              "nonfinite_policy": policy, "max_nonfinite_skips": 2, "logger": logger, "backend": "naive",
              "seq_len": 5, "progress": False}
    before = {}

    def on_step_end(s):
        before[s.step] = model.head.weight.detach().clone()

    with pytest.raises(NonFiniteLossError, match=r"non-finite loss .* at step (2|4) "):
        train_epoch(model, loader, optimizer, scheduler, state, on_step_end=on_step_end, **kwargs)
    if policy == "stop":
        assert state.step == 1 and state.nonfinite_skips == 1
    else:  # steps 2 and 3 skipped (weights as after step 1), step 4 is the third bad one: stop
        assert state.nonfinite_skips == 3 and len([m for m in logger.lines if "step skipped" in m]) == 2
        assert torch.equal(before[2], before[1]) and torch.equal(before[3], before[1])
        assert torch.isfinite(model.head.weight).all()


def test_overflowing_grad_norm_is_named_not_the_finite_loss():
    """Gradients of ~1e28 are finite but their squared norm overflows float32: the message says the grad
    norm is inf and that the loss (finite) is not the cause."""
    from timm.scheduler import CosineLRScheduler

    from vit.engine import NonFiniteLossError, TrainState, train_epoch
    from vit.model import create_model

    torch.manual_seed(0)
    model = create_model("debug", img_size=8, patch_size=4, num_classes=3)
    model.head.weight.register_hook(lambda g: g * 1e30)
    loader = [(torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0]))]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(NonFiniteLossError) as info:
        train_epoch(model, loader, optimizer, CosineLRScheduler(optimizer, t_initial=1, t_in_epochs=False),
                    TrainState(), device=torch.device("cpu"), amp_dtype=None, grad_accum=1, clip_grad=1.0,
                    recipe=Recipe(torch.nn.functional.cross_entropy), steps_per_epoch=1, world_size=1, log_every=10,
                    nonfinite_policy="stop", max_nonfinite_skips=0, logger=_Logger(), backend="naive", seq_len=5,
                    progress=False)
    message = str(info.value)
    assert message.startswith("non-finite grad norm inf (the loss, ") and "is finite) at step 1 " in message
    loss = float(message.split("the loss, ")[1].split(",")[0])
    assert math.isfinite(loss) and 0 < loss < 10


def test_init_from_resizes_pos_embed_for_another_image_size(run_a, digits_root, tmp_path, capsys):
    """Fine-tuning the 32 px checkpoint at 48 px: weights load with the 8×8 position grid resampled to 12×12."""
    # lr ~ 0, so the weights after the epoch are the ones init_from loaded
    cfg = compose_cfg("train", ["epochs=1", f"out_dir={tmp_path}", f"data.root={digits_root}", "data.img_size=48",
                                "attention=sdpa", "logger=none", "progress=false", f"init_from={run_a['checkpoint']}",
                                "optim.lr=1e-12", "schedule.min_lr=0", "schedule.warmup_lr_init=0"])
    result = train(cfg)
    assert "resized pos_embed from a 8×8 to a 12×12 patch grid" in capsys.readouterr().out
    tuned, source = load_checkpoint(result["checkpoint"])["model"], load_checkpoint(run_a["checkpoint"])["model"]
    assert tuned["pos_embed"].shape == (1, 145, 64)
    for name in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "head.weight"):
        torch.testing.assert_close(tuned[name], source[name], rtol=0, atol=1e-6)  # the trained weights, loaded
    torch.testing.assert_close(tuned["pos_embed"][:, 0], source["pos_embed"][:, 0], rtol=0, atol=1e-6)  # class token


def test_init_from_timm_reads_a_local_file_offline(tmp_path, monkeypatch):
    """init_from=timm:vit_tiny_patch16_224 init_from_file=<state dict saved by timm>, with the hub offline: timm's
    own pretrained loading reads the file, resamples pos_embed to the 2×2 grid of 32 px, gives a fresh 4-class head."""
    import timm

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    saved = timm.create_model("vit_tiny_patch16_224", pretrained=False).state_dict()
    torch.save(saved, tmp_path / "vit_tiny.pth")
    cfg = compose_cfg("train", ["model=tiny", "data=synthetic", "data.img_size=32", "data.num_classes=4",
                                "data.train_samples=16", "data.val_samples=8", "batch_size=16", "epochs=1",
                                "attention=sdpa", "logger=none", "progress=false", f"out_dir={tmp_path / 'out'}",
                                "init_from=timm:vit_tiny_patch16_224", f"init_from_file={tmp_path / 'vit_tiny.pth'}",
                                "optim.lr=1e-12", "schedule.min_lr=0", "schedule.warmup_lr_init=0",
                                "schedule.warmup_epochs=0"])
    tuned = load_checkpoint(train(cfg)["checkpoint"])["model"]
    for name in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.11.mlp.fc2.bias", "norm.weight"):
        torch.testing.assert_close(tuned[name], saved[name], rtol=0, atol=1e-6)
    assert tuned["pos_embed"].shape == (1, 5, 192) and tuned["head.weight"].shape == (4, 192)
    torch.testing.assert_close(tuned["pos_embed"][:, 0], saved["pos_embed"][:, 0], rtol=0, atol=1e-6)  # class token
    with pytest.raises(ValueError, match=r"init_from_file=.*null unless init_from=timm:<model name>"):
        train(compose_cfg("train", [f"init_from_file={tmp_path / 'vit_tiny.pth'}", "logger=none"]))


def test_rectangular_images_train_from_an_image_folder(tmp_path):
    """data.img_size=[16, 32]: the folder's images are cropped to 16×32 (train and eval), N = 4·8 + 1 = 33, and the
    checkpoint keeps [16, 32] (a resume with it passes the model check)."""
    root = make_folder(tmp_path / "ds", {"train": {"cat": 8, "dog": 8}, "val": {"cat": 2, "dog": 2}})
    overrides = ["data=imagefolder", f"data.root={root}", "data.img_size=[16,32]", "data.num_workers=0",
                 "batch_size=8", "epochs=1", "attention=naive", "logger=none", "progress=false",
                 "schedule.warmup_epochs=0", f"out_dir={tmp_path / 'out'}"]
    result = train(compose_cfg("train", overrides))
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["seq_len"] == 33
    ckpt = load_checkpoint(result["checkpoint"])
    assert ckpt["model_args"]["img_size"] == [16, 32] and ckpt["model"]["pos_embed"].shape == (1, 33, 64)
    resumed = train(compose_cfg("train", [*overrides, "epochs=1", f"resume={result['checkpoint']}"]))
    assert resumed["steps"] == result["steps"]
    with pytest.raises(ValueError, match=r"data.img_size=\[16, 30\]: an integer or \[height, width\], each a multiple"):
        train(compose_cfg("train", ["data.img_size=[16,30]", "logger=none"]))


def test_synthetic_data_with_grad_accum(tmp_path):
    """Throughput path: device-made batches, 2 micro-batches per optimizer step, partial last val batch."""
    cfg = compose_cfg("train", ["data=synthetic", "data.img_size=32", "data.num_classes=10", "data.train_samples=128",
                                "data.val_samples=40", "eval_batch_size=32", "grad_accum=2", "epochs=1",
                                "attention=sdpa", "logger=none", "progress=false", f"out_dir={tmp_path}"])
    result = train(cfg)
    assert result["steps"] == 128 // 32 and result["val"]["images"] == 40
    assert math.isfinite(result["history"][0]["train_loss"])
