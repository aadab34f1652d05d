"""Attention kernel benchmark: every backend × shape × dtype, forward, backward, forward+backward.

    python -m benchmarks.attention --preset baseline        # the shapes of shared/perf/h200_baseline.md
    python -m benchmarks.attention --preset full            # ViT-S/B/L at 224/384 px + N sweep, bf16 and fp16
    python -m benchmarks.attention --preset smoke           # tiny, runs on CPU (naive + sdpa)
    python -m benchmarks.attention --layout packed          # as the ViT calls it: one (B, N, 3, H, d) qkv

Method (ARCHITECTURE.md, Benchmarks): FLOPs forward = 4·B·H·N²·d (two N×N×d matmuls), backward =
2.5× forward (five matmuls, one recomputed in FlashAttention-2), forward+backward = 3.5×. Each phase
is timed with CUDA events around each call, after warm-up, median of ``--iters`` calls; the calls
rotate over several input sets whose total size exceeds the GPU's L2 so inputs come from HBM.
Peak memory = ``max_memory_allocated`` during one forward+backward minus what was allocated before
(the inputs); it includes the output and dq, dk, dv. Every backend's output is also checked against
float32 naive attention on a slice (first batch element, first two heads) and the max error reported.
A backend that fails or runs out of memory gets a row with the error; none is skipped silently.
``--layout bhnd`` (default) times ``attention(q, k, v)`` on contiguous (B, H, N, d) tensors, the
kernels alone; ``--layout packed`` times ``get_attention_qkvpacked(name)(qkv)`` on one (B, N, 3, H, d)
leaf, as the ViT calls it, so the backward includes assembling the qkv gradient (autograd's stack and
copy for backends without a packed form; nothing for ``flash``).
Outputs: ``<out>/<name>.json``, ``.md`` and ``.png`` (time, memory and speedup vs N per backend).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import (
    DEFAULT_OUT,
    MiB,
    cli,
    environment,
    error_text,
    free_memory,
    markdown_header,
    markdown_table,
    peak_extra_bytes,
    print_environment,
    time_ms,
    write_outputs,
)
from benchmarks.plots import plot_attention

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# name -> (registry name, SDPA backend it is pinned to or None). "sdpa-*" are PyTorch's kernels.
BACKENDS: dict[str, tuple[str, SDPBackend | None]] = {
    "naive": ("naive", None),
    "sdpa-flash": ("sdpa", SDPBackend.FLASH_ATTENTION),
    "sdpa-cudnn": ("sdpa", SDPBackend.CUDNN_ATTENTION),
    "sdpa-efficient": ("sdpa", SDPBackend.EFFICIENT_ATTENTION),
    "sdpa-math": ("sdpa", SDPBackend.MATH),
    "flash": ("flash", None),
    "cuda": ("cuda", None),
}
DEFAULT_BACKENDS = ["naive", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flash", "cuda"]

# (B, H, N, d): ViT-S/B/L (H = 6/12/16, d = 64) at 224 px (N = 197) and 384 px (N = 577).
VIT_SHAPES = [(256, 6, 197, 64), (256, 12, 197, 64), (256, 16, 197, 64),
              (128, 6, 577, 64), (128, 12, 577, 64), (64, 16, 577, 64)]
# High resolution: N = 1024 … 16384 with B·N = 32768 held, d = 64 (H = 12) and d = 128 (H = 16).
SWEEP_SHAPES = [(32768 // n, h, n, d) for d, h in ((64, 12), (128, 16)) for n in (1024, 2048, 4096, 8192, 16384)]
PRESETS = {
    # Exactly the rows of shared/perf/h200_baseline.md, so our numbers sit beside the measured peers.
    "baseline": {"shapes": [(256, 12, 197, 64), (128, 16, 577, 64), (32, 12, 1024, 64), (8, 12, 4096, 64),
                            (2, 12, 16384, 64), (8, 16, 4096, 128), (256, 12, 197, 128)],
                 "dtypes": ["bf16"], "backends": DEFAULT_BACKENDS, "warmup": 5, "iters": 30},
    "full": {"shapes": VIT_SHAPES + SWEEP_SHAPES, "dtypes": ["bf16", "fp16"], "backends": DEFAULT_BACKENDS,
             "warmup": 5, "iters": 30},
    # CPU-sized; sdpa-efficient has no CPU kernel, so its rows exercise the error path.
    "smoke": {"shapes": [(8, 2, 16, 16), (4, 2, 32, 16), (2, 2, 64, 16), (2, 2, 32, 32)], "dtypes": ["bf16"],
              "backends": ["naive", "sdpa-flash", "sdpa-efficient"], "warmup": 1, "iters": 3},
}


def flops_forward(B: int, H: int, N: int, d: int) -> float:
    """Forward FLOPs of non-causal attention: q·kᵀ and p·v, each 2·B·H·N²·d."""
    return 4.0 * B * H * N * N * d


def resolve_backend(name: str, layout: str = "bhnd"):
    """-> (attention fn, context manager factory); the packed form for ``layout='packed'``.
    Raises whatever the registry raises."""
    from kernels import get_attention, get_attention_qkvpacked

    if name not in BACKENDS:
        raise ValueError(f"unknown benchmark backend {name!r}; valid: {', '.join(BACKENDS)}")
    registry_name, sdpa_backend = BACKENDS[name]
    fn = (get_attention_qkvpacked if layout == "packed" else get_attention)(registry_name)
    ctx = (lambda: sdpa_kernel(sdpa_backend)) if sdpa_backend is not None else contextlib.nullcontext
    return fn, ctx


def input_sets(B, H, N, d, dtype, device, l2_bytes, layout="bhnd"):
    """Random inputs and do; enough sets that their total exceeds 2× the L2.

    Each set is ``(inputs, do)``: inputs ``(q, k, v)``, leaves of (B, H, N, d), or with
    ``layout='packed'`` ``(qkv,)``, one (B, N, 3, H, d) leaf; do (B, H, N, d).
    """
    set_bytes = 4 * B * H * N * d * torch.finfo(dtype).bits // 8
    n = 1 if device == "cpu" else max(2, min(64, math.ceil(2 * l2_bytes / set_bytes)))
    sets = []
    for _ in range(n):
        do = torch.randn(B, H, N, d, device=device, dtype=dtype)  # (B, H, N, d)
        if layout == "packed":
            inputs = (torch.randn(B, N, 3, H, d, device=device, dtype=dtype),)  # (B, N, 3, H, d)
        else:
            inputs = tuple(torch.randn(B, H, N, d, device=device, dtype=dtype) for _ in range(3))  # (B, H, N, d)
        sets.append((tuple(t.requires_grad_() for t in inputs), do))
    return sets


def max_error_vs_fp32(fn, inputs) -> float:
    """Max |fn - float32 naive| on the first batch element and first two heads (cheap at any N).

    ``inputs`` as in :func:`input_sets`: ``(q, k, v)``, or ``(qkv,)`` for the packed form.
    """
    from kernels import split_qkv
    from kernels.naive import attention as naive

    if len(inputs) == 1:
        qkv = inputs[0][:1, :, :, :2].detach().contiguous()  # (1, N, 3, ≤2, d)
        args, (qs, ks, vs) = (qkv,), split_qkv(qkv)
    else:
        qs, ks, vs = (t[:1, :2].detach().contiguous() for t in inputs)  # (1, ≤2, N, d)
        args = (qs, ks, vs)
    with torch.no_grad():
        ref = naive(qs.float(), ks.float(), vs.float())
        got = fn(*args)
    return (got.float() - ref).abs().max().item()


def measure(name, B, H, N, d, dtype_name, device, warmup, iters, l2_bytes, row, layout="bhnd"):
    """Fill ``row`` with fwd / bwd / fwd+bwd ms, TFLOP/s and peak MiB; exceptions propagate."""
    fn, ctx = resolve_backend(name, layout)
    with ctx():
        sets = input_sets(B, H, N, d, DTYPES[dtype_name], device, l2_bytes, layout)
        row["input_sets"] = len(sets)

        def fwd(i):
            inputs, _ = sets[i % len(sets)]
            return fn(*inputs)

        def fwd_bwd(i):
            inputs, do = sets[i % len(sets)]
            return torch.autograd.grad(fn(*inputs), inputs, do)

        def bwd(i, out):
            inputs, do = sets[i % len(sets)]
            return torch.autograd.grad(out, inputs, do)

        flops = flops_forward(B, H, N, d)
        for phase, kwargs, mult in (("fwd", {"fn": fwd}, 1.0), ("bwd", {"fn": bwd, "setup": fwd}, 2.5),
                                    ("fwdbwd", {"fn": fwd_bwd}, 3.5)):
            ms = time_ms(**kwargs, warmup=warmup, iters=iters, device=device)
            row[f"{phase}_ms"] = ms
            row[f"{phase}_tflops"] = mult * flops / (ms * 1e-3) / 1e12 if device == "cuda" else None  # GPU only
        free_memory()
        for phase, f in (("fwd", lambda: fwd(0)), ("fwdbwd", lambda: fwd_bwd(0))):
            peak = peak_extra_bytes(f, device=device)
            row[f"{phase}_peak_mib"] = None if peak is None else peak / MiB
        # Last: autotuned kernels key on (N, d) only, so the first call must be the full shape, not this slice.
        row["max_err"] = max_error_vs_fp32(fn, sets[0][0])


def run_case(name, B, H, N, d, dtype_name, device, warmup, iters, l2_bytes, layout="bhnd") -> dict:
    row = {"backend": name, "B": B, "H": H, "N": N, "d": d, "dtype": dtype_name, "layout": layout, "status": "ok"}
    t0 = time.perf_counter()
    try:
        measure(name, B, H, N, d, dtype_name, device, warmup, iters, l2_bytes, row, layout)
    except Exception as exc:  # noqa: BLE001  one failing backend must not stop the run; its row says why
        row["status"] = error_text(exc)
    free_memory()
    row["wall_s"] = time.perf_counter() - t0
    return row


def add_ratios(rows: list[dict]) -> None:
    """naive's fwd+bwd time and peak memory over each row's, for the same shape and dtype."""
    naive = {(r["B"], r["H"], r["N"], r["d"], r["dtype"]): r for r in rows if r["backend"] == "naive"}
    for r in rows:
        ref = naive.get((r["B"], r["H"], r["N"], r["d"], r["dtype"]))
        ok = ref is not None and r.get("fwdbwd_ms") and ref.get("fwdbwd_ms")
        r["speedup_vs_naive"] = ref["fwdbwd_ms"] / r["fwdbwd_ms"] if ok else None
        ok = ok and r.get("fwdbwd_peak_mib") and ref.get("fwdbwd_peak_mib")
        r["memory_saving_vs_naive"] = ref["fwdbwd_peak_mib"] / r["fwdbwd_peak_mib"] if ok else None


COLUMNS = [("B", "B", 0), ("H", "H", 0), ("N", "N", 0), ("d", "d", 0), ("dtype", "dtype", 0),
           ("backend", "backend", 0), ("fwd ms", "fwd_ms", 3), ("fwd TFLOP/s", "fwd_tflops", 1),
           ("bwd ms", "bwd_ms", 3), ("bwd TFLOP/s", "bwd_tflops", 1), ("fwd+bwd ms", "fwdbwd_ms", 3),
           ("fwd+bwd TFLOP/s", "fwdbwd_tflops", 1), ("peak fwd MiB", "fwd_peak_mib", 0),
           ("peak fwd+bwd MiB", "fwdbwd_peak_mib", 0), ("× faster than naive", "speedup_vs_naive", 2),
           ("× less memory than naive", "memory_saving_vs_naive", 1), ("max err vs fp32", "max_err", 4),
           ("status", "status", 0)]
# A CPU run reports times (and the error check) only: no TFLOP/s, memory or ratios to naive.
CPU_COLUMNS = [c for c in COLUMNS if not c[1].endswith(("_tflops", "_peak_mib", "_vs_naive"))]


def render_markdown(env, config, rows) -> str:
    notes = [(f"Preset `{config['preset']}`; warm-up {config['warmup']}, median of {config['iters']} calls per phase; "
             "inputs rotated over sets totalling > 2× L2."),
             ("Layout `packed`: each backend's packed form on one (B, N, 3, H, d) qkv, as the ViT calls it; the "
              "backward includes assembling the qkv gradient." if config.get("layout") == "packed" else
              "Layout `bhnd`: contiguous (B, H, N, d) q, k, v, the kernels alone."),
             ("FLOPs: fwd 4·B·H·N²·d, bwd 2.5×, fwd+bwd 3.5×. Peak = extra memory allocated during the phase beyond "
             "the inputs (includes out, and dq/dk/dv for fwd+bwd); n/a on CPU."),
             ("sdpa-X = `F.scaled_dot_product_attention` pinned to SDPBackend.X; naive = softmax(q·kᵀ·d^-0.5)·v, "
             "all in float32; max err = max |out − float32 naive| on batch 0, heads 0-1.")]
    if env["gpu"] is None:
        notes.append("**CPU run: wall-clock times only (no TFLOP/s, memory or ratios). Not a GPU result.**")
    columns = COLUMNS if config["device"] == "cuda" else CPU_COLUMNS
    return markdown_header("Attention benchmark", env, notes) + "\n" + markdown_table(rows, columns)


class ShapeError(argparse.ArgumentTypeError, ValueError):
    """A bad ``--shapes`` value: a ValueError, and one argparse prints with its message (a plain ValueError raised by
    a ``type=`` function comes out as "invalid parse_shapes value")."""


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """'B,H,N,d;B,H,N,d' -> list of 4-tuples. Raises ShapeError (a ValueError) naming the bad entry."""
    shapes = []
    for part in filter(None, text.split(";")):
        try:
            B, H, N, d = (int(x) for x in part.split(","))
        except ValueError:
            raise ShapeError(f"bad shape {part!r} in --shapes; write B,H,N,d;B,H,N,d (e.g. 32,12,1024,64)") from None
        if min(B, H, N, d) < 1:
            raise ShapeError(f"shape {part!r} has a non-positive size")
        shapes.append((B, H, N, d))
    return shapes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="baseline")
    p.add_argument("--backends", nargs="+", choices=list(BACKENDS), help="override the preset's backends")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="override the preset's dtypes")
    p.add_argument("--shapes", type=parse_shapes, help="override the preset's shapes: 'B,H,N,d;B,H,N,d'")
    p.add_argument("--warmup", type=int, help="untimed calls per phase (preset default)")
    p.add_argument("--iters", type=int, help="timed calls per phase; the median is reported (preset default)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    p.add_argument("--name", help="output file stem (default attention_<preset>)")
    p.add_argument("--layout", choices=["bhnd", "packed"], default="bhnd",
                   help="bhnd: q, k, v (B, H, N, d), the kernels alone; packed: one (B, N, 3, H, d) qkv, as the ViT")
    p.add_argument("--no-plot", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA GPU is visible; use --device cpu (and --preset smoke)")
    if args.device == "cpu" and args.preset != "smoke" and args.shapes is None:
        raise ValueError(f"--preset {args.preset} is sized for a GPU (up to B·N = 32768 tokens, N = 16384) and would "
                         f"run for hours on a CPU; use --preset smoke, or give CPU-sized --shapes")
    preset = PRESETS[args.preset]
    config = {"preset": args.preset, "shapes": args.shapes or preset["shapes"],
              "dtypes": args.dtypes or preset["dtypes"], "backends": args.backends or preset["backends"],
              "warmup": preset["warmup"] if args.warmup is None else args.warmup,
              "iters": preset["iters"] if args.iters is None else args.iters, "device": args.device,
              "layout": args.layout}
    name = args.name or f"attention_{args.preset}" + ("_packed" if args.layout == "packed" else "")
    env = environment(["benchmarks/attention.py"] + list(sys.argv[1:] if argv is None else argv), device=args.device)
    print_environment(env)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) if args.device == "cuda" else 0
    l2 = l2 or 60 * MiB  # H200's L2 when the property is missing
    rows = []
    paths = write_outputs(args.out, name, env, config, rows, render_markdown(env, config, rows))
    for dtype_name in config["dtypes"]:
        for B, H, N, d in config["shapes"]:
            for backend in config["backends"]:
                row = run_case(backend, B, H, N, d, dtype_name, args.device, config["warmup"], config["iters"], l2,
                               args.layout)
                rows.append(row)
                gpu = (f"  {row.get('fwdbwd_tflops') or 0:6.0f} TFLOP/s  peak "
                       f"{row.get('fwdbwd_peak_mib') or float('nan'):9.0f} MiB" if args.device == "cuda" else "")
                print(f"{dtype_name} B={B:<4} H={H:<3} N={N:<6} d={d:<4} {backend:<15} "
                      f"fwd {row.get('fwd_ms', float('nan')):9.3f} ms  fwd+bwd {row.get('fwdbwd_ms', float('nan')):9.3f} ms"
                      f"{gpu}  err {row.get('max_err', float('nan')):.1e}  {row['status']}", flush=True)
                if args.device == "cuda":
                    add_ratios(rows)
                paths = write_outputs(args.out, name, env, config, rows, render_markdown(env, config, rows))
    if not args.no_plot:
        title = (f"{env['command']}\n{env['gpu'] or 'CPU (wall-clock)'} · torch {env['torch']} · triton {env['triton']}"
                 f" · {env['date_utc']}")
        paths["png"] = plot_attention(rows, args.out / f"{name}.png", title)
    print("wrote " + ", ".join(str(p) for p in paths.values() if p))
    return {"rows": rows, "paths": paths, "environment": env}


if __name__ == "__main__":
    cli(main)
