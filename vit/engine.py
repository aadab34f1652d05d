"""One training epoch, one validation pass, and the throughput/memory meters they report.

Optimizer steps: one step consumes ``grad_accum`` micro-batches; the loss of each micro-batch is
divided by ``grad_accum`` so the accumulated gradient is the mean over the step's images. The
gradient norm is clipped (``clip_grad``; 0 = no clipping, the norm is still measured) and checked:
a non-finite loss or gradient either stops the run or skips the step (``nonfinite.policy``).
Scale-out hooks: ``reduce`` averages (training) or sums (validation) metric tensors across ranks
(identity on one process). An out-of-memory error (CUDA or CPU) in a training step becomes
:class:`TrainingOutOfMemoryError`, naming the backend, N and the batch and how to fit.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from vit.checkpoint import crash_point
from vit.wrap import gradient_sync, unwrap


@dataclass
class TrainState:
    """Progress counters saved in every checkpoint."""
    epoch: int = 0  # finished epochs
    step: int = 0  # finished optimizer steps, all epochs
    step_in_epoch: int = 0  # finished optimizer steps in the current epoch (> 0: mid-epoch)
    best_top1: float = -1.0
    nonfinite_skips: int = 0
    epoch_loss_sum: float = 0.0  # this epoch's step losses summed, resumed ones too (a checkpoint's: mean over ranks)
    train_seconds: float = 0.0  # training and validation time (s), summed over the run's resumed segments

    def state_dict(self) -> dict:
        return asdict(self)


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm was NaN/inf and ``nonfinite.policy`` says stop (or the skip limit was hit)."""


class TrainingOutOfMemoryError(torch.OutOfMemoryError):
    """A training step ran out of GPU or CPU memory; the message says with which backend, N and batch, and what
    to change."""


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's ``torch.OutOfMemoryError``, or the CPU allocator's RuntimeError ("DefaultCPUAllocator: can't
    allocate memory")."""
    return isinstance(error, torch.OutOfMemoryError) or "DefaultCPUAllocator: can't allocate memory" in str(error)


def oom_message(backend: str, seq_len: int, micro_batch: int, world_size: int, grad_accum: int, device) -> str:
    """The explanation :class:`TrainingOutOfMemoryError` carries."""
    return (f"out of memory in a training step on {device}: attention={backend}, N={seq_len} tokens, "
            f"micro-batch {micro_batch} per process (batch_size={micro_batch * world_size * grad_accum} = "
            f"{micro_batch} × {world_size} processes × grad_accum {grad_accum}). "
            + ("attention=naive stores the full (B, H, N, N) score matrix per layer; use attention=flash "
               "(memory linear in N), " if backend == "naive" else "Try ")
            + "grad_ckpt=true (recompute each block in the backward), or a smaller batch_size "
              "(or grad_accum > 1 at the same batch_size)")


class EvalOutOfMemoryError(torch.OutOfMemoryError):
    """An evaluation batch ran out of GPU or CPU memory; the message says with which backend, N and batch, and what
    to change."""


def eval_oom_message(backend: str, seq_len: int, batch: int, device) -> str:
    """The explanation :class:`EvalOutOfMemoryError` carries."""
    return (f"out of memory evaluating on {device}: attention={backend}, N={seq_len} tokens, batch {batch} per "
            "process. " + ("attention=naive stores the full (B, H, N, N) score matrix per layer; use attention=flash "
                           "(memory linear in N) or attention=sdpa, or " if backend == "naive" else "Use ")
            + "a smaller batch_size")


def nonfinite_what(loss: float, grad_norm: float) -> str:
    """Which of the step's loss and gradient norm is non-finite, with both values, e.g.
    ``non-finite grad norm inf (the loss, 1.48e+08, is finite)``."""
    if not math.isfinite(loss):
        return f"non-finite loss {loss} (grad norm {grad_norm})"
    return f"non-finite grad norm {grad_norm} (the loss, {loss:.6g}, is finite)"


def autocast(device: torch.device, amp_dtype: torch.dtype | None):
    """bf16/fp16 autocast context on CUDA when ``amp_dtype`` is set, else a no-op."""
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype)


def memory_peaks_mb(device: torch.device, reset: bool = True) -> dict:
    """Peak allocated / reserved memory (MiB) on ``device`` since the last reset; 0 on CPU."""
    if device.type != "cuda":
        return {"peak_mem_allocated_mb": 0.0, "peak_mem_reserved_mb": 0.0}
    peaks = {"peak_mem_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20,
             "peak_mem_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20}
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
    return peaks


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class WindowMeter:
    """Images, step time and data-wait time accumulated since the last :meth:`read`."""

    def __init__(self, device: torch.device, seq_len: int):
        self.device, self.seq_len = device, seq_len
        self.start()

    def start(self) -> None:
        synchronize(self.device)
        self.t0, self.images, self.steps, self.data_wait = time.perf_counter(), 0, 0, 0.0
        self.loss_sum = torch.zeros((), device=self.device)

    def read(self, reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> dict:
        synchronize(self.device)
        elapsed = time.perf_counter() - self.t0
        steps = max(self.steps, 1)
        out = {"loss": (reduce(self.loss_sum) / steps).item(),
               "images_per_s": self.images / elapsed, "tokens_per_s": self.images * self.seq_len / elapsed,
               "step_time_ms": 1000 * elapsed / steps, "data_wait_ms": 1000 * self.data_wait / steps,
               **memory_peaks_mb(self.device)}
        self.start()
        return out


def train_epoch(model, loader, optimizer, scheduler, state: TrainState, *, device: torch.device,
                amp_dtype: torch.dtype | None, grad_accum: int, clip_grad: float, recipe,
                steps_per_epoch: int, world_size: int, log_every: int, nonfinite_policy: str, max_nonfinite_skips: int,
                logger, backend: str, seq_len: int, on_step_end: Callable[[TrainState], None] | None = None,
                progress: bool = True, reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
                on_window: Callable[[dict, int], None] | None = None) -> float:
    """Run optimizer steps from ``state.step_in_epoch`` to ``steps_per_epoch``; updates ``state``.

    Returns the epoch's mean training loss (averaged over ranks with ``reduce``): over all its steps, those
    before a mid-epoch resume included (``state.epoch_loss_sum`` carries their sum).

    ``loader`` must already be positioned (sampler set to the epoch and the consumed samples).
    ``recipe`` (:class:`vit.recipe.Recipe`) mixes each micro-batch, gives the loss and updates the EMA.
    ``on_step_end(state)`` runs after every optimizer step (mid-epoch checkpoints hook in here);
    ``on_window(window, epoch)`` after each logged window (:class:`vit.data_wait.DataWaitCheck`).

    Raises:
        NonFiniteLossError: a non-finite loss/gradient with ``nonfinite_policy='stop'``, or more
            than ``max_nonfinite_skips`` skipped steps with ``'skip'``.
        TrainingOutOfMemoryError: the device ran out of memory in the forward or backward (see :func:`oom_message`).
    """
    model.train()
    recipe.set_epoch(state.epoch)  # mixup.off_epoch
    meter = WindowMeter(device, seq_len)
    it = iter(loader)
    bar = tqdm(total=steps_per_epoch, initial=state.step_in_epoch, desc=f"epoch {state.epoch + 1}",
               disable=not progress or logger.rank != 0, leave=False, dynamic_ncols=True)
    while state.step_in_epoch < steps_per_epoch:
        loss_sum = torch.zeros((), device=device)
        images = 0
        for micro in range(grad_accum):
            t_wait = time.perf_counter()
            x, y = next(it)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            meter.data_wait += time.perf_counter() - t_wait
            x, y = recipe.mix(x, y)  # mixup/cutmix: mixed images, (B, C) soft targets; as is without
            try:
                with gradient_sync(model, enabled=micro == grad_accum - 1):  # reduce over ranks once a step
                    with autocast(device, amp_dtype):
                        logits = model(x)  # (B, num_classes)
                    loss = recipe.loss_fn(logits.float(), y) / grad_accum
                    loss.backward()
            except RuntimeError as e:  # torch.OutOfMemoryError (CUDA) subclasses it; the CPU allocator raises it
                if not is_out_of_memory(e):
                    raise
                logits = loss = None
                raise TrainingOutOfMemoryError(
                    oom_message(backend, seq_len, x.shape[0], world_size, grad_accum, device)) from e
            loss_sum += loss.detach()
            images += x.shape[0]
        max_norm = clip_grad if clip_grad > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        crash_point("step")  # test hook, a no-op unless VIT_TEST_CRASH_AT=step:<n>
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor over the ranks' shards
            grad_norm = grad_norm.full_tensor()
        loss_value, norm_value = torch.stack([loss_sum, grad_norm.float()]).tolist()  # one host sync per step
        state.epoch_loss_sum += loss_value
        if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
            state.nonfinite_skips += 1
            where = (f"{nonfinite_what(loss_value, norm_value)} at step {state.step + 1} "
                     f"(epoch {state.epoch + 1}, step {state.step_in_epoch + 1} of the epoch)")
            if nonfinite_policy == "stop" or state.nonfinite_skips > max_nonfinite_skips:
                raise NonFiniteLossError(f"{where}; stopping (nonfinite.policy={nonfinite_policy}, "
                                         f"{state.nonfinite_skips} skipped so far). The last checkpoint is "
                                         f"intact; lower optim.lr, raise clip_grad, or set nonfinite.policy=skip")
            logger.print(f"[nonfinite] {where}: step skipped ({state.nonfinite_skips}/{max_nonfinite_skips})")
        else:
            optimizer.step()
            recipe.update_ema(model, state.step + 1)
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.step_in_epoch += 1
        scheduler.step_update(state.step)
        meter.loss_sum += loss_sum
        meter.steps += 1
        meter.images += images * world_size
        bar.update(1)
        if state.step % log_every == 0 or state.step_in_epoch == steps_per_epoch:
            window = meter.read(reduce)
            metrics = {f"train/{k}": v for k, v in window.items()}
            metrics.update({"train/lr": max(g["lr"] for g in optimizer.param_groups),  # top layer's (layer decay)
                            "train/grad_norm": norm_value,
                            "epoch": state.epoch + state.step_in_epoch / steps_per_epoch})
            bar.set_postfix(loss=f"{window['loss']:.4f}", img_s=f"{window['images_per_s']:.0f}")
            logger.log(metrics, step=state.step, prefix=f"[train {backend}] ")
            if on_window is not None:
                on_window(window, state.epoch)
        if on_step_end is not None:
            on_step_end(state)
    bar.close()
    epoch_loss = torch.tensor(state.epoch_loss_sum, dtype=torch.float64, device=device)
    return reduce(epoch_loss).item() / max(state.step_in_epoch, 1)


@torch.no_grad()
def evaluate(model, loader, device: torch.device, amp_dtype: torch.dtype | None = None,
             reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t, backend: str = "?") -> dict:
    """Cross-entropy loss, top-1 and top-5 accuracy (%) over ``loader``; images/s and peak memory.

    ``reduce`` sums the (loss_sum, correct1, correct5, count) tensor across ranks in distributed
    runs. Top-5 is top-min(5, num_classes). ``backend``: the attention backend's name, for the error below.

    Raises:
        EvalOutOfMemoryError: the device ran out of memory in a forward (see :func:`eval_oom_message`).
    """
    model.eval()
    memory_peaks_mb(device)  # reset
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss_sum, correct1, correct5, count
    synchronize(device)
    t0 = time.perf_counter()
    for batch in loader:
        if batch is None:  # every image of this batch was a bad file (vit.images.collate_drop_bad)
            continue
        x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        try:
            with autocast(device, amp_dtype):
                logits = model(x).float()  # (B, num_classes)
        except RuntimeError as e:  # torch.OutOfMemoryError (CUDA) subclasses it; the CPU allocator raises it
            if not is_out_of_memory(e):
                raise
            seq_len = getattr(unwrap(model), "seq_len", "?")
            raise EvalOutOfMemoryError(eval_oom_message(backend, seq_len, x.shape[0], device)) from e
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices  # (B, k)
        hits = top == y[:, None]
        totals += torch.stack([F.cross_entropy(logits, y, reduction="sum").double(), hits[:, 0].sum().double(),
                               hits.any(dim=1).sum().double(), torch.tensor(float(len(y)), device=device).double()])
        crash_point("val")  # test hook, a no-op unless VIT_TEST_CRASH_AT=val:<n>
    synchronize(device)
    elapsed = time.perf_counter() - t0
    totals = reduce(totals)
    loss_sum, c1, c5, n = totals.tolist()
    if n == 0:
        raise ValueError("the validation set is empty; add images to the val/<class>/ folders")
    return {"loss": loss_sum / n, "top1": 100 * c1 / n, "top5": 100 * c5 / n, "images": int(n),
            "images_per_s": n / elapsed, **memory_peaks_mb(device)}
