"""Every paper preset in configs/experiment/ starts and trains a few steps on the CPU (synthetic 32 px images;
its own model size up to ViT-S, ViT-Ti for the ViT-B ones: a ViT-B run writes 2 GB of checkpoints), so none
rots; and the presets hold the papers' values where they are easy to get wrong."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from train import train
from vit.build import effective_lr
from vit.model import create_model

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESETS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml") if p.stem != "throughput")
TINY_RUN = ["data=synthetic", "data.img_size=32", "data.num_classes=4", "data.train_samples=16",
            "data.val_samples=8", "batch_size=8", "eval_batch_size=8", "epochs=1", "device=cpu", "attention=sdpa",
            "logger=none", "progress=false"]


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


@pytest.mark.slow  # 3-25 s each on 2 busy cores
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_a_few_steps_on_synthetic_data(preset, tmp_path):
    extra = ["model=tiny"] if preset == "deit_base" else []
    if preset == "finetune_base":  # ViT-Ti weights (a ViT-B file would be 344 MB) at 16 px, fine-tuned at 32 px
        weights = create_model("tiny", img_size=16, patch_size=16, num_classes=4).state_dict()
        torch.save(weights, tmp_path / "vit_tiny.pth")
        extra = ["model=tiny", f"init_from={tmp_path / 'vit_tiny.pth'}"]
    result = train(compose_cfg([f"experiment={preset}", *TINY_RUN, f"out_dir={tmp_path / 'run'}", *extra]))
    assert result["steps"] == 2 and math.isfinite(result["history"][0]["train_loss"])
    assert (tmp_path / "run" / "summary.csv").read_text().count("\n") == 2  # header + epoch 1


def test_deit_presets_are_deits_recipe():
    for size, preset in (("tiny", "deit_tiny"), ("small", "deit_small"), ("base", "deit_base")):
        cfg = compose_cfg([f"experiment={preset}", "data.root=/data/imagenet"])
        assert cfg.model.size == size and cfg.model.drop_path_rate == 0.1 and cfg.batch_size == 1024
        assert effective_lr(cfg) == pytest.approx(1e-3)  # 5e-4 × 1024 / 512
        assert (cfg.mixup.mixup_alpha, cfg.mixup.cutmix_alpha, cfg.label_smoothing) == (0.8, 1.0, 0.1)
        assert cfg.ema.enabled and cfg.ema.decay == 0.99996 and cfg.repeated_aug.repeats == 3
        assert (cfg.data.train_aug.auto_augment, cfg.data.train_aug.re_prob) == ("rand-m9-mstd0.5-inc1", 0.25)


def test_bigvision_preset_is_the_plain_vit_s16_baseline():
    cfg = compose_cfg(["experiment=bigvision_s16", "data.root=/data/imagenet"])
    assert (cfg.model.size, cfg.model.global_pool, cfg.model.pos_embed) == ("small", "avg", "sincos2d")
    assert effective_lr(cfg) == 1e-3 and cfg.optim.weight_decay * effective_lr(cfg) == pytest.approx(1e-4)
    assert cfg.schedule.warmup_steps == 10_000 and cfg.mixup.mixup_alpha == 0.2 and cfg.mixup.cutmix_alpha == 0
    assert (cfg.epochs, cfg.batch_size, cfg.label_smoothing, cfg.model.drop_path_rate) == (90, 1024, 0.0, 0.0)


def test_finetune_preset_is_maes_vit_b_recipe():
    cfg = compose_cfg(["experiment=finetune_base", "init_from=w.pth", "data.root=/data/imagenet"])
    assert effective_lr(cfg) == pytest.approx(2e-3) and cfg.optim.layer_decay == 0.65  # blr 5e-4 × 1024 / 256
    assert (cfg.epochs, cfg.model.drop_path_rate, cfg.schedule.min_lr, cfg.ema.enabled) == (100, 0.1, 1e-6, False)
