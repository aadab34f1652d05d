"""Train a ViT: ``python train.py [key=value ...]`` (Hydra; see configs/train.yaml).

``train(cfg)`` is plain and testable (tests build ``cfg`` with ``hydra.compose``); ``main`` is the
``@hydra.main`` wrapper. Outputs go to ``out_dir`` (default: the Hydra run dir, outputs/<date>/<time>):
``checkpoints/step_XXXXXXXX.pt`` (last ``checkpoint.keep_last``), ``checkpoints/best.pt`` (weights of
the best validation top-1, of the EMA's with ``ema.best_from=ema``), ``metrics.jsonl`` (every logged line),
``summary.csv`` (one row per epoch, timm's columns), ``summary.json`` (final metrics, steady-state images/s,
peak memory) and ``wandb/`` (the W&B run). Mixup/cutmix, the loss and the EMA of the weights come from
:mod:`vit.recipe`.

Several processes: ``torchrun --nproc_per_node=G train.py ...`` (vit/distributed.py). ``batch_size`` stays
the global batch; rank 0 alone prints, logs and writes checkpoints, into rank 0's output directory.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import sys
import time
import warnings
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from vit.build import (
    ConfigWarning,
    build_model,
    build_optimizer,
    build_scheduler,
    check_train_config,
    config_warnings,
    effective_lr,
    model_args,
    resolve_amp,
    resolve_backend,
    resolve_cpu_threads,
    resolve_device,
    resolve_out_dir,
)
from vit.checkpoint import (
    capture_rng_state,
    load_model_weights,
    load_state_dict_file,
    prune_checkpoints,
    save_best,
    save_checkpoint,
    step_checkpoint_path,
    timm_pretrained_state_dict,
)
from vit.data import build_data
from vit.data_wait import DataWaitCheck
from vit.distributed import DistInfo, all_reduce_mean, all_reduce_sum, broadcast_object, init_distributed, teardown
from vit.engine import TrainState, evaluate, train_epoch
from vit.logger import RunLogger, append_summary_csv, console_log, environment, info, scrub_secrets, trim_summary_csv
from vit.monitor import AttentionMonitor
from vit.recipe import build_recipe
from vit.resume import find_resume, restore_run
from vit.wrap import (
    apply_compile,
    apply_distributed,
    apply_grad_ckpt,
    load_optimizer_state_dict,
    model_state_dict,
    optimizer_state_dict,
    resolve_strategy,
    unwrap,
)


def load_init_weights(model: torch.nn.Module, cfg: DictConfig, margs: dict) -> None:
    """``init_from``: ``timm:<model name>`` (timm's pretrained loading; ``init_from_file`` reads a local copy),
    or a path to one of our checkpoints or a bare state dict (.pth, .safetensors)."""
    file = to_absolute_path(cfg.init_from_file) if cfg.get("init_from_file") else None
    if cfg.init_from.startswith("timm:"):
        name = cfg.init_from.removeprefix("timm:")
        state, source = timm_pretrained_state_dict(name, margs, file), f"timm:{name}" + (f" ({file})" if file else "")
    else:
        source = to_absolute_path(cfg.init_from)
        state = load_state_dict_file(source)
    load_model_weights(model, state, source=source)
    info(f"[init] weights from {source}")


def seed_all(seed: int) -> None:
    """Seed torch, python and numpy."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def micro_batch_size(cfg: DictConfig, world_size: int) -> int:
    """Images per process and forward pass: ``batch_size / (grad_accum × world_size)`` (ValueError if not whole)."""
    micro_batch = cfg.batch_size // (cfg.grad_accum * world_size)
    if micro_batch * cfg.grad_accum * world_size != cfg.batch_size:
        raise ValueError(f"batch_size={cfg.batch_size} is not divisible by grad_accum × world size "
                         f"= {cfg.grad_accum * world_size}")
    return micro_batch


def prefixed(prefix: str, metrics: dict) -> dict:
    """``metrics`` under ``prefix`` + key, without the image count (``val/top1``, ``val_ema_loss``, ...)."""
    return {f"{prefix}{k}": v for k, v in metrics.items() if k != "images"}


def steady_images_per_s(epoch_step_ends: list[list[float]], batch_size: int, skip: int) -> tuple[float | None, int]:
    """(images/s, steps timed) over the optimizer steps after the run's first ``skip`` (compilation,
    autotuning, allocator warm-up), from each epoch's start and step-end times (perf_counter seconds);
    validation gaps are excluded."""
    seconds, steps, seen = 0.0, 0, 0
    for ends in epoch_step_ends:
        for i in range(1, len(ends)):
            if seen + i > skip:
                seconds += ends[i] - ends[i - 1]
                steps += 1
        seen += len(ends) - 1
    return (steps * batch_size / seconds if seconds > 0 else None), steps


def train(cfg: DictConfig) -> dict:
    """Train per ``cfg``; return the final metrics, per-epoch history and output paths.

    Under torchrun every process calls this; see :mod:`vit.distributed`.

    Raises:
        ValueError: invalid config values (before any work), no data root, empty class folder, class mismatch.
        FileNotFoundError: dataset folder or checkpoint not found.
        RuntimeError: unavailable attention backend; incompatible checkpoint; too many undecodable images.
        vit.engine.NonFiniteLossError: non-finite loss under ``nonfinite.policy``.
        vit.engine.TrainingOutOfMemoryError: the GPU or CPU ran out of memory in a training step.
    """
    check_train_config(cfg)
    dist = init_distributed(resolve_device(cfg.device))
    threads = torch.get_num_threads()
    torch.set_num_threads(resolve_cpu_threads(cfg.get("cpu_threads", "auto")))
    try:
        out_dir = shared_out_dir(cfg, dist.rank)
        if dist.is_main:
            with console_log(out_dir):
                return _train(cfg, dist, out_dir)
        with (open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull),  # rank 0 alone prints
              console_log(out_dir, write_file=False)):
            return _train(cfg, dist, out_dir)
    finally:
        torch.set_num_threads(threads)
        teardown(dist)


def shared_out_dir(cfg: DictConfig, rank: int) -> Path:
    """Rank 0's output directory, for all ranks; other ranks remove their own (empty) Hydra run dirs."""
    out_dir = broadcast_object(resolve_out_dir(cfg))
    if rank > 0 and HydraConfig.initialized():
        own_dir = Path(HydraConfig.get().runtime.output_dir)
        if own_dir != out_dir:
            with contextlib.suppress(OSError):  # this rank's Hydra run dir, empty (see __main__)
                own_dir.rmdir()
    return out_dir


def _train(cfg: DictConfig, dist: DistInfo, out_dir: Path) -> dict:
    rank, world_size, device = dist.rank, dist.world_size, dist.device
    strategy = resolve_strategy(cfg.get("strategy"), world_size)
    ckpt_dir = out_dir / "checkpoints"
    seed_all(cfg.seed)
    amp_dtype = resolve_amp(cfg.amp, device)
    backend = resolve_backend(cfg.attention.name, device, amp_dtype)
    micro_batch = micro_batch_size(cfg, world_size)
    data = build_data(cfg.data, micro_batch, cfg.eval_batch_size, device, cfg.seed, world_size, rank,
                      num_repeats=cfg.repeated_aug.repeats, selected_round=cfg.repeated_aug.selected_round)
    per_rank = data.sampler.per_rank() if data.sampler is not None else len(data.train_loader) * micro_batch
    steps_per_epoch = per_rank // micro_batch // cfg.grad_accum
    if steps_per_epoch == 0:
        raise ValueError(f"batch_size={cfg.batch_size} is larger than the training set ({per_rank * world_size} "
                         f"images); lower batch_size")

    margs = model_args(cfg, len(data.classes))
    for message in config_warnings(cfg, margs, backend, micro_batch, steps_per_epoch):
        warnings.warn(message, ConfigWarning, stacklevel=1)
    model = build_model(margs, backend, cfg.attention).to(device)  # the same initial weights on every rank (same seed)
    state = TrainState()
    if cfg.init_from:  # weights only (ours or timm's), pos_embed resized to this image size; fresh optimizer
        load_init_weights(model, cfg, margs)
    cfg_dict = scrub_secrets(OmegaConf.to_container(cfg, resolve=True))  # what checkpoints and W&B hold
    resume = find_resume(cfg.resume, ckpt_dir)
    if resume is not None:
        state = restore_run(*resume, model, margs, data.classes, cfg, cfg_dict,
                            lambda batch, accum: per_rank // max(batch // (accum * world_size), 1) // accum)
    recipe = build_recipe(cfg, model, len(data.classes), strategy, device, micro_batch,  # mixup, loss, EMA
                          checkpoint=resume[1] if resume else None)
    if rank > 0:  # own dropout / drop-path streams per rank (rank 0 keeps the one-process run's)
        torch.manual_seed(cfg.seed + rank + 1000 * state.step)
    model = apply_grad_ckpt(model, cfg)
    model = apply_distributed(model, strategy, device)
    model = apply_compile(model, cfg)
    optimizer = build_optimizer(unwrap(model), cfg)  # after fully_shard, which replaces the parameters
    scheduler = build_scheduler(optimizer, cfg, steps_per_epoch)
    if resume is not None:
        load_optimizer_state_dict(model, optimizer, resume[1]["optimizer"])
        scheduler.step_update(state.step)
    lr, scale_batch = effective_lr(cfg), cfg.optim.get("lr_scale_batch")
    info(f"[optim] peak lr {lr:.4g}" + (f" = optim.lr {cfg.optim.lr:.4g} × batch_size {cfg.batch_size} / "
                                        f"optim.lr_scale_batch {scale_batch}" if scale_batch else
                                        " (optim.lr as given; optim.lr_scale_batch=K scales it by batch_size / K)"))

    env = environment(backend, device)
    logger = RunLogger(cfg.logger, out_dir, {**cfg_dict, "env": env, "out_dir": str(out_dir),
                                             "resumed_from": str(resume[0]) if resume else None}, rank,
                       resume_step=state.step if resume else None, run_id=resume[1].get("wandb_id") if resume else None)
    if rank == 0:  # one row per finished epoch: a resumed run rewrites those past its checkpoint
        trim_summary_csv(out_dir / "summary.csv", state.epoch)
    logger.print(f"[run] {out_dir} | model {margs['size']} (patch {margs['patch_size']}, img {margs['img_size']}, "
                 f"N={unwrap(model).seq_len}) | attention {backend} | device {device} | "
                 f"{steps_per_epoch} steps/epoch × {cfg.epochs} epochs, batch {cfg.batch_size} "
                 f"({world_size} process{'es' if world_size > 1 else ''} × {micro_batch} × grad_accum {cfg.grad_accum}"
                 f"{f', strategy {strategy}' if world_size > 1 else ''})"
                 f"{' | compile' if cfg.compile else ''}{' | grad_ckpt' if cfg.grad_ckpt else ''}")

    def payload(with_optimizer: bool = True) -> dict | None:
        """The checkpoint's content on rank 0 (None elsewhere); a collective under FSDP (all ranks call it)."""
        weights, ema = model_state_dict(model), recipe.ema_state_dict()
        state.train_seconds = seconds_before + time.perf_counter() - t_start
        optim_state = optimizer_state_dict(model, optimizer) if with_optimizer else None
        epoch_loss = all_reduce_mean(torch.tensor(state.epoch_loss_sum, dtype=torch.float64, device=device)).item()
        if rank != 0:
            return None
        out = {"model": weights, **ema, **state.state_dict(), "epoch_loss_sum": epoch_loss,
               "sampler": {"epoch": state.epoch, "position": state.step_in_epoch * cfg.grad_accum * micro_batch},
               "rng": capture_rng_state(), "config": cfg_dict, "model_args": margs, "classes": list(data.classes),
               "backend": backend, "metrics": last_val, "wandb_id": logger.run_id}
        if with_optimizer:
            out["optimizer"] = optim_state
        return out

    def save_step() -> Path | None:
        content = payload()
        if rank != 0:
            return None
        path = save_checkpoint(step_checkpoint_path(ckpt_dir, state.step), content)
        prune_checkpoints(ckpt_dir, cfg.checkpoint.keep_last)
        return path

    step_ends: list[list[float]] = []  # per epoch: perf_counter() at its start and at each optimizer step's end
    monitor = AttentionMonitor.from_config(cfg, model, data.val_loader, device, amp_dtype)  # None: off
    data_wait = DataWaitCheck(cfg.data, device, logger.print)  # says once if the loader bounds the run

    def on_step_end(s: TrainState) -> None:
        step_ends[-1].append(time.perf_counter())
        if monitor is not None:
            monitor.after_step(s.step, logger)
        every = cfg.checkpoint.every_steps
        if every > 0 and s.step % every == 0 and s.step_in_epoch < steps_per_epoch:
            save_step()

    last_val, history, last_path, t_start, seconds_before = {}, [], None, time.perf_counter(), state.train_seconds
    if state.epoch >= cfg.epochs:
        logger.print(f"[run] nothing to train: the checkpoint is at epoch {state.epoch} of epochs={cfg.epochs}; "
                     f"raise epochs to continue")
    try:
        for epoch in range(state.epoch, cfg.epochs):
            data.set_epoch(epoch, position=state.step_in_epoch * cfg.grad_accum * micro_batch)
            step_ends.append([time.perf_counter()])
            train_loss = train_epoch(
                model, data.train_loader, optimizer, scheduler, state, device=device, amp_dtype=amp_dtype,
                grad_accum=cfg.grad_accum, clip_grad=cfg.clip_grad, recipe=recipe,
                steps_per_epoch=steps_per_epoch, world_size=world_size, log_every=cfg.log_every,
                nonfinite_policy=cfg.nonfinite.policy, max_nonfinite_skips=cfg.nonfinite.max_skips, logger=logger,
                backend=backend, seq_len=unwrap(model).seq_len, on_step_end=on_step_end, progress=cfg.progress,
                reduce=all_reduce_mean, on_window=data_wait)
            if epoch + 1 < cfg.epochs:
                data.start_epoch(epoch + 1)  # the next epoch's loading runs while this one validates
            last_val = evaluate(model, data.val_loader, device, amp_dtype, reduce=all_reduce_sum, backend=backend)
            last_ema = recipe.evaluate_ema(data.val_loader, device, amp_dtype, reduce=all_reduce_sum)  # {} without EMA
            state.epoch, state.step_in_epoch, state.epoch_loss_sum = epoch + 1, 0, 0.0
            logger.log({**prefixed("val/", last_val), **prefixed("val/ema_", last_ema), "epoch": state.epoch,
                        "data/bad_files": data.num_bad()}, step=state.step,
                       prefix=f"[val   epoch {state.epoch}/{cfg.epochs}] ")
            history.append({"epoch": state.epoch, "train_loss": train_loss,
                            "lr": max(g["lr"] for g in optimizer.param_groups),
                            **prefixed("val_", last_val), **prefixed("val_ema_", last_ema)})
            if rank == 0:
                append_summary_csv(out_dir / "summary.csv", {**history[-1], "val": last_val, "val_ema": last_ema})
            top1 = (last_ema if cfg.ema.best_from == "ema" else last_val)["top1"]  # ema.best_from picks best.pt
            improved, state.best_top1 = top1 > state.best_top1, max(state.best_top1, top1)
            # best.pt first: a step checkpoint that counts this epoch as best implies best.pt has it
            if improved or cfg.checkpoint.keep_best > 0:  # the same on every rank; payload is a collective under FSDP
                best = payload(with_optimizer=False)
                if rank == 0:
                    save_best(ckpt_dir, best, top1, state.step, improved, cfg.checkpoint.keep_best)
            last_path = save_step()
    except BaseException:
        data.cancel()  # the loader's running or begun iteration (decode thread, prefetched batches)
        raise
    train_seconds = state.train_seconds = seconds_before + time.perf_counter() - t_start

    run_steps = sum(len(e) - 1 for e in step_ends)
    images_per_s, timed_steps = steady_images_per_s(step_ends, cfg.batch_size, skip=min(5, run_steps // 2))
    peaks = {k: max([r.get(f"train/{k}", 0.0) for r in logger.records] + [last_val.get(k, 0.0)])
             for k in ("peak_mem_allocated_mb", "peak_mem_reserved_mb")}
    summary = {"final/val_top1": last_val.get("top1"), "final/val_top5": last_val.get("top5"),
               "final/val_loss": last_val.get("loss"), "best/val_top1": state.best_top1,
               "train_seconds": train_seconds, "train/steady_images_per_s": images_per_s}
    logger.summary(summary)
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json.dumps({
            **summary, "steady_steps": timed_steps, "steps": run_steps, "backend": backend, "strategy": strategy,
            "world_size": world_size, "compile": cfg.compile, "grad_ckpt": cfg.grad_ckpt, "batch_size": cfg.batch_size,
            "micro_batch": micro_batch, "img_size": margs["img_size"], "seq_len": unwrap(model).seq_len,
            "model": margs["size"], "lr": lr, **peaks, "env": env}, indent=1) + "\n")
    wandb_dir = logger.run_dir
    logger.finish()
    result = {"val": last_val, "best_top1": state.best_top1, "history": history, "out_dir": str(out_dir),
              "images_per_s": images_per_s, **peaks, "world_size": world_size, "strategy": strategy,
              "checkpoint": str(last_path) if last_path else None, "best_checkpoint": str(ckpt_dir / "best.pt"),
              "wandb_dir": wandb_dir, "backend": backend, "train_seconds": train_seconds, "steps": state.step}
    if rank == 0 and last_val:
        print_report(last_val, state, last_path, ckpt_dir, wandb_dir)
    return result


def print_report(last_val: dict, state: TrainState, last_path: Path | None, ckpt_dir: Path,
                 wandb_dir: str | None) -> None:
    """The run's last lines: final and best top-1, the checkpoints, the W&B run, the eval command."""
    info(f"\nfinal val top-1 {last_val['top1']:.2f} % (top-5 {last_val['top5']:.2f} %, loss {last_val['loss']:.4f}) "
         f"after {state.epoch} epochs, {state.train_seconds:.0f} s of training; best top-1 {state.best_top1:.2f} %")
    info(f"checkpoint: {last_path}\nbest:       {ckpt_dir / 'best.pt'}")
    info(f"W&B run:    {wandb_dir} (offline: `wandb sync {wandb_dir}` uploads it)" if wandb_dir
         else "W&B run:    none (logger=none)")
    info(f"evaluate:   python eval.py {shell_override('checkpoint', str(last_path))}")


def shell_override(key: str, value: str) -> str:
    """``key=value`` as one shell word Hydra parses back to ``value``: quoted for both when the value holds a
    character Hydra's grammar reserves (``=`` is a syntax error unquoted, ``,`` makes a list)."""
    if not any(c in value for c in "=,'\"()[]{}<>*?$` \\"):
        return f"{key}={value}"
    hydra = f"{key}='{value}'" if "'" not in value else f'{key}="{value}"'
    return shlex.quote(hydra) if any(c in hydra for c in '"$`\\') else f'"{hydra}"'


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    if int(os.environ.get("RANK", "0")) > 0:  # only rank 0 writes Hydra's files; the others' run dirs stay empty
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    main()
