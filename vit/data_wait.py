"""Say when data is the bottleneck: once a run, the first logging window whose data wait is over a quarter of
its step time gets one console line with the measured share and what to try.

Only on CUDA: on a CPU the loader's workers and the model share the same cores, so the share does not say
that more workers or another decoder would help (the digits default waits 28 of 63 ms on 2 cores, and is
slower with a worker). Each epoch's first window is not judged: it holds the wait for the first batches
(worker start-up without persistent workers, an empty prefetch queue after validation).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from vit.build import cores_per_process, resolve_num_workers

DATA_BOUND_SHARE = 0.25  # data_wait_ms / step_time_ms above which the run is data-bound


def data_bound_message(data_wait_ms: float, step_time_ms: float, data_cfg) -> str | None:
    """The console line for a window whose wait for data (``data_wait_ms``, per step) is over
    :data:`DATA_BOUND_SHARE` of its step time (``step_time_ms``, per step); None otherwise.

    The tips name what applies to ``data_cfg`` (a ``data`` config): more workers while fewer than this
    process's cores - 1 run; for image folders ``data.decode=gpu`` while decoding on the CPU, and the prepared
    copy.
    """
    share = data_wait_ms / step_time_ms if step_time_ms > 0 else 0.0
    if share <= DATA_BOUND_SHARE or data_cfg.name == "synthetic":
        return None
    tips = []
    workers, cores = resolve_num_workers(data_cfg.num_workers), cores_per_process()
    if workers < cores - 1:
        tips.append(f"more loader processes, data.num_workers={min(cores - 1, max(2 * workers, 1))} (now {workers}, "
                    f"{cores} cores for this process)")
    if data_cfg.name == "imagefolder":  # the digits export is small PNGs: neither of these helps it
        if data_cfg.get("decode", "cpu") == "cpu":
            tips.append("JPEG decoding on the GPU, data.decode=gpu")
        tips.append("for images much larger than data.img_size, a copy resized once: python -m vit.prepare "
                    f"data.root={data_cfg.root} out=<new folder> max_side=<px>, then data.root=<new folder>")
    return (f"[data] the input pipeline is the bottleneck: each step waited {data_wait_ms:.0f} ms of "
            f"{step_time_ms:.0f} ms for data ({share:.0%}) over the last logging window."
            + (" Try: " + "; ".join(tips) if tips else ""))


class DataWaitCheck:
    """``check(window, epoch)`` after each logged training window (``window``: :class:`vit.engine.WindowMeter`'s
    ``read()``) prints :func:`data_bound_message` through ``say`` once per run (see the module docstring)."""

    def __init__(self, data_cfg, device: torch.device, say: Callable[[str], None]):
        self.data_cfg, self.say = data_cfg, say
        self.done = torch.device(device).type != "cuda"
        self.epoch = None

    def __call__(self, window: dict, epoch: int) -> None:
        first, self.epoch = epoch != self.epoch, epoch
        if self.done or first:
            return
        message = data_bound_message(window["data_wait_ms"], window["step_time_ms"], self.data_cfg)
        if message is not None:
            self.done = True
            self.say(message)
