"""Process groups for runs launched by ``torchrun`` (PyTorch's own collectives, nothing home-made).

``torchrun --nproc_per_node=G train.py ...`` starts G processes and sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` (and the rendezvous ``MASTER_ADDR``/``MASTER_PORT``) in each. :func:`init_distributed`
reads them: NCCL on CUDA, each process on ``cuda:LOCAL_RANK``; gloo on the CPU. A plain
``python train.py`` (no ``WORLD_SIZE``, or 1) runs as one process without a process group.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    """Where this process sits: ``rank`` of ``world_size`` processes, on ``device``."""
    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this call created the process group, so teardown destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group described by torchrun's environment variables, if any.

    Args:
        device: the resolved device of the run (``cuda``/``cuda:N`` or ``cpu``). Under torchrun on
            CUDA each process takes ``cuda:LOCAL_RANK`` instead (an explicit index is overridden).

    Returns:
        A :class:`DistInfo`; ``world_size == 1`` without torchrun. A single process on ``cuda:N`` makes GPU N
        the current device, where Triton (the flash backend) launches its kernels.

    Raises:
        RuntimeError: ``LOCAL_RANK`` names a GPU that this node does not have.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        return DistInfo(device=device)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank} but this node has {torch.cuda.device_count()} visible GPUs; "
                               f"use torchrun --nproc_per_node <= the number of GPUs")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    return DistInfo(device, rank, world_size, local_rank, owns)


def teardown(info: DistInfo) -> None:
    """Destroy the process group if :func:`init_distributed` created it."""
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over all ranks (a new tensor; ``t`` itself on one process)."""
    if not dist.is_initialized():
        return t
    t = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean of ``t`` over all ranks (``t`` itself on one process)."""
    if not dist.is_initialized():
        return t
    return all_reduce_sum(t) / dist.get_world_size()


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` (picklable) on every rank; used so all ranks write to rank 0's output dir."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
