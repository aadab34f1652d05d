"""The CUDA kernels as ``torch.library`` custom ops, with fake (meta) kernels and autograd.

``vit_cuda::attn_fwd(q, k, v, softmax_scale, deterministic) -> (out, lse)`` (the Hopper or the mma.sync
forward, as :func:`fwd_path` picks at run time) and
``vit_cuda::attn_bwd(dout, q, k, v, out, lse, softmax_scale, bwd_warps, dq_splits) -> (dq, dk, dv)`` (the
Hopper or the mma.sync backward, as :func:`bwd_path` picks; bwd_warps is the mma.sync tile; dq_splits > 0, from
``deterministic``, the deterministic mode of either, :func:`backward_splits`): raw launchers over
``csrc/api.cpp``. Their packed twins ``vit_cuda::attn_fwd_qkvpacked(qkv, softmax_scale, deterministic)`` and
``vit_cuda::attn_bwd_qkvpacked(dout, qkv, out, lse, softmax_scale, bwd_warps, dq_splits) -> dqkv`` take the ViT's
``(B, N, 3, H, d)`` qkv, and the backward writes dq, dk, dv into one gradient of that shape (no stack of three). The fake kernels give ``torch.compile`` the output shapes (all outputs
contiguous but out, which is ``(B, N, H, d)`` in memory; lse is float32 ``(B, H, N)``), so a compiled model traces through with no graph break.
Autograd saves q, k, v, out and lse only (FlashAttention-2's recomputation).
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from .. import split_qkv
from .build import extension

# Warps per CTA of the dK/dV kernel (16 key rows each): 4 -> 64 keys per CTA, 2 CTAs per SM
# (247 registers); 8 -> 128 keys per CTA, half the dQ atomics and Q/dO re-reads, 1 CTA per SM.
# H200, bf16, fwd+bwd: 8 warps 6.42 ms vs 4 warps 6.93 ms at (8, 12, 4096, 64); 1.37 ms both at
# (256, 12, 197, 64) (benchmarks/results/cuda_h200.md). Override with VIT_CUDA_BWD_WARPS=4.
BWD_WARPS = int(os.environ.get("VIT_CUDA_BWD_WARPS", "8"))
if BWD_WARPS not in (4, 8):
    raise ValueError(f"VIT_CUDA_BWD_WARPS must be 4 or 8 (warps per CTA of the dK/dV kernel), got {BWD_WARPS}")
# Which kernels: "auto" (the rules below), "sm80" (mma.sync everywhere) or "sm90" (Hopper's
# wgmma/TMA kernels; an error where they cannot run).
FWD_PATH = os.environ.get("VIT_CUDA_FWD", "auto")
BWD_PATH = os.environ.get("VIT_CUDA_BWD", "auto")
PATHS = ("auto", "sm80", "sm90")
SM90_HEAD_DIMS = (64, 128)
# auto on compute capability 9.0 (H200, bf16, ms; benchmarks/results/h200_20261204_b.md, two runs of cuda_bench):
# - forward sm90 at seq_len >= 128 (one 128-row tile; 197 is the shortest measured), head_dim 64 and 128 (80, 96
#   padded): forward alone (64, 12, 577, 64) 0.303 / 0.296 vs mma.sync 0.376 / 0.418, (256, 12, 197, 128) 0.405 vs
#   0.527; (256, 12, 197, 64) a tie, 0.310 / 0.275 vs 0.351 / 0.270 (fwd+bwd 1.353 / 1.163 vs 1.362 / 1.317); at
#   N >= 4096 0.88-0.98x cuDNN's forward against 0.37-0.57x for mma.sync (cuda_h200.md, 2026-12-01).
# - backward sm90 at head_dim 64 and 128 from the same seq_len: fwd+bwd with the sm90 forward, (8, 16, 4096, 128)
#   10.396 vs 14.910 for the mma.sync backward, (256, 12, 197, 128) 1.772 vs 2.034; head_dim 64 with the row-split dQ
#   (rows-tma) vs the mma.sync backward: (8, 12, 4096) 4.122 vs 5.789, (2, 12, 16384) 15.289 vs 22.185,
#   (64, 12, 577) 1.116 vs 1.542, (256, 12, 197) 1.054 vs 1.217 (h200_20261204_d.md, call 1).
SM90_MIN_SEQ_LEN = 128
# dQ in the Hopper backward (csrc/bwd_sm90.cuh): "atomic" (each consumer warpgroup adds dS·K over its own 64 keys by
# float32 atomics), "columns" (each adds 64 of dQ's columns over all 128 keys: half the adds; head_dim 128 only),
# "tma" and "columns-tma" (the same products stored into a shared-memory staging box and added by TMA reduce-add,
# DQ_TMA), "sum" and "sum-tma" (head_dim 64: the two consumers' dQ summed in shared memory and added once a step,
# kDqSum), "rows" and "rows-tma" (head_dim 64: 128 query rows a step instead of 64, FlashAttention-3's head_dim-64
# tile, with consumer w adding dQ's rows 64w.. over all 128 keys, kDqRows).
# "auto": columns-tma at head_dim 128, rows-tma at 64. H200, bf16, fwd+bwd ms: (8, 16, 4096, 128) columns-tma 10.669,
# tma 10.827, columns 11.817 (h200_20261204_b.md); head_dim 64 rows-tma against rows and sum-tma
# (h200_20261204_d.md, call 1): (8, 12, 4096) 4.122 vs 4.365, 5.929; (2, 12, 16384) 15.289 vs 16.186, 21.482;
# (64, 12, 577) 1.116 vs 1.147, 1.593; (256, 12, 197) 1.054 vs 1.065, 1.329; atomic 7.086 and 25.882 at the first two
# (h200_20261204_b.md).
BWD_DQ = os.environ.get("VIT_CUDA_BWD_DQ", "auto")
BWD_DQ_MODES = ("auto", "atomic", "columns", "tma", "columns-tma", "sum", "sum-tma", "rows", "rows-tma")
# The Hopper backward's consumer schedule: "sequential" (Sᵀ and dPᵀ, then their softmax) or "overlap" (head_dim 64:
# Pᵀ's exponentials under dPᵀ's wgmma, bitwise the same results; at 128 it runs out of registers). Overlap measured
# slower at every shape (h200_20261204_b.md, fwd+bwd ms, atomic dQ): (8, 12, 4096, 64) 7.666 vs 7.086,
# (2, 12, 16384, 64) 27.520 vs 25.882, (256, 12, 197, 64) 1.736 vs 1.545. It applies where the Hopper backward runs:
# with 64 query rows a step, so not with the row-split dQ that auto runs at head_dim 64. "pingpong" (with rows-tma at
# head_dim 64, columns-tma at 128, the auto dQ modes there): the products issued by the two consumers in turn, each
# one's softmax under the other's products, dQ one step late (csrc/bwd_sm90.cuh, bwd_sm90_consume_pp).
# "auto": pingpong at head_dim 128 (80, 96 padded) with columns-tma, and at 64 with rows-tma from N = 512 (below), else
# sequential. It ran pingpong at 128 only from these runs: H200, bf16, fwd+bwd ms with
# cuda-auto's forward, two runs, pingpong vs sequential (benchmarks/results/h200_20261207/call1_bench*.log): d=128
# (8, 16, 4096) 9.341 / 9.387 vs 10.361 / 10.285, (256, 12, 197) 1.625 / 1.649 vs 1.727 / 1.733; d=64 (8, 12, 4096)
# 4.017 / 3.953 vs 4.132 / 4.074, (2, 12, 16384) 15.207 / 15.075 vs 15.296 / 15.278, (64, 12, 577) 1.059 / 1.162 vs
# 1.168 / 1.091, (256, 12, 197) 1.093 / 1.062 vs 1.033 / 0.988; ViT-B/16 training at 1024 px (N = 4097, d = 64),
# batch 8, vs timm + SDPA: eager +3.6 % vs +4.0 %, compiled -0.4 % vs -0.8 % (call2b, call3): at 64 no clear gain.
# Since the ping-pong consumer issues its batches in the ordered step's order, at head_dim 64 it was faster at N = 577
# and 4096 in three runs of three, at 16384 in two (the threshold between 197 and 577 is not measured).
# H100, bf16, fwd+bwd ms with cuda-auto's forward, three runs, pingpong vs sequential
# (benchmarks/results/h100_20261207d/call1_bench_wip{1,2}.log, call2_bench_wip.log): (8, 12, 4096) 3.275 / 3.230 /
# 3.216 vs 3.523 / 3.405 / 3.406, (2, 12, 16384) 13.020 / 12.850 / 12.144 vs 12.964 / 13.112 / 13.096, (64, 12, 577)
# 0.919 / 0.907 / 0.919 vs 0.951 / 0.939 / 0.948, but (256, 12, 197) 0.879 / 0.881 / 0.881 vs 0.863 / 0.864 / 0.863;
# ViT-B/16 at 1024 px, batch 8, one run each, eager 86 vs 85 img/s, compiled 95 vs 93 (call4; other runs of the old
# choice read 84 and 93): auto runs it where
# :func:`pingpong_bwd_pays`.
# "persistent" (rows-tma at head_dim 64, columns-tma at 128): the sequential consumers in fewer CTAs, each walking key
# tiles of its (batch, head) (sm90_key_ctas counts them). Opt-in: H100, fwd+bwd ms vs auto in one run
# (benchmarks/results/h100_20261207b/call4_bench.log) 3.911 vs 4.002 at (8, 12, 4096, 64), 14.765 vs 15.256 at
# (2, 12, 16384, 64), but 1.105 vs 1.080 at (256, 12, 197, 64) and 8.707 vs 8.669 at (8, 16, 4096, 128). With the
# ordered step (benchmarks/results/h100_20261207c/call1_bench_wip{1,2}.log) it lost at long N: 3.491 / 3.567 vs
# 3.400 / 3.411 at (8, 12, 4096, 64), 14.510 / 14.547 vs 12.804 at (2, 12, 16384, 64); 0.847 vs 0.860-0.864 at 197.
BWD_SM90 = os.environ.get("VIT_CUDA_BWD_SM90", "auto")
BWD_SM90_MODES = ("auto", "sequential", "overlap", "pingpong", "persistent")
# The Hopper forward's consumer schedule (csrc/fwd_sm90.cuh): "sequential" (S, softmax, P·V in turn), "pingpong"
# (FlashAttention-3's ping-pong and intra-warpgroup overlap) or "auto" (:func:`sm90_forward`). Auto took pingpong at
# head_dim 128 (80, 96 padded) and sequential at 64 from these runs: H200, bf16, forward TFLOP/s, pingpong vs
# sequential: d=128 (8, 16, 4096) 585 vs 546; d=64 (8, 12, 4096) 343 vs 424, (2, 12, 16384) 409 vs 471
# (benchmarks/results/h200_20261202/call1_cuda_bench.log).
# "wide" (head_dim 64): sequential with three consumer warpgroups, 192 query rows a CTA (FlashAttention-3's head_dim-64
# forward tile height); auto picks it at head_dim 64 where its CTAs hold no more 64-row consumer tiles than the two-
# consumer kernel's (within 5 %: :func:`wide_pays`). H100, bf16, forward ms, wide vs sequential, two runs
# (benchmarks/results/h100_20261207/call1_bench*.log): (8, 12, 4096) 0.853 / 0.903 vs 0.939 / 0.922, (2, 12, 16384)
# 3.258 / 3.290 vs 3.517 / 3.406; but (256, 12, 197) 0.322 / 0.325 vs 0.280 / 0.280 (6 consumer tiles a head where
# sequential has 4), (64, 12, 577) 0.297 / 0.309 vs 0.289 / 0.305 (12 vs 10).
FWD_SM90 = os.environ.get("VIT_CUDA_FWD_SM90", "auto")
# "persistent": sequential with one CTA an SM looping over the Q tiles, as cuDNN's Hopper kernels run; auto picks it
# where the others' CTAs are few a head (:func:`persistent_pays`: N <= 1024 at head_dim 128; at 64 where wide does not
# pay, as "short" below). H100, bf16, forward ms, persistent vs sequential / pingpong / wide, batch so that B·N is about 50k
# (benchmarks/results/h100_20261207b/call3_sweep.log): d=64 (256, 12, 197) 0.196 vs 0.241 / 0.239 / 0.279, (128, 12,
# 401) 0.294 vs 0.333 / 0.354 / 0.321, (64, 12, 577) 0.221 vs 0.244 / 0.262 / 0.252, (32, 12, 785) 0.204 vs 0.218 /
# 0.238 / 0.205, but (8, 12, 4096) 0.964 vs wide 0.865; d=128 (256, 12, 197) 0.292 vs 0.344 / 0.333, (64, 12, 577)
# 0.344 vs 0.378 / 0.368, (32, 12, 1025) 0.514 vs pingpong 0.513, (8, 16, 4096) 1.994 vs pingpong 1.948.
# "persistent-pingpong": the ping-pong consumers in persistent CTAs, their turns running on from one Q tile to the next.
# auto picks it at head_dim 128 past N = 1024, since its softmax runs under P·V there too (fwd_sm90.cuh's brkpt block
# boundary); measured at N = 4096 only, not between 1025 and 4096. H100, bf16, forward ms vs pingpong (auto's before),
# three runs (benchmarks/results/h100_20261207d/call1_bench_wip{1,2}.log, call2_bench_wip.log): (8, 16, 4096, 128)
# 1.667 / 1.676 / 1.833 vs 1.821 / 1.829 / 1.865;
# (256, 12, 197, 128) 0.285 / 0.285 / 0.287 vs persistent 0.282 / 0.292 / 0.293, where auto keeps persistent. Slower at
# head_dim 64: 0.955-1.006 vs wide 0.829-0.860 at (8, 12, 4096, 64).
# "short" (head_dim 64): the persistent sequential forward with 208-key tiles, so that N <= 208 (ViT at 224 px: 197)
# is one key tile, not 128 + 69 keys: 19 % fewer S and P·V products at N = 197 and one softmax pass. auto picks it where
# the persistent forward pays at head_dim 64 (N = 197 to 785). H100, bf16, forward ms, short vs persistent, four runs
# (two of them with tails.patch, which does not change either; benchmarks/results/h100_20261207f/call1_bench_*.log):
# (256, 12, 197) 0.184 / 0.184 / 0.179 / 0.178 vs 0.193 / 0.193 / 0.188 / 0.189, (64, 12, 577) 0.224 / 0.221 / 0.223 /
# 0.225 vs 0.229 / 0.225 / 0.238 / 0.240; N = 401 and 785 not measured.
FWD_SM90_MODES = ("auto", "sequential", "pingpong", "wide", "persistent", "persistent-pingpong", "short")


@functools.cache
def _capability_of(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _capability(device: torch.device) -> tuple[int, int]:
    return _capability_of(_index(device))


def _choose(setting: str, env: str, q: Tensor) -> str:
    if setting not in PATHS:
        raise ValueError(f"{env} must be one of {PATHS}, got {setting!r}")
    if setting == "sm80":
        return "sm80"
    capability = _capability(q.device)
    hopper = capability == (9, 0)
    head_dim, seq_len = q.shape[-1], q.shape[-2]
    if setting == "auto" and not (hopper and head_dim in SM90_HEAD_DIMS and seq_len >= SM90_MIN_SEQ_LEN):
        return "sm80"
    if not hopper:
        raise RuntimeError(f"{env}=sm90 needs a compute capability 9.0 GPU (H100, H200), this one is "
                           f"{capability[0]}.{capability[1]}; use {env}=auto or sm80")
    if head_dim not in SM90_HEAD_DIMS:
        raise ValueError(f"{env}=sm90 has kernels for head_dim {SM90_HEAD_DIMS}, got {head_dim}; "
                         f"use {env}=auto (head_dim 32 runs the sm80 kernels)")
    if not extension().has_sm90:
        raise RuntimeError("this GPU is compute capability 9.0 but the CUDA extension was built without sm_90a "
                           "kernels; unset TORCH_CUDA_ARCH_LIST or include 9.0 in it and rebuild, or set "
                           f"{env}=sm80")
    return "sm90"


def fwd_path(q: Tensor) -> str:
    """Which forward runs for ``q`` (a CUDA tensor ``(B, H, N, head_dim)``, head_dim 32, 64 or 128
    after padding) under ``FWD_PATH``.

    Returns ``"sm90"`` (csrc/fwd_sm90.cuh) or ``"sm80"`` (csrc/fwd.cuh). ``auto`` takes sm90 on
    compute capability 9.0 at head_dim 64 or 128 and N ≥ ``SM90_MIN_SEQ_LEN``, where it measured
    faster (the comment above it), else sm80.

    Raises:
        ValueError: FWD_PATH (env ``VIT_CUDA_FWD``) is not one of auto, sm80, sm90, or sm90 was asked
            for at head_dim 32.
        RuntimeError: sm90 asked for on a GPU that is not compute capability 9.0, or auto/sm90 would
            run it on a 9.0 GPU but the extension was built without sm_90a kernels (a
            TORCH_CUDA_ARCH_LIST without 9.0).
    """
    return _choose(FWD_PATH, "VIT_CUDA_FWD", q)


def bwd_path(q: Tensor) -> str:
    """Which backward runs (csrc/bwd_sm90.cuh or csrc/bwd.cuh) under ``BWD_PATH`` (env
    ``VIT_CUDA_BWD``): the errors of :func:`fwd_path`; ``auto`` takes sm90 where the forward does."""
    return _choose(BWD_PATH, "VIT_CUDA_BWD", q)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _split_ctas_per_sm(index: int, dtype: torch.dtype, head_dim: int, bwd_warps: int) -> int:
    return extension().bwd_split_ctas_per_sm(dtype == torch.bfloat16, head_dim, bwd_warps, index)


# The dq slices together take at most this many bytes (each is a float32 (B, H, N, d) buffer, zeroed and summed):
# 1 GiB holds the 5 slices that fill one wave at (2, 12, 16384, 64) on 132 SMs, and 32 at (1, 2, 4096, 64).
DQ_SPLITS_BYTES = 1 << 30


def dq_splits(q: Tensor, bwd_warps: int) -> int:
    """The deterministic backward's dq slices s for ``q`` (B, H, N, d) on its GPU: CTA j of a (batch, head) walks
    key tiles j, j + s, ... (tiles of 16·bwd_warps keys) into slice j. Its time goes as waves × tiles per CTA,
    ceil(B·H·s / (SMs · CTAs per SM)) · ceil(tiles / s); the smallest s within 10 % of the best is taken (each
    slice costs a float32 (B, H, N, d) buffer, summed at the end). FlashAttention-2's ceil(SMs / (B·H)) measured
    1.84× the atomic backward's time at (2, 12, 16384, 64) on an H200, where it makes 144 CTAs of one wave's 132:
    a second wave for 12 of them (benchmarks/results/cuda_h200.md)."""
    d = q.shape[-1]
    if d not in (32, 64, 128):
        raise ValueError(f"dq_splits takes q as the kernels get it, head_dim 32, 64 or 128 (others padded), got {d}")
    return _wave_splits(q, 16 * bwd_warps, _split_ctas_per_sm(_index(q.device), q.dtype, d, bwd_warps))


def sm90_dq_splits(q: Tensor) -> int:
    """The Hopper backward's dq slices for ``q`` (B, H, N, d), d 64 or 128, on its GPU: as :func:`dq_splits`, with
    its 128-key tiles and one CTA per SM (its shared memory, over half an SM's, makes it so: a static_assert in
    csrc/bwd_sm90.cuh)."""
    return _wave_splits(q, 128, 1)


# The most key tiles one CTA of the persistent backward walks. Fewer CTAs per (batch, head) put more heads in flight at
# once, each streaming its own Q, dO and dq_accum rows: at (8, 12, 4096, 64) four CTAs a head would hold 33 heads' 1 MiB
# of Q and dO and 1 MiB of dQ, past the 50-60 MB L2. The deterministic walk, which holds 128 heads at once at
# (8, 16, 4096, 128), cost 1.56-1.63x the one-tile kernel at every slice count (h100_20261207.md): a hypothesis for
# why, not profiled. The walk pays where it saves the most CTA starts: heads of few key tiles (N = 197: two).
WALK_MAX_TILES = 4


def sm90_key_ctas(q: Tensor) -> int:
    """VIT_CUDA_BWD_SM90=persistent's CTAs per (batch, head) for ``q`` (B, H, N, d) on its GPU, each walking key tiles
    j, j + c, ... of 128 keys: :func:`splits_for`'s count (whole waves of one CTA an SM, the fewest CTAs within 10 % of
    the best; no memory cap, they share one dq_accum), and enough that none walks more than WALK_MAX_TILES."""
    tiles = -(-q.shape[-2] // 128)
    return max(_wave_splits(q, 128, 1, most=tiles), -(-tiles // WALK_MAX_TILES))


def _wave_splits(q: Tensor, tile_keys: int, ctas_per_sm: int, most: int | None = None) -> int:
    """:func:`splits_for` on ``q``'s GPU, for key tiles of ``tile_keys`` keys, ``ctas_per_sm`` CTAs on each SM and at
    most ``most`` CTAs per (batch, head) (default: as many float32 dq slices as DQ_SPLITS_BYTES holds)."""
    B, H, N, d = q.shape
    per_wave = _sm_count(_index(q.device)) * ctas_per_sm
    if most is None:
        most = max(1, DQ_SPLITS_BYTES // max(1, B * H * N * d * 4))
    return splits_for(B * H, -(-N // tile_keys), per_wave, most)


def backward_splits(q: Tensor, deterministic: bool) -> int:
    """The ``dq_splits`` argument of the backward ops for ``q`` as the kernels get it: 0 (dQ by atomics or TMA
    reduce-adds in any order) unless ``deterministic``, then the slices of the backward :func:`bwd_path` picks
    (:func:`sm90_dq_splits` or :func:`dq_splits`)."""
    if not deterministic:
        return 0
    return sm90_dq_splits(q) if bwd_path(q) == "sm90" else dq_splits(q, BWD_WARPS)


def splits_for(heads: int, tiles: int, per_wave: int, most: int) -> int:
    """:func:`dq_splits`'s choice for ``heads`` = B·H (batch, head) pairs of ``tiles`` key tiles each, on a GPU
    running ``per_wave`` CTAs at once, from 1 to ``most`` slices (and at most one per key tile)."""
    def cost(s: int) -> int:
        return -(-heads * s // per_wave) * -(-tiles // s)

    candidates = range(1, max(1, min(tiles, most)) + 1)
    best = min(cost(s) for s in candidates)
    return next(s for s in candidates if cost(s) <= 1.1 * best)


@torch.library.custom_op("vit_cuda::attn_fwd", mutates_args=())
def attn_fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, deterministic: bool) -> tuple[Tensor, Tensor]:
    return _fwd(q, k, v, softmax_scale)


def _fwd(q, k, v, softmax_scale) -> tuple[Tensor, Tensor]:
    """(out, lse) of the forward :func:`forward_name` picks."""
    out, lse = getattr(extension(), forward_name(q))(q, k, v, softmax_scale)
    return out, lse


def forward_name(q: Tensor) -> str:
    """The extension's forward entry point for ``q`` (as the kernels get it, head_dim padded): ``fwd`` (mma.sync) or
    :func:`sm90_forward`'s, as :func:`fwd_path` says. Raises as those two do."""
    return sm90_forward(q) if fwd_path(q) == "sm90" else "fwd"


def wide_pays(seq_len: int) -> bool:
    """Whether the three-consumer forward's 64-row consumer tiles, 3·ceil(N / 192), are at most 1.05× the two-consumer
    kernel's, 2·ceil(N / 128): true at N = 1025, 4096, 4097, 16384; false at 197 (6 against 4) and 577 (12 against
    10), where it measured slower (the comment at FWD_SM90)."""
    return 3 * -(-seq_len // 192) <= 1.05 * 2 * -(-seq_len // 128)


def persistent_pays(seq_len: int, head_dim: int) -> bool:
    """Whether auto runs a persistent forward: at head_dim 64 (the short one, 208-key tiles) where :func:`wide_pays` is
    false (N = 197, 401, 577, 785), at 128 up to N = 1024 (8 Q tiles of 128 rows a head), where each measured faster
    (the comments at FWD_SM90)."""
    return not wide_pays(seq_len) if head_dim == 64 else seq_len <= 1024


def sm90_forward(q: Tensor) -> str:
    """The name of the extension's Hopper forward for ``q`` (as the kernels get it, head_dim padded) under ``FWD_SM90`` (env
    ``VIT_CUDA_FWD_SM90``): ``fwd_sm90`` ("sequential"), ``fwd_sm90_pingpong`` ("pingpong"), ``fwd_sm90_wide``
    ("wide", head_dim 64; "auto" picks it at 64 where :func:`wide_pays`), ``fwd_sm90_persistent`` ("persistent";
    "auto" picks it where :func:`persistent_pays` at head_dim 128), ``fwd_sm90_persistent_pingpong``
    ("persistent-pingpong"; "auto" picks it at head_dim 128 past N = 1024) or ``fwd_sm90_short`` ("short", head_dim 64:
    persistent, 208-key tiles; "auto" picks it where :func:`persistent_pays` at head_dim 64).
    Raises ValueError for another value, or "wide" or "short" at another head_dim."""
    if FWD_SM90 not in FWD_SM90_MODES:
        raise ValueError(f"VIT_CUDA_FWD_SM90 must be one of {FWD_SM90_MODES}, got {FWD_SM90!r}")
    if FWD_SM90 in ("wide", "short"):
        if q.shape[-1] != 64:
            raise ValueError(f"VIT_CUDA_FWD_SM90={FWD_SM90} has kernels for head_dim 64 only (q as the kernels get it, "
                             f"head_dim padded), got {q.shape[-1]}: unset it or use sequential / pingpong")
        return "fwd_sm90_wide" if FWD_SM90 == "wide" else "fwd_sm90_short"
    auto = FWD_SM90 == "auto"
    if auto and persistent_pays(q.shape[-2], q.shape[-1]):
        return "fwd_sm90_short" if q.shape[-1] == 64 else "fwd_sm90_persistent"
    if FWD_SM90 == "persistent":
        return "fwd_sm90_persistent"
    if FWD_SM90 == "persistent-pingpong" or (auto and q.shape[-1] == 128):
        return "fwd_sm90_persistent_pingpong"
    if auto:  # head_dim 64 past persistent_pays
        return "fwd_sm90_wide"
    return "fwd_sm90_pingpong" if FWD_SM90 == "pingpong" else "fwd_sm90"


@attn_fwd.register_fake
def _(q, k, v, softmax_scale, deterministic):
    B, H, N, d = q.shape  # out is (B, N, H, d) in memory, as api.cpp allocates it
    return q.new_empty((B, N, H, d)).transpose(1, 2), q.new_empty((B, H, N), dtype=torch.float32)


@torch.library.custom_op("vit_cuda::attn_bwd", mutates_args=())
def attn_bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, softmax_scale: float, bwd_warps: int,
    dq_splits: int,
) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = _bwd_into(extension(), dout, q, k, v, out, lse, softmax_scale, bwd_warps, dq_splits, None)
    return dq, dk, dv


def _bwd_into(ext, dout, q, k, v, out, lse, softmax_scale, bwd_warps, dq_splits, dqkv):
    """The backward under the path rules; ``dqkv``: None, or a packed gradient to write dq, dk, dv into."""
    return ext.backward(dout, q, k, v, out, lse, softmax_scale, backward_plan(q, bwd_warps, dq_splits), dqkv)


def backward_plan(q: Tensor, bwd_warps: int, dq_splits: int) -> list[int]:
    """The extension's ``backward`` arguments for ``q`` (as the kernels get it) under the path rules, as nine
    integers: ``[sm90, bwd_warps, dq_splits, dq_cols, dq_sum, dq_rows, dq_tma, overlap, key_ctas]``; sm90 = 1 runs
    ``bwd_sm90`` with :func:`sm90_bwd_options` and :func:`sm90_key_ctas`, 0 the mma.sync ``bwd``. Raises as
    :func:`bwd_path` and :func:`sm90_bwd_options` do."""
    if bwd_path(q) != "sm90":
        return [0, bwd_warps, dq_splits, 0, 0, 0, 0, 0, 0]
    options = sm90_bwd_options(q, deterministic=dq_splits > 0)
    key_ctas = sm90_key_ctas(q) if BWD_SM90 == "persistent" else 0
    return [1, bwd_warps, dq_splits, *map(int, options), key_ctas]


def pingpong_bwd_pays(seq_len: int) -> bool:
    """Whether auto runs the ping-pong backward at head_dim 64 (with rows-tma): from N = 512, between N = 197, where it
    measured 2 % slower than the sequential consumer, and 577, where it measured 3 % faster (the comment at BWD_SM90;
    the threshold between them is not measured)."""
    return seq_len >= 512


def sm90_bwd_options(q: Tensor, deterministic: bool = False) -> tuple[bool, bool, bool, bool, bool]:
    """``(dq_cols, dq_sum, dq_rows, dq_tma, overlap)`` of the extension's Hopper backward for ``q`` under ``BWD_DQ``
    (env ``VIT_CUDA_BWD_DQ``: "atomic", "columns" (head_dim 128), "tma", "columns-tma" (128), "sum", "sum-tma",
    "rows", "rows-tma" (64); "auto": columns-tma at head_dim 128, rows-tma at 64) and ``BWD_SM90`` (env
    ``VIT_CUDA_BWD_SM90``: "sequential", "overlap" (head_dim 64, not with rows), "pingpong" (rows-tma at head_dim 64,
    columns-tma at 128: the extension's overlap flag with dq_rows or dq_cols), "persistent" (the sequential consumer in
    CTAs walking key tiles, the extension's key_ctas (:func:`sm90_key_ctas`); rows-tma at 64, columns-tma at 128),
    "auto": pingpong with columns-tma at head_dim 128 and with rows-tma at 64 where :func:`pingpong_bwd_pays`, else
    sequential).
    ``deterministic`` (dq slices): the auto dQ mode with the sequential consumer, the one kernel that has them (auto
    picks it then).

    Raises:
        ValueError: a setting outside BWD_DQ_MODES or BWD_SM90_MODES, a mode at a head_dim it has no kernel for, or
            with ``deterministic`` a dQ mode or consumer other than auto's.
    """
    if BWD_DQ not in BWD_DQ_MODES:
        raise ValueError(f"VIT_CUDA_BWD_DQ must be one of {BWD_DQ_MODES}, got {BWD_DQ!r}")
    if BWD_SM90 not in BWD_SM90_MODES:
        raise ValueError(f"VIT_CUDA_BWD_SM90 must be one of {BWD_SM90_MODES}, got {BWD_SM90!r}")
    head_dim = q.shape[-1]
    auto_mode = "columns-tma" if head_dim == 128 else "rows-tma"
    mode = auto_mode if BWD_DQ == "auto" else BWD_DQ
    if deterministic and (mode != auto_mode or BWD_SM90 not in ("auto", "sequential")):
        raise ValueError(f"the deterministic Hopper backward (attention.deterministic=true) has one kernel per "
                         f"head_dim: VIT_CUDA_BWD_DQ={auto_mode} with the sequential consumer; got "
                         f"VIT_CUDA_BWD_DQ={BWD_DQ}, VIT_CUDA_BWD_SM90={BWD_SM90}: unset both, or set "
                         f"VIT_CUDA_BWD=sm80 for the mma.sync deterministic backward")
    cols, summed, rows = mode.startswith("columns"), mode.startswith("sum"), mode.startswith("rows")
    if cols and head_dim != 128:
        raise ValueError(f"VIT_CUDA_BWD_DQ={mode} has a kernel for head_dim 128 (80, 96 padded), got {head_dim}; use "
                         f"atomic or tma, or unset it (auto)")
    if (summed or rows) and head_dim != 64:
        raise ValueError(f"VIT_CUDA_BWD_DQ={mode} has a kernel for head_dim 64, got {head_dim}; use columns or "
                         f"columns-tma, or unset it (auto)")
    if BWD_SM90 == "overlap" and (head_dim != 64 or rows):
        raise ValueError(f"VIT_CUDA_BWD_SM90=overlap has a kernel for head_dim 64 with 64 query rows a step, got "
                         f"head_dim {head_dim} and VIT_CUDA_BWD_DQ={mode}; unset it (auto)")
    if BWD_SM90 in ("pingpong", "persistent") and mode not in ("rows-tma", "columns-tma"):
        raise ValueError(f"VIT_CUDA_BWD_SM90={BWD_SM90} has kernels for VIT_CUDA_BWD_DQ=rows-tma (head_dim 64) and "
                         f"columns-tma (128), the auto modes there; got VIT_CUDA_BWD_DQ={mode}; unset it (auto)")
    auto_pingpong = BWD_SM90 == "auto" and not deterministic and (
        mode == "columns-tma" or (mode == "rows-tma" and pingpong_bwd_pays(q.shape[-2])))
    return cols, summed, rows, mode.endswith("tma"), BWD_SM90 in ("overlap", "pingpong") or auto_pingpong


@attn_bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, bwd_warps, dq_splits):
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale, ctx.deterministic = softmax_scale, deterministic


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    splits = backward_splits(q, ctx.deterministic)
    dq, dk, dv = attn_bwd(dout, q, k, v, out, lse, ctx.softmax_scale, BWD_WARPS, splits)
    return dq, dk, dv, None, None


attn_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("vit_cuda::attn_fwd_qkvpacked", mutates_args=())
def attn_fwd_qkvpacked(qkv: Tensor, softmax_scale: float, deterministic: bool) -> tuple[Tensor, Tensor]:
    return _fwd(*split_qkv(qkv), softmax_scale)


@attn_fwd_qkvpacked.register_fake
def _(qkv, softmax_scale, deterministic):
    B, N, _, H, d = qkv.shape
    return qkv.new_empty((B, N, H, d)).transpose(1, 2), qkv.new_empty((B, H, N), dtype=torch.float32)


@torch.library.custom_op("vit_cuda::attn_bwd_qkvpacked", mutates_args=())
def attn_bwd_qkvpacked(dout: Tensor, qkv: Tensor, out: Tensor, lse: Tensor, softmax_scale: float, bwd_warps: int,
                       dq_splits: int) -> Tensor:
    return _bwd_qkvpacked(dout, qkv, out, lse, softmax_scale, bwd_warps, dq_splits)


def _bwd_qkvpacked(dout, qkv, out, lse, softmax_scale, bwd_warps, dq_splits) -> Tensor:
    """dq, dk, dv written into one new ``(B, N, 3, H, d)`` gradient of ``qkv``."""
    dqkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)  # (B, N, 3, H, d)
    _bwd_into(extension(), dout, *split_qkv(qkv), out, lse, softmax_scale, bwd_warps, dq_splits, dqkv)
    return dqkv


@attn_bwd_qkvpacked.register_fake
def _(dout, qkv, out, lse, softmax_scale, bwd_warps, dq_splits):
    return torch.empty_like(qkv, memory_format=torch.contiguous_format)


def _setup_context_packed(ctx, inputs, output):
    qkv, softmax_scale, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(qkv, out, lse)
    ctx.softmax_scale, ctx.deterministic = softmax_scale, deterministic


def _backward_packed(ctx, dout, dlse):
    qkv, out, lse = ctx.saved_tensors
    splits = backward_splits(split_qkv(qkv)[0], ctx.deterministic)
    return attn_bwd_qkvpacked(dout, qkv, out, lse, ctx.softmax_scale, BWD_WARPS, splits), None, None


attn_fwd_qkvpacked.register_autograd(_backward_packed, setup_context=_setup_context_packed)
