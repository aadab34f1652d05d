"""Evaluate a checkpoint: ``python eval.py checkpoint=PATH [attention=sdpa] [data=...] [model=...]``.

Reports loss, top-1, top-5 (%), images/s and peak memory on the val split; writes them to
``<out_dir>/eval.json`` and to a W&B run (``logger=none`` for neither W&B). ``evaluate_checkpoint(cfg)``
is the plain, testable function.

Our checkpoints carry their model arguments, class names and config, so only ``checkpoint=`` is
needed; ``attention=`` and ``data=`` override the checkpoint's. A timm-format state dict carries no
config: give ``model=<size>`` and ``data=`` (and ``data.img_size``) that match it.
"""
from __future__ import annotations

import json
from pathlib import Path

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from vit.build import build_model, check_model_config, resolve_amp, resolve_backend, resolve_device, resolve_out_dir
from vit.checkpoint import load_checkpoint, load_model_weights, load_state_dict_file
from vit.data import build_eval_data
from vit.engine import evaluate
from vit.logger import RunLogger, environment


def evaluate_checkpoint(cfg: DictConfig) -> dict:
    """Evaluate ``cfg.checkpoint``; return the metrics dict (also written as JSON).

    Raises:
        ValueError: no checkpoint given; a timm state dict without ``model=``/``data=``.
        FileNotFoundError: checkpoint or dataset folder missing.
        RuntimeError: the weights do not fit the model (names the keys), classes differ, backend unavailable.
    """
    if not cfg.checkpoint:
        raise ValueError("checkpoint is not set; pass checkpoint=path/to/step_XXXXXXXX.pt "
                         "(train.py prints it at the end of a run)")
    path = Path(to_absolute_path(cfg.checkpoint))
    ours = path.suffix == ".pt" and "model_args" in (ckpt := load_checkpoint(path))
    if ours:
        run_cfg = OmegaConf.create(ckpt["config"])
        margs = dict(ckpt["model_args"])
        state_dict = ckpt["model"]
    else:
        if "model" not in cfg or "data" not in cfg:
            raise ValueError(f"{path} is a bare state dict without a config; pass model=<size> and data=<dataset> "
                             f"(and data.img_size) that match it")
        run_cfg = OmegaConf.create({})
        margs = {}
        state_dict = load_state_dict_file(path)
    data_cfg = cfg.data if "data" in cfg else run_cfg.data
    if "model" in cfg:
        margs.update(size=cfg.model.size, patch_size=cfg.model.patch_size, drop_rate=0.0, drop_path_rate=0.0)
    margs["img_size"] = data_cfg.img_size
    attention_name = cfg.attention.name if "attention" in cfg else run_cfg.attention.name
    check_model_config(OmegaConf.create({"model": {"size": margs["size"], "patch_size": margs["patch_size"]},
                                         "data": {"img_size": margs["img_size"]},
                                         "attention": {"name": attention_name}}))

    device = resolve_device(cfg.device)
    amp_dtype = resolve_amp(cfg.amp, device)
    backend = resolve_backend(attention_name, device, amp_dtype)
    loader, classes = build_eval_data(data_cfg, cfg.batch_size, device)
    if ours and list(ckpt["classes"]) != list(classes):
        raise RuntimeError(f"the val folder's classes differ from those the checkpoint was trained on "
                           f"({len(classes)} vs {len(ckpt['classes'])}); pass the matching data= / data.root=")
    margs["num_classes"] = len(classes)
    model = build_model(margs, backend).to(device)
    load_model_weights(model, state_dict, source=str(path))

    metrics = evaluate(model, loader, device, amp_dtype)
    metrics.update(backend=backend, checkpoint=str(path), model=margs["size"], device=str(device))
    out_dir = resolve_out_dir(cfg, "outputs/eval/%Y-%m-%d/%H-%M-%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval.json").write_text(json.dumps(metrics, indent=2))
    logger = RunLogger(cfg.logger, out_dir, {**OmegaConf.to_container(cfg, resolve=True),
                                             "env": environment(backend, device)})
    logger.summary({f"eval/{k}": v for k, v in metrics.items()})
    wandb_dir = logger.run_dir
    logger.finish()
    print(f"[eval {backend}] {path}: loss {metrics['loss']:.4f}  top-1 {metrics['top1']:.2f} %  "
          f"top-5 {metrics['top5']:.2f} %  {metrics['images_per_s']:.0f} images/s  "
          f"peak memory {metrics['peak_mem_allocated_mb']:.0f} MiB allocated, "
          f"{metrics['peak_mem_reserved_mb']:.0f} MiB reserved ({metrics['images']} images)")
    print(f"metrics: {out_dir / 'eval.json'}" + (f"\nW&B run: {wandb_dir}" if wandb_dir else ""))
    return {**metrics, "out_dir": str(out_dir), "wandb_dir": wandb_dir}


@hydra.main(config_path="configs", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    evaluate_checkpoint(cfg)


if __name__ == "__main__":
    main()
