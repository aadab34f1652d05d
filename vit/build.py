"""Turn a resolved config into the pieces of a run: checks, device, backend, model, optimizer, schedule.

Shared by train.py and eval.py so both read config keys the same way.
"""
from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from timm.scheduler import CosineLRScheduler

from kernels import HEAD_DIM_LIMITS, available_backends, get_attention
from vit.logger import info
from vit.model import SIZES, VisionTransformer, create_model, img_hw
from vit.recipe import check_recipe_config, param_groups


def _require(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"invalid config value {key}={value!r}: {allowed}")


def check_train_config(cfg) -> None:
    """Fail before any work on values that cannot run, naming the key, the value and what is allowed.

    Raises:
        ValueError: see the message.
    """
    _require(isinstance(cfg.epochs, int) and cfg.epochs >= 1, "epochs", cfg.epochs, "a positive integer")
    _require(isinstance(cfg.batch_size, int) and cfg.batch_size >= 1, "batch_size", cfg.batch_size,
             "a positive integer (the global batch: images per optimizer step)")
    _require(isinstance(cfg.grad_accum, int) and cfg.grad_accum >= 1, "grad_accum", cfg.grad_accum, "an integer >= 1")
    _require(cfg.batch_size % cfg.grad_accum == 0, "batch_size", cfg.batch_size,
             f"a multiple of grad_accum={cfg.grad_accum}")
    _require(cfg.log_every >= 1, "log_every", cfg.log_every, "an integer >= 1")
    _require(cfg.clip_grad >= 0, "clip_grad", cfg.clip_grad, "a max gradient norm >= 0 (0 = no clipping)")
    _require(0 <= cfg.label_smoothing < 1, "label_smoothing", cfg.label_smoothing, "a value in [0, 1)")
    _require(cfg.optim.lr > 0, "optim.lr", cfg.optim.lr, "a positive learning rate")
    fused_adamw(cfg.optim.get("fused", "auto"), [])  # checks the setting
    _require(cfg.nonfinite.policy in ("stop", "skip"), "nonfinite.policy", cfg.nonfinite.policy, "'stop' or 'skip'")
    _require(isinstance(cfg.nonfinite.max_skips, int) and cfg.nonfinite.max_skips >= 0, "nonfinite.max_skips",
             cfg.nonfinite.max_skips, "an integer >= 0")
    _require(isinstance(cfg.eval_batch_size, int) and cfg.eval_batch_size >= 1, "eval_batch_size", cfg.eval_batch_size,
             "a positive integer")
    for key in ("keep_last", "every_steps", "keep_best"):
        value = cfg.checkpoint.get(key, 0)
        _require(isinstance(value, int) and value >= 0, f"checkpoint.{key}", value, "an integer >= 0 (0 = all / never)")
    _require(cfg.schedule.warmup_epochs >= 0, "schedule.warmup_epochs", cfg.schedule.warmup_epochs, "a number >= 0")
    if cfg.data.name != "synthetic":
        workers = cfg.data.num_workers
        _require(workers == "auto" or (isinstance(workers, int) and workers >= 0), "data.num_workers", workers,
                 "auto (min(8, cores - 1)) or an integer >= 0")
    threads = cfg.get("cpu_threads", "auto")
    _require(threads == "auto" or (isinstance(threads, int) and threads >= 1), "cpu_threads", threads,
             "auto (torch's default, at most the cores this process may use) or an integer >= 1")
    _require(cfg.amp in ("auto", "bf16", "none"), "amp", cfg.amp,
             "one of auto, bf16, none for training (fp16 would need loss scaling, which this trainer does not do; "
             "bf16 has float32's range)")
    _require(cfg.resume is None or isinstance(cfg.resume, str), "resume", cfg.resume, "null, 'auto' or a path")
    _require(cfg.get("init_from") is None or isinstance(cfg.init_from, str), "init_from", cfg.get("init_from"),
             "null or a path to weights")
    file = cfg.get("init_from_file")
    _require(file is None or str(cfg.get("init_from")).startswith("timm:"), "init_from_file", file,
             "null unless init_from=timm:<model name> (a state dict file goes in init_from itself)")
    check_model_config(cfg)
    check_recipe_config(cfg)


def check_model_config(cfg) -> None:
    """Model size, patch/image size and backend names are valid (raises ValueError)."""
    _require(cfg.model.size in SIZES, "model.size", cfg.model.size, f"one of {', '.join(SIZES)}")
    _require(cfg.attention.name in (*available_backends(), "auto"), "attention.name", cfg.attention.name,
             f"one of auto, {', '.join(available_backends())} (set it with attention=<name>)")
    img, patch = cfg.data.img_size, cfg.model.patch_size
    _require(isinstance(patch, int) and patch >= 1, "model.patch_size", patch, "a positive integer")
    if isinstance(img, int):
        _require(img >= patch and img % patch == 0, "data.img_size", img, f"a multiple of model.patch_size={patch}")
    else:
        hw = list(img) if hasattr(img, "__len__") and not isinstance(img, str) else []
        _require(len(hw) == 2 and all(isinstance(s, int) and s >= patch and s % patch == 0 for s in hw),
                 "data.img_size", img, f"an integer or [height, width], each a multiple of model.patch_size={patch}")
    dims = SIZES[cfg.model.size]
    head_dim = dims["embed_dim"] // dims["num_heads"]
    lo, hi = HEAD_DIM_LIMITS.get(cfg.attention.name, (1, head_dim))
    _require(lo <= head_dim <= hi, "attention.name", cfg.attention.name,
             f"a backend that runs head_dim={head_dim} (model.size={cfg.model.size}: embed_dim {dims['embed_dim']} / "
             f"num_heads {dims['num_heads']}); attention={cfg.attention.name} runs head_dim {lo}-{hi}. "
             f"Use attention=sdpa or attention=naive, or another model.size")


class ConfigWarning(UserWarning):
    """A config that runs but probably not as meant (see :func:`config_warnings`)."""


QUIET_TOKENS = 1025  # ViT-B/16 at 512 px; beyond it, a patch < 16 or attention=naive draws a warning


def token_count_warning(margs: dict, backend: str, micro_batch: int) -> str | None:
    """Why ``N`` tokens per image may not fit, or None: N > :data:`QUIET_TOKENS` with a patch smaller than
    16 (a model made for small images, e.g. ``debug``'s patch 4 at 224 px: N = 3137), or with
    ``attention=naive``, which stores the (B, H, N, N) scores."""
    size, img, patch = margs["size"], margs["img_size"], margs["patch_size"]
    (h, w), img = img_hw(img), img if isinstance(img, int) else list(img)
    n = (h // patch) * (w // patch) + 1
    if n <= QUIET_TOKENS or (patch >= 16 and backend != "naive"):
        return None
    heads = SIZES[size]["num_heads"]
    scores_gib = micro_batch * heads * n * n * 4 / 2**30
    msg = (f"model={size} (patch_size {patch}) at data.img_size={img} gives N={n} tokens per image: attention's "
           f"float32 N×N scores take {scores_gib:.1f} GiB per layer at micro-batch {micro_batch} with {heads} heads "
           f"under attention=naive, and time grows as N²")
    if patch < 16:
        return msg + (f". For {img} px images use model=tiny, model=small or model=base (patch 16: "
                      f"N={(h // 16) * (w // 16) + 1}), or a larger model.patch_size")
    return msg + "; use attention=flash (memory linear in N), grad_ckpt=true or a smaller batch_size"


def config_warnings(cfg, margs: dict, backend: str, micro_batch: int, steps_per_epoch: int) -> list[str]:
    """What in a valid config is likely not what was meant: too many tokens per image
    (:func:`token_count_warning`), or a warm-up as long as the run (the LR never leaves it)."""
    out = [w for w in [token_count_warning(margs, backend, micro_batch)] if w]
    s, total = cfg.schedule, cfg.epochs * steps_per_epoch
    if s.get("warmup_steps") is not None:
        key, value, too_long, run = "warmup_steps", s.warmup_steps, s.warmup_steps >= total, f"the run's {total} steps"
    else:
        key, value, too_long, run = "warmup_epochs", s.warmup_epochs, s.warmup_epochs >= cfg.epochs, f"epochs={cfg.epochs}"
    if too_long:
        out.append(f"schedule.{key}={value} is not below {run}: the run never leaves warm-up (the learning rate rises "
                   f"linearly from schedule.warmup_lr_init over the whole run, reaches the peak only at its last step "
                   f"and never decays); lower schedule.{key} or raise epochs")
    return out


def cores_per_process() -> int:
    """CPU cores this process may use (its affinity mask, so a container's or taskset's limit counts), shared
    with the other processes of this node under torchrun (``LOCAL_WORLD_SIZE``); at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def resolve_num_workers(value) -> int:
    """``data.num_workers``: ``auto`` -> min(8, :func:`cores_per_process` - 1), leaving a core for the training
    process (0 on a 1-core machine: load in the main process); an integer as given."""
    return min(8, cores_per_process() - 1) if value == "auto" else value


def resolve_cpu_threads(value) -> int:
    """``cpu_threads`` (torch's intra-op threads): ``auto`` -> torch's default (``OMP_NUM_THREADS``, else the
    physical cores), capped at :func:`cores_per_process`; an integer as given. CPU results are bit-reproducible
    for a given count, and change with it (the order of floating-point sums in matmuls does)."""
    return min(torch.get_num_threads(), cores_per_process()) if value == "auto" else value


def resolve_out_dir(cfg, fallback: str = "outputs/%Y-%m-%d/%H-%M-%S") -> Path:
    """``out_dir`` if set (relative to the launch directory), else the Hydra run dir, else (``compose``
    in tests) ``fallback`` formatted with the current time."""
    if cfg.out_dir:
        return Path(to_absolute_path(cfg.out_dir))
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(to_absolute_path(time.strftime(fallback)))


def resolve_device(name: str) -> torch.device:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``.

    Raises:
        RuntimeError: a CUDA device is asked for but none is visible, or ``cuda:N`` names a GPU past the visible ones.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={name} was requested but no CUDA GPU is visible; use device=cpu or device=auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(f"device={name} was requested but this machine has {torch.cuda.device_count()} visible "
                           f"GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}; use one of those or device=cuda")
    return device


def resolve_backend(name: str, device: torch.device, amp_dtype: torch.dtype | None) -> str:
    """The attention backend to run: ``auto`` -> ``flash`` on a CUDA device, ``naive`` otherwise.

    The backend is imported and checked against the device and the autocast dtype (``None``: float32)
    here, so that one that cannot run stops the run before any work, never falling back to another.

    Raises:
        ValueError: unknown name (lists the valid ones).
        RuntimeError: the backend cannot be imported or cannot run on ``device`` / at ``amp_dtype``;
            says how to fix it.
    """
    if name == "auto":
        name = "flash" if device.type == "cuda" else "naive"
        info(f"[attention] attention=auto chose {name!r} (device {device.type})")
    try:
        get_attention(name)
    except ImportError as e:
        raise RuntimeError(f"attention backend {name!r} is not available here: {type(e).__name__}: {e}. "
                           f"It lives in kernels/{name}/; install/build it, or choose another backend with "
                           f"attention=naive or attention=sdpa (no automatic fallback)") from e
    if name == "flash" and device.type != "cuda" and not importlib.import_module("kernels.flash.configs").INTERPRETED:
        raise RuntimeError(f"attention=flash runs on a CUDA GPU but this run's device is {device}; use device=cuda on "
                           f"a GPU machine, attention=sdpa or attention=naive, or set TRITON_INTERPRET=1 before "
                           f"starting to run Triton's (slow) CPU interpreter")
    if name == "cuda" and device.type != "cuda":
        raise RuntimeError(f"attention=cuda runs on a CUDA GPU but this run's device is {device}; use device=cuda on "
                           f"a GPU machine, or attention=sdpa or attention=naive")
    if name == "cuda" and amp_dtype not in (torch.bfloat16, torch.float16):
        raise RuntimeError("attention=cuda computes in bf16/fp16 only, but amp=none keeps activations in float32; "
                           "use amp=bf16 (or amp=auto), or attention=flash, which also runs float32")
    return name


def resolve_amp(name: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype: ``auto`` -> bf16 on CUDA, none on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}[name]


def model_args(cfg, num_classes: int) -> dict:
    """Arguments of :func:`vit.model.create_model` from a config; stored in checkpoints."""
    m = cfg.model
    img = cfg.data.img_size if isinstance(cfg.data.img_size, int) else list(cfg.data.img_size)  # plain, for checkpoints
    return {"size": m.size, "img_size": img, "patch_size": m.patch_size, "num_classes": num_classes,
            "drop_rate": m.drop_rate, "drop_path_rate": m.drop_path_rate,
            "global_pool": m.get("global_pool", "token"), "pos_embed": m.get("pos_embed", "learn")}


def attention_options(attention_cfg) -> dict:
    """The attention group's options for its backend: every key but ``name`` (e.g. flash's ``fp32_delta``)."""
    return {k: v for k, v in attention_cfg.items() if k != "name"} if attention_cfg is not None else {}


def build_model(args: dict, backend: str, attention_cfg=None) -> VisionTransformer:
    """The model of ``args`` (:func:`model_args`) with ``backend`` and the options of ``attention_cfg``.

    Raises:
        ValueError: an option the backend does not take (the message lists those it takes)."""
    args = dict(args)
    return create_model(args.pop("size"), attention=backend, attention_options=attention_options(attention_cfg), **args)


def effective_lr(cfg) -> float:
    """The peak learning rate: ``optim.lr``, or with ``optim.lr_scale_batch=K`` the linear scaling rule
    ``optim.lr × batch_size / K`` (Goyal et al., 2017, "Accurate, Large Minibatch SGD"); ``batch_size``
    is the global batch, so the rate does not depend on the number of processes.

    Raises:
        ValueError: ``optim.lr_scale_batch`` is neither null nor a positive integer.
    """
    base = cfg.optim.get("lr_scale_batch")
    if base is None:
        return float(cfg.optim.lr)
    _require(isinstance(base, int) and not isinstance(base, bool) and base >= 1, "optim.lr_scale_batch", base,
             "null (use optim.lr as given) or a positive integer K (lr × batch_size / K)")
    return float(cfg.optim.lr) * cfg.batch_size / base


def fused_adamw(setting, params: list[torch.Tensor]) -> bool:
    """``optim.fused``: whether AdamW runs as PyTorch's one fused multi-tensor kernel (``fused=True``) instead of its
    per-op ``foreach`` form; ``auto`` fuses when every parameter is a plain CUDA tensor (not FSDP's sharded DTensor).

    Raises:
        ValueError: a setting other than auto, true, false.
    """
    _require(setting == "auto" or isinstance(setting, bool), "optim.fused", setting,
             "auto (fused on CUDA), true (PyTorch's fused AdamW kernel) or false (its foreach ops)")
    if setting != "auto":
        return setting
    if not params or not all(p.is_cuda for p in params):
        return False
    from torch.distributed.tensor import DTensor

    return not any(isinstance(p, DTensor) for p in params)


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter, 2019) at :func:`effective_lr` over :func:`vit.recipe.param_groups`
    (weight decay and, with ``optim.layer_decay``, per-layer learning rates), fused per :func:`fused_adamw`."""
    o = cfg.optim
    fused = fused_adamw(o.get("fused", "auto"), list(model.parameters()))
    return torch.optim.AdamW(param_groups(model, cfg), lr=effective_lr(cfg), betas=tuple(o.betas), eps=o.eps,
                             fused=fused)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg, steps_per_epoch: int) -> CosineLRScheduler:
    """Per-step linear warmup then cosine decay to ``schedule.min_lr`` (timm ``CosineLRScheduler``); the
    warm-up lasts ``schedule.warmup_steps`` optimizer steps if set, else ``schedule.warmup_epochs`` epochs."""
    s = cfg.schedule
    total = cfg.epochs * steps_per_epoch
    steps = s.get("warmup_steps")
    warmup = min(steps if steps is not None else round(s.warmup_epochs * steps_per_epoch), max(total - 1, 0))
    return CosineLRScheduler(optimizer, t_initial=total, lr_min=s.min_lr, warmup_t=warmup,
                             warmup_lr_init=s.warmup_lr_init, t_in_epochs=False)
