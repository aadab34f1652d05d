"""Every file in configs/ composes, and invalid values fail before any work, naming key and value."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from vit.build import check_train_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GROUPS = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())


def compose_cfg(name: str, overrides: list[str] = ()):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


@pytest.mark.parametrize("value", ["outputs/2026-12-01/09-47-45/checkpoints/step_00001320.pt", "runs/lr=1e-3/best.pt",
                                   "runs/a,b/best.pt", "runs/it's=here/best.pt", "runs/$HOME=x/best.pt"])
def test_printed_eval_command_survives_the_shell_and_hydra(value):
    """train.py's last line, `python eval.py checkpoint=...`, stays runnable for a run folder holding `=` or `,`
    (unquoted, Hydra rejects `=` and splits `,` into a sweep); the README's quoted example parses too."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from train import shell_override

    [word] = shlex.split(shell_override("checkpoint", value))
    [override] = OverridesParser.create().parse_overrides([word])
    assert override.key_or_group == "checkpoint" and override.value() == value and not override.is_sweep_override()
    [readme] = OverridesParser.create().parse_overrides(shlex.split('''"checkpoint='runs/lr=1e-3/best.pt'"'''))
    assert readme.value() == "runs/lr=1e-3/best.pt"


def test_every_group_has_options():
    assert set(GROUPS) >= {"model", "attention", "data", "optim", "schedule", "logger", "experiment"}
    assert {p.stem for p in (CONFIGS / "attention").glob("*.yaml")} == {"auto", "naive", "sdpa", "flash", "cuda"}
    assert {p.stem for p in (CONFIGS / "model").glob("*.yaml")} == {"debug", "tiny", "small", "base", "large"}


@pytest.mark.parametrize("path", sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.rglob("*.yaml")
                                        if p.parent != CONFIGS))
def test_group_file_composes(path):
    group, option = Path(path).parent.as_posix(), Path(path).stem
    needs = ["init_from=/weights/vit_base.pth"] if path == "experiment/finetune_base.yaml" else []
    cfg = compose_cfg("train", [f"{group}={option}", *needs])
    OmegaConf.resolve(cfg)  # every interpolation resolves
    if group == "attention":
        assert cfg.attention.name == option
    if group == "model":
        assert cfg.model.size == option
    if group in ("data", "logger", "optim", "schedule"):
        assert cfg[group].name == option
    check_train_config(cfg)


@pytest.mark.parametrize("name", ["train", "eval"])
def test_top_level_composes(name):
    cfg = compose_cfg(name, ["attention=sdpa", "data=digits"] if name == "eval" else [])
    OmegaConf.resolve(cfg)
    if name == "train":
        assert (cfg.model.size, cfg.attention.name, cfg.data.name) == ("debug", "auto", "digits")
        check_train_config(cfg)
    else:
        assert "model" not in cfg and cfg.attention.name == "sdpa"


def test_experiment_overrides_only_what_differs():
    cfg = compose_cfg("train", ["experiment=deit_base", "data.root=/data/imagenet"])
    assert (cfg.model.size, cfg.model.patch_size, cfg.data.name, cfg.data.img_size) == ("base", 16, "imagefolder", 224)
    assert cfg.epochs == 300 and cfg.log_every == 10  # set by the experiment / kept from train.yaml


def test_finetune_preset_requires_init_from():
    with pytest.raises(ValueError, match=r"optim.layer_decay=0.65 is for fine-tuning .* init_from is null"):
        check_train_config(compose_cfg("train", ["experiment=finetune_base", "data.root=/data/imagenet"]))


@pytest.mark.parametrize("override, key", [
    ("batch_size=-4", "batch_size"),
    ("epochs=0", "epochs"),
    ("grad_accum=3", "batch_size"),  # 64 is not a multiple of 3
    ("model.size=huge", "model.size"),
    ("data.img_size=30", "data.img_size"),  # not a multiple of patch_size 4
    ("attention.name=flashy", "attention.name"),
    ("optim.lr=0", "optim.lr"),
    ("nonfinite.policy=ignore", "nonfinite.policy"),
])
def test_invalid_value_names_key(override, key):
    cfg = compose_cfg("train", [override])
    with pytest.raises(ValueError) as e:
        check_train_config(cfg)
    assert f"{key}=" in str(e.value), str(e.value)


@pytest.mark.parametrize("cores, local_processes, workers", [(2, 1, 1), (16, 1, 8), (1, 1, 0), (16, 4, 3)])
def test_num_workers_auto_follows_the_cores(monkeypatch, cores, local_processes, workers):
    """data=imagefolder's num_workers=auto leaves a core for training: 2 cores -> 1 worker (8 made PyTorch warn)."""
    from vit.build import resolve_num_workers

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_processes))
    cfg = compose_cfg("train", ["data=imagefolder", "data.root=/data/imagenet"])
    check_train_config(cfg)
    assert resolve_num_workers(cfg.data.num_workers) == workers
    assert resolve_num_workers(3) == 3


@pytest.mark.parametrize("value, error", [("cpu_threads=0", "cpu_threads=0: auto"),
                                          ("data.num_workers=many", "data.num_workers='many': auto")])
def test_cpu_threads_and_num_workers_values_are_checked(value, error):
    with pytest.raises(ValueError, match=f"invalid config value {error}"):
        check_train_config(compose_cfg("train", ["data=imagefolder", value]))


def test_cpu_threads_sets_torch_threads_for_the_run_only(tmp_path):
    import json

    import torch

    from train import train

    before = torch.get_num_threads()
    cfg = compose_cfg("train", ["data=synthetic", "data.img_size=16", "data.num_classes=4", "data.train_samples=32",
                                "data.val_samples=16", "batch_size=16", "epochs=1", "attention=naive", "device=cpu",
                                "progress=false", "logger=none", "cpu_threads=1", "schedule.warmup_epochs=0",
                                f"out_dir={tmp_path}"])
    train(cfg)
    assert json.loads((tmp_path / "summary.json").read_text())["env"]["cpu_threads"] == 1
    assert torch.get_num_threads() == before
