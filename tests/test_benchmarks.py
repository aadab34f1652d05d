"""CPU smoke of the benchmark tools: both scripts on tiny shapes (naive, sdpa, timm), real output files.

They check that each script writes JSON, Markdown and (attention) PNG holding measured rows, that a
failing backend becomes an error row instead of stopping the run, and that the analytic FLOP count
used for MFU equals what PyTorch's FlopCounterMode counts on the model itself.
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is run as `python -m benchmarks.x` from the repo root
    sys.path.insert(0, str(ROOT))

from benchmarks import attention as attn_bench
from benchmarks import common, plots
from benchmarks import train as train_bench

ON_GPU = torch.cuda.is_available()


def _read(paths):
    data = json.loads(Path(paths["json"]).read_text())
    return data, Path(paths["md"]).read_text()


def test_attention_smoke_writes_real_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no --out: outputs/benchmarks/ under the working directory, not benchmarks/results/
    result = attn_bench.main(["--preset", "smoke", "--name", "att"])
    assert Path(result["paths"]["json"]) == Path("outputs") / "benchmarks" / "att.json"
    data, md = _read(result["paths"])
    env, rows = data["environment"], data["rows"]
    assert env["torch"] == torch.__version__ and env["command"].startswith("python -m benchmarks.attention")
    assert env["timer"].startswith("cuda-events" if ON_GPU else "wall-clock")
    shapes = attn_bench.PRESETS["smoke"]["shapes"]
    assert len(rows) == len(shapes) * 3
    for r in rows:
        if r["backend"] in ("naive", "sdpa-flash"):
            assert r["status"] == "ok", r
            for key in ("fwd_ms", "bwd_ms", "fwdbwd_ms"):
                assert r[key] > 0 and math.isfinite(r[key]), (key, r)
            for key in ("fwd_tflops", "fwdbwd_tflops", "fwdbwd_peak_mib"):  # GPU figures: none on a CPU
                assert (r[key] > 0) if ON_GPU else (r[key] is None), (key, r)
            assert r["max_err"] < 0.05, r  # bf16 output vs float32 naive
    if ON_GPU:
        assert all(r["speedup_vs_naive"] == pytest.approx(1.0) for r in rows if r["backend"] == "naive")
    else:  # times only
        assert all("speedup_vs_naive" not in r for r in rows)
        header = next(line for line in md.splitlines() if line.startswith("| B |"))
        assert not any(word in header for word in ("TFLOP/s", "MiB", "naive")), header
    if not ON_GPU:  # PyTorch has no memory-efficient kernel on CPU: the row must say so
        errors = [r for r in rows if r["backend"] == "sdpa-efficient"]
        assert errors and all(r["status"].startswith("error: ") for r in errors)
    # the Markdown table has the header, the environment, and one line per row
    assert "| B | H | N | d | dtype | backend |" in md and env["date_utc"] in md and env["torch"] in md
    assert sum(line.startswith("| ") for line in md.splitlines()) == len(rows) + 1
    png = Path(result["paths"]["png"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    png.unlink()
    plots.main([result["paths"]["json"]])  # redraw from the saved JSON alone
    assert png.stat().st_size > 10_000


def test_attention_packed_layout_times_the_vit_call(tmp_path):
    """--layout packed: each backend's packed form on one (B, N, 3, H, d) leaf, checked against
    float32 naive; flash (Triton interpreter on CPU) in float32 beside naive."""
    result = attn_bench.main(["--layout", "packed", "--backends", "naive", "flash", "--dtypes", "fp32",
                              "--shapes", "2,3,17,16", "--iters", "2", "--warmup", "1", "--out", str(tmp_path),
                              "--no-plot"])
    assert Path(result["paths"]["md"]).name == "attention_baseline_packed.md"
    rows = {r["backend"]: r for r in result["rows"]}
    for r in rows.values():
        assert r["status"] == "ok" and r["layout"] == "packed", r
        assert r["fwdbwd_ms"] > 0 and r["max_err"] < 1e-5, r
    assert "Layout `packed`" in Path(result["paths"]["md"]).read_text()


def test_attention_failing_backend_gets_error_row(tmp_path, monkeypatch):
    real = attn_bench.resolve_backend

    def resolve(name, *args):
        if name == "flash":
            raise RuntimeError("kernel not built")
        return real(name, *args)

    monkeypatch.setattr(attn_bench, "resolve_backend", resolve)
    result = attn_bench.main(["--preset", "smoke", "--backends", "naive", "flash", "--shapes", "2,2,16,16",
                              "--out", str(tmp_path), "--no-plot"])
    rows = {r["backend"]: r for r in result["rows"]}
    assert rows["naive"]["status"] == "ok"
    assert rows["flash"]["status"] == "error: RuntimeError: kernel not built"
    assert "error: RuntimeError: kernel not built" in Path(result["paths"]["md"]).read_text()


@pytest.mark.skipif(ON_GPU, reason="checks the CPU guard")
def test_gpu_presets_refused_on_cpu():
    with pytest.raises(ValueError, match="--preset smoke"):
        attn_bench.main(["--layout", "packed", "--no-plot"])
    with pytest.raises(ValueError, match="--preset smoke"):
        train_bench.main([])
    with pytest.raises(ValueError, match="needs --device cuda"):
        train_bench.main(["--preset", "smoke", "--memory-peak"])


def test_attention_bad_arguments():
    with pytest.raises(ValueError, match="B,H,N,d"):
        attn_bench.parse_shapes("2,2,16")
    with pytest.raises(ValueError, match="iters"):
        common.time_ms(lambda i: None, warmup=0, iters=0, device="cpu")
    assert common.error_text(torch.cuda.OutOfMemoryError("CUDA out of memory")).startswith("error: OOM")


def test_train_smoke_writes_real_rows(tmp_path):
    result = train_bench.main(["--preset", "smoke", "--steps", "2", "--out", str(tmp_path), "--name", "tr"])
    data, md = _read(result["paths"])
    rows = data["rows"]
    assert [(r["impl"], r["attention"]) for r in rows][:1] == [("timm", "sdpa (timm fused_attn)")]
    assert {r["attention"] for r in rows if r["impl"] == "ours"} == {"sdpa", "naive"}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["images_per_s"] > 0 and r["step_ms"] > 0 and math.isfinite(r["loss"])
        assert r["params_m"] > 0
        assert (0 < r["mfu"]) if ON_GPU else ("mfu" not in r and r["model_tflops"] is None)
    params = {r["params_m"] for r in rows}
    assert len(params) == 1, "ours and timm must be the same architecture"
    ours = [r for r in rows if r["impl"] == "ours"]
    assert all((r["speed_vs_timm"] is not None) if ON_GPU else ("speed_vs_timm" not in r) for r in ours)
    assert (data["config"]["matmul_tflops"] > 0) if ON_GPU else (data["config"]["matmul_tflops"] is None)
    assert "| model | impl | attention |" in md
    header = next(line for line in md.splitlines() if line.startswith("| model |"))
    assert all((word in header) == ON_GPU for word in ("vs timm", "MFU", "TFLOP/s", "peak GiB")), header
    assert sum(line.startswith("| ") for line in md.splitlines()) == len(rows) + 1


def test_train_rounds_interleave_the_implementations(tmp_path, monkeypatch):
    """--rounds 2: every implementation of the model is built first, then timed in two rounds whose order
    rotates; each row holds both rounds' wall-clock images/s, and the steps sum to --steps."""
    calls = []
    real = train_bench.timed_steps
    monkeypatch.setattr(train_bench, "timed_steps", lambda step, n, device: calls.append(n) or real(step, n, device))
    real_prepare = train_bench.prepare
    order = []

    def prepare(impl, *args):
        step = real_prepare(impl, *args)
        return lambda: order.append(impl) or step()

    monkeypatch.setattr(train_bench, "prepare", prepare)
    result = train_bench.main(["--preset", "smoke", "--steps", "4", "--rounds", "2", "--out", str(tmp_path)])
    rows = result["rows"]
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert calls == [2] * 6
    impls = ["timm", "sdpa", "naive"]
    assert order[::2] == impls + impls[1:] + impls[:1], order  # two rounds of two timed steps each
    for r in rows:
        assert len(r["round_images_per_s"]) == 2 and r["wall_images_per_s"] > 0 and r["peak_gib"] is None
    assert "interleaved rounds" in Path(result["paths"]["md"]).read_text()
    with pytest.raises(ValueError, match="--rounds"):
        train_bench.main(["--preset", "smoke", "--rounds", "0"])
    with pytest.raises(ValueError, match="--steps 3 is not a multiple of --rounds 2"):  # 2 steps timed, not 3
        train_bench.main(["--preset", "smoke", "--rounds", "2", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--steps 4 is not a multiple of --rounds 8"):  # 8 steps timed, not 4
        train_bench.main(["--preset", "smoke", "--steps", "4", "--rounds", "8", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--steps must be at least 1, got -2"):  # was a row error from torch.stack
        train_bench.main(["--preset", "smoke", "--steps", "-2", "--out", str(tmp_path)])


def test_train_comparisons_without_peak_memory():
    """--rounds rows have no peak memory; their images/s and wall-clock ratios to timm are still given."""
    rows = [{"model": "m", "compile": False, "impl": impl, "images_per_s": ips, "wall_images_per_s": wall,
             "peak_gib": None, "model_tflops": 1.0} for impl, ips, wall in (("timm", 100.0, 90.0), ("ours", 110.0, 99.0))]
    train_bench.add_comparisons(rows, ceiling_tflops=10.0)
    assert rows[1]["speed_vs_timm_pct"] == "+10.0%" and rows[1]["wall_vs_timm_pct"] == "+10.0%"
    assert rows[1]["peak_vs_timm_gib"] is None and rows[0]["wall_vs_timm_pct"] is None


def test_train_time_budget_marks_rows_not_run(tmp_path):
    result = train_bench.main(["--preset", "smoke", "--max-minutes", "1e-4", "--out", str(tmp_path)])
    assert result["rows"] and all(r["status"].startswith("not run: time budget") for r in result["rows"])


def test_cuda_bench_rows_only_skip_and_a_misspelt_name():
    from benchmarks.cuda_bench import select_rows

    names = ["sdpa-flash", "sdpa-cudnn", "cuda-sm80", "cuda-auto", "cuda-sm90-dqcols-tma"]
    assert select_rows(names) == names
    assert select_rows(names, only=["cuda-auto"]) == ["sdpa-flash", "sdpa-cudnn", "cuda-auto"]  # the peers stay
    assert select_rows(names, only=["cuda-auto"], skip=["sdpa-flash"]) == ["sdpa-cudnn", "cuda-auto"]
    assert select_rows(names, skip=["cuda-sm80", "sdpa-flash"]) == ["sdpa-cudnn", "cuda-auto", "cuda-sm90-dqcols-tma"]
    with pytest.raises(ValueError, match="no benchmark row named cuda-atuo on this GPU; its rows: sdpa-flash"):
        select_rows(names, only=["cuda-atuo"])
    with pytest.raises(ValueError, match="cuda-sm90-pingpong"):  # a row this GPU has none of, as --skip
        select_rows(names, skip=["cuda-sm90-pingpong"])


def test_cuda_bench_table_without_a_peer(monkeypatch, capsys):
    from benchmarks import cuda_bench

    def row(name, fwd, fwd_bwd):
        return {"B": 8, "H": 12, "N": 4096, "d": 64, "backend": name, "fwd_ms": fwd, "fwd_tflops": 1.0,
                "fwd_bwd_ms": fwd_bwd, "fwd_bwd_tflops": 1.0, "fwd_err": 0.0, "rounds": 1, "fwd_bwd_spread": 0.0}

    calls = []
    monkeypatch.setattr(cuda_bench, "bench_attention", lambda **kw: calls.append(kw) or [
        row("sdpa-cudnn", 1.0, 3.0), row("cuda-auto", 2.0, 4.0)])
    monkeypatch.setattr(cuda_bench.torch.cuda, "get_device_name", lambda: "a test GPU")
    monkeypatch.setattr(sys, "argv", ["cuda_bench.py", "--attention-only", "--only", "cuda-auto",
                                      "--skip", "sdpa-flash"])
    cuda_bench.main()
    assert calls == [{"skip": ["sdpa-flash"], "rounds": 1, "only": ["cuda-auto"]}]
    line = next(x for x in capsys.readouterr().out.splitlines() if "| cuda-auto |" in x)
    assert "| 0.50x | 0.75x | n/a |" in line, line  # cuDNN's fwd and fwd+bwd over ours; FlashAttention-2 skipped


def test_input_pipeline_refuses_fewer_images_than_a_batch(tmp_path):
    with pytest.raises(ValueError, match="--num-images 3 is below the batch size 4"):
        train_bench.main(["--input-pipeline", "--workers", "0", "--num-images", "3", "--batch-size", "4",
                          "--out", str(tmp_path)])


def test_a_bad_argument_ends_the_command_line_with_its_message():
    """benchmarks.common.cli: a ValueError from main() is one line and exit status 1, not a traceback."""
    from benchmarks.common import cli

    def main():
        raise ValueError("--preset main is sized for a GPU")

    with pytest.raises(SystemExit) as stop:
        cli(main)
    assert str(stop.value) == "error: --preset main is sized for a GPU"


def test_input_pipeline_smoke(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the generated folder and its prepared copy
    result = train_bench.main(["--input-pipeline", "--workers", "0", "1", "--num-images", "20", "--batch-size", "4",
                               "--gen-size", "72", "80", "--img-size", "32", "--max-side", "40",
                               "--out", str(tmp_path / "out")])
    data, md = _read(result["paths"])
    assert [(r["path"], r["workers"]) for r in data["rows"]] == [
        (p, w) for p in ("cpu", "gpu", "prepared", "prepared-gpu") for w in (0, 1)]
    for r in data["rows"]:
        if r["path"].endswith("gpu") and not ON_GPU:
            assert r["status"].startswith("skipped: no CUDA GPU"), r
        else:
            assert r["status"] == "ok" and r["images"] == 20 and r["images_per_s"] > 0, r
    assert "ColorJitter" in data["config"]["transform"] and "RandAugment" not in data["config"]["transform"]
    assert data["config"]["prepare_s"] > 0 and "python -m vit.prepare max_side=40" in md
    prepared = tmp_path / "vit_bench_jpegs_20_72x80_prepared_40"
    assert {Image.open(p).size for p in prepared.rglob("*.jpg")} == {(44, 40)}  # 80×72 -> shorter side 40
    with pytest.raises(ValueError, match="not a directory"):
        from benchmarks.input_pipeline import train_split

        train_split(tmp_path / "missing")


def test_input_pipeline_generates_imagenet_like_sizes():
    from benchmarks.input_pipeline import image_sizes

    sizes = np.array(image_sizes(3000))  # (height, width)
    assert 380 < sizes[:, 0].mean() < 430 and 490 < sizes[:, 1].mean() < 530
    assert (sizes.min(1) > 500).mean() > 0.03  # some larger ones
    assert image_sizes(3, (72, 80)) == [(72, 80)] * 3


@pytest.mark.parametrize("size,img_size", [("debug", 32), ("debug", 64)])
def test_flops_per_image_matches_flop_counter(size, img_size):
    from torch.utils.flop_counter import FlopCounterMode

    from vit.model import create_model

    model = create_model(size, attention="naive", img_size=img_size, num_classes=1000)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(2, 3, img_size, img_size))
    assert counter.get_total_flops() == 2 * train_bench.flops_per_image(size, img_size)


def test_flops_per_image_vit_base():
    # timm/fvcore report 17.6 GMACs for vit_base_patch16_224 (matmuls and the patch conv)
    assert train_bench.flops_per_image("base", 224) / 2e9 == pytest.approx(17.56, abs=0.05)


def test_memory_peak_replay_finds_the_peak_and_its_sites():
    """A hand-written allocator trace: the peak is after the third alloc, before any free; blocks
    freed before the peak and blocks that predate the trace do not count."""
    from benchmarks.memory_peak import peak_sites, render, site_of

    def frames(*where):
        return [{"filename": f, "line": line, "name": fn} for f, line, fn in where]

    plumbing = ("/x/site-packages/torch/nn/modules/module.py", 1, "_call_impl")
    mine = ("/repo/vit/model.py", 70, "forward")
    generated = ("/tmp/torchinductor_root/ab/cab.py", 512, "call")
    events = [
        {"action": "free_completed", "addr": 99, "size": 1000, "frames": []},  # allocated before the trace
        {"action": "alloc", "addr": 1, "size": 100, "frames": frames(plumbing, mine)},
        {"action": "alloc", "addr": 2, "size": 50, "frames": frames(generated, mine)},
        {"action": "free_completed", "addr": 2, "size": 50, "frames": []},
        {"action": "alloc", "addr": 3, "size": 300, "frames": frames(plumbing, mine)},
        {"action": "alloc", "addr": 4, "size": 200, "frames": frames(generated)},
        {"action": "free_completed", "addr": 3, "size": 300, "frames": []},
        {"action": "alloc", "addr": 5, "size": 10, "frames": frames(plumbing)},
    ]
    info = peak_sites(events)
    assert info["peak_bytes"] == 600
    assert info["sites"] == [("model.py:70 forward", 2, 400), ("cab.py:512 call", 1, 200)]
    assert site_of(frames(plumbing)) == "?"
    md = render([{"model": "m", "impl": "ours", "attention": "flash", "compile": True, "peak_sites": info}])
    assert "`model.py:70 forward` | 2 | 0.000" in md


def test_memory_peak_site_skips_cpp_frames():
    """Frames as the allocator records them (innermost first, C++ before Python when recorded)."""
    from benchmarks.memory_peak import site_of

    def here():
        return torch._C._profiler.gather_traceback(python=True, script=True, cpp=True)

    tb = torch._C._profiler.symbolize_tracebacks([here()])[0]
    assert site_of(tb).startswith("test_benchmarks.py:") and site_of(tb).endswith(" here")


def test_memory_peak_needs_a_gpu():
    from benchmarks.memory_peak import record

    if ON_GPU:
        pytest.skip("checks the CPU-only error")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        record(lambda: None)


def test_decoder_probe_needs_a_gpu():
    from benchmarks import decoder_probe

    if ON_GPU:
        pytest.skip("checks the CPU-only error")
    with pytest.raises(SystemExit, match="machine with a CUDA GPU"):
        decoder_probe.main([])


def test_launch_overhead_needs_a_gpu():
    from benchmarks import launch_overhead

    if ON_GPU:
        pytest.skip("checks the CPU-only error")
    with pytest.raises(SystemExit, match="machine with a CUDA GPU"):
        launch_overhead.main([])


@pytest.mark.slow
def test_scale_smoke_runs_train_py(tmp_path):
    """benchmarks.scale's command lines, tiny on a CPU: 2 gloo processes (DDP) through torchrun, and a run
    that cannot run here (cuda without a GPU) gets a row saying so."""
    from benchmarks import scale

    result = scale.main(["--preset", "smoke", "--runs", "flash_ddp2", "cuda_eager", "--out", str(tmp_path)])
    rows = result["rows"]
    r = rows["flash_ddp2"]
    assert r["status"] == "ok", Path(result["paths"]["log"]).read_text()[-3000:]
    assert r["gpus"] == 2 and r["strategy"] == "ddp" and r["batch"] == 16, r
    assert r["images_per_s"] > 0 and r["timed_steps"] > 0 and r["N"] == 65
    assert rows["cuda_eager"]["status"] == "not run: attention=cuda needs a CUDA GPU"
    md = Path(result["paths"]["md"]).read_text()
    assert sum(line.startswith("| ") for line in md.splitlines()) == 2 + 1 and "peak GiB" not in md
    assert "=== flash_ddp2: " in Path(result["paths"]["log"]).read_text()


def test_reproduce_sh_calls_each_benchmark_with_arguments_it_accepts(tmp_path):
    """benchmarks/reproduce.sh with a stand-in python that records its calls: every step's arguments parse
    with the benchmark's own parser; a bad part name and (on a CPU) the real python are refused."""
    import importlib
    import os
    import shlex
    import subprocess

    script, record = ROOT / "benchmarks" / "reproduce.sh", tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exit 0\necho "$@" >> {record}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "OUT": str(tmp_path / "out")}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [shlex.split(line) for line in record.read_text().splitlines()]
    assert [c[1] for c in calls] == ["kernels.cuda.build"] + ["benchmarks.attention"] * 4 + \
        ["benchmarks.launch_overhead"] * 2 + ["benchmarks.flash_bench"] * 2 + ["benchmarks.train"] * 7 + \
        ["benchmarks.scale"]
    for call in calls:
        module = importlib.import_module(call[1])
        if hasattr(module, "parse_args"):
            args = module.parse_args(call[2:])
            assert args.out == tmp_path / "out"
    record.unlink()
    proc = subprocess.run(["bash", str(script), "train_vit", "scale"], env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0 and [shlex.split(line)[1] for line in record.read_text().splitlines()] == \
        ["benchmarks.train", "benchmarks.scale"]
    proc = subprocess.run(["bash", str(script), "everything"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "usage: bash benchmarks/reproduce.sh" in proc.stderr
    if not ON_GPU:
        proc = subprocess.run(["bash", str(script)], env={**env, "PYTHON": sys.executable}, capture_output=True,
                              text=True, check=False)
        assert proc.returncode != 0 and "needs a CUDA GPU" in proc.stderr


def test_readme_result_links_exist():
    """Every benchmarks/results/ file README.md links, and every file of benchmarks/README.md's index of which
    file backs which table, is there (archive/ included)."""
    import re

    results = ROOT / "benchmarks" / "results"
    links = re.findall(r"\]\(benchmarks/results/([^)#]+)\)", (ROOT / "README.md").read_text())
    index = (ROOT / "benchmarks" / "README.md").read_text().split("## Results")[1].split("\n## ")[0]
    files = [name for row in index.splitlines() if row.startswith("| ") and "file in" not in row
             for name in re.findall(r"`([^`]+\.(?:md|log|png))`", row.split(" | ")[1])]
    assert len(links) > 10 and len(files) > 10, (links, files)
    missing = [name for name in links + files if not (results / name).is_file()]
    assert not missing, f"named in README.md or benchmarks/README.md's index but not in benchmarks/results/: {missing}"


def test_flash_bench_sweep_shapes_parse_and_refuse_bad_ones(monkeypatch, capsys):
    """``flash_bench.py --sweep --shapes 'B,H,N,d;B,H,N,d'`` (benchmarks.attention's syntax): four positive integers
    each, else argparse's error with parse_shapes' message."""
    from benchmarks import flash_bench

    assert attn_bench.parse_shapes("8,12,4097,64;32,12,1024,64") == [(8, 12, 4097, 64), (32, 12, 1024, 64)]
    for bad in ("8,12,4097", "8,12,0,64", "8,12,x,64"):
        with pytest.raises(ValueError):
            attn_bench.parse_shapes(bad)
        monkeypatch.setattr(sys, "argv", ["flash_bench.py", "--sweep", "--shapes", bad])
        with pytest.raises(SystemExit) as stop:
            flash_bench.main()
        assert stop.value.code == 2  # argparse's usage error, before any CUDA check
        assert bad in capsys.readouterr().err


def test_cuda_resources_reads_ptxas_and_names_kernels():
    """benchmarks.cuda_resources: registers, spills and static shared memory per kernel from a -Xptxas -v report, and
    readable names from the mangled template arguments (dQ mode, TMA, overlap; warps; pingpong)."""
    from benchmarks import cuda_resources as res

    report = """ptxas info    : Compiling entry function '_ZN4vitk15bwd_sm90_kernelILi1ELi64ELi3ELb1ELb0ELb0EEEv14CUtensorMap_stS1_S1_S1_S1_NS_9BwdParamsE' for 'sm_90a'
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 4 barriers, 48 bytes smem
ptxas info    : Compiling entry function '_ZN4vitk10bwd_kernelILi0ELi64ELi8ELb1EEEvNS_9BwdParamsE' for 'sm_80'
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 227 registers, used 1 barriers, 624 bytes cmem[0]"""
    rows = res.ptxas_rows(report)
    sm90, sm80 = rows
    assert rows[sm90] == {"spills": 0, "registers": 168, "static_smem": 48}
    assert rows[sm80] == {"spills": 12, "registers": 227, "static_smem": 0}
    smem = {("bwd", 64, 3, 1, 0): 166912, ("bwd", 64, 3, 1, 1): 199680, ("bwd80", 64, 8): 93184}
    assert res.describe("bwd_sm90_hdim64_bf16", sm90, smem) == ("bwd_sm90 bf16 d64 dQ rows tma", 166912)
    assert res.describe("bwd_hdim64_fp16", sm80, smem) == ("bwd fp16 d64 8 warps deterministic", 93184)
    pp = sm90.replace("Li3ELb1ELb0", "Li3ELb1ELb1")  # OVERLAP with the row split: the ping-pong consumer
    assert res.describe("bwd_sm90_hdim64_bf16", pp, smem) == ("bwd_sm90 bf16 d64 dQ rows tma pingpong", 199680)
    walk = sm90.replace("ELb0ELb0EEEv", "ELb0ELb0ELb1EEEv")  # PERSIST: the key-tile walk, its twin's smem
    assert res.describe("bwd_sm90_hdim64_bf16", walk, smem) == ("bwd_sm90 bf16 d64 dQ rows tma persistent", 166912)
    det = sm90.replace("ELb0ELb0EEEv", "ELb0ELb1EEEv")  # SPLITS: the deterministic kernel (dq slices), its twin's smem
    assert res.describe("bwd_sm90_hdim64_bf16", det, smem) == ("bwd_sm90 bf16 d64 dQ rows tma deterministic", 166912)
    cols = sm90.replace("Li64ELi3ELb1ELb0", "Li128ELi1ELb1ELb1")
    assert res.describe("bwd_sm90_hdim128_bf16", cols, {("bwd", 128, 1, 1, 1): 197632}) == (
        "bwd_sm90 bf16 d128 dQ columns tma pingpong", 197632)
    fwd = "_ZN4vitk15fwd_sm90_kernelILi1ELi128ELi1ELi2ELb0EEEv14CUtensorMap_stS1_S1_NS_9FwdParamsE"
    assert res.describe("fwd_sm90_hdim128_bf16", fwd, {("fwd", 128, 2, 128): 164864}) == ("fwd_sm90 bf16 d128 pingpong",
                                                                                    164864)
    wide = "_ZN4vitk15fwd_sm90_kernelILi0ELi64ELi2ELi3ELb0EEEv14CUtensorMap_stS1_S1_NS_9FwdParamsE"
    assert res.describe("fwd_sm90_hdim64_fp16", wide, {("fwd", 64, 3, 128): 91136}) == ("fwd_sm90 fp16 d64 wide", 91136)
    persistent = wide.replace("Li2ELi3ELb0", "Li0ELi2ELb1")
    assert res.describe("fwd_sm90_hdim64_fp16", persistent, {("fwd", 64, 2, 128): 66560}) == (
        "fwd_sm90 fp16 d64 persistent", 66560)
    short = wide.replace("Li2ELi3ELb0", "Li3ELi2ELb1")  # the 208-key tiles: their own shared memory
    assert res.describe("fwd_sm90_hdim64_fp16", short, {("fwd", 64, 2, 128): 66560, ("fwd", 64, 2, 208): 123904}) == (
        "fwd_sm90 fp16 d64 short persistent", 123904)
    dq = "_ZN4vitk13bwd_dq_kernelILi1ELi64EEEvNS_9BwdParamsE"  # named apart from the forward (it was once "fwd")
    assert res.describe("bwd_sm90_hdim64_bf16", dq, smem) == ("dq from dq_accum bf16 d64", 0)
