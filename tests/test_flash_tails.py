"""The flash kernels' sequence ends, under every tuned block configuration, against float64.

Each kernel handles its last tile three ways (kernels/flash/kernels.py, module docstring): none
(N a multiple of the block), a TAIL-wide (16) tile when at most 16 rows or keys are left, and a masked
full tile otherwise, for the program's own tile (query rows in the forward and dQ kernels, keys in
dK/dV) and for its loop's last step. Which branch runs depends on N and the block sizes, and the
autotuner picks the blocks, so the usual tests cover only the winners'. Here each kernel is pinned to
one row of its list in ``kernels.flash.configs`` at a time, at sequence lengths that reach every
branch for blocks 32, 64 and 128: 129 = 128 + 1 (and 2·64 + 1, 4·32 + 1), 144 = 128 + 16 (a tail of
exactly TAIL), 145 = 128 + 17 (one past it: a masked full tile), 197 = 3·64 + 5 (ViT at 224 px) and,
on the GPU, 4097 (ViT at 1024 px). The Python launcher runs them (the C++ path keeps plans by shape,
not by tuner). The interpreter runs the GPU's configs too: it ignores warps and stages, not blocks.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import triton
from conftest import check_against_reference, make_qkv

from kernels.flash import attention, configs, native

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
KERNELS = (("FWD", configs._FWD, ("BLOCK_M", "BLOCK_N")), ("DKDV", configs._DKDV, ("BLOCK_M1", "BLOCK_N1")),
           ("DQ", configs._DQ, ("BLOCK_M2", "BLOCK_N2")))
SEQ_LENS = [129, 144, 145, 197] + ([4097] if DEVICE == "cuda" else [])


def _pin(monkeypatch, cls: int, row: int) -> str:
    """Make each kernel of head-dim class ``cls`` run only its ``row``-th config; returns their description."""
    monkeypatch.setattr(native, "_mode", "python")
    pinned = []
    for name, table, names in KERNELS:
        tuners = getattr(configs, name)
        cfg = table[cls][row]
        kernel = tuners[cls].fn
        monkeypatch.setitem(tuners, cls, triton.autotune(configs._cfgs(names, [cfg]), key=["N_BUCKET", "HEAD_DIM"])(kernel))
        pinned.append(f"{name.lower()} {cfg[:2]}")
    return ", ".join(pinned)


@pytest.mark.parametrize("row", [0, 1, 2])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_config_at_every_tail(head_dim, row, monkeypatch):
    what = _pin(monkeypatch, configs.head_dim_class(head_dim), row)
    for seq_len in SEQ_LENS:
        q, k, v = make_qkv(1, 2, seq_len, head_dim, dtype=DTYPE, device=DEVICE)
        try:
            check_against_reference(attention, q, k, v)
        except AssertionError as error:
            raise AssertionError(f"N={seq_len}, {what}: {error}") from None


@pytest.mark.gpu
@pytest.mark.parametrize("row", [0, 1, 2])
def test_gpu_head_dim_256_configs_at_tails(row, monkeypatch):
    what = _pin(monkeypatch, 256, row)
    for seq_len in (129, 144, 145, 197):
        q, k, v = make_qkv(1, 2, seq_len, 256, dtype=DTYPE, device=DEVICE)
        try:
            check_against_reference(attention, q, k, v)
        except AssertionError as error:
            raise AssertionError(f"N={seq_len}, {what}: {error}") from None
