"""eval.py: the README's eval commands as typed, bare timm state dicts, data overrides, class checks, torchrun.

A 3-class folder of random images (9 val images, so 2 processes get uneven shards), a checkpoint of
ours (ViT-Ti/16 at 32 px) trained on it for one epoch, and a timm ``vit_tiny_patch16_224`` state dict saved by timm itself
(``.safetensors`` and ``.pth``). W&B runs offline into the temporary folders.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import yaml
from hydra import compose, initialize_config_dir
from PIL import Image
from safetensors.torch import save_file

from eval import evaluate_checkpoint
from train import train
from vit.data import build_eval_data
from vit.images import class_difference

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = str(ROOT / "configs")
TORCHRUN = Path(sys.executable).with_name("torchrun")


def compose_cfg(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def make_folder(root: Path, classes: str, val_per_class: int, seed: int) -> Path:
    """``root/{train,val}/<class>/*.png``: 2 train and ``val_per_class`` val images of 40×48 random pixels per class."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", 2), ("val", val_per_class)):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    folder, other = make_folder(tmp / "imgs", "abc", 3, 0), make_folder(tmp / "other", "abc", 2, 1)
    torch.manual_seed(0)
    peer = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3).eval()
    save_file(peer.state_dict(), str(tmp / "vit_tiny.safetensors"))
    torch.save(peer.state_dict(), tmp / "vit_tiny.pth")
    run = train(compose_cfg("train", ["data=imagefolder", f"data.root={folder}", "data.img_size=32", "data.num_workers=0",
                                      "model=tiny", "epochs=1", "batch_size=2", "attention=naive", "logger=none",
                                      "progress=false", f"out_dir={tmp / 'run'}"]))
    return {"tmp": tmp, "folder": folder, "other": other, "peer": peer, "run": run}


def peer_loss(setup) -> float:
    """timm's own model on the val folder, through the same eval transform (imagefolder at 224 px)."""
    loader, _ = build_eval_data(compose_cfg("eval", ["data=imagefolder", f"data.root={setup['folder']}",
                                                     "data.num_workers=0"]).data, 256, "cpu")
    x, y = next(iter(loader))
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(setup["peer"](x), y).item()


def readme_eval_commands() -> list[str]:
    """Every ``python eval.py ...`` line of the README's bash blocks, without its trailing comment."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
            if line.startswith("python eval.py")]


def readme_overrides(command: str, setup) -> list[str]:
    """The command's Hydra overrides with the README's placeholder paths replaced by the test's files."""
    run = setup["run"]
    places = {"outputs/<date>/<time>/checkpoints/step_00001320.pt": run["checkpoint"], "...": run["best_checkpoint"],
              ".../best.pt": run["best_checkpoint"], "/data/imagenet": setup["folder"], "/data/other": setup["other"]}
    out = []
    for token in shlex.split(command)[2:]:
        key, value = token.split("=", 1)
        if value in places:
            value = str(places[value])
        assert not re.search(r"<|\.\.\.|^/data/", value), (
            f"README command {command!r}: placeholder {value!r} has no stand-in in tests/test_eval.py")
        out.append(f"{key}={value}")
    return out


def test_readme_eval_commands_run_as_typed(setup, monkeypatch):
    commands = readme_eval_commands()
    assert any("safetensors" in c for c in commands) and len(commands) >= 4, commands
    monkeypatch.chdir(setup["tmp"])  # where vit_tiny.safetensors is, as in the README
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for command in commands:
        metrics = evaluate_checkpoint(compose_cfg("eval", readme_overrides(command, setup)))
        other = "/data/other" in command
        assert metrics["images"] == (6 if other else 9), command
        assert Path(metrics["wandb_dir"]).is_dir() and (Path(metrics["out_dir"]) / "eval.json").is_file()
        if "attention=" in command:
            assert metrics["backend"] == command.split("attention=")[1].split()[0]
        if "safetensors" in command:  # timm's weights give timm's own loss
            assert metrics["loss"] == pytest.approx(peer_loss(setup), rel=1e-4)


def test_bare_pth_state_dict_equals_safetensors(setup):
    common = ["model=tiny", "data=imagefolder", f"data.root={setup['folder']}", "logger=none",
              f"out_dir={setup['tmp'] / 'pth'}"]
    a = evaluate_checkpoint(compose_cfg("eval", [f"checkpoint={setup['tmp'] / 'vit_tiny.pth'}", *common]))
    b = evaluate_checkpoint(compose_cfg("eval", [f"checkpoint={setup['tmp'] / 'vit_tiny.safetensors'}", *common]))
    assert a["loss"] == b["loss"] == pytest.approx(peer_loss(setup), rel=1e-4)
    assert a["backend"] == "naive"  # attention=auto on a CPU


def test_bare_state_dict_needs_model_and_data(setup):
    for extra in (["model=tiny"], ["data=imagefolder", f"data.root={setup['folder']}"]):
        cfg = compose_cfg("eval", [f"checkpoint={setup['tmp'] / 'vit_tiny.pth'}", "logger=none", *extra])
        with pytest.raises(ValueError, match="bare state dict without a config; pass model=<size> and data="):
            evaluate_checkpoint(cfg)


def test_data_keys_override_the_checkpoints(setup, capsys):
    base = [f"checkpoint={setup['run']['checkpoint']}", "logger=none", f"out_dir={setup['tmp'] / 'over'}"]
    bigger = evaluate_checkpoint(compose_cfg("eval", [*base, "data.img_size=48"]))
    assert "resized pos_embed from a 2×2 to a 3×3 patch grid" in capsys.readouterr().out
    same = evaluate_checkpoint(compose_cfg("eval", base))
    assert bigger["images"] == same["images"] == 9 and bigger["loss"] != same["loss"]
    moved = evaluate_checkpoint(compose_cfg("eval", [*base, f"data.root={setup['other']}"]))
    assert moved["images"] == 6


def test_eval_config_can_override_every_data_key_evaluation_reads():
    template = yaml.safe_load((ROOT / "configs" / "eval.yaml").read_text())["data"]
    for path in (ROOT / "configs" / "data").glob("*.yaml"):
        keys = set(yaml.safe_load(path.read_text())) - {"train_aug", "train_samples", "decode"}  # training's only
        assert keys <= set(template), f"configs/eval.yaml's data: lacks {sorted(keys - set(template))} of {path.name}"
        assert all(v is None for v in template.values())


def test_class_mismatch_names_the_classes(setup, tmp_path):
    abd = make_folder(tmp_path / "abd", "abd", 1, 2)
    cfg = compose_cfg("eval", [f"checkpoint={setup['run']['checkpoint']}", "data=imagefolder", f"data.root={abd}",
                               "data.img_size=32", "logger=none", f"out_dir={tmp_path}"])
    with pytest.raises(RuntimeError, match=r"only in the checkpoint: \['c'\] \(1\), only in the folder: \['d'\] \(1\)"):
        evaluate_checkpoint(cfg)


def test_class_difference_names_order_changes():
    assert class_difference(["a", "b"], ["a", "b"]) == ""
    assert "label 0 is 'a' in x, 'b' in y" in class_difference(["a", "b"], ["b", "a"], "x", "y")


def test_torchrun_shards_the_val_set_and_reports_once(setup, tmp_path):
    """2 gloo processes, 5 + 4 val images: rank 0 reports the totals of both shards, once."""
    one = evaluate_checkpoint(compose_cfg("eval", [f"checkpoint={setup['run']['checkpoint']}", "logger=none",
                                                   f"out_dir={tmp_path / 'one'}"]))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(TORCHRUN), "--nproc_per_node=2", "--standalone", str(ROOT / "eval.py"),
                           f"checkpoint={setup['run']['checkpoint']}", "logger=none", "device=cpu",
                           f"out_dir={tmp_path / 'two'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("[eval naive]") == 1 and "(9 images over 2 processes)" in proc.stdout, proc.stdout
    two = json.loads((tmp_path / "two" / "eval.json").read_text())
    assert two["world_size"] == 2 and two["images"] == 9
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6) and two["top1"] == one["top1"]
    assert len(list((tmp_path / "outputs" / "eval").glob("*/*"))) == 1  # rank 0's Hydra run dir, not rank 1's


def test_a_digits_root_that_holds_something_else_is_refused_with_what_to_pass(tmp_path):
    """eval.py checkpoint=<digits run> data.root=<an image folder>: the digits config keeps data.name=digits, so
    data.root is where digits would be exported; a folder holding other files gets a ValueError naming
    data=imagefolder (a raw OSError from the export's rename before)."""
    from vit.data import export_digits

    (tmp_path / "val" / "cat").mkdir(parents=True)
    with pytest.raises(ValueError, match="is not a digits export.*data=imagefolder"):
        export_digits(tmp_path)
    assert export_digits(tmp_path / "fresh").joinpath(".complete").exists()


def test_a_data_name_override_keeps_the_checkpoints_image_size():
    from omegaconf import OmegaConf

    from eval import eval_data_config

    run_cfg = OmegaConf.create({"data": {"name": "digits", "img_size": 32, "root": None}})
    cfg = OmegaConf.create({"data": {"name": "imagefolder", "img_size": None, "root": "/data/x"}})
    assert eval_data_config(cfg, run_cfg).img_size == 32
    cfg.data.img_size = 48
    assert eval_data_config(cfg, run_cfg).img_size == 48
    assert eval_data_config(cfg, OmegaConf.create({})).img_size == 48


def test_eval_out_of_memory_gets_the_clear_message(setup, monkeypatch):
    """A forward that asks the CPU allocator for more than the machine has: the message names the backend, N and the
    batch, as training's does."""
    from vit.engine import EvalOutOfMemoryError
    from vit.model import VisionTransformer

    monkeypatch.setattr(VisionTransformer, "forward", lambda self, x: torch.empty(1 << 60, dtype=torch.uint8))  # 1 EiB
    cfg = compose_cfg("eval", [f"checkpoint={setup['run']['checkpoint']}", "logger=none", "attention=naive",
                               f"out_dir={setup['tmp'] / 'oom'}"])
    with pytest.raises(EvalOutOfMemoryError) as error:
        evaluate_checkpoint(cfg)
    assert str(error.value).startswith("out of memory evaluating on cpu: attention=naive, N=")
    assert "use attention=flash" in str(error.value) and "smaller batch_size" in str(error.value)
    assert "DefaultCPUAllocator: can't allocate memory" in str(error.value.__cause__)
