"""End-to-end training throughput: our ViT per attention backend beside timm's ViT, same run.

    python -m benchmarks.train --preset main                 # ViT-B/16 224 px, eager + torch.compile
    python -m benchmarks.train --preset full                 # + ViT-S/16 224 px and ViT-B/16 384 px
    python -m benchmarks.train --preset range                # ViT-B/16: batch 16, 64, 256 at 224 px; 512 and 1024 px
    python -m benchmarks.train --preset smoke                # tiny model on CPU (naive, sdpa, timm)
    python -m benchmarks.train --compiled timm flash --eager --memory-peak   # + what is alive at the peak
    python -m benchmarks.train --input-pipeline --workers 8 16 [--data-dir /path/to/imagefolder]

One training step as the framework takes it: bf16 autocast forward, cross-entropy, backward,
optional gradient clipping, AdamW (fused on CUDA), zero_grad. Synthetic images and labels live
on the GPU, so the loader is not measured here (``--input-pipeline`` measures it alone). Warm-up
steps (they include torch.compile's compilation) are timed separately and excluded; then each
step is timed with CUDA events and the median reported. Peak memory = ``max_memory_allocated``
over the timed steps (weights, gradients, AdamW state and activations). MFU = analytic training
FLOPs per image (:func:`flops_per_image`, ×3 for forward+backward) × images/s over the bf16 matmul
ceiling measured at the start of the same run (8192³ ``torch.mm`` on random data). On a CPU (``--preset
smoke``) only times are reported: no memory, MFU or comparison with timm.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import (
    DEFAULT_OUT,
    GiB,
    cli,
    environment,
    error_text,
    free_memory,
    markdown_header,
    markdown_table,
    print_environment,
    time_ms,
    write_outputs,
)
from vit.model import SIZES

# name -> our size and image size, timm's model name (+ overrides for the CPU-sized one), batch size.
MODELS = {
    "vit_small_patch16_224": {"size": "small", "img_size": 224, "timm": "vit_small_patch16_224", "batch": 256},
    "vit_base_patch16_224": {"size": "base", "img_size": 224, "timm": "vit_base_patch16_224", "batch": 256},
    # N = 577; batch 128 keeps naive's N×N activations (~55 GiB over 12 blocks) inside one H200.
    "vit_base_patch16_384": {"size": "base", "img_size": 384, "timm": "vit_base_patch16_384", "batch": 128},
    # The range users train at (issue 11's table): fine-tuning batches, and detection/segmentation resolutions.
    "vit_base_patch16_224_b16": {"size": "base", "img_size": 224, "timm": "vit_base_patch16_224", "batch": 16},
    "vit_base_patch16_224_b64": {"size": "base", "img_size": 224, "timm": "vit_base_patch16_224", "batch": 64},
    "vit_base_patch16_512": {"size": "base", "img_size": 512, "timm": "vit_base_patch16_224", "batch": 64,
                             "timm_overrides": {"img_size": 512}},
    "vit_base_patch16_1024": {"size": "base", "img_size": 1024, "timm": "vit_base_patch16_224", "batch": 8,
                              "timm_overrides": {"img_size": 1024}},
    "debug_patch16_32": {"size": "debug", "img_size": 32, "timm": "vit_tiny_patch16_224", "batch": 8,
                         "timm_overrides": {"img_size": 32, **SIZES["debug"]}},
}
# An implementation is "timm" or one of our registry's backends.
EAGER = ["timm", "sdpa", "flash", "cuda", "naive"]
COMPILED = ["timm", "flash", "sdpa", "cuda"]  # naive compiled is left out: slowest, and 1 min of compile
PRESETS = {
    "main": {"models": ["vit_base_patch16_224"], "eager": EAGER, "compiled": COMPILED, "warmup": 5, "steps": 20,
             "max_minutes": 4.5, "matmul_size": 8192},
    "full": {"models": ["vit_small_patch16_224", "vit_base_patch16_224", "vit_base_patch16_384"], "eager": EAGER,
             "compiled": COMPILED, "warmup": 5, "steps": 20, "max_minutes": 9.0, "matmul_size": 8192},
    "range": {"models": ["vit_base_patch16_224_b16", "vit_base_patch16_224_b64", "vit_base_patch16_224",
                         "vit_base_patch16_512", "vit_base_patch16_1024"],
              "eager": ["timm", "flash", "sdpa"], "compiled": ["timm", "flash"], "warmup": 5, "steps": 20,
              "max_minutes": 20.0, "matmul_size": 8192},
    "smoke": {"models": ["debug_patch16_32"], "eager": ["timm", "sdpa", "naive"], "compiled": [], "warmup": 1,
              "steps": 3, "max_minutes": 5.0, "matmul_size": 256},
}
# Rough wall-clock cost of one configuration on an H200, used only to stop before the time budget.
EXPECTED_S = {False: 10.0, True: 75.0}
# torch.compile's modes; the CUDA-graph ones (max-autotune, reduce-overhead) replay the step's kernels from a graph.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")


def flops_per_image(size: str, img_size: int, patch_size: int = 16, num_classes: int = 1000,
                    mlp_ratio: float = 4.0) -> float:
    """Forward FLOPs of one image through the ViT (2 per multiply-add; matmuls and the patch conv only).

    patch-embed 2·(N-1)·3P²·D; per block: qkv 2·N·D·3D, q·kᵀ 2·N²·D, p·v 2·N²·D, proj 2·N·D², MLP
    2·2·N·D·(r·D); head 2·D·C. ViT-B/16 at 224 px: 35.1 GFLOP (timm/fvcore: 17.6 GMACs).
    Norms, softmax, GELU and the optimizer are not counted (standard MFU practice, PaLM appendix B).
    """

    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; valid sizes are: {', '.join(SIZES)}")
    D, depth = SIZES[size]["embed_dim"], SIZES[size]["depth"]
    P, N, M = patch_size, (img_size // patch_size) ** 2 + 1, int(D * mlp_ratio)
    block = 2 * N * D * 3 * D + 4 * N * N * D + 2 * N * D * D + 4 * N * D * M
    return 2 * (N - 1) * 3 * P * P * D + depth * block + 2 * D * num_classes


def matmul_ceiling_tflops(n: int, device: str) -> float:
    """bf16 n×n @ n×n TFLOP/s on random data: the ceiling MFU is measured against."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    ms = time_ms(lambda i: torch.mm(a, b), warmup=3, iters=20 if device == "cuda" else 3, device=device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def build(impl: str, spec: dict, device: str) -> torch.nn.Module:
    """Our ViT with backend ``impl``, or timm's same model with its default fused SDPA when impl == 'timm'."""
    if impl == "timm":
        import timm

        model = timm.create_model(spec["timm"], pretrained=False, num_classes=1000, **spec.get("timm_overrides", {}))
    else:
        from vit.model import create_model

        model = create_model(spec["size"], attention=impl, img_size=spec["img_size"], num_classes=1000)
    return model.to(device).train()


def train_step(model, opt, x, y, clip_grad: float | None, device: str) -> torch.Tensor:
    """One step as vit/engine.py takes it: bf16 autocast forward, float32 loss, backward, clipping, AdamW.

    The engine's per-step finiteness check (one host sync) is left out; the loss is checked after timing.
    """
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        logits = model(x)  # (B, num_classes)
    loss = F.cross_entropy(logits.float(), y)
    loss.backward()
    if clip_grad:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def compile_mode(args) -> str | None:
    """``torch.compile``'s ``mode`` for ``--compile-mode`` (None: its default)."""
    return None if args.compile_mode == "default" else args.compile_mode


def prepare(impl, model_name, compiled, args, device, row):
    """Build one configuration and take its warm-up steps; returns ``step()``, one timed-to-be training step."""
    spec = MODELS[model_name]
    B, S = args.batch_size or spec["batch"], spec["img_size"]
    model = build(impl, spec, device)
    row["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    if impl == "timm":
        row["attention"] = "sdpa (timm fused_attn)" if getattr(model.blocks[0].attn, "fused_attn", False) else \
            "explicit softmax (timm)"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=device == "cuda")
    step_model = torch.compile(model, mode=compile_mode(args)) if compiled else model
    x = torch.randn(B, 3, S, S, device=device)  # (B, 3, S, S) synthetic images
    y = torch.randint(0, 1000, (B,), device=device)  # (B,) labels
    row["batch"] = B
    losses = row.setdefault("_losses", [])

    def step():
        losses.append(train_step(step_model, opt, x, y, args.clip_grad, device))

    t0 = time.perf_counter()
    for _ in range(args.warmup):  # the first step compiles under torch.compile
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    row["warmup_s"] = time.perf_counter() - t0
    losses.clear()
    return step


def timed_steps(step, steps: int, device: str) -> tuple[list[float], float]:
    """(each step's ms, by CUDA events on a GPU; wall-clock ms of all ``steps``, synchronised at both ends)."""
    if device != "cuda":
        per_step, t0 = [], time.perf_counter()
        for _ in range(steps):
            t = time.perf_counter()
            step()
            per_step.append((time.perf_counter() - t) * 1e3)
        return per_step, (time.perf_counter() - t0) * 1e3
    starts, ends = ([torch.cuda.Event(enable_timing=True) for _ in range(steps)] for _ in range(2))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for start, end in zip(starts, ends):
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends)], (time.perf_counter() - t0) * 1e3


def finish(row, per_step: list[float], wall_ms: list[float], flops_image: float, device: str) -> None:
    """Step ms (median of the per-step times), wall-clock images/s (every timed step, pauses included), loss."""
    final = torch.stack(row.pop("_losses")).float()
    if not torch.isfinite(final).all():
        raise RuntimeError(f"non-finite training loss {final.tolist()}: the backend's gradients are broken")
    B, steps = row["batch"], len(per_step) // len(wall_ms)
    row["loss"] = final[-1].item()
    row["step_ms"] = statistics.median(per_step)
    row["images_per_s"] = B / (row["step_ms"] * 1e-3)
    row["round_images_per_s"] = [B * steps / (w * 1e-3) for w in wall_ms]
    row["wall_images_per_s"] = B * len(per_step) / (sum(wall_ms) * 1e-3)
    row["model_tflops"] = flops_image * row["images_per_s"] / 1e12 if device == "cuda" else None  # a GPU figure


def measure(impl, model_name, compiled, args, device, row) -> None:
    """Fill ``row`` with step ms, images/s and peak GiB for one configuration; exceptions propagate."""
    step = prepare(impl, model_name, compiled, args, device, row)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    per_step, wall = timed_steps(step, args.steps, device)
    row["peak_gib"] = torch.cuda.max_memory_allocated() / GiB if device == "cuda" else None
    spec = MODELS[model_name]
    finish(row, per_step, [wall], 3 * flops_per_image(spec["size"], spec["img_size"]), device)
    if args.memory_peak and device == "cuda":  # one more step, traced: what is alive at its peak
        from benchmarks.memory_peak import peak_sites, record

        row["peak_sites"] = peak_sites(record(step))


def new_row(impl, model_name, compiled, status="ok") -> dict:
    """A result row's identity (model, timm or ours, attention, compile) and its status, before any measurement."""
    return {"model": model_name, "impl": "timm" if impl == "timm" else "ours", "attention": impl,
            "compile": compiled, "status": status}


def not_run_row(impl, model_name, compiled, config, elapsed: float) -> dict:
    return new_row(impl, model_name, compiled, f"not run: time budget of {config['max_minutes']} min reached after "
                                               f"{elapsed:.0f} s (raise --max-minutes)")


def run_config(impl, model_name, compiled, args, device) -> dict:
    row = new_row(impl, model_name, compiled)
    t0 = time.perf_counter()
    try:
        measure(impl, model_name, compiled, args, device, row)
    except Exception as exc:  # noqa: BLE001  one failing backend must not stop the run; its row says why
        row["status"] = error_text(exc)
    if compiled:
        torch._dynamo.reset()
    free_memory()
    row["wall_s"] = time.perf_counter() - t0
    return row


def measure_rounds(impls, model_name, compiled, args, device) -> list[dict]:
    """One model and compile setting, every implementation in ``impls``: all are built and warmed up,
    then their timed steps run in ``args.rounds`` interleaved rounds (the order rotating each round),
    so that drift of the machine over the minutes of a run (CPU clocks, other load) falls on each
    implementation alike. Peak memory is not measured here: every model is alive at once."""
    rows, steps = [], {}
    for impl in impls:
        row = {**new_row(impl, model_name, compiled), "peak_gib": None}
        t0 = time.perf_counter()
        try:
            steps[impl] = prepare(impl, model_name, compiled, args, device, row)
        except Exception as exc:  # noqa: BLE001  its row says why; the others still run
            row["status"] = error_text(exc)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
    per_step, wall, errors = {i: [] for i in steps}, {i: [] for i in steps}, {}
    per_round = max(1, args.steps // args.rounds)
    for r in range(args.rounds):
        order = list(steps)[r % len(steps):] + list(steps)[:r % len(steps)] if steps else []
        for impl in (i for i in order if i not in errors):
            try:
                times, ms = timed_steps(steps[impl], per_round, device)
            except Exception as exc:  # noqa: BLE001
                errors[impl] = error_text(exc)
                continue
            per_step[impl] += times
            wall[impl].append(ms)
    spec = MODELS[model_name]
    for impl, row in zip(impls, rows):  # timm's row names its attention, not "timm"
        if impl in steps:
            try:
                if impl in errors:
                    raise RuntimeError(errors[impl])
                finish(row, per_step[impl], wall[impl], 3 * flops_per_image(spec["size"], spec["img_size"]), device)
            except Exception as exc:  # noqa: BLE001
                row["status"] = errors.get(impl) or error_text(exc)
    steps.clear()
    if compiled:
        torch._dynamo.reset()
    free_memory()
    return rows


def add_comparisons(rows: list[dict], ceiling_tflops: float) -> None:
    """MFU, and each of our rows against timm's for the same model and compile setting (GPU runs only:
    on a CPU neither the bf16 ceiling nor the ratio to timm says anything about the kernels)."""
    timm_rows = {(r["model"], r["compile"]): r for r in rows if r["impl"] == "timm" and r.get("images_per_s")}
    for r in rows:
        r["mfu"] = r["model_tflops"] / ceiling_tflops if r.get("model_tflops") and ceiling_tflops else None
        ref = timm_rows.get((r["model"], r["compile"]))
        ok = r["impl"] == "ours" and ref is not None and r.get("images_per_s")
        r["speed_vs_timm"] = r["images_per_s"] / ref["images_per_s"] - 1 if ok else None
        wall = ok and r.get("wall_images_per_s") and ref.get("wall_images_per_s")
        r["wall_vs_timm_pct"] = f"{100 * (r['wall_images_per_s'] / ref['wall_images_per_s'] - 1):+.1f}%" if wall \
            else None
        ok = ok and r.get("peak_gib") is not None and ref.get("peak_gib") is not None
        r["peak_vs_timm_gib"] = r["peak_gib"] - ref["peak_gib"] if ok else None
        r["speed_vs_timm_pct"] = None if r["speed_vs_timm"] is None else f"{100 * r['speed_vs_timm']:+.1f}%"
        r["mfu_pct"] = None if r["mfu"] is None else 100 * r["mfu"]


COLUMNS = [("model", "model", 0), ("impl", "impl", 0), ("attention", "attention", 0), ("compile", "compile", 0),
           ("batch", "batch", 0), ("images/s", "images_per_s", 0), ("vs timm images/s", "speed_vs_timm_pct", 0),
           ("wall images/s", "wall_images_per_s", 0), ("vs timm wall", "wall_vs_timm_pct", 0),
           ("step ms", "step_ms", 1), ("peak GiB", "peak_gib", 2), ("vs timm peak GiB", "peak_vs_timm_gib", 2),
           ("model TFLOP/s", "model_tflops", 0), ("MFU %", "mfu_pct", 1), ("warm-up s", "warmup_s", 1),
           ("status", "status", 0)]
# A CPU run reports times only: no memory statistics, no MFU, no comparison with timm.
CPU_COLUMNS = [c for c in COLUMNS if c[1] not in ("speed_vs_timm_pct", "wall_vs_timm_pct", "peak_gib",
                                                 "peak_vs_timm_gib", "model_tflops", "mfu_pct")]


def render_markdown(env, config, rows) -> str:
    rounds = config.get("rounds", 1)
    notes = [(f"Preset `{config['preset']}`; {config['warmup']} warm-up steps (incl. compilation) excluded, median of "
              f"{config['steps']} timed steps; bf16 autocast, AdamW(fused on CUDA), synthetic data on the device, "
              f"clip_grad={config['clip_grad']}, cudnn.benchmark=True, torch.compile mode "
              f"{config.get('compile_mode', 'default')!r}."),
             ("'images/s' = batch / median step (CUDA events); 'wall images/s' = every timed step by the wall "
              "clock, pauses (Python's garbage collector, allocator) included.")]
    if rounds > 1:
        notes.append(f"--rounds {rounds}: the implementations of one model and compile setting were built together and "
                     f"their timed steps run in {rounds} interleaved rounds, the order rotating; no peak memory.")
    notes += [
             ("impl timm = `timm.create_model(name, pretrained=False)` with its default fused SDPA; ours = "
              "`vit.model.create_model(size, attention=...)`.")]
    if config["matmul_tflops"] is not None:
        notes += [(f"bf16 {config['matmul_size']}³ matmul ceiling in this run: {config['matmul_tflops']:.4g} TFLOP/s; "
                   "MFU = 3 × analytic forward FLOPs/image × images/s / ceiling."),
                  "'vs timm' compares with timm at the same compile setting."]
    if env["gpu"] is None:
        notes.append("**CPU run: wall-clock times only (no memory, MFU or comparison with timm). Not a GPU result.**")
    columns = COLUMNS if env["gpu"] is not None else CPU_COLUMNS
    text = markdown_header("Training throughput", env, notes) + "\n" + markdown_table(rows, columns)
    if any(r.get("peak_sites") for r in rows):
        from benchmarks.memory_peak import render

        text += ("\n## Alive at the peak (--memory-peak)\n\nOne extra traced step per configuration; blocks "
                 "allocated during it and alive at its peak, by allocating line.\n" + render(rows))
    return text


def run_models(args, device, env) -> dict:
    preset = PRESETS[args.preset]
    config = {"preset": args.preset, "models": args.models or preset["models"],
              "eager": preset["eager"] if args.eager is None else args.eager,
              "compiled": preset["compiled"] if args.compiled is None else args.compiled,
              "warmup": preset["warmup"] if args.warmup is None else args.warmup,
              "steps": args.steps or preset["steps"],
              "max_minutes": args.max_minutes or preset["max_minutes"],
              "matmul_size": args.matmul_size or preset["matmul_size"], "clip_grad": args.clip_grad,
              "compile_mode": args.compile_mode}
    args.warmup, args.steps = config["warmup"], config["steps"]
    torch.backends.cudnn.benchmark = True  # as timm's train.py does; only the patch-embed conv uses cuDNN
    config["matmul_tflops"] = matmul_ceiling_tflops(config["matmul_size"], device) if device == "cuda" else None
    if config["matmul_tflops"] is not None:
        print(f"bf16 {config['matmul_size']}^3 matmul: {config['matmul_tflops']:.1f} TFLOP/s", flush=True)
    config["rounds"] = args.rounds
    name, rows, start = args.name or f"train_{args.preset}", [], time.perf_counter()
    paths = write_outputs(args.out, name, env, config, rows, render_markdown(env, config, rows))
    if args.rounds > 1:
        return run_rounds(args, device, env, config, name, rows)
    plan = [(m, impl, compiled) for compiled in (False, True) for m in config["models"]
            for impl in (config["compiled"] if compiled else config["eager"])]
    for model_name, impl, compiled in plan:
        elapsed = time.perf_counter() - start
        if elapsed + EXPECTED_S[compiled] > 60 * config["max_minutes"]:
            row = not_run_row(impl, model_name, compiled, config, elapsed)
        else:
            row = run_config(impl, model_name, compiled, args, device)
        paths = record_rows(args, device, env, config, name, rows, [row])
    return {"rows": rows, "paths": paths, "config": config}


def record_rows(args, device, env, config, name, rows, new_rows) -> dict:
    """Append ``new_rows``, print them, and rewrite the outputs (so a run cut short keeps what it measured)."""
    for row in new_rows:
        row.pop("_losses", None)  # a configuration that failed after its first steps
        rows.append(row)
        peak = f"peak {row.get('peak_gib') or float('nan'):6.2f} GiB  " if device == "cuda" else ""
        print(f"{row['model']:<22} {row['impl']:<5} {row['attention']:<6} compile={row['compile']!s:<5} "
              f"{row.get('images_per_s') or float('nan'):8.0f} img/s  {row.get('step_ms') or float('nan'):8.1f} ms  "
              f"wall {row.get('wall_images_per_s') or float('nan'):8.0f} img/s  "
              f"{peak}warm-up {row.get('warmup_s') or 0:5.1f} s  {row['status']}", flush=True)
    if device == "cuda":
        add_comparisons(rows, config["matmul_tflops"])
    return write_outputs(args.out, name, env, config, rows, render_markdown(env, config, rows))


def run_rounds(args, device, env, config, name, rows) -> dict:
    """``--rounds``: per model and compile setting, :func:`measure_rounds` over every implementation."""
    paths, start = None, time.perf_counter()
    for compiled in (False, True):
        impls = config["compiled"] if compiled else config["eager"]
        for model_name in config["models"] if impls else []:
            elapsed = time.perf_counter() - start
            if elapsed + len(impls) * EXPECTED_S[compiled] > 60 * config["max_minutes"]:
                new = [not_run_row(i, model_name, compiled, config, elapsed) for i in impls]
            else:
                new = measure_rounds(impls, model_name, compiled, args, device)
            paths = record_rows(args, device, env, config, name, rows, new)
    return {"rows": rows, "paths": paths or write_outputs(args.out, name, env, config, rows,
                                                          render_markdown(env, config, rows)), "config": config}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="main")
    p.add_argument("--models", nargs="+", choices=list(MODELS), help="override the preset's models")
    p.add_argument("--eager", nargs="*", help="implementations to run eagerly: timm and/or backend names")
    p.add_argument("--compiled", nargs="*", help="implementations to run under torch.compile ([] for none)")
    p.add_argument("--batch-size", type=int, help="override the model's batch size")
    p.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                   help="torch.compile's mode for every --compiled implementation alike (default: %(default)s)")
    p.add_argument("--warmup", type=int, help="untimed steps per configuration (include compilation)")
    p.add_argument("--steps", type=int, help="timed steps per configuration; the median is reported")
    p.add_argument("--rounds", type=int, default=1,
                   help="split the timed steps (a multiple of it) into this many rounds interleaved across the "
                        "implementations of one model (builds them all at once; no peak memory): for CPU-bound small "
                        "batches, whose images/s drift with the machine")
    p.add_argument("--clip-grad", type=float, default=None,
                   help="clip the gradient norm to this value (the framework's default is 1.0; off here, as in "
                        "shared/perf/h200_baseline.md's timm runs)")
    p.add_argument("--max-minutes", type=float, help="stop starting new configurations after this long")
    p.add_argument("--matmul-size", type=int, help="n of the n³ bf16 matmul ceiling (8192 on GPU)")
    p.add_argument("--memory-peak", action="store_true",
                   help="trace one extra step per configuration and list what is alive at its peak (CUDA)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    p.add_argument("--name", help="output file stem (default train_<preset>, or input_pipeline)")
    pipe = p.add_argument_group("input pipeline (--input-pipeline): the training loader alone")
    pipe.add_argument("--input-pipeline", action="store_true", help="measure the loader instead of the model")
    pipe.add_argument("--data-dir", type=Path, help="ImageNet-style folder with train/<class>/<image>; "
                                                    "default: a generated folder of random JPEGs")
    pipe.add_argument("--workers", type=int, nargs="+", default=[8, 16], help="DataLoader worker counts to try")
    pipe.add_argument("--paths", nargs="+", choices=["cpu", "gpu", "prepared", "prepared-gpu"],
                      default=["cpu", "gpu", "prepared", "prepared-gpu"],
                      help="cpu: PIL in the workers; gpu: data.decode=gpu; prepared(-gpu): the same on a vit.prepare copy")
    pipe.add_argument("--max-side", type=int, default=256, help="vit.prepare max_side of the prepared copy")
    pipe.add_argument("--num-images", type=int, default=3000, help="images in the generated folder")
    pipe.add_argument("--gen-size", type=int, nargs=2, help="generated JPEGs all of this height, width "
                                                           "(default: ImageNet-like sizes, mean about 513×408)")
    pipe.add_argument("--img-size", type=int, default=224, help="the transform's output size")
    pipe.add_argument("--auto-augment", default="", help="timm auto_augment added to the train transform ('' off, "
                                                         "as configs/data/imagefolder.yaml)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA GPU is visible; use --device cpu (and --preset smoke)")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    steps = args.steps or PRESETS[args.preset]["steps"]
    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")
    if args.rounds > 1 and steps % args.rounds:
        raise ValueError(f"--steps {steps} is not a multiple of --rounds {args.rounds}: every round times the same "
                         f"number of steps; choose --steps as a multiple of --rounds")
    if args.rounds > 1 and args.memory_peak:
        raise ValueError("--memory-peak needs one model alive at a time; leave --rounds at 1 for it")
    if args.memory_peak and args.device != "cuda":
        raise ValueError("--memory-peak traces the CUDA caching allocator and needs --device cuda on a GPU machine")
    if args.device == "cpu" and not args.input_pipeline and args.preset != "smoke" and args.models is None:
        raise ValueError(f"--preset {args.preset} trains ViT-B/16 at batch 256 and would run for hours on a CPU; "
                         f"use --preset smoke (or name --models and --batch-size yourself)")
    for impl in (args.eager or []) + (args.compiled or []):
        if impl != "timm":
            from kernels import available_backends

            if impl not in available_backends():
                raise ValueError(f"unknown implementation {impl!r}; valid: timm, {', '.join(available_backends())}")
    script = "benchmarks/train.py"
    env = environment([script] + list(sys.argv[1:] if argv is None else argv), device=args.device)
    print_environment(env)
    if args.input_pipeline:
        from benchmarks.input_pipeline import run_pipeline

        result = run_pipeline(args, env)
    else:
        result = run_models(args, args.device, env)
    print("wrote " + ", ".join(str(p) for p in result["paths"].values()))
    return result


if __name__ == "__main__":
    cli(main)
