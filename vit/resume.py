"""Resuming a run: which checkpoint, whether it fits this run, and what of its config changed.

A resume continues the checkpoint's run: same model and classes (else RuntimeError), and the same
learning-rate schedule unless ``allow_schedule_change=true``. The schedule is a function of the total
number of optimizer steps, so changing ``epochs``, ``batch_size``, ``optim.lr``, ``optim.lr_scale_batch``
or any ``schedule.*`` key recomputes the whole curve: the LR at the resumed step jumps (for a cosine, a
longer run raises it again). Refused by default, naming the keys; allowed, the new curve's key points
are printed beside the old LR at the resumed step.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from hydra.utils import to_absolute_path
from omegaconf import OmegaConf

from vit.build import ConfigWarning, build_scheduler, effective_lr
from vit.checkpoint import find_latest_checkpoint, load_checkpoint, load_model_weights, restore_rng_state
from vit.engine import TrainState
from vit.logger import info

SCHEDULE_KEYS = ("epochs:", "batch_size:", "optim.lr:", "optim.lr_scale_batch:", "schedule.")
IGNORED_KEYS = ("resume:", "out_dir:", "allow_schedule_change:")


def find_resume(spec: str | None, ckpt_dir: Path) -> tuple[Path, dict] | None:
    """``resume=null``: none; ``auto``: newest complete checkpoint in ``ckpt_dir`` (none is fine);
    a path: that checkpoint (must exist)."""
    if spec is None:
        return None
    if spec == "auto":
        found = find_latest_checkpoint(ckpt_dir)
        info(f"[resume] resume=auto: {'found ' + str(found[0]) if found else 'no checkpoint in ' + str(ckpt_dir)}")
        return found
    path = Path(to_absolute_path(spec))
    return path, load_checkpoint(path)


def check_compatible(ckpt: dict, path: Path, margs: dict, classes: list[str]) -> None:
    """The checkpoint was made for this model and these classes (RuntimeError naming what differs)."""
    diff = {k: (ckpt["model_args"].get(k), v) for k, v in margs.items()
            if k in ("size", "img_size", "patch_size", "num_classes") and ckpt["model_args"].get(k) != v}
    if diff:
        what = ", ".join(f"{k}: {a} in checkpoint, {b} in this run" for k, (a, b) in diff.items())
        raise RuntimeError(f"cannot resume from {path}: the model differs ({what}); "
                           f"resume with the model=/data= settings the checkpoint was made with")
    if ckpt["classes"] != classes:
        raise RuntimeError(f"cannot resume from {path}: its classes differ from the dataset's ({len(ckpt['classes'])} "
                           f"vs {len(classes)} classes); use the same data.root")


def config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every leaf that differs between two config dicts."""
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changes += config_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return changes


def lr_curve(cfg, steps_per_epoch: int, steps: list[int]) -> tuple[list[float], int, int]:
    """(the peak group's learning rate after each of ``steps`` optimizer steps, the warm-up's last step, the
    total steps) under ``cfg``'s schedule (:func:`vit.build.build_scheduler` on a one-parameter optimizer)."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=effective_lr(cfg))
    scheduler = build_scheduler(optimizer, cfg, steps_per_epoch)
    return [scheduler._get_lr(t)[0] for t in steps], scheduler.warmup_t, scheduler.t_initial


def check_schedule(ckpt: dict, path: Path, cfg, changes: list[str],
                   steps_for: Callable[[int, int], int]) -> None:
    """Refuse (ValueError) a resume whose config changes the LR schedule unless ``allow_schedule_change``;
    allowed, warn with the LR at the resumed step under both schedules and the new curve's key points.
    ``steps_for(batch_size, grad_accum)`` is the number of optimizer steps per epoch on this dataset."""
    changed = [c for c in changes if c.startswith(SCHEDULE_KEYS)]
    if not changed:
        return
    old, step = OmegaConf.create(ckpt["config"]), ckpt["step"]
    old_spe, new_spe = steps_for(old.batch_size, old.grad_accum), steps_for(cfg.batch_size, cfg.grad_accum)
    [was], _, _ = lr_curve(old, old_spe, [step])
    _, warmup, total = lr_curve(cfg, new_spe, [])
    [now, peak, end], _, _ = lr_curve(cfg, new_spe, [step, warmup, total])
    what = (f"{'; '.join(changed)} change the learning-rate schedule: at the resumed step {step} the LR was "
            f"{was:.4g} under the checkpoint's schedule and is {now:.4g} under this run's")
    if not cfg.get("allow_schedule_change", False):
        raise ValueError(f"cannot resume from {path}: {what}. Resume with the checkpoint's values, or set "
                         f"allow_schedule_change=true to continue on the recomputed curve")
    warnings.warn(f"{what}; allow_schedule_change=true: continuing on the new curve: peak {peak:.4g} at step "
                  f"{warmup} (end of warm-up), {now:.4g} now (step {step}), {end:.4g} at step {total} (end)",
                  ConfigWarning, stacklevel=2)


def restore_run(path: Path, ckpt: dict, model: torch.nn.Module, margs: dict, classes: list[str], cfg,
                cfg_dict: dict, steps_for: Callable[[int, int], int]) -> TrainState:
    """Check the checkpoint against this run, load its weights and RNG states into ``model`` and the
    process, and return its progress counters (optimizer and scheduler are restored by the caller).

    Raises:
        RuntimeError: another model or other classes (:func:`check_compatible`).
        ValueError: another LR schedule without ``allow_schedule_change`` (:func:`check_schedule`).
    """
    check_compatible(ckpt, path, margs, classes)
    changes = [c for c in config_changes(ckpt["config"], cfg_dict) if not c.startswith(IGNORED_KEYS)]
    check_schedule(ckpt, path, cfg, changes, steps_for)
    if changes:
        info(f"[resume] this run's config differs from the checkpoint's: {'; '.join(changes)}")
    load_model_weights(model, ckpt["model"], source=str(path))
    defaults = TrainState().state_dict()
    state = TrainState(**{k: ckpt.get(k, v) for k, v in defaults.items()})
    restore_rng_state(ckpt["rng"])
    spe = steps_for(cfg.batch_size, cfg.grad_accum)
    info(f"[resume] from {path}: epoch {state.epoch}, step {state.step}"
         f"{f' (mid-epoch, step {state.step_in_epoch} of {spe})' if state.step_in_epoch else ''}")
    return state
