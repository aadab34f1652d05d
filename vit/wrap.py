"""Training-side wrappers applied to a built model, in one place and in this order:

    model = apply_grad_ckpt(model, cfg)   # activation checkpointing per block
    model = apply_compile(model, cfg)     # torch.compile

The model itself (vit/model.py) knows nothing of these. Distributed wrappers (DDP, FSDP2) belong
here too, applied between the two. Each returns the module to train; ``unwrap(model)`` gives back
the plain ``VisionTransformer`` whose ``state_dict()`` is what checkpoints hold.
"""
from __future__ import annotations

import types

import torch
from torch.utils.checkpoint import checkpoint


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


def apply_compile(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """With ``cfg.compile``, return ``torch.compile(model)``; the original stays reachable via :func:`unwrap`."""
    if cfg.compile:
        return torch.compile(model)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under torch.compile (``_orig_mod``) and DDP (``module``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model
