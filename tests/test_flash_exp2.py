"""The flash kernels' mixed exp2 (kernels/flash/kernels.py, _EXP2_PTX), run here by emulating its PTX.

The interpreter (CPU CI) cannot run inline PTX, so this test executes the PTX text itself, instruction by instruction,
in numpy float32/uint32 arithmetic, on scores the kernels can produce (x ≤ 0, down to far below the clamp). The GPU
tests (tests/test_flash.py, -m gpu) check the compiled kernels that use it against float64.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernels.flash import kernels as K


def _value(token: str, regs: dict):
    if token.startswith("0f"):  # PTX's hex float
        return np.uint32(int("0x" + token[2:], 0)).view(np.float32)
    if token.isdigit():
        return np.uint32(int(token))
    return regs[token]


def _run_ptx(ptx: str, inputs: np.ndarray) -> np.ndarray:
    """Execute _EXP2_PTX on (4, n) float32 inputs ($4…$7); returns $0…$3 as (4, n) float32."""
    regs = {f"${4 + i}": inputs[i].astype(np.float32) for i in range(4)}
    f32 = np.float32
    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [a.strip() for a in args.split(",")]
        v = [_value(s, regs) for s in src]
        if op == "ex2.approx.ftz.f32":
            out = np.exp2(v[0].astype(np.float64)).astype(f32)
        elif op == "max.f32":
            out = np.maximum(v[0], v[1]).astype(f32)
        elif op == "add.rn.f32":
            out = (v[0].astype(np.float64) + np.float64(v[1])).astype(f32)
        elif op == "sub.rn.f32":
            out = (np.float64(v[0]) - np.float64(v[1])).astype(f32)
        elif op == "fma.rn.f32":  # the float64 product of two float32 is exact: one rounding, as FMA
            out = (np.float64(v[0]) * np.float64(v[1]) + np.float64(v[2])).astype(f32)
        elif op == "mov.b32":
            out = v[0]
        elif op == "shl.b32":
            out = (np.asarray(v[0]).view(np.uint32) << v[1]).astype(np.uint32)
        elif op == "add.s32":
            out = (np.asarray(v[0]).view(np.uint32) + np.asarray(v[1]).view(np.uint32)).astype(np.uint32)
        else:
            raise AssertionError(f"instruction {op!r} is not emulated: extend _run_ptx")
        regs[dst] = out
    return np.stack([np.asarray(regs[f"${i}"]).view(np.float32) for i in range(4)])


def test_ptx_uses_only_emulated_instructions():
    ops = {line.split()[0] for line in K._EXP2_PTX.value.splitlines() if re.match(r"\s*[a-z]", line)}
    assert ops == {"ex2.approx.ftz.f32", "max.f32", "add.rn.f32", "sub.rn.f32", "fma.rn.f32", "mov.b32", "shl.b32",
                   "add.s32"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mixed_exp2_matches_float64(seed):
    """Three of four lanes are ex2; the fourth, the polynomial, is within 8e-5 relative of 2^x down to 2^-126, and
    below that at most 2^-126 (where ex2 would give a value below 1.2e-38 or 0)."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([-rng.random(4 * 50_000) * 30, -rng.random(4 * 10_000) * 300, [0.0, -0.5, -1.5, -126.0]])
    x = x.astype(np.float32).reshape(4, -1, order="F")
    out = _run_ptx(K._EXP2_PTX.value, x).astype(np.float64)
    ref = np.exp2(x.astype(np.float64))
    normal = x[3] > -125.5
    poly = np.abs(out[3] - ref[3])[normal] / ref[3][normal]
    assert poly.max() < 8e-5, poly.max()
    assert np.all(out[3][~normal] <= 2.0**-125) and np.all(out[3] >= 0)
    assert np.array_equal(out[:3], ref[:3].astype(np.float32).astype(np.float64))  # lanes 0-2: ex2
