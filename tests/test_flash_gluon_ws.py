"""kernels/flash/gluon_ws.py: the Gluon forward with TMA loads by a producer warp (experimental, not wired).

CPU: it compiles for sm_90 ahead of time (``python -m benchmarks.flash_gluon_aot --ws``) with TMA loads, wgmma,
register reallocation between the producer and the consumers, and no spills. GPU (Hopper): out and lse against
float64 at the sequence lengths and head dims of the other kernels' tests, within 2× the error of PyTorch's math at
the same dtype, and on the ViT's packed (B, N, 3, H, d) views at every tile the benchmark times.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import is_hopper, make_qkv, max_err
from test_flash_gluon import _check_forward

ROOT = Path(__file__).parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is run as `python -m benchmarks.x` from the repo root
    sys.path.insert(0, str(ROOT))

from benchmarks.flash_bench import GLUON_WS_TILES


def test_the_ws_forward_compiles_for_sm90_with_tma_and_a_producer_warp():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.flash_gluon_aot", "--ws"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ws d=")]
    assert len(lines) == 4, proc.stdout
    for line in lines:
        assert " 0 spill stores" in line and "HGMMA True" in line and "UTMALDG True" in line, line
        assert "setmaxnreg [24, 240]" in line, line  # the load warp gives its registers to the compute warps


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [32, 64, 72, 80, 128])
@pytest.mark.parametrize("seq_len", [1, 17, 197, 577, 1025, 4096])
def test_gpu_ws_forward_matches_float64(seq_len, head_dim, dtype):
    if not is_hopper():
        pytest.skip("the Gluon forward is written for Hopper (compute capability 9.0)")
    from kernels.flash import gluon_ws

    q, k, v = make_qkv(2, 3, seq_len, head_dim, dtype=dtype, device="cuda", requires_grad=False)
    _check_forward(q, k, v, gluon_ws.fwd)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", GLUON_WS_TILES + [(128, 64, 2, 8, None)])
def test_gpu_ws_forward_tiles_and_packed_views(tile):
    """The tiles the benchmark times, on the ViT's strided (B, N, 3, H, d) views, against float64 and the Triton
    forward."""
    if not is_hopper():
        pytest.skip("the Gluon forward is written for Hopper (compute capability 9.0)")
    from kernels import split_qkv
    from kernels.flash import gluon_ws, op

    qkv = torch.randn(3, 301, 3, 4, 64, device="cuda", dtype=torch.bfloat16)  # (B, N, 3, H, d)
    q, k, v = split_qkv(qkv)

    def fwd(q, k, v, scale):
        return gluon_ws.fwd(q, k, v, scale, *tile)

    _check_forward(q, k, v, fwd)
    out, lse = fwd(q, k, v, 0.125)
    ref_out, ref_lse = op._fwd(q, k, v, 0.125)
    assert max_err(out, ref_out) <= 2e-2 and max_err(lse, ref_lse) <= 1e-4
