"""Training-side wrappers applied to a built model, in one place and in this order:

    model = apply_grad_ckpt(model, cfg)                # activation checkpointing per block
    model = apply_distributed(model, strategy, dist)   # DDP or FSDP2 (fully_shard), multi-process only
    model = apply_compile(model, cfg)                  # torch.compile

Why this order: checkpointing replaces each block's ``forward`` on the plain module, which DDP's and
FSDP's hooks (on ``__call__``) then wrap unchanged; FSDP2's pre-backward unshard runs before a block's
recomputation, as in torchtitan. ``torch.compile`` goes outermost so Dynamo sees the wrapper: for
DDP its DDPOptimizer splits the graph at gradient-bucket boundaries so all-reduces overlap the
backward; FSDP2's hooks run eagerly between the compiled blocks (Dynamo skips them by default).

The model itself (vit/model.py) knows nothing of these. ``unwrap(model)`` gives back the plain
``VisionTransformer``; :func:`model_state_dict` / :func:`optimizer_state_dict` give the full
(unsharded) state that checkpoints hold in every mode, so a checkpoint loads with or without DDP/FSDP.
"""
from __future__ import annotations

import contextlib
import types

import torch
from torch.utils.checkpoint import checkpoint

STRATEGIES = ("none", "ddp", "fsdp")


def _checkpointed_forward(block, x: torch.Tensor) -> torch.Tensor:
    return checkpoint(type(block).forward, block, x, use_reentrant=False)


def apply_grad_ckpt(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """With ``cfg.grad_ckpt``, recompute each block's activations in the backward pass instead of
    storing them (Chen et al., 2016, "Training Deep Nets with Sublinear Memory Cost"). Parameter
    names are unchanged, so checkpoints are interchangeable with and without it."""
    if cfg.grad_ckpt:
        for block in unwrap(model).blocks:
            block.forward = types.MethodType(_checkpointed_forward, block)
    return model


def resolve_strategy(name: str | None, world_size: int) -> str:
    """``strategy``: null -> ``ddp`` with several processes, ``none`` on one; ``ddp``/``fsdp`` need torchrun.

    Raises:
        ValueError: an unknown name, or ``ddp``/``fsdp`` on one process.
    """
    if name is None:
        return "ddp" if world_size > 1 else "none"
    if name not in STRATEGIES:
        raise ValueError(f"invalid config value strategy={name!r}: one of null, {', '.join(STRATEGIES)}")
    if name == "none" and world_size > 1:
        raise ValueError(f"strategy=none with {world_size} processes would train {world_size} unsynchronised "
                         f"models; use strategy=ddp or strategy=fsdp (or null)")
    return name


def apply_distributed(model: torch.nn.Module, strategy: str, device: torch.device) -> torch.nn.Module:
    """Wrap for data-parallel training over the initialised process group.

    ``ddp``: ``DistributedDataParallel`` (gradients all-reduced in buckets during the backward).
    ``fsdp``: FSDP2 ``fully_shard`` per block, then the root (parameters, gradients and AdamW state
    sharded over ranks; each block's parameters all-gathered just before it runs). Zhao et al., 2023,
    "PyTorch FSDP". ``none``: unchanged.
    """
    if strategy == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in unwrap(model).blocks:
            fully_shard(block)
        fully_shard(unwrap(model))
    return model


def apply_compile(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """With ``cfg.compile``, return ``torch.compile(model)``; the original stays reachable via :func:`unwrap`."""
    if cfg.compile:
        return torch.compile(model)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under torch.compile (``_orig_mod``) and DDP (``module``) wrappers
    (FSDP2 shards in place: the module is its own)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, enabled: bool):
    """With ``enabled=False``, run the enclosed forward and backward without reducing gradients over
    ranks: DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync(False)``. For gradient accumulation,
    every micro-batch but the last of an optimizer step; the last one reduces the summed gradients
    once. A no-op on one process."""
    inner = getattr(model, "_orig_mod", model)  # under torch.compile
    if enabled:
        yield
    elif isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        with inner.no_sync():
            yield
    elif hasattr(inner, "set_requires_gradient_sync"):  # an FSDP2 module
        inner.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            inner.set_requires_gradient_sync(True)
    else:
        yield


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in unwrap(model).parameters())


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's full state dict. With FSDP this is a collective (call it on every rank):
    rank 0 receives the unsharded tensors on the CPU, other ranks an empty dict."""
    if not is_sharded(model):
        return unwrap(model).state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(unwrap(model), options=_full_options())


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the order ``optimizer.state_dict()`` numbers them (groups in order)."""
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """``optimizer.state_dict()``'s format (parameters numbered 0..n-1) with full tensors in every mode.
    With FSDP a collective (call it on every rank); rank 0 receives the result, other ranks ``{}``."""
    if not is_sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = get_optimizer_state_dict(unwrap(model), optimizer, options=_full_options())
    if not full:
        return {}
    index = {name: i for i, name in enumerate(_param_names(model, optimizer))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]
    return {"state": {index[n]: s for n, s in full["state"].items()}, "param_groups": groups}


# How an optimizer's step runs, not what it computes: the resumed run's own setting (optim.fused) decides, where
# Optimizer.load_state_dict would keep the checkpoint's.
_IMPLEMENTATION_KEYS = ("foreach", "fused")


def load_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Inverse of :func:`optimizer_state_dict`: load a full, numbered optimizer state in any mode
    (with FSDP every rank passes the full state and keeps its shard). The param groups keep ``optimizer``'s
    ``foreach`` / ``fused`` choice, not the checkpoint's."""
    groups = [{**saved, **{k: now[k] for k in _IMPLEMENTATION_KEYS if k in now}}
              for saved, now in zip(state["param_groups"], optimizer.param_groups)]
    state = {**state, "param_groups": groups + state["param_groups"][len(groups):]}
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _param_names(model, optimizer)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    full = {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(unwrap(model), optimizer, full, options=StateDictOptions(full_state_dict=True))
