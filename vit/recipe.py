"""The training recipe around the model: mixup/cutmix and its loss, and the EMA of the weights.

timm's implementations, wired here (the loop in vit/engine.py calls :class:`Recipe`):

- **Mixup** (Zhang et al., 2018) and **CutMix** (Yun et al., 2019): ``timm.data.Mixup`` on each
  micro-batch on the device, after the loader. Targets become (B, num_classes) soft labels with
  ``label_smoothing`` folded in (timm's ``mixup_target``), and the loss is timm's
  ``SoftTargetCrossEntropy`` (``mixup.loss=bce``: ``BinaryCrossEntropy``, as DeiT III). Active when
  ``mixup.mixup_alpha > 0``, ``mixup.cutmix_alpha > 0`` or ``mixup.cutmix_minmax`` is set (timm's
  rule); from epoch ``mixup.off_epoch`` on (if > 0) batches are no longer mixed. Its draws come from
  numpy's global RNG, which checkpoints save, so a resumed run mixes the same batches the same way.
  Without mixup the loss is ``F.cross_entropy(label_smoothing=label_smoothing)`` on hard labels.
  The logged ``train/loss`` is the loss against these (mixed) targets; no training accuracy is
  reported, since against mixed targets it would not be one.
- **EMA of the weights** (as DeiT's ``--model-ema``): ``timm.utils.ModelEmaV3`` over the plain model's
  state dict, updated after every optimizer step that ran (a skipped non-finite step leaves it),
  with ``step`` = optimizer steps so far (timm's train.py: the first update copies the weights);
  validated every epoch beside the raw model (``val/ema_loss``, ``val/ema_top1``, ``val/ema_top5``).
  It is made from the plain model before DDP/FSDP/compile; under ``strategy=fsdp`` it is sharded the
  same way (``fully_shard`` per block), so every rank averages its own shard. Checkpoints hold it under
  ``"ema"`` (a full state dict); ``eval.py use_ema=true`` evaluates it.

- **Parameter groups** for AdamW (:func:`param_groups`): no weight decay on 1-D parameters, pos_embed and
  cls_token; with ``optim.layer_decay``, layer-wise learning-rate decay (timm's ``param_groups_layer_decay``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import BinaryCrossEntropy, SoftTargetCrossEntropy
from timm.optim import param_groups_layer_decay, param_groups_weight_decay
from timm.utils import ModelEmaV3

from vit.checkpoint import load_model_weights
from vit.engine import evaluate
from vit.logger import info
from vit.wrap import apply_distributed, model_state_dict, unwrap

NO_WEIGHT_DECAY = ("pos_embed", "cls_token")  # plus every 1-D parameter (biases, norms)
MIXUP_MODES = ("batch", "pair", "elem")
MIXUP_LOSSES = ("soft_ce", "bce")


def _require(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"invalid config value {key}={value!r}: {allowed}")


def mixup_active(m) -> bool:
    """timm's rule (and DeiT's): mixup/cutmix is on when an alpha is > 0 or cutmix_minmax is set."""
    return m.mixup_alpha > 0 or m.cutmix_alpha > 0 or m.cutmix_minmax is not None


def check_recipe_config(cfg) -> None:
    """The ``mixup``, ``ema`` groups, ``repeated_aug``, ``optim.layer_decay`` and ``schedule.warmup_steps``
    hold values that can run (ValueError naming key and value)."""
    m, e = cfg.mixup, cfg.ema
    for key in ("mixup_alpha", "cutmix_alpha"):
        _require(m[key] >= 0, f"mixup.{key}", m[key], "a Beta-distribution alpha >= 0 (0 = off)")
    minmax = m.cutmix_minmax
    _require(minmax is None or (len(minmax) == 2 and 0 < minmax[0] <= minmax[1] <= 1), "mixup.cutmix_minmax",
             minmax, "null or [min, max] box-size ratios in (0, 1]")
    for key in ("prob", "switch_prob"):
        _require(0 <= m[key] <= 1, f"mixup.{key}", m[key], "a probability in [0, 1]")
    _require(m.mode in MIXUP_MODES, "mixup.mode", m.mode, f"one of {', '.join(MIXUP_MODES)}")
    _require(m.loss in MIXUP_LOSSES, "mixup.loss", m.loss, f"one of {', '.join(MIXUP_LOSSES)}")
    _require(isinstance(m.off_epoch, int) and m.off_epoch >= 0, "mixup.off_epoch", m.off_epoch,
             "an integer >= 0: the epoch (0-based) from which batches are no longer mixed; 0 = never")
    ra = cfg.repeated_aug
    _require(isinstance(ra.repeats, int) and ra.repeats >= 1, "repeated_aug.repeats", ra.repeats,
             "an integer >= 1 (1 = off; DeiT uses 3)")
    _require(isinstance(ra.selected_round, int) and ra.selected_round >= 0, "repeated_aug.selected_round",
             ra.selected_round, "an integer >= 0 (0 = an epoch is the dataset size, not rounded)")
    ld = cfg.optim.get("layer_decay")
    _require(ld is None or 0 < ld <= 1, "optim.layer_decay", ld, "null (off) or a factor in (0, 1], e.g. 0.65")
    steps = cfg.schedule.get("warmup_steps")
    _require(steps is None or (isinstance(steps, int) and steps >= 0), "schedule.warmup_steps", steps,
             "null (use schedule.warmup_epochs) or an integer >= 0")
    _require(0 <= e.decay < 1, "ema.decay", e.decay, "a decay in [0, 1), e.g. 0.9998")
    _require(e.best_from in ("model", "ema"), "ema.best_from", e.best_from, "'model' or 'ema'")
    _require(e.enabled or e.best_from == "model", "ema.best_from", e.best_from,
             "'model' unless the EMA is on (ema=on); there is no EMA to pick best.pt by")
    if cfg.optim.get("layer_decay") is not None and not cfg.get("init_from") and not cfg.get("resume"):
        raise ValueError(f"optim.layer_decay={cfg.optim.layer_decay} is for fine-tuning (experiment=finetune_base), "
                         f"but init_from is null: pass init_from=<one of our checkpoints or a timm state dict "
                         f"(.pth, .safetensors)>")


def check_mixup_batch(cfg, micro_batch: int) -> None:
    """timm's Mixup needs an even micro-batch (it mixes image i with image B-1-i); checked at start-up.

    Raises:
        ValueError: mixup/cutmix on with an odd micro-batch, naming how it was computed.
    """
    if mixup_active(cfg.mixup) and micro_batch % 2:
        raise ValueError(f"mixup/cutmix needs an even micro-batch (timm.data.Mixup), but micro-batch = batch_size "
                         f"{cfg.batch_size} / (grad_accum {cfg.grad_accum} × processes) = {micro_batch}; choose a "
                         f"batch_size that gives an even micro-batch, or mixup=none")


def build_mixup(cfg, num_classes: int) -> Mixup | None:
    """timm's ``Mixup`` from the ``mixup`` group (label smoothing from ``label_smoothing``), or None when off."""
    m = cfg.mixup
    if not mixup_active(m):
        return None
    return Mixup(mixup_alpha=m.mixup_alpha, cutmix_alpha=m.cutmix_alpha,
                 cutmix_minmax=list(m.cutmix_minmax) if m.cutmix_minmax is not None else None, prob=m.prob,
                 switch_prob=m.switch_prob, mode=m.mode, label_smoothing=cfg.label_smoothing, num_classes=num_classes)


def build_loss(cfg):
    """``(logits float (B, C), targets) -> scalar``: soft-target cross-entropy (or BCE) with mixup, else
    cross-entropy with label smoothing on class indices (B,)."""
    if not mixup_active(cfg.mixup):
        return partial(F.cross_entropy, label_smoothing=cfg.label_smoothing)
    if cfg.mixup.loss == "bce":  # smoothing is already in the mixed targets
        return BinaryCrossEntropy(smoothing=0.0, target_threshold=cfg.mixup.bce_target_thresh)
    return SoftTargetCrossEntropy()


def param_groups(model: torch.nn.Module, cfg) -> list[dict]:
    """AdamW parameter groups: ``optim.weight_decay`` on weight matrices, none on 1-D parameters, pos_embed and
    cls_token; frozen parameters (a sincos2d pos_embed) left out. timm's ``param_groups_weight_decay``.

    ``optim.layer_decay=d``: layer-wise learning-rate decay (BEiT, Bao et al. 2022; MAE fine-tuning), timm's
    ``param_groups_layer_decay`` over the model's ``group_matcher``: with L blocks, block i (0-based) learns at
    lr × d^(L-i), the stem (patch_embed, pos_embed, cls_token) at lr × d^(L+1), the head at lr; timm groups
    the final norm with the last block (lr × d; MAE's own grouping gives it lr). The timm scheduler applies
    each group's ``lr_scale``.
    """
    o = cfg.optim
    if o.get("layer_decay") is not None:
        return param_groups_layer_decay(model, o.weight_decay, no_weight_decay_list=NO_WEIGHT_DECAY,
                                        layer_decay=o.layer_decay)
    return param_groups_weight_decay(model, o.weight_decay, no_weight_decay_list=NO_WEIGHT_DECAY)


def build_ema(model: torch.nn.Module, cfg, strategy: str, device: torch.device,
              state_dict: dict | None = None) -> ModelEmaV3 | None:
    """timm's ``ModelEmaV3`` of the plain ``model`` (before DDP/FSDP/compile), or None with ``ema=none``.

    ``state_dict``: EMA weights to start from (a checkpoint's ``"ema"``), else a copy of ``model``'s.
    Under ``strategy=fsdp`` the copy is sharded like the model, so updates run on each rank's shard.

    Raises:
        RuntimeError: ``state_dict`` does not fit the model (names the keys).
    """
    e = cfg.ema
    if not e.enabled:
        return None
    # exclude_buffers: the ViT has no buffers, and the parameter lists cost less CPU per step than two
    # state_dict() calls (ViT-B on the 2-core CI VM: 0.9 ms per list against 2.5 ms per state_dict())
    ema = ModelEmaV3(model, decay=e.decay, use_warmup=e.warmup, warmup_power=e.warmup_power, exclude_buffers=True)
    if state_dict is not None:
        load_model_weights(ema.module, state_dict, source="the checkpoint's EMA weights")
    if strategy == "fsdp":
        apply_distributed(ema.module, "fsdp", device)
    return ema


@dataclass
class Recipe:
    """What a training step does around the model's forward and the optimizer step."""
    loss_fn: object  # (logits float (B, C), targets) -> scalar loss
    mixup: Mixup | None = None
    ema: ModelEmaV3 | None = None
    mixup_off_epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        """Turn mixing off from ``mixup.off_epoch`` on (0-based ``epoch``; targets stay soft, as timm)."""
        if self.mixup is not None and self.mixup_off_epoch:
            self.mixup.mixup_enabled = epoch < self.mixup_off_epoch

    def mix(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) images, (B,) labels -> mixed images (in place), (B, C) soft targets; as is without mixup."""
        return self.mixup(x, y) if self.mixup is not None else (x, y)

    def update_ema(self, model: torch.nn.Module, step: int) -> None:
        """After optimizer step number ``step`` (1-based): fold the weights into the EMA."""
        if self.ema is not None:
            self.ema.update(unwrap(model), step=step)

    def evaluate_ema(self, loader, device: torch.device, amp_dtype, reduce) -> dict:
        """Loss, top-1 and top-5 (%) of the EMA weights (:func:`vit.engine.evaluate`), or ``{}`` without EMA.
        Under FSDP the EMA is resharded after (a forward without backward leaves the root's parameters gathered)."""
        if self.ema is None:
            return {}
        metrics = evaluate(self.ema.module, loader, device, amp_dtype, reduce=reduce)
        if hasattr(self.ema.module, "reshard"):
            self.ema.module.reshard()
        return {k: metrics[k] for k in ("loss", "top1", "top5")}

    def ema_state_dict(self) -> dict:
        """``{"ema": full state dict}`` for a checkpoint, or ``{}``; a collective under FSDP (all ranks call it)."""
        return {"ema": model_state_dict(self.ema.module)} if self.ema is not None else {}


def build_recipe(cfg, model: torch.nn.Module, num_classes: int, strategy: str, device: torch.device,
                 micro_batch: int, checkpoint: dict | None = None) -> Recipe:
    """Mixup, loss and EMA for a run (see the module docstring), at start-up; ``model`` is the plain model,
    ``checkpoint`` the one resumed from (its ``"ema"`` restores the EMA).

    Raises:
        ValueError: mixup with an odd micro-batch (:func:`check_mixup_batch`).
        RuntimeError: the checkpoint's EMA weights do not fit the model.
    """
    check_mixup_batch(cfg, micro_batch)
    ema_state = checkpoint.get("ema") if checkpoint is not None else None
    if checkpoint is not None and cfg.ema.enabled and ema_state is None:
        info("[ema] the checkpoint holds no EMA weights (trained with ema=none): the EMA starts from its weights")
    return Recipe(loss_fn=build_loss(cfg), mixup=build_mixup(cfg, num_classes),
                  ema=build_ema(model, cfg, strategy, device, ema_state), mixup_off_epoch=cfg.mixup.off_epoch)
