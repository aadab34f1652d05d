"""Attention health while training (monitor.attention_every): its numbers, where they are logged, and its switch."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_analyze import compose_cfg, hand_computed

from train import train
from vit.model import VisionTransformer
from vit.monitor import AttentionMonitor

SYNTHETIC = ["data=synthetic", "data.img_size=16", "data.num_classes=4", "data.train_samples=32", "data.val_samples=16",
             "batch_size=16", "attention=naive", "device=cpu", "progress=false", "logger=none", "schedule.warmup_epochs=0"]


def test_monitor_numbers_equal_a_hand_computation():
    torch.manual_seed(0)
    model = VisionTransformer(img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=2, num_heads=2).train()
    images = torch.randn(3, 3, 16, 16)
    metrics = AttentionMonitor(model, images, 1, torch.device("cpu"), None).measure()
    assert model.training  # put back in train mode
    ref = hand_computed(model.eval(), images)
    for layer in (1, 2):
        assert metrics[f"attention/max_logit_{layer}"] == pytest.approx(ref["max_logit"][layer - 1].max().item(),
                                                                        rel=1e-5)
        assert metrics[f"attention/entropy_{layer}"] == pytest.approx(ref["entropy"][layer - 1].mean().item(), rel=1e-5)
    assert metrics["attention/max_logit"] == max(metrics["attention/max_logit_1"], metrics["attention/max_logit_2"])
    assert metrics["attention/monitor_ms"] > 0


def test_monitor_logs_every_n_steps_to_metrics_jsonl(tmp_path):
    """4 optimizer steps with attention_every=2: lines at steps 2 and 4, one max logit and entropy per layer."""
    result = train(compose_cfg("train", [*SYNTHETIC, "epochs=2", "monitor.attention_every=2",
                                         f"out_dir={tmp_path}"]))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    health = [r for r in lines if "attention/max_logit" in r]
    assert result["steps"] == 4 and [r["step"] for r in health] == [2, 4]
    for r in health:
        assert {f"attention/{k}_{layer}" for k in ("max_logit", "entropy") for layer in range(1, 5)} <= r.keys()
        assert all(0 < r[f"attention/entropy_{layer}"] <= math.log(17) + 1e-5 for layer in range(1, 5))
    assert health[0] != health[1]  # the weights moved between the two


def test_monitor_is_off_by_default_and_checks_its_values():
    cfg = compose_cfg("train", [])
    assert cfg.monitor.attention_every == 0
    assert AttentionMonitor.from_config(cfg, None, None, torch.device("cpu"), None) is None
    for key, value in (("attention_every", -1), ("attention_images", 0)):
        bad = compose_cfg("train", [f"monitor.{key}={value}"])
        with pytest.raises(ValueError, match=rf"monitor.{key}={value}"):
            AttentionMonitor.from_config(bad, None, None, torch.device("cpu"), None)


def test_readme_monitor_line_names_real_keys():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "monitor.attention_every=" in readme and "attention/max_logit_" in readme
