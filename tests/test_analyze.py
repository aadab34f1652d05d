"""analyze.py: the probe's statistics, maps and rollout against a hand computation, and a run on a digits checkpoint.

The digits checkpoint is the default model (debug, 4 layers, 2 heads, N = 65) after one epoch. W&B runs offline
into the temporary folder.
"""
from __future__ import annotations

import json
import math
import re
import shlex
import time
from pathlib import Path

import pytest
import timm
import torch
import yaml
from hydra import compose, initialize_config_dir
from PIL import Image
from test_train import read_wandb_records

from analyze import analyze_checkpoint
from kernels.naive import patch_distances
from train import train
from vit.attention_probe import MAX_ROLLOUT_TOKENS, AttentionProbe
from vit.data import export_digits
from vit.model import VisionTransformer, create_model

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("attention_distance.png", "attention_entropy.png", "attention_maps.png")


def compose_cfg(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def hand_computed(model: VisionTransformer, x: torch.Tensor) -> dict:
    """Each layer's P from the block's own modules, then the probe's quantities by their definitions."""
    prefix, grid = model.num_prefix_tokens, model.patch_embed.grid
    t = model.patch_embed(x)
    if prefix:
        t = torch.cat([model.cls_token.expand(len(x), -1, -1), t], dim=1)
    t = t + model.pos_embed
    logits, probs = [], []
    for block in model.blocks:
        B, N, _ = t.shape
        qkv = block.attn.qkv(block.norm1(t)).reshape(B, N, 3, block.attn.num_heads, -1).permute(2, 0, 3, 1, 4)
        logits.append(qkv[0] @ qkv[1].transpose(-2, -1) * qkv.shape[-1] ** -0.5)  # (B, H, N, N)
        probs.append(logits[-1].softmax(-1))
        t = block(t)
    eye = torch.eye(probs[0].shape[-1])
    rollout = (0.5 * probs[1].mean(1) + 0.5 * eye) @ (0.5 * probs[0].mean(1) + 0.5 * eye)  # rows already sum to 1
    rows = (lambda a: a[..., 0, :]) if prefix else (lambda a: a.mean(-2))  # class token's row, or the mean row
    dist = patch_distances(grid, model.patch_embed.patch_size, prefix, torch.float32)
    return {"maps": rows(probs[1])[..., prefix:].reshape(len(x), -1, *grid),
            "rollout": rows(rollout)[..., prefix:].reshape(len(x), *grid),
            "distance": [(p * dist).sum(-1)[..., prefix:].mean(-1) for p in probs],
            "entropy": [-(p * p.log()).sum(-1).mean(-1) for p in probs],
            "max_logit": [s.amax((-2, -1)) for s in logits]}


@pytest.mark.parametrize("global_pool, img_size", [("token", 16), ("avg", 16), ("token", (12, 20))])
def test_probe_equals_a_hand_computation_on_a_2_layer_model(global_pool, img_size):
    """Square and rectangular (3×5 patches) grids; with and without a class token."""
    torch.manual_seed(0)
    model = VisionTransformer(img_size=img_size, patch_size=4, num_classes=3, embed_dim=32, depth=2, num_heads=2,
                              global_pool=global_pool).eval()
    x = torch.randn(2, 3, *model.patch_embed.img_hw)
    with torch.no_grad():
        ref, plain = hand_computed(model, x), model(x)
        with AttentionProbe(model, "naive", maps=True, rollout=True) as probe:
            logits = model(x)
    assert torch.allclose(logits, plain, atol=1e-6)  # the probe's attention is the model's
    assert torch.allclose(probe.rollout, ref["rollout"], atol=1e-6)
    assert torch.allclose(probe.maps, ref["maps"], atol=1e-6)
    for layer in range(2):
        assert torch.allclose(probe.distance[layer], ref["distance"][layer], atol=1e-5)
        assert torch.allclose(probe.entropy[layer], ref["entropy"][layer], atol=1e-5)
        assert torch.allclose(probe.max_logit[layer], ref["max_logit"][layer], atol=1e-5)
    assert all(b.attn.attn_fn is not None and "AttentionProbe" not in repr(b.attn.attn_fn) for b in model.blocks)


def test_probe_flash_kernel_equals_naive_on_a_rectangular_grid():
    """The fused kernel (Triton's interpreter) through the model at 3×5 patches plus a class token."""
    torch.manual_seed(0)
    model = VisionTransformer(img_size=(12, 20), patch_size=4, num_classes=3, embed_dim=32, depth=2, num_heads=2)
    x = torch.randn(2, 3, 12, 20)
    got = {}
    with torch.no_grad():
        for stats in ("flash", "naive"):
            with AttentionProbe(model.eval(), stats) as probe:
                model(x)
            got[stats] = torch.stack(probe.distance + probe.entropy + probe.max_logit)
    assert torch.allclose(got["flash"], got["naive"], rtol=1e-5, atol=1e-5)


def test_rollout_is_refused_above_1025_tokens():
    AttentionProbe(create_model("debug", img_size=512, patch_size=16), rollout=True)  # N = 1025: allowed
    big = create_model("debug", img_size=528, patch_size=16)  # N = 33² + 1 = 1090
    with pytest.raises(ValueError, match=rf"N=1090 tokens .* above the {MAX_ROLLOUT_TOKENS} allowed; pass "
                                         r"maps.rollout=false"):
        AttentionProbe(big, rollout=True)
    AttentionProbe(big, maps=True)  # maps alone are O(N)


def finished_wandb_records(run_dir: Path, timeout: float = 60.0) -> list:
    """The run file's records once its exit record is on disk: W&B's service writes the file after ``finish()``
    returns (measured: 7 bytes at return, complete 0.2 s later)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_wandb_records(next(run_dir.glob("run-*.wandb")))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


@pytest.fixture(scope="module")
def digits_ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("analyze")
    root = export_digits(tmp / "digits")
    run = train(compose_cfg("train", ["epochs=1", f"data.root={root}", "attention=naive", "logger=none",
                                      "progress=false", "schedule.warmup_epochs=0", f"out_dir={tmp / 'run'}"]))
    return {"tmp": tmp, "checkpoint": run["checkpoint"]}


def test_analyze_digits_writes_json_figures_and_wandb(digits_ckpt, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = digits_ckpt["tmp"] / "out"
    result = analyze_checkpoint(compose_cfg("analyze", [f"checkpoint={digits_ckpt['checkpoint']}", "num_images=40",
                                                        "batch_size=16", "maps.images=3", f"out_dir={out}"]))
    saved = json.loads((out / "analysis.json").read_text())
    assert saved["images"] == 40 and saved["seq_len"] == 65 and saved["stats_kernel"] == "naive"
    for key in ("mean_attention_distance_px", "attention_entropy_nats", "max_logit"):
        assert len(saved[key]) == 4 and all(len(row) == 2 for row in saved[key]), key
    far = math.hypot(7, 7) * 4  # opposite corners of the 8×8 grid of 4 px patches
    assert all(0 < d < far for row in saved["mean_attention_distance_px"] for d in row)
    assert all(0 < e <= math.log(65) + 1e-5 for row in saved["attention_entropy_nats"] for e in row)
    for name in FIGURES:
        with Image.open(out / name) as img:
            assert img.format == "PNG" and min(img.size) >= 300, name
    media = Path(result["wandb_dir"]) / "files" / "media"
    logged = sorted(p.name.split("_0_")[0] for p in (media / "images" / "analyze").glob("*.png"))
    assert logged == ["attention_distance", "attention_entropy", "attention_maps"]
    table = json.loads(next((media / "table" / "analyze").glob("per_head_*.table.json")).read_text())
    assert len(table["data"]) == 8 and table["data"][0][2] == pytest.approx(saved["mean_attention_distance_px"][0][0])
    records = finished_wandb_records(Path(result["wandb_dir"]))
    paths = {i.nested_key[0]: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "history"
             for i in r.history.item if list(i.nested_key[1:]) == ["path"]}  # the history's media entries
    assert sorted(paths) == ["analyze/attention_distance", "analyze/attention_entropy", "analyze/attention_maps",
                             "analyze/per_head"]
    assert all((media.parent / p).is_file() for p in paths.values()), paths


def test_analyze_flash_kernel_gives_the_naive_numbers(digits_ckpt):
    """The fused kernel (Triton's interpreter here) and the materialising reference, through the whole model."""
    runs = {}
    for stats in ("flash", "naive"):
        runs[stats] = analyze_checkpoint(compose_cfg("analyze", [
            f"checkpoint={digits_ckpt['checkpoint']}", f"stats={stats}", "num_images=4", "maps.images=0",
            "logger=none", f"out_dir={digits_ckpt['tmp'] / stats}"]))
    assert runs["flash"]["stats_kernel"] == "flash"
    for key in ("mean_attention_distance_px", "attention_entropy_nats", "max_logit"):
        assert torch.allclose(torch.tensor(runs["flash"][key]), torch.tensor(runs["naive"][key]), rtol=1e-5), key
    assert not (digits_ckpt["tmp"] / "flash" / "attention_maps.png").exists()


def test_analyze_refuses_rollout_above_1025_tokens_before_any_work(digits_ckpt):
    out = digits_ckpt["tmp"] / "big"
    cfg = compose_cfg("analyze", [f"checkpoint={digits_ckpt['checkpoint']}", "data.img_size=132", "logger=none",
                                  f"out_dir={out}"])  # 33×33 patches of 4 px: N = 1090
    with pytest.raises(ValueError, match="N=1090 tokens"):
        analyze_checkpoint(cfg)
    assert not out.exists()


def test_analyze_config_can_override_every_data_key_evaluation_reads():
    assert (yaml.safe_load((ROOT / "configs" / "analyze.yaml").read_text())["data"]
            == yaml.safe_load((ROOT / "configs" / "eval.yaml").read_text())["data"])


def test_readme_analyze_commands_run_as_typed(digits_ckpt, monkeypatch):
    """Each ``python analyze.py`` line of the README, its placeholders replaced: the digits checkpoint, and a timm
    ViT-Ti/16 state dict (saved by timm) on a folder of random images."""
    from safetensors.torch import save_file
    from test_eval import make_folder

    tmp = digits_ckpt["tmp"]
    folder = make_folder(tmp / "imgs", "abc", 2, 0)
    save_file(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3).state_dict(),
              str(tmp / "vit_tiny.safetensors"))
    places = {"outputs/<date>/<time>/checkpoints/step_00001320.pt": digits_ckpt["checkpoint"], "/data/imagenet": folder}
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    commands = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
                if line.startswith("python analyze.py")]
    assert len(commands) == 2, commands
    monkeypatch.chdir(tmp)  # where vit_tiny.safetensors is, as in the README
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for command in commands:
        overrides = []
        for token in shlex.split(command)[2:]:
            key, value = token.split("=", 1)
            overrides.append(f"{key}={places.get(value, value)}")
        result = analyze_checkpoint(compose_cfg("analyze", overrides))
        assert all((Path(result["out_dir"]) / name).is_file() for name in FIGURES), command


@pytest.mark.gpu
def test_analyze_vit_b16_at_1024px_runs_in_bounded_memory(tmp_path, capsys):
    """ViT-B/16 at 1024 px (N = 4097), 4 images per batch, stats=flash: the peak must stay below half of what one
    layer's materialised (B, H, N, N) float32 probabilities take (3 GiB), where hooking the softmax would need them."""
    from test_eval import make_folder

    assert torch.cuda.is_available()
    folder = make_folder(tmp_path / "imgs", "ab", 2, 0)
    torch.save(create_model("base", img_size=1024, num_classes=2).state_dict(), tmp_path / "vit_b16_1024.pth")
    result = analyze_checkpoint(compose_cfg("analyze", [
        f"checkpoint={tmp_path / 'vit_b16_1024.pth'}", "model=base", "data=imagefolder", f"data.root={folder}",
        "data.img_size=1024", "data.num_workers=0", "batch_size=4", "maps.rollout=false", "maps.images=2",
        "stats=flash", "logger=none", f"out_dir={tmp_path / 'out'}"]))
    with capsys.disabled():
        print(f"\n[analyze ViT-B/16 1024 px] peak {result['peak_mem_allocated_mb']:.0f} MiB allocated; one layer's "
              f"probabilities would be {result['naive_probs_mb_per_layer']:.0f} MiB")
    assert result["seq_len"] == 4097 and result["images"] == 4 and result["stats_kernel"] == "flash"
    assert 0 < result["peak_mem_allocated_mb"] < result["naive_probs_mb_per_layer"] / 2
    assert (tmp_path / "out" / "attention_maps.png").is_file()
