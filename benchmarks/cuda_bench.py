"""Focused benchmark for the CUDA C++ backend: attention beside SDPA's flash (and cuDNN) backends,
and the vector-add example beside torch.add and a device-to-device copy.

    python benchmarks/cuda_bench.py [--json out.json] [--attention-only] [--skip BACKEND ...] [--only BACKEND ...]
                                    [--rounds R]

Attention: bf16, non-causal; FLOPs forward 4·B·H·N²·d, forward+backward 3.5× that. Our rows:
``cuda-sm80`` (mma.sync kernels, backward with 8 warps) and, on compute capability 9.0,
``cuda-sm90`` (the Hopper forward, csrc/fwd_sm90.cuh, with the mma.sync backward) and
``cuda-sm90-bwd90`` (Hopper forward and backward, csrc/bwd_sm90.cuh) ``cuda-sm90-dqcols`` (the same with
the column-split dQ, VIT_CUDA_BWD_DQ=columns; head_dim 128 only), ``cuda-sm90-dqtma`` and ``cuda-sm90-dqcols-tma``
(those two with dQ added by TMA reduce-add instead of atomics, VIT_CUDA_BWD_DQ=tma / columns-tma;
``cuda-sm90-dqcols-tma-pingpong``: its products issued by the two consumers in turn, VIT_CUDA_BWD_SM90=pingpong),
``cuda-sm90-overlap`` and ``cuda-sm90-dqtma-overlap`` (the Hopper backward's overlapped consumer, VIT_CUDA_BWD_SM90=overlap,
with atomic or TMA dQ; head_dim 64 only), ``cuda-sm90-dqsum*`` (the two consumers' dQ summed in shared memory and
added once, VIT_CUDA_BWD_DQ=sum / sum-tma; head_dim 64 only), ``cuda-sm90-dqrows*`` (128 query rows a step, dQ
split by rows across the consumers, VIT_CUDA_BWD_DQ=rows / rows-tma; head_dim 64 only; ``-pingpong``: its products issued
by the two consumers in turn, VIT_CUDA_BWD_SM90=pingpong), ``cuda-sm90-pingpong`` (the Hopper forward's
pipelined consumers, VIT_CUDA_FWD_SM90=pingpong, with the mma.sync backward), ``cuda-sm90-wide`` (its three consumer
warpgroups, VIT_CUDA_FWD_SM90=wide, head_dim 64, with auto's backward), ``cuda-sm90-persistent`` (its two sequential
consumers in one persistent CTA an SM, VIT_CUDA_FWD_SM90=persistent, with auto's backward),
``cuda-sm90-persistent-pingpong`` (its ping-pong consumers so, VIT_CUDA_FWD_SM90=persistent-pingpong, with auto's
backward), ``cuda-sm90-bwd-persistent``
(the backward's sequential consumers in CTAs walking key tiles, VIT_CUDA_BWD_SM90=persistent, with auto's forward) and
``cuda-auto`` (the default
rules of kernels/cuda/ops.py), ``cuda-auto-bwd-sequential`` (the same with the backward's sequential consumers, what
auto's ping-pong backward is measured against) and ``cuda-auto-deterministic`` (the same with ``deterministic=True``:
the Hopper backward's dq slices, ops.sm90_dq_splits, where auto runs it, else the mma.sync one's). ``fwd err`` is
max |out − SDPA flash's out| on the first input set. Vector add: bytes = 3 · 4 · n (two reads, one write);
copy = 2 · 4 · n. GPU time by CUDA events: 3 warm-ups, then 20 calls enqueued back to back with an event pair each and
one synchronize at the end (host work overlapped, as a training loop runs them), the median; inputs rotated over two
sets larger than the 60 MB L2 together. Until 2026-12-07 each call synchronized before the next, so each call's time
also counted the host's dispatch up to its first kernel and any gap after it; cuDNN's fwd+bwd at (256, 12, 197, 64)
then read 0.88-1.06 ms across four H100 runs (benchmarks/results/h100_20261207b.md), a spread that host time would
explain (not shown). ``--only NAME`` (repeatable) runs the named rows and the two peers, ``--skip NAME`` leaves a row
out; a name this GPU has no row for is an error. ``--rounds R`` times every row R times,
the rows of a shape interleaved and their order rotated each round, and reports the median round with the spread
(max − min over the median) of fwd+bwd.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.cuda import attention as cuda_attention
from kernels.cuda import ops
from kernels.vector_add import add_cuda, add_torch, add_triton

# Rows run in the order of `backends` per shape, peers first: a kernel that faults poisons the CUDA context for every
# later row.
SHAPES = [(8, 12, 4096, 64), (256, 12, 197, 64), (2, 12, 16384, 64), (64, 12, 577, 64), (8, 16, 4096, 128),
          (256, 12, 197, 128)]


def time_ms(fn, args_list, warmup=3, rep=20) -> float:
    """Median GPU milliseconds of ``fn(*args_list[i % len])`` over ``rep`` calls enqueued back to back (an event pair
    each, one synchronize at the end) after ``warmup`` untimed calls."""
    for i in range(warmup):
        fn(*args_list[i % len(args_list)])
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(rep)]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(*args_list[i % len(args_list)])
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def sdpa(backend):
    def fn(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)
    return fn


def cuda_with(fwd_path, bwd_path="sm80", bwd_warps=8, bwd_dq="atomic", deterministic=False, fwd_sm90="sequential",
              bwd_sm90="sequential"):
    def fn(q, k, v):
        ops.FWD_PATH, ops.BWD_PATH, ops.BWD_WARPS, ops.BWD_DQ = fwd_path, bwd_path, bwd_warps, bwd_dq  # read at run time
        ops.FWD_SM90, ops.BWD_SM90 = fwd_sm90, bwd_sm90
        return cuda_attention(q, k, v, deterministic=deterministic)
    return fn


PEERS = ("sdpa-flash", "sdpa-cudnn")


def select_rows(names, only=(), skip=()) -> list[str]:
    """The rows of ``names`` to run, in their order: those in ``only`` (every one if empty) and the peers, less those
    in ``skip``. Raises ValueError naming the known rows if ``only`` or ``skip`` names one not in ``names``."""
    unknown = sorted(set(only) - set(names)) + sorted(set(skip) - set(names))
    if unknown:
        raise ValueError(f"no benchmark row named {', '.join(unknown)} on this GPU; its rows: {', '.join(names)}")
    return [n for n in names if (not only or n in only or n in PEERS) and n not in skip]


def bench_attention(skip=(), rounds=1, only=()):
    # Peers first: a kernel of ours that faults poisons the CUDA context for every later row.
    backends = {"sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                "cuda-sm80": cuda_with("sm80")}
    if torch.cuda.get_device_capability() == (9, 0):
        backends["cuda-sm90"] = cuda_with("sm90")
        backends["cuda-sm90-bwd90"] = cuda_with("sm90", "sm90")
        backends["cuda-sm90-pingpong"] = cuda_with("sm90", fwd_sm90="pingpong")
        # three consumer warpgroups in the forward (head_dim 64), with auto's backward: differs from cuda-auto in it
        backends["cuda-sm90-wide"] = cuda_with("sm90", "auto", bwd_dq="auto", fwd_sm90="wide", bwd_sm90="auto")
        # persistent CTAs in the sequential forward, with auto's backward
        backends["cuda-sm90-persistent"] = cuda_with("sm90", "auto", bwd_dq="auto", fwd_sm90="persistent",
                                                     bwd_sm90="auto")
        # the persistent sequential forward with 208-key tiles (head_dim 64: N <= 208 in one tile), auto's backward
        backends["cuda-sm90-short"] = cuda_with("sm90", "auto", bwd_dq="auto", fwd_sm90="short", bwd_sm90="auto")
        # the ping-pong consumers in persistent CTAs (the forward), with auto's backward
        backends["cuda-sm90-persistent-pingpong"] = cuda_with("sm90", "auto", bwd_dq="auto",
                                                              fwd_sm90="persistent-pingpong", bwd_sm90="auto")
        # the backward's CTAs walking key tiles (ops.sm90_key_ctas), with auto's forward
        backends["cuda-sm90-bwd-persistent"] = cuda_with("sm90", "sm90", bwd_dq="auto", fwd_sm90="auto",
                                                         bwd_sm90="persistent")
        backends["cuda-auto"] = cuda_with("auto", "auto", bwd_dq="auto", fwd_sm90="auto", bwd_sm90="auto")
        backends["cuda-auto-bwd-sequential"] = cuda_with("auto", "auto", bwd_dq="auto", fwd_sm90="auto",
                                                         bwd_sm90="sequential")
        backends["cuda-auto-deterministic"] = cuda_with("auto", "auto", bwd_dq="auto", deterministic=True,
                                                        fwd_sm90="auto", bwd_sm90="auto")
        backends["cuda-sm90-dqcols"] = cuda_with("sm90", "sm90", bwd_dq="columns")
        backends["cuda-sm90-dqtma"] = cuda_with("sm90", "sm90", bwd_dq="tma")
        backends["cuda-sm90-dqcols-tma"] = cuda_with("sm90", "sm90", bwd_dq="columns-tma")
        backends["cuda-sm90-overlap"] = cuda_with("sm90", "sm90", bwd_sm90="overlap")
        backends["cuda-sm90-dqtma-overlap"] = cuda_with("sm90", "sm90", bwd_dq="tma", bwd_sm90="overlap")
        backends["cuda-sm90-dqsum"] = cuda_with("sm90", "sm90", bwd_dq="sum")
        backends["cuda-sm90-dqsum-tma"] = cuda_with("sm90", "sm90", bwd_dq="sum-tma")
        backends["cuda-sm90-dqsum-tma-overlap"] = cuda_with("sm90", "sm90", bwd_dq="sum-tma", bwd_sm90="overlap")
        backends["cuda-sm90-dqrows"] = cuda_with("sm90", "sm90", bwd_dq="rows")
        backends["cuda-sm90-dqrows-tma"] = cuda_with("sm90", "sm90", bwd_dq="rows-tma")
        # the forward as cuda-auto's; where auto takes the ping-pong backward (head_dim 128, and 64 from N = 512) these
        # rows are cuda-auto
        backends["cuda-sm90-dqrows-tma-pingpong"] = cuda_with("sm90", "sm90", bwd_dq="rows-tma", fwd_sm90="auto",
                                                              bwd_sm90="pingpong")
        backends["cuda-sm90-dqcols-tma-pingpong"] = cuda_with("sm90", "sm90", bwd_dq="columns-tma", fwd_sm90="auto",
                                                              bwd_sm90="pingpong")
    keep = select_rows(list(backends), only, skip)
    return bench_shapes({name: backends[name] for name in keep}, rounds)


def runs_at(name: str, d: int) -> bool:
    """Whether backend row ``name`` has a kernel at head_dim ``d`` (the column split at 128, some at 64 only)."""
    d64_only = name.endswith(("overlap", "wide", "short")) or name.startswith(("cuda-sm90-dqsum", "cuda-sm90-dqrows"))
    return not ((name.startswith("cuda-sm90-dqcols") and d != 128) or (d64_only and d != 64))


def time_pair(fn, sets) -> tuple[float, float]:
    """(forward ms, forward+backward ms) of ``fn`` on the rotated input ``sets``."""
    fwd = time_ms(lambda q, k, v, do: fn(q.detach(), k.detach(), v.detach()), sets)
    fwd_bwd = time_ms(lambda q, k, v, do: torch.autograd.grad(fn(q, k, v), (q, k, v), do), sets)
    return fwd, fwd_bwd


def bench_shapes(backends, rounds=1) -> list[dict]:
    """One row per (shape, backend) of ``backends``, shapes outermost. Round 0 runs the rows in the order given (peers
    first); rounds 1.. rotate that order. Each row reports its median forward and forward+backward over the rounds and
    the fwd+bwd spread, (max − min) / median."""
    rows = []
    for B, H, N, d in SHAPES if backends else []:
        sets = []
        for _ in range(2):
            q, k, v, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            sets.append((q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do))
        flops = 4 * B * H * N * N * d
        q, k, v, _ = sets[0]
        with torch.no_grad():
            reference = sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v).float()
        errs, times = {}, {}
        for name, fn in backends.items():
            if not runs_at(name, d):
                continue
            try:
                with torch.no_grad():
                    errs[name] = (fn(q, k, v).float() - reference).abs().max().item()
                times[name] = [time_pair(fn, sets)]
            except RuntimeError as exc:  # a backend PyTorch cannot run at this shape
                print(f"{name} {B, H, N, d}: {exc}")
        names = list(times)
        for r in range(1, rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(time_pair(backends[name], sets))
        for name, pairs in times.items():
            fwd, fwd_bwd = (statistics.median(t[i] for t in pairs) for i in (0, 1))
            spread = (max(t[1] for t in pairs) - min(t[1] for t in pairs)) / fwd_bwd
            rows.append({"B": B, "H": H, "N": N, "d": d, "backend": name, "fwd_ms": fwd, "fwd_tflops": flops / fwd / 1e9,
                         "fwd_bwd_ms": fwd_bwd, "fwd_bwd_tflops": 3.5 * flops / fwd_bwd / 1e9, "fwd_err": errs[name],
                         "rounds": len(pairs), "fwd_bwd_spread": spread})
        del reference
        del sets
        torch.cuda.empty_cache()
    return rows


def bench_vector_add(n=1 << 28):
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c, d = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    dst = torch.empty(n, device="cuda")
    copy_ms = time_ms(lambda x: dst.copy_(x), [(a,), (c,)])
    copy_gbs = 2 * 4 * n / copy_ms / 1e6
    rows = [{"kernel": "copy (d2d)", "ms": copy_ms, "gbs": copy_gbs, "of_copy": 1.0}]
    for name, fn in (("cuda", add_cuda), ("triton", add_triton), ("torch.add", add_torch)):
        assert torch.equal(fn(a, b), a + b), name
        ms = time_ms(fn, [(a, b), (c, d)])
        gbs = 3 * 4 * n / ms / 1e6
        rows.append({"kernel": name, "ms": ms, "gbs": gbs, "of_copy": gbs / copy_gbs})
    return n, rows


def versus(peers: dict, row: dict, name: str, key: str) -> str:
    """Peer ``name``'s time ``key`` over ``row``'s, as "1.23x"; "n/a" where that peer was not run."""
    return f"{peers[name][key] / row[key]:.2f}x" if name in peers else "n/a"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--attention-only", action="store_true", help="skip the vector-add table")
    parser.add_argument("--skip", action="append", default=[], help="leave out this backend row (repeatable)")
    parser.add_argument("--only", action="append", default=[], help="run this row and the peers only (repeatable)")
    parser.add_argument("--rounds", type=int, default=1, help="time every row this many times, interleaved (≥ 1)")
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    try:
        attn = bench_attention(skip=args.skip, rounds=args.rounds, only=args.only)
    except ValueError as exc:
        parser.error(str(exc))
    print("\n| B | H | N | d | backend | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | fwd vs cudnn "
          "| fwd+bwd vs cudnn | fwd+bwd vs sdpa-flash | fwd err | fwd+bwd spread |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in attn:
        peer = {x["backend"]: x for x in attn if (x["B"], x["N"], x["d"]) == (r["B"], r["N"], r["d"])}
        vs = functools.partial(versus, peer, r)
        print(f"| {r['B']} | {r['H']} | {r['N']} | {r['d']} | {r['backend']} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.0f} "
              f"| {r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_tflops']:.0f} | {vs('sdpa-cudnn', 'fwd_ms')} "
              f"| {vs('sdpa-cudnn', 'fwd_bwd_ms')} | {vs('sdpa-flash', 'fwd_bwd_ms')} "
              f"| {r['fwd_err']:.1e} | {r['fwd_bwd_spread']:.0%} ({r['rounds']}) |")
    if args.attention_only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "attention": attn}, f, indent=1)
        return
    n, vadd = bench_vector_add()
    print(f"\nvector add, float32, n = {n} ({4 * n / 2**30:.0f} GiB per tensor)\n")
    print("| kernel | ms | GB/s | of copy |\n|---|---|---|---|")
    for r in vadd:
        print(f"| {r['kernel']} | {r['ms']:.3f} | {r['gbs']:.0f} | {r['of_copy']:.0%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "attention": attn,
                           "vector_add": {"n": n, "rows": vadd}}, f, indent=1)


if __name__ == "__main__":
    main()
