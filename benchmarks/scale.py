"""Scale-out through train.py itself: one GPU eager and compiled, the cuda backend, DDP and FSDP2 on 2 GPUs, 1024 px.

    python -m benchmarks.scale                          # the README's scale table (DDP/FSDP rows need 2 GPUs)
    python -m benchmarks.scale --runs flash_eager flash_ddp2
    python -m benchmarks.scale --preset smoke           # the same command lines, tiny, on a CPU (gloo, sdpa)

Each run is ``python train.py model=base data=synthetic ...`` (``torchrun --nproc_per_node=2`` for the
2-process ones) into its own folder under ``--runs-dir``, one epoch of synthetic images. images/s is
train.py's own steady state (``summary.json``: global images/s over the optimizer steps after the
first 5), with its gradient clipping and per-step finiteness check; peak GiB is rank 0's
``max_memory_allocated``. ``naive_1024`` is expected to stop with train.py's out-of-memory message,
which the table quotes. A run that cannot run here (2 processes on one GPU, cuda without a GPU) gets a
row saying so. Outputs: ``<out>/<name>.json`` (every run's summary), ``.md`` (the table) and ``.log``
(every run's console output).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import (
    DEFAULT_OUT,
    environment,
    markdown_header,
    markdown_table,
    print_environment,
    write_outputs,
)

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["epochs=1", "logger=none", "progress=false", "log_every=5", "checkpoint.keep_last=1"]
# flash: the backend under test (sdpa on a CPU, where Triton's interpreter is too slow for whole runs);
# lo/hi: the 224 px and 1024 px settings; batch and steps per process.
PRESETS = {
    "gpu": {"base": ["model=base", "data=synthetic"], "flash": "flash", "lo": ["data.img_size=224",
            "data.val_samples=256"], "batch": 256, "steps": 40, "hi": ["data.img_size=1024", "data.val_samples=16"],
            "hi_batch": 16, "hi_steps": 12},
    "smoke": {"base": ["model=debug", "data=synthetic", "data.num_classes=10", "device=cpu"], "flash": "sdpa",
              "lo": ["data.img_size=32", "data.val_samples=16"], "batch": 8, "steps": 8,
              "hi": ["data.img_size=64", "data.val_samples=4"], "hi_batch": 2, "hi_steps": 6},
}
RUNS = ["flash_eager", "flash_compile", "cuda_eager", "flash_ddp2", "flash_fsdp2", "flash_1024", "naive_1024",
        "flash_1024_ckpt"]


def run_args(name: str, p: dict) -> tuple[int, list[str]]:
    """(processes, train.py overrides) of run ``name`` under preset ``p``."""
    flash, B, n = p["flash"], p["batch"], p["batch"] * p["steps"]
    hi = [*p["base"], *p["hi"], *COMMON, f"batch_size={p['hi_batch']}", f"data.train_samples={p['hi_batch'] * p['hi_steps']}"]
    lo = [*p["base"], *p["lo"], *COMMON]
    return {
        "flash_eager": (1, [*lo, f"attention={flash}", f"batch_size={B}", f"data.train_samples={n}"]),
        "flash_compile": (1, [*lo, f"attention={flash}", f"batch_size={B}", f"data.train_samples={n}", "compile=true"]),
        "cuda_eager": (1, [*lo, "attention=cuda", f"batch_size={B}", f"data.train_samples={n}"]),
        "flash_ddp2": (2, [*lo, f"attention={flash}", f"batch_size={2 * B}", f"data.train_samples={2 * n}"]),
        "flash_fsdp2": (2, [*lo, f"attention={flash}", f"batch_size={2 * B}", f"data.train_samples={n}",
                            "strategy=fsdp"]),
        "flash_1024": (1, [*hi, f"attention={flash}"]),
        "naive_1024": (1, [*hi, "attention=naive"]),
        "flash_1024_ckpt": (1, [*hi, f"attention={flash}", "grad_ckpt=true"]),
    }[name]


def cannot_run(name: str, nproc: int, device: str) -> str | None:
    if name == "cuda_eager" and device != "cuda":
        return "not run: attention=cuda needs a CUDA GPU"
    if device == "cuda" and nproc > torch.cuda.device_count():
        return f"not run: needs {nproc} GPUs, {torch.cuda.device_count()} visible"
    return None


def run_one(name: str, p: dict, device: str, runs_dir: Path, log) -> dict:
    """Run ``name`` to completion; its row (summary fields, return code, status)."""
    nproc, overrides = run_args(name, p)
    row = {"run": name, "processes": nproc}
    if (reason := cannot_run(name, nproc, device)) is not None:
        log.write(f"=== {name}: {reason}\n")
        return {**row, "status": reason}
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
                if nproc > 1 else [sys.executable])
    cmd = [*launcher, str(ROOT / "train.py"), *overrides, f"out_dir={runs_dir / name}"]
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", **({"TORCH_LOGS": "graph_breaks"} if "compile=true" in cmd else {})}
    log.write(f"=== {name}: {' '.join(cmd[len(launcher):])}\n")
    log.flush()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", check=False)
    row.update(rc=proc.returncode, wall_s=time.perf_counter() - t0)
    log.write(proc.stdout + f"=== {name}: rc={proc.returncode} in {row['wall_s']:.0f} s\n")
    oom = [line.strip() for line in proc.stdout.splitlines() if "TrainingOutOfMemoryError:" in line]
    summary = runs_dir / name / "summary.json"
    if proc.returncode == 0 and summary.exists():
        s = json.loads(summary.read_text())
        row.update(attention=s["backend"], gpus=s["world_size"], strategy=s["strategy"], compile=s["compile"],
                   grad_ckpt=s["grad_ckpt"], px=s["img_size"], N=s["seq_len"], batch=s["batch_size"],
                   timed_steps=s["steady_steps"], images_per_s=s["train/steady_images_per_s"],
                   peak_gib=s["peak_mem_allocated_mb"] / 1024 if device == "cuda" else None, status="ok", env=s["env"])
    elif oom:
        row.update(status="stopped with train.py's out-of-memory message", message=oom[0][:600])
    else:
        row["status"] = f"rc {proc.returncode}, no summary (see the log)"
    return row


COLUMNS = [("run", "run", 0), ("attention", "attention", 0), ("processes", "processes", 0), ("strategy", "strategy", 0),
           ("compile", "compile", 0), ("grad_ckpt", "grad_ckpt", 0), ("px", "px", 0), ("N", "N", 0),
           ("batch", "batch", 0), ("timed steps", "timed_steps", 0), ("images/s", "images_per_s", 0),
           ("peak GiB", "peak_gib", 2), ("status", "status", 0)]


def findings(rows: dict, log_text: str, device: str) -> list[str]:
    """The ratios the README quotes (GPU runs only), graph breaks, and any out-of-memory message."""
    ips = {k: r.get("images_per_s") for k, r in rows.items()}
    mem = {k: r.get("peak_gib") for k, r in rows.items()}
    lines = []
    for label, a, b, value in (("DDP scaling (2 GPUs / 1 GPU, same batch per GPU)", "flash_ddp2", "flash_eager", ips),
                               ("compile / eager (1 GPU)", "flash_compile", "flash_eager", ips),
                               ("cuda / flash (eager, 1 GPU)", "cuda_eager", "flash_eager", ips),
                               ("1024 px peak memory, grad_ckpt / plain", "flash_1024_ckpt", "flash_1024", mem)):
        if device == "cuda" and value.get(a) and value.get(b):
            lines.append(f"{label}: {value[a] / value[b]:.3f}")
    lines.append(f"'graph break' mentions in the log: {log_text.count('graph break') + log_text.count('Graph break')}")
    lines += [f"{name}: {r['message']}" for name, r in rows.items() if r.get("message")]
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpu" if torch.cuda.is_available() else "smoke")
    p.add_argument("--runs", nargs="+", choices=RUNS, default=RUNS)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    p.add_argument("--name", default="scale", help="output file stem")
    p.add_argument("--runs-dir", type=Path, help="where the train.py runs write (default: <out>/<name>_runs)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = "cuda" if args.preset == "gpu" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--preset gpu trains ViT-B/16 on CUDA GPUs and none is visible; use --preset smoke on a CPU")
    env = environment(["benchmarks/scale.py"] + list(sys.argv[1:] if argv is None else argv), device=device)
    print_environment(env)
    args.out.mkdir(parents=True, exist_ok=True)
    runs_dir = (args.runs_dir or args.out / f"{args.name}_runs").resolve()
    log_path, rows = args.out / f"{args.name}.log", {}
    with open(log_path, "w") as log:
        for name in args.runs:
            rows[name] = run_one(name, PRESETS[args.preset], device, runs_dir, log)
            print(f"{name:<16} {rows[name].get('images_per_s') or float('nan'):8.0f} images/s  {rows[name]['status']}",
                  flush=True)
    notes = [("images/s: train.py's steady state (global, all processes), optimizer steps after the first 5; "
              "peak: rank 0's max_memory_allocated.")]
    if device != "cuda":
        notes.append("**CPU run (gloo, sdpa for flash): wall-clock times only. Not a GPU result.**")
    lines = findings(rows, log_path.read_text(errors="replace"), device)
    columns = COLUMNS if device == "cuda" else [c for c in COLUMNS if c[1] != "peak_gib"]
    md = (markdown_header("Scale-out through train.py", env, notes) + "\n" + markdown_table(list(rows.values()), columns)
          + "\n" + "\n".join(f"{line}  " for line in lines) + "\n")
    paths = write_outputs(args.out, args.name, env, {"preset": args.preset, "runs": args.runs}, list(rows.values()), md)
    print("\n".join(lines))
    print(f"wrote {paths['json']}, {paths['md']}, {log_path}")
    return {"rows": rows, "paths": {**paths, "log": log_path}}


if __name__ == "__main__":
    main()
