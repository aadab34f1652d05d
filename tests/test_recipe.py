"""The training recipe (vit/recipe.py): mixup/cutmix as timm does it, the soft-target loss, the EMA of the
weights against a hand-computed one, and the start-up errors for combinations that cannot run (CPU, seconds)."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from timm.data import Mixup
from timm.scheduler import CosineLRScheduler

from train import train
from vit.build import check_train_config
from vit.engine import TrainState, train_epoch
from vit.model import create_model
from vit.recipe import build_recipe

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")
CPU = torch.device("cpu")


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def recipe_for(overrides: list[str], model=None, num_classes: int = 10, micro_batch: int = 8):
    model = model if model is not None else create_model("debug", img_size=8, patch_size=4, num_classes=num_classes)
    return build_recipe(compose_cfg(overrides), model, num_classes, "none", CPU, micro_batch)


class _Logger:
    rank = 0

    def print(self, msg):
        pass

    def log(self, metrics, step, prefix=""):
        pass


def run_steps(model, recipe, loader, on_step_end=None, grad_accum: int = 1):
    """``len(loader) // grad_accum`` optimizer steps of train_epoch on the CPU."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    steps = len(loader) // grad_accum
    scheduler = CosineLRScheduler(optimizer, t_initial=steps, t_in_epochs=False)
    return train_epoch(model, loader, optimizer, scheduler, TrainState(), device=CPU, amp_dtype=None,
                       grad_accum=grad_accum, clip_grad=1.0, recipe=recipe, steps_per_epoch=steps, world_size=1,
                       log_every=100, nonfinite_policy="stop", max_nonfinite_skips=0, logger=_Logger(),
                       backend="naive", seq_len=5, on_step_end=on_step_end, progress=False)


def batches(n: int, size: int = 8, num_classes: int = 10, seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 3, 8, 8, generator=gen), torch.randint(0, num_classes, (size,), generator=gen))
            for _ in range(n)]


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_mixup_cutmix_mix_as_timm_does_with_the_same_seed(mode):
    """mixup=deit builds timm's Mixup with DeiT's values; same numpy seed, same images and targets."""
    recipe = recipe_for(["mixup=deit", f"mixup.mode={mode}", "label_smoothing=0.1"])
    reference = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode=mode, label_smoothing=0.1,
                      num_classes=10)
    for seed in range(6):  # over seeds both mixup and cutmix get drawn
        x, y = batches(1, seed=seed)[0]
        np.random.seed(seed)
        mixed, target = recipe.mix(x.clone(), y)
        np.random.seed(seed)
        want_x, want_target = reference(x.clone(), y)
        assert torch.equal(mixed, want_x) and torch.equal(target, want_target)
        assert not torch.equal(mixed, x) and target.shape == (8, 10)
        torch.testing.assert_close(target.sum(1), torch.ones(8))


def test_loss_is_soft_target_cross_entropy_with_mixup_else_label_smoothed_ce():
    logits, y = torch.randn(8, 10), torch.randint(0, 10, (8,))
    soft = torch.softmax(torch.randn(8, 10), 1)
    recipe = recipe_for(["mixup=deit"])
    torch.testing.assert_close(recipe.loss_fn(logits, soft), (-soft * logits.log_softmax(1)).sum(1).mean())
    plain = recipe_for(["label_smoothing=0.2"])
    assert plain.mixup is None
    torch.testing.assert_close(plain.loss_fn(logits, y), torch.nn.functional.cross_entropy(logits, y,
                                                                                           label_smoothing=0.2))
    bce = recipe_for(["mixup=deit", "mixup.loss=bce"])
    torch.testing.assert_close(bce.loss_fn(logits, soft),
                               torch.nn.functional.binary_cross_entropy_with_logits(logits, soft))


def test_training_step_sees_the_mixed_batch_and_the_loss_of_the_soft_targets():
    """Inside train_epoch, the model gets timm's mixed images (one draw per micro-batch, grad_accum=2)."""
    torch.manual_seed(0)
    model = create_model("debug", img_size=8, patch_size=4, num_classes=10)
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    loader = batches(4)
    reference = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)
    np.random.seed(3)
    want = [reference(x.clone(), y)[0] for x, y in loader]
    np.random.seed(3)
    loss = run_steps(model, recipe_for(["mixup=deit"], model), [(x.clone(), y) for x, y in loader], grad_accum=2)
    assert len(seen) == 4 and all(torch.equal(a, b) for a, b in zip(seen, want))
    assert np.isfinite(loss)


def test_mixup_off_epoch_stops_mixing():
    recipe = recipe_for(["mixup=deit", "mixup.off_epoch=2"])
    x, y = batches(1)[0]
    recipe.set_epoch(1)
    assert not torch.equal(recipe.mix(x.clone(), y)[0], x)
    recipe.set_epoch(2)
    mixed, target = recipe.mix(x.clone(), y)
    assert torch.equal(mixed, x) and torch.equal(target.argmax(1), y)  # unmixed, still smoothed soft targets


def test_ema_equals_a_hand_computed_ema_after_k_steps():
    """ModelEmaV3 with step = optimizer steps: the first update copies, then ema = d·ema + (1-d)·w."""
    torch.manual_seed(0)
    model = create_model("debug", img_size=8, patch_size=4, num_classes=10, drop_path_rate=0.1)
    recipe = recipe_for(["ema=on", "ema.decay=0.7"], model)
    weights = []
    run_steps(model, recipe, batches(5), on_step_end=lambda s: weights.append(copy.deepcopy(model.state_dict())))
    assert len(weights) == 5
    expected = {k: v.double() for k, v in weights[0].items()}  # step 1: decay 0, a copy
    for w in weights[1:]:
        expected = {k: 0.7 * expected[k] + 0.3 * w[k].double() for k in expected}
    ema = recipe.ema.module.state_dict()
    for k, v in expected.items():
        torch.testing.assert_close(ema[k].double(), v, rtol=0, atol=1e-6, msg=k)
    assert not torch.allclose(ema["head.weight"], model.head.weight)  # an average, not the last weights


def test_ema_skips_a_skipped_step():
    torch.manual_seed(0)
    model = create_model("debug", img_size=8, patch_size=4, num_classes=10)
    recipe = recipe_for(["ema=on", "ema.decay=0.5"], model)
    before = copy.deepcopy(recipe.ema.module.state_dict())
    bad = [(torch.full((8, 3, 8, 8), float("nan")), torch.zeros(8, dtype=torch.long))]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_epoch(model, bad, optimizer, CosineLRScheduler(optimizer, t_initial=1, t_in_epochs=False), TrainState(),
                device=CPU, amp_dtype=None, grad_accum=1, clip_grad=1.0, recipe=recipe, steps_per_epoch=1,
                world_size=1, log_every=100, nonfinite_policy="skip", max_nonfinite_skips=1, logger=_Logger(),
                backend="naive", seq_len=5, progress=False)
    assert all(torch.equal(v, before[k]) for k, v in recipe.ema.module.state_dict().items())


def test_odd_micro_batch_with_mixup_fails_at_start_up(tmp_path):
    """batch_size 12 / grad_accum 2 = 6 is even and runs; 6 / 2 = 3 is refused before any step."""
    base = ["data=synthetic", "data.img_size=8", "data.num_classes=4", "data.train_samples=100", "data.val_samples=8",
            "model=debug", "attention=naive", "device=cpu", "logger=none", "progress=false", "epochs=1", "mixup=deit",
            "ema=on", "eval_batch_size=8", "schedule.warmup_epochs=0"]
    result = train(compose_cfg(base + ["batch_size=12", "grad_accum=2", f"out_dir={tmp_path / 'even'}"]))
    assert result["steps"] == 100 // 12  # 8 steps; the last 4 images (an odd micro-batch of 4 % 6) are dropped
    assert np.isfinite(result["history"][0]["train_loss"]) and "val_ema_top1" in result["history"][0]
    with pytest.raises(ValueError, match=r"mixup/cutmix needs an even micro-batch .* = 3; "):
        train(compose_cfg(base + ["batch_size=6", "grad_accum=2", f"out_dir={tmp_path / 'odd'}"]))
    assert not (tmp_path / "odd" / "metrics.jsonl").exists()


@pytest.mark.parametrize("override, key", [
    ("ema.best_from=ema", "ema.best_from"),  # no EMA to choose by
    ("mixup.mode=row", "mixup.mode"),
    ("mixup.mixup_alpha=-1", "mixup.mixup_alpha"),
    ("ema.decay=1.5", "ema.decay"),
    ("optim.layer_decay=1.5", "optim.layer_decay"),
    ("schedule.warmup_steps=2.5", "schedule.warmup_steps"),
    ("optim.fused=yes", "optim.fused"),
])
def test_invalid_recipe_values_name_the_key(override, key):
    with pytest.raises(ValueError, match=rf"invalid config value {key}="):
        check_train_config(compose_cfg([override]))


def test_layer_decay_param_groups_have_the_per_block_rates():
    """optim.layer_decay=0.5 on the 4-block debug ViT at peak lr 1e-3: block i at 1e-3 × 0.5^(4-i), the stem
    (patch_embed, pos_embed, cls_token) at 1e-3 × 0.5^5, the final norm with the last block (timm's grouping),
    the head at 1e-3; no weight decay on 1-D params."""
    from vit.build import build_optimizer, build_scheduler

    model = create_model("debug", img_size=8, patch_size=4, num_classes=10)
    cfg = compose_cfg(["optim.layer_decay=0.5", "optim.lr=1e-3", "schedule.warmup_steps=10", "epochs=10",
                       "init_from=weights.pt"])
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg, steps_per_epoch=100)
    scheduler.step_update(10)  # the end of warm-up (the cosine factor is 0.99975 at step 10 of 1000)
    rate = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    peak = rate[id(model.head.weight)][0]
    assert peak == pytest.approx(1e-3, rel=1e-3)
    expected = {"patch_embed.proj.weight": 0.5 ** 5, "pos_embed": 0.5 ** 5, "cls_token": 0.5 ** 5,
                **{f"blocks.{i}.attn.qkv.weight": 0.5 ** (4 - i) for i in range(4)},
                "blocks.2.mlp.fc1.bias": 0.5 ** 2, "norm.weight": 0.5, "head.weight": 1.0, "head.bias": 1.0}
    params = dict(model.named_parameters())
    for name, scale in expected.items():
        lr, wd = rate[id(params[name])]
        assert lr == pytest.approx(peak * scale, rel=1e-9), name
        assert wd == (0.05 if params[name].ndim > 1 and name not in ("pos_embed", "cls_token") else 0.0), name
    assert len(rate) == len(params)  # every parameter is in one group
    plain = build_optimizer(model, compose_cfg(["optim.lr=1e-3"]))
    assert all("lr_scale" not in g for g in plain.param_groups)


def test_adamw_is_fused_where_asked_and_on_cuda_by_default():
    """optim.fused: auto leaves a CPU model on foreach AdamW; true runs PyTorch's fused kernel (here on the CPU) and
    gives the foreach step's parameters to float rounding."""
    from vit.build import build_optimizer, fused_adamw

    assert not fused_adamw("auto", [torch.zeros(2)]) and not fused_adamw("auto", [])
    steps = {}
    for setting in ("auto", True):
        torch.manual_seed(0)
        model = create_model("debug", img_size=8, patch_size=4, num_classes=10)
        optimizer = build_optimizer(model, compose_cfg(["optim.lr=1e-2", f"optim.fused={str(setting).lower()}"]))
        assert bool(optimizer.defaults["fused"]) == (setting is True)
        model(torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))).square().mean().backward()
        optimizer.step()
        steps[setting] = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(steps[True], steps["auto"], rtol=1e-5, atol=1e-6)


def test_a_resumed_optimizer_keeps_its_own_fused_setting():
    """A checkpoint's param groups carry fused/foreach; a resumed run uses its own optim.fused (checkpoints written
    before optim.fused existed are foreach), and steps on with the loaded moments either way."""
    from vit.build import build_optimizer
    from vit.wrap import load_optimizer_state_dict

    for saved, resumed in ((True, False), (False, True)):
        torch.manual_seed(0)
        model = create_model("debug", img_size=8, patch_size=4, num_classes=10)
        before = build_optimizer(model, compose_cfg([f"optim.fused={str(saved).lower()}"]))
        model(torch.randn(2, 3, 8, 8)).sum().backward()
        before.step()
        after = build_optimizer(model, compose_cfg([f"optim.fused={str(resumed).lower()}"]))
        load_optimizer_state_dict(model, after, before.state_dict())
        assert all(bool(g["fused"]) == resumed for g in after.param_groups), (saved, resumed)
        moments = [after.state[p]["exp_avg"].clone() for p in model.parameters()]
        after.step()  # the loaded step counters and moments suit the new implementation
        assert any(not torch.equal(after.state[p]["exp_avg"], m) for p, m in zip(model.parameters(), moments))
        assert all(float(after.state[p]["step"]) == 2 for p in model.parameters())
    with pytest.raises(ValueError, match="invalid config value optim.fused=1"):
        build_optimizer(model, compose_cfg(["optim.fused=1"]))


def test_warmup_steps_counts_optimizer_steps():
    from vit.build import build_optimizer, build_scheduler

    model = create_model("debug", img_size=8, patch_size=4, num_classes=10)
    cfg = compose_cfg(["optim.lr=1e-3", "schedule.warmup_steps=30", "schedule.warmup_lr_init=0", "epochs=10"])
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg, steps_per_epoch=7)
    scheduler.step_update(15)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-3)  # half-way through 30 steps


@pytest.mark.parametrize("n, replicas, repeats, selected_round", [(1437, 1, 3, 256), (1437, 2, 3, 256),
                                                                  (100, 3, 3, 256), (96, 2, 3, 0)])
def test_repeated_aug_sampler_is_deits_index_for_index_and_resumes(n, replicas, repeats, selected_round):
    """ResumableSampler(num_repeats=3) gives timm's RepeatAugSampler (DeiT's RASampler) order on every rank,
    each copy under its own virtual index, and restarts at any position of the epoch."""
    from timm.data.distributed_sampler import RepeatAugSampler

    from vit.data import ResumableSampler

    for epoch in (0, 1):
        ranks = []
        for rank in range(replicas):
            ours = ResumableSampler(n, True, seed=0, num_replicas=replicas, rank=rank, num_repeats=repeats,
                                    selected_round=selected_round)
            timm_sampler = RepeatAugSampler(range(n), num_replicas=replicas, rank=rank, num_repeats=repeats,
                                            selected_round=selected_round)
            ours.set_epoch(epoch)
            timm_sampler.set_epoch(epoch)  # timm seeds with the epoch alone: ours with seed + epoch
            pairs = list(ours)
            order = [i for i, _ in pairs]
            assert [i % n for i in order] == list(timm_sampler) and len(order) == ours.per_rank()
            assert len({s for _, s in pairs}) == len(set(order))  # each (virtual) index its own seed
            ours.set_epoch(epoch, position=7)
            assert list(ours) == pairs[7:] and len(ours) == len(order) - 7
            ranks.append(order)
        everything = [i for order in ranks for i in order]
        assert len(set(everything)) == len(everything) or selected_round == 0  # no copy twice (unless padded)
        copies = {}
        for i in everything:
            copies.setdefault(i % n, set()).add(i // n)
        assert max(len(c) for c in copies.values()) == repeats  # an image's copies, each its own index


def test_repeated_copies_get_their_own_augmentation():
    from vit.data import SeededDataset, sample_seed

    class Noisy(torch.utils.data.Dataset):  # a random augmentation of a fixed image
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.full((3,), float(i)) + torch.rand(3), i

    data = SeededDataset(Noisy())
    first, twin = (data[(i, sample_seed(0, 0, i))] for i in (1, 1 + 4))  # image 1 and its copy 1
    assert torch.equal(first[0], data[(1, sample_seed(0, 0, 1))][0])  # the same seed: the same augmentation
    assert twin[0].floor().tolist() == [1.0] * 3 and twin[1] == 1 and not torch.equal(first[0], twin[0])


def test_summary_csv_has_one_row_per_epoch_and_a_resume_rewrites_the_rest(tmp_path):
    """timm's columns (epoch, train_loss, eval_*, eval_ema_*, lr); resuming from epoch 1 into the same folder keeps
    row 1 and writes row 2 again, equal to the first run's."""
    import csv

    from vit.checkpoint import list_checkpoints

    base = ["data=synthetic", "data.img_size=8", "data.num_classes=4", "data.train_samples=32", "data.val_samples=8",
            "model=debug", "attention=naive", "device=cpu", "logger=none", "progress=false", "epochs=2",
            "batch_size=8", "eval_batch_size=8", "schedule.warmup_epochs=0", "ema=on", "ema.decay=0.5",
            "checkpoint.keep_last=0", f"out_dir={tmp_path}"]
    first = train(compose_cfg(base))
    path = tmp_path / "summary.csv"
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["epoch", "train_loss", "eval_loss", "eval_top1", "eval_top5", "eval_ema_loss",
                             "eval_ema_top1", "eval_ema_top5", "lr"]
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert float(rows[1]["eval_top1"]) == pytest.approx(first["val"]["top1"])
    assert float(rows[1]["eval_ema_loss"]) == pytest.approx(first["history"][1]["val_ema_loss"])
    epoch1 = next(p for p in list_checkpoints(tmp_path / "checkpoints") if p.name == "step_00000004.pt")
    train(compose_cfg([*base, f"resume={epoch1}"]))
    assert list(csv.DictReader(path.open())) == rows


@pytest.mark.slow  # two 2-epoch runs on a small folder
def test_eval_use_ema_evaluates_the_ema_weights(tmp_path):
    """eval.py use_ema=true on a checkpoint of an ema=on run reproduces val/ema_*; without EMA weights it says so.
    ema.best_from=ema: best.pt is chosen by the EMA's top-1."""
    from PIL import Image

    from eval import evaluate_checkpoint

    rng = np.random.RandomState(0)  # 3 classes told apart by brightness: learnable in 2 epochs
    for split, count in (("train", 32), ("val", 16)):
        for c in range(3):
            (tmp_path / "ds" / split / f"c{c}").mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(rng.randint(0, 160, (8, 8, 3)) + 40 * c, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(tmp_path / "ds" / split / f"c{c}" / f"{i}.png")
    base = ["data=imagefolder", f"data.root={tmp_path / 'ds'}", "data.img_size=8", "data.num_workers=0",
            "model=debug", "attention=naive", "device=cpu", "logger=none", "progress=false", "epochs=2",
            "batch_size=8", "eval_batch_size=16", "schedule.warmup_epochs=0"]
    result = train(compose_cfg([*base, "ema=on", "ema.decay=0.9", "ema.best_from=ema", f"out_dir={tmp_path / 'ema'}"]))
    history = result["history"]
    assert any(h["val_top1"] != h["val_ema_top1"] for h in history)  # so that the choice below shows
    assert result["best_top1"] == max(h["val_ema_top1"] for h in history)
    plain = train(compose_cfg([*base, f"out_dir={tmp_path / 'plain'}"]))
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        def evaluate(checkpoint, *extra):
            return evaluate_checkpoint(compose(config_name="eval", overrides=[
                f"checkpoint={checkpoint}", "logger=none", "device=cpu", f"out_dir={tmp_path / 'eval'}", *extra]))

        ema = evaluate(result["checkpoint"], "use_ema=true")
        raw = evaluate(result["checkpoint"])
        assert ema["weights"] == "ema" and ema["loss"] == pytest.approx(history[-1]["val_ema_loss"], rel=1e-6)
        assert raw["weights"] == "model" and raw["loss"] == pytest.approx(result["val"]["loss"], rel=1e-6)
        assert ema["loss"] != raw["loss"]
        with pytest.raises(ValueError, match=r"use_ema=true, but .* holds no EMA weights \(its run had ema=none\)"):
            evaluate(plain["checkpoint"], "use_ema=true")


def test_summary_csv_header_and_trim_do_not_depend_on_the_timm_version(tmp_path, monkeypatch):
    """timm 1.0.29's ``update_summary`` writes no header unless asked and it has no ``trim_summary``: the
    header comes on a new file and a resume trims the rows past its epoch all the same."""
    import csv

    import timm.utils

    from vit.logger import append_summary_csv, trim_summary_csv

    real = timm.utils.update_summary
    monkeypatch.setattr(timm.utils, "update_summary",
                        lambda *args, write_header=False, **kwargs: real(*args, write_header=write_header, **kwargs))
    path = tmp_path / "summary.csv"
    for epoch in (1, 2, 3):
        append_summary_csv(path, {"epoch": epoch, "train_loss": 1 / epoch, "lr": 0.1, "val_ema": None,
                                  "val": {"loss": 2.0, "top1": 50.0, "top5": 90.0}})
    assert [r["epoch"] for r in csv.DictReader(path.open())] == ["1", "2", "3"]
    trim_summary_csv(path, 1)
    assert [(r["epoch"], r["eval_top1"]) for r in csv.DictReader(path.open())] == [("1", "50.0")]
    trim_summary_csv(path, 0)
    assert path.read_text() == ""
