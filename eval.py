"""Evaluate a checkpoint: ``python eval.py checkpoint=PATH [attention=sdpa] [data=...] [data.img_size=...]``.

Reports loss, top-1, top-5 (%), images/s and peak memory on the val split; writes them to
``<out_dir>/eval.json`` and to a W&B run (``logger=none`` for neither W&B). ``evaluate_checkpoint(cfg)``
is the plain, testable function.

Our checkpoints carry their model arguments, class names and config, so only ``checkpoint=`` is
needed; ``attention=`` overrides the checkpoint's backend, ``data=<group>`` its data config, and
``data.<key>=`` single keys of it (``data.img_size=384``, ``data.root=/other/val/folder``). A bare
state dict (timm's ``.safetensors`` or ``.pth``) carries no config: give ``model=<size>`` and
``data=`` (and ``data.img_size``) that match it; its backend defaults to ``auto``. ``use_ema=true``
evaluates the EMA of the weights that a run with ``ema=on`` keeps in its checkpoints.

Under ``torchrun --nproc_per_node=G eval.py ...`` each process evaluates every G-th val image (as
``train.py``'s validation does), the sums are reduced over the processes, and rank 0 alone prints,
writes ``eval.json`` and logs to W&B.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from vit.build import build_model, check_model_config, resolve_amp, resolve_backend, resolve_device, resolve_out_dir
from vit.checkpoint import load_checkpoint, load_model_weights, load_state_dict_file
from vit.data import build_eval_data
from vit.distributed import DistInfo, all_reduce_sum, broadcast_object, init_distributed, teardown
from vit.engine import evaluate
from vit.images import class_difference
from vit.logger import RunLogger, environment


def read_checkpoint(cfg: DictConfig, path: Path) -> tuple[dict, dict, DictConfig, list[str] | None]:
    """(state dict, model args, the run's config, class names) of one of our checkpoints, or of a bare
    state dict (empty args and config, no class names; ``model=`` and ``data=`` are then required)."""
    if path.suffix != ".safetensors":
        ckpt = load_checkpoint(path)
        if isinstance(ckpt, dict) and "model_args" in ckpt:
            weights = checkpoint_weights(ckpt, path, cfg.get("use_ema", False))
            return weights, dict(ckpt["model_args"]), OmegaConf.create(ckpt["config"]), list(ckpt["classes"])
    if cfg.get("use_ema"):
        raise ValueError(f"use_ema=true, but {path} is a bare state dict, which holds one set of weights; drop use_ema")
    if "model" not in cfg or cfg.data.name is None:
        raise ValueError(f"{path} is a bare state dict without a config; pass model=<size> and data=<dataset> "
                         f"(and data.img_size) that match it, e.g. model=tiny data=imagefolder data.root=/data/imagenet")
    return load_state_dict_file(path), {}, OmegaConf.create({}), None


def checkpoint_weights(ckpt: dict, path: Path, use_ema: bool) -> dict:
    """The checkpoint's model weights, or with ``use_ema`` its EMA weights (ValueError if it has none)."""
    if not use_ema:
        return ckpt["model"]
    if "ema" not in ckpt:
        raise ValueError(f"use_ema=true, but {path} holds no EMA weights (its run had ema=none); drop use_ema, "
                         f"or train with ema=on")
    return ckpt["ema"]


def eval_data_config(cfg: DictConfig, run_cfg: DictConfig) -> DictConfig:
    """``data=<group>`` as given (with its ``data.*`` overrides; an image size it leaves unset is the
    checkpoint's); else the checkpoint's data config with the non-null ``data.*`` keys of ``cfg`` set over it."""
    if cfg.data.name is not None:
        if cfg.data.get("img_size") is None and run_cfg.get("data", {}).get("img_size") is not None:
            return OmegaConf.merge(cfg.data, {"img_size": run_cfg.data.img_size})
        return cfg.data
    overrides = {k: v for k, v in cfg.data.items() if v is not None}
    return OmegaConf.merge(run_cfg.data, overrides)


def evaluate_checkpoint(cfg: DictConfig) -> dict:
    """Evaluate ``cfg.checkpoint``; return the metrics dict (also written as JSON by rank 0).

    Under torchrun every process calls this; see the module docstring.

    Raises:
        ValueError: no checkpoint given; a bare state dict without ``model=``/``data=``; invalid sizes.
        FileNotFoundError: checkpoint or dataset folder missing.
        RuntimeError: the weights do not fit the model (names the keys), classes differ (names them),
            backend unavailable.
    """
    if not cfg.checkpoint:
        raise ValueError("checkpoint is not set; pass checkpoint=path/to/step_XXXXXXXX.pt "
                         "(train.py prints it at the end of a run)")
    dist = init_distributed(resolve_device(cfg.device))
    try:
        if dist.is_main:
            return _evaluate(cfg, dist)
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # rank 0 alone prints
            return _evaluate(cfg, dist)
    finally:
        teardown(dist)


def _evaluate(cfg: DictConfig, dist: DistInfo) -> dict:
    path = Path(to_absolute_path(cfg.checkpoint))
    state_dict, margs, run_cfg, ckpt_classes = read_checkpoint(cfg, path)
    data_cfg = eval_data_config(cfg, run_cfg)
    if "model" in cfg:
        margs.update(size=cfg.model.size, patch_size=cfg.model.patch_size, drop_rate=0.0, drop_path_rate=0.0,
                     global_pool=cfg.model.get("global_pool", "token"), pos_embed=cfg.model.get("pos_embed", "learn"))
    margs["img_size"] = data_cfg.img_size
    attention_name = cfg.attention.name if "attention" in cfg else run_cfg.get("attention", {}).get("name", "auto")
    check_model_config(OmegaConf.create({"model": {"size": margs["size"], "patch_size": margs["patch_size"]},
                                         "data": {"img_size": margs["img_size"]},
                                         "attention": {"name": attention_name}}))

    device = dist.device
    amp_dtype = resolve_amp(cfg.amp, device)
    backend = resolve_backend(attention_name, device, amp_dtype)
    loader, classes = build_eval_data(data_cfg, cfg.batch_size, device, num_replicas=dist.world_size,
                                      rank=dist.rank)
    if ckpt_classes is not None and (diff := class_difference(ckpt_classes, classes, "the checkpoint", "the folder")):
        raise RuntimeError(f"the val folder's classes differ from those {path} was trained on: {diff}; "
                           f"pass the data= / data.root= of a folder with the checkpoint's classes")
    margs["num_classes"] = len(classes)
    model = build_model(margs, backend).to(device)
    load_model_weights(model, state_dict, source=str(path))

    metrics = evaluate(model, loader, device, amp_dtype, reduce=all_reduce_sum, backend=backend)
    metrics.update(backend=backend, checkpoint=str(path), model=margs["size"], device=str(device),
                   world_size=dist.world_size, weights="ema" if cfg.get("use_ema") else "model")
    out_dir = broadcast_object(resolve_out_dir(cfg, "outputs/eval/%Y-%m-%d/%H-%M-%S"))  # rank 0's
    if dist.rank > 0 and HydraConfig.initialized():
        with contextlib.suppress(OSError):  # this rank's own Hydra run dir, empty (see __main__)
            Path(HydraConfig.get().runtime.output_dir).rmdir()
    logger = RunLogger(cfg.logger, out_dir, {**OmegaConf.to_container(cfg, resolve=True),
                                             "env": environment(backend, device)}, rank=dist.rank)
    if dist.is_main:
        (out_dir / "eval.json").write_text(json.dumps(metrics, indent=2))
    logger.summary({f"eval/{k}": v for k, v in metrics.items()})
    wandb_dir = logger.run_dir
    logger.finish()
    print(f"[eval {backend}{', EMA weights' if cfg.get('use_ema') else ''}] {path}: loss {metrics['loss']:.4f}  top-1 {metrics['top1']:.2f} %  "
          f"top-5 {metrics['top5']:.2f} %  {metrics['images_per_s']:.0f} images/s  "
          f"peak memory {metrics['peak_mem_allocated_mb']:.0f} MiB allocated, "
          f"{metrics['peak_mem_reserved_mb']:.0f} MiB reserved ({metrics['images']} images"
          f"{f' over {dist.world_size} processes' if dist.world_size > 1 else ''})")
    print(f"metrics: {out_dir / 'eval.json'}" + (f"\nW&B run: {wandb_dir}" if wandb_dir else ""))
    return {**metrics, "out_dir": str(out_dir), "wandb_dir": wandb_dir}


@hydra.main(config_path="configs", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    evaluate_checkpoint(cfg)


if __name__ == "__main__":
    if int(os.environ.get("RANK", "0")) > 0:  # only rank 0 writes Hydra's files; the others' run dirs stay empty
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    main()
