"""Shared benchmark plumbing: timing, peak memory, the run's environment, and the output writers.

Timing on CUDA uses one pair of CUDA events per call and reports the median (Method: warm up, then
median of many; the events measure GPU time, not Python launch time). On a CPU-only machine events
do not exist, so the same functions fall back to wall-clock `time.perf_counter` and every output
says so in its `timer` field; memory there is reported as None ("n/a"), never guessed.
"""
from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

MiB = 2**20
GiB = 2**30
# Where results go unless --out is given: beside train.py's runs (git-ignored). The files that back the
# README's tables are copied into benchmarks/results/ deliberately (benchmarks/README.md, Results).
DEFAULT_OUT = Path("outputs") / "benchmarks"


def has_cuda() -> bool:
    return torch.cuda.is_available()


def cli(main: Callable[[], object]) -> None:
    """Run a benchmark's ``main()`` from the command line: a bad argument (``ValueError``, e.g. a GPU-sized preset
    on a CPU) ends the program with its one-line message and exit status 1, not a traceback."""
    try:
        main()
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None


def timer_name(device: str = "cuda") -> str:
    """What the numbers were measured with; printed beside every result."""
    if device == "cuda" and has_cuda():
        return "cuda-events (median)"
    return "wall-clock perf_counter on CPU (median); memory n/a"


def time_ms(fn: Callable[..., object], warmup: int, iters: int, setup: Callable[[int], object] | None = None,
            device: str = "cuda") -> float:
    """Median milliseconds of ``fn(i)`` over ``iters`` calls after ``warmup`` untimed calls.

    ``i`` counts calls so the caller can rotate inputs (``inputs[i % n]``) and defeat the L2 cache.
    ``setup(i)``, when given, runs before each call outside the timed region (e.g. the forward pass
    whose backward is timed); its result is passed as ``fn(i, state)``. ``device`` "cuda" times with
    CUDA events, anything else with wall-clock.

    Raises:
        ValueError: ``iters`` < 1 or ``warmup`` < 0.
    """
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")

    def call(i):  # -> (the timed closure, state kept alive until after its timing)
        state = setup(i) if setup is not None else None
        return ((lambda: fn(i, state)) if setup is not None else (lambda: fn(i))), state

    for i in range(warmup):
        run, _ = call(i)
        run()
    times = []
    if device == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        torch.cuda.synchronize()
        for j in range(iters):
            run, state = call(warmup + j)
            starts[j].record()
            run()
            ends[j].record()
            del state
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        for j in range(iters):
            run, state = call(warmup + j)
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
            del state
    return statistics.median(times)


def peak_extra_bytes(fn: Callable[[], object], device: str = "cuda") -> int | None:
    """Bytes allocated at the peak of ``fn()`` beyond what was allocated before it (CUDA only).

    ``max_memory_allocated`` after a reset, minus ``memory_allocated`` before: the inputs the caller
    already holds are not counted, everything ``fn`` creates (activations, outputs, gradients) is.
    Returns None on CPU, where no allocator statistics exist.
    """
    if device != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return peak


def free_memory() -> None:
    """Drop cached blocks between cases so one case's leftovers never count in the next."""
    gc.collect()
    if has_cuda():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def error_text(exc: BaseException) -> str:
    """One line for a results row: 'error: OOM ...' or 'error: <Type>: <first line>'."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return f"error: OOM ({first[:160]})"
    return f"error: {type(exc).__name__}: {first}"


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001  a missing library or git is not an error here
        return None


def _git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parents[1]
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, check=False, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, check=False, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) if sha else None
    except Exception:  # noqa: BLE001  a missing library or git is not an error here
        return None


def environment(argv: Sequence[str] | None = None, device: str = "cuda") -> dict:
    """The facts that make a result reproducible: command, date, host, GPU, library versions."""
    argv = list(sys.argv if argv is None else argv)
    env = {
        "command": "python -m " + _module_name(argv[0]) + " " + shlex.join(argv[1:]) if argv else "",
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "timm": _version("timm"),
        "torchvision": _version("torchvision"),
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "git_commit": _git_commit(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "timer": timer_name(device),
    }
    if has_cuda():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_count=torch.cuda.device_count(), gpu_memory_gib=round(props.total_memory / GiB, 1),
                   l2_cache_mib=round(getattr(props, "L2_cache_size", 0) / MiB, 1) or None)
    else:
        env.update(gpu=None, gpu_count=0)
    return env


def _module_name(path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}.{p.stem}" if p.suffix == ".py" else path


def print_environment(env: dict) -> None:
    print(f"# {env['command']}")
    print(f"# {env['date_utc']}  gpu={env['gpu'] or 'none (CPU)'}  torch={env['torch']}  triton={env['triton']}  "
          f"timm={env['timm']}  cuda={env['cuda_runtime']}  git={env['git_commit']}  timer={env['timer']}", flush=True)


def fmt(value, digits: int = 3) -> str:
    """Table cell: None -> 'n/a', floats to ``digits`` decimals, everything else as str."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_header(title: str, env: dict, notes: Sequence[str] = ()) -> str:
    lines = [f"# {title}", "", f"Command: `{env['command']}`  ", f"Date: {env['date_utc']}  ",
             f"GPU: {env['gpu'] or 'none: CPU only, wall-clock timing, memory n/a'}  ",
             (f"Versions: torch {env['torch']}, triton {env['triton']}, timm {env['timm']}, "
             f"torchvision {env['torchvision']}, CUDA {env['cuda_runtime']}, cuDNN {env['cudnn']}, "
             f"python {env['python']}, git {env['git_commit']}  "),
             f"Timer: {env['timer']}", ""]
    lines += [f"{n}  " for n in notes]
    return "\n".join(lines).rstrip() + "\n"


def markdown_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, int]]) -> str:
    """``columns`` = (header, row key, float digits); missing keys print as 'n/a'."""
    out = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(k), d) for _, k, d in columns) + " |")
    return "\n".join(out) + "\n"


def write_outputs(out_dir: Path, name: str, env: dict, config: dict, rows: list[dict], markdown: str) -> dict[str, Path]:
    """Write ``<out_dir>/<name>.json`` and ``.md`` (atomically: temp file then rename); return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{name}.json", "md": out_dir / f"{name}.md"}
    payload = {"environment": env, "config": config, "rows": rows}
    for kind, text in (("json", json.dumps(payload, indent=1, default=str) + "\n"), ("md", markdown)):
        tmp = paths[kind].with_suffix(paths[kind].suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, paths[kind])
    return paths
