"""What each attention head does: ``python analyze.py checkpoint=PATH [data=...] [data.img_size=...]``.

Over the first ``num_images`` val images, per layer and head: the mean attention distance in pixels
(Dosovitskiy et al. 2021, Fig. 7: Σ_j P_ij·‖pos_i − pos_j‖ over the patch query rows, the class token's
column at distance 0; definition in kernels/flash/stats.py), the mean attention entropy in nats and the
largest logit. For the first ``maps.images`` val images: the last layer's class-token attention per head
and attention rollout (Abnar & Zuidema 2020), overlaid on the images (vit/attention_probe.py).

Writes to ``<out_dir>``: ``analysis.json``, ``attention_distance.png``, ``attention_entropy.png`` and
``attention_maps.png``, and logs the figures and a per-head table to a W&B run (``logger=none``: no W&B).
``stats=flash`` (auto on CUDA) computes the statistics inside the FlashAttention forward in O(N) memory,
so 1024 px images (N = 4097) fit; ``stats=naive`` materialises each layer's (B, H, N, N) matrix. Rollout
needs those matrices, so it is refused above N = 1025: pass ``maps.rollout=false`` there.

Checkpoints as eval.py reads them: ours carry their model and data config; a bare state dict (timm's
``.safetensors`` or ``.pth``) needs ``model=<size>`` and ``data=``. ``analyze_checkpoint(cfg)`` is the
plain, testable function. One process (no torchrun).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from eval import eval_data_config, read_checkpoint
from vit.attention_plots import plot_maps, plot_per_head
from vit.attention_probe import AttentionProbe
from vit.build import build_model, check_model_config, resolve_amp, resolve_device, resolve_out_dir
from vit.checkpoint import load_model_weights
from vit.data import build_eval_data, spread_images
from vit.engine import autocast, memory_peaks_mb
from vit.logger import RunLogger, environment, info


def load_model(cfg: DictConfig, device: torch.device):
    """(model in eval mode on ``device``, the val loader, its data config, class names, and the JSON's
    ``checkpoint`` and ``model`` fields).

    The head's size is the checkpoint's own (the statistics do not need the folder's classes to match)."""
    path = Path(to_absolute_path(cfg.checkpoint))
    state_dict, margs, run_cfg, _ = read_checkpoint(cfg, path)
    data_cfg = eval_data_config(cfg, run_cfg)
    if "model" in cfg:
        margs.update(size=cfg.model.size, patch_size=cfg.model.patch_size, drop_rate=0.0, drop_path_rate=0.0)
    margs["img_size"] = data_cfg.img_size
    check_model_config(OmegaConf.create({"model": {"size": margs["size"], "patch_size": margs["patch_size"]},
                                         "data": {"img_size": margs["img_size"]}, "attention": {"name": "naive"}}))
    loader, classes = build_eval_data(data_cfg, cfg.batch_size, device)
    head = state_dict.get("head.weight")
    margs["num_classes"] = head.shape[0] if head is not None else len(classes)
    model = build_model(margs, "naive")  # every block's attention is the probe's while it runs
    load_model_weights(model, state_dict, source=str(path))
    return model.to(device).eval(), loader, data_cfg, classes, {"checkpoint": str(path), "model": margs["size"]}


def val_batches(loader, limit: int):
    """(images, labels) of the val loader's first ``limit`` images, batch by batch."""
    seen = 0
    for batch in loader:
        if batch is None:  # every image of the batch was a bad file
            continue
        x, y = batch[0][: limit - seen], batch[1][: limit - seen]
        seen += len(x)
        yield x, y
        if seen >= limit:
            return


@torch.no_grad()
def measure(model, loader, probe: AttentionProbe, limit: int, device, amp_dtype) -> dict:
    """Per layer and head (lists of lists): mean distance (px) and entropy (nats) over the images, largest logit."""
    dist = ent = top = None
    n = 0
    for x, _ in val_batches(loader, limit):
        with autocast(device, amp_dtype), probe:
            model(x.to(device))
        d, e, m = (torch.stack(t).double() for t in (probe.distance, probe.entropy, probe.max_logit))  # (L, B, H)
        dist = d.sum(1) if dist is None else dist + d.sum(1)
        ent = e.sum(1) if ent is None else ent + e.sum(1)
        top = m.amax(1) if top is None else torch.maximum(top, m.amax(1))
        n += len(x)
    if n == 0:
        raise ValueError("the validation set is empty; add images to the val/<class>/ folders")
    return {"images": n, "mean_attention_distance_px": (dist / n).tolist(),
            "attention_entropy_nats": (ent / n).tolist(), "max_logit": top.tolist()}


@torch.no_grad()
def draw_maps(model, loader, probe: AttentionProbe, data_cfg, classes, count: int, device, amp_dtype, path: Path):
    """``count`` val images (:func:`spread_images`) with their last-layer class-token maps (and rollout), a PNG grid."""
    x, y = spread_images(loader, count)
    with autocast(device, amp_dtype), probe:
        model(x.to(device))
    mean, std = (torch.tensor(list(data_cfg[k])).view(1, -1, 1, 1) for k in ("mean", "std"))
    what = "last layer: class token's attention" if model.num_prefix_tokens else "last layer: mean attention"
    return plot_maps(x * std + mean, probe.maps, probe.rollout, [f"class {classes[int(c)]}" for c in y], path, what)


def write_figures(stats: dict, seq_len: int, out_dir: Path) -> dict:
    dist = plot_per_head(np.array(stats["mean_attention_distance_px"]), "mean attention distance (pixels)",
                         f"Mean attention distance per head ({stats['images']} val images)",
                         out_dir / "attention_distance.png")
    ent = plot_per_head(np.array(stats["attention_entropy_nats"]), "attention entropy (nats)",
                        f"Attention entropy per head ({stats['images']} val images)", out_dir / "attention_entropy.png",
                        reference=(math.log(seq_len), f"uniform over N={seq_len}: ln N"))
    return {"attention_distance": dist, "attention_entropy": ent}


def log_wandb(logger: RunLogger, figures: dict, stats: dict) -> None:
    """The figures as images and one table row per (layer, head) in the W&B run."""
    if logger.run is None:
        return
    import wandb

    rows = [[layer + 1, head + 1, d, e, m] for layer, (ds, es, ms) in enumerate(
        zip(stats["mean_attention_distance_px"], stats["attention_entropy_nats"], stats["max_logit"]))
        for head, (d, e, m) in enumerate(zip(ds, es, ms))]
    logger.run.log({**{f"analyze/{k}": wandb.Image(str(p)) for k, p in figures.items()},
                    "analyze/per_head": wandb.Table(columns=["layer", "head", "mean_attention_distance_px",
                                                             "attention_entropy_nats", "max_logit"], data=rows)})
    logger.summary({"analyze/images": stats["images"], "analyze/stats_kernel": stats["stats_kernel"]})


def analyze_checkpoint(cfg: DictConfig) -> dict:
    """Analyse ``cfg.checkpoint`` (see the module docstring); return the JSON's dict plus ``out_dir``, ``wandb_dir``.

    Raises:
        ValueError: no checkpoint; a bare state dict without ``model=``/``data=``; rollout above N = 1025;
            an unknown ``stats``; bad sizes.
        FileNotFoundError: checkpoint or dataset folder missing.
        RuntimeError: weights that do not fit the model; ``stats=flash`` without a GPU or the interpreter.
    """
    if not cfg.checkpoint:
        raise ValueError("checkpoint is not set; pass checkpoint=path/to/step_XXXXXXXX.pt (or a timm state dict "
                         "with model=<size> data=<dataset>)")
    device = resolve_device(cfg.device)
    amp_dtype = resolve_amp(cfg.amp, device)
    model, loader, data_cfg, classes, names = load_model(cfg, device)
    map_probe = AttentionProbe(model, cfg.stats, maps=True, rollout=cfg.maps.rollout) if cfg.maps.images else None
    probe = AttentionProbe(model, cfg.stats)
    out_dir = resolve_out_dir(cfg, "outputs/analyze/%Y-%m-%d/%H-%M-%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    memory_peaks_mb(device)  # reset
    t0 = time.perf_counter()
    stats = measure(model, loader, probe, cfg.num_images, device, amp_dtype)
    seq_len, heads = model.seq_len, model.blocks[0].attn.num_heads
    stats.update(**names, img_size=data_cfg.img_size,
                 patch_size=model.patch_embed.patch_size, seq_len=seq_len, depth=len(model.blocks), num_heads=heads,
                 stats_kernel=probe.stats_name, device=str(device), seconds=time.perf_counter() - t0,
                 uniform_entropy_nats=math.log(seq_len), **memory_peaks_mb(device),
                 naive_probs_mb_per_layer=min(cfg.batch_size, cfg.num_images) * heads * seq_len ** 2 * 4 / 2 ** 20)
    figures = write_figures(stats, seq_len, out_dir)
    if map_probe is not None:
        figures["attention_maps"] = draw_maps(model, loader, map_probe, data_cfg, classes, cfg.maps.images, device,
                                              amp_dtype, out_dir / "attention_maps.png")
    (out_dir / "analysis.json").write_text(json.dumps(stats, indent=2))
    logger = RunLogger(cfg.logger, out_dir, {**OmegaConf.to_container(cfg, resolve=True),
                                             "env": environment(probe.stats_name, device)})
    log_wandb(logger, figures, stats)
    wandb_dir = logger.run_dir
    logger.finish()
    report(stats, out_dir, figures, wandb_dir)
    return {**stats, "out_dir": str(out_dir), "wandb_dir": wandb_dir}


def report(stats: dict, out_dir: Path, figures: dict, wandb_dir: str | None) -> None:
    dist = np.array(stats["mean_attention_distance_px"])
    info(f"[analyze {stats['stats_kernel']}] {stats['checkpoint']}: {stats['images']} images, N={stats['seq_len']}, "
         f"{stats['seconds']:.1f} s, peak memory {stats['peak_mem_allocated_mb']:.0f} MiB allocated")
    for layer, row in enumerate(dist):
        info(f"  layer {layer + 1:2d}: mean attention distance {row.min():6.1f}-{row.max():6.1f} px over heads, "
             f"entropy {min(stats['attention_entropy_nats'][layer]):.2f}-"
             f"{max(stats['attention_entropy_nats'][layer]):.2f} nats")
    info(f"statistics: {out_dir / 'analysis.json'}\nfigures: {', '.join(str(p) for p in figures.values())}"
         + (f"\nW&B run: {wandb_dir}" if wandb_dir else ""))


@hydra.main(config_path="configs", config_name="analyze", version_base="1.3")
def main(cfg: DictConfig) -> None:
    analyze_checkpoint(cfg)


if __name__ == "__main__":
    main()
