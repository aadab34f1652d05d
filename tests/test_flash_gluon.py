"""kernels/flash/gluon_fwd.py and gluon_bwd.py: the Gluon forward and dK/dV kernel for Hopper (experimental, not wired).

CPU: it compiles for sm_90 ahead of time (``python -m benchmarks.flash_gluon_aot``, Triton's own cuobjdump), without
spills, with wgmma, and with the softmax's exponentials between the wait for S and the wait for P·V in the machine
code (SASS: ptxas moves that wait above the exponentials unless a branch stands between them). GPU (Hopper):
out and lse against float64 at the sequence lengths and head dims of the other kernels' tests, within 2× the error of
PyTorch's math at the same dtype; and out against the Triton forward. The dK/dV kernel likewise: dk and dv against
float64 and against the Triton backward.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import error_floor, is_hopper, make_qkv, max_err

ROOT = Path(__file__).parents[1]



def test_the_gluon_kernels_compile_for_sm90_with_the_elementwise_work_between_the_waits():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.flash_gluon_aot"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("d=")]
    assert len(lines) == 5, proc.stdout
    for line in lines:
        assert " 0 spill stores" in line and "HGMMA True" in line, line
        assert "W1 EXP W0" in line.split("sass order:")[1], line  # tile j's exponentials while P·V is in flight
    lines = [line for line in proc.stdout.splitlines() if line.startswith("dkdv d=")]
    assert len(lines) == 4, proc.stdout
    for line in lines:
        assert " 0 spill stores" in line and "HGMMA True" in line, line
        assert line.split("sass order:")[1].strip().startswith("W1 EXP W1"), line  # the wait for dPᵀ after the exps
    lines = [line for line in proc.stdout.splitlines() if line.startswith("dq d=")]
    assert len(lines) == 3, proc.stdout
    for line in lines:
        assert " 0 spill stores" in line and "HGMMA True" in line, line
        assert line.split("sass order:")[1].strip().startswith("W1 EXP W0"), line  # the wait for dP after the exps


def _check_forward(q, k, v, fwd=None):
    from kernels.flash import gluon_fwd
    from kernels.naive import attention as naive

    scale = q.shape[-1] ** -0.5
    ref = torch.softmax(q.double() @ k.double().transpose(-2, -1) * scale, dim=-1)
    ref_out = ref @ v.double()
    ref_lse = torch.logsumexp(q.double() @ k.double().transpose(-2, -1) * scale, dim=-1)
    out, lse = (fwd or gluon_fwd.fwd)(q, k, v, scale)
    assert torch.isfinite(out).all()
    floor = error_floor(ref_out, q.dtype)
    err, base_err = max_err(out, ref_out), max_err(naive(q, k, v, softmax_scale=scale), ref_out)
    assert err <= 2 * base_err + floor, (err, base_err, floor, tuple(q.shape), q.dtype)
    assert max_err(lse, ref_lse) <= 1e-4 * max(1.0, ref_lse.abs().max().item()), max_err(lse, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [32, 64, 72, 80, 128])
@pytest.mark.parametrize("seq_len", [1, 17, 197, 577, 1025, 4096])
def test_gpu_gluon_forward_matches_float64(seq_len, head_dim, dtype):
    if not is_hopper():
        pytest.skip("the Gluon forward is written for Hopper (compute capability 9.0)")
    q, k, v = make_qkv(2, 3, seq_len, head_dim, dtype=dtype, device="cuda", requires_grad=False)
    _check_forward(q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("block_m, block_n, stages, num_warps", [(128, 64, 3, 8), (64, 64, 4, 4), (128, 128, 3, 8)])
def test_gpu_gluon_forward_tiles_and_packed_views(block_m, block_n, stages, num_warps):
    """Other tiles and stage counts, on the ViT's strided (B, N, 3, H, d) views, against the Triton forward."""
    if not is_hopper():
        pytest.skip("the Gluon forward is written for Hopper (compute capability 9.0)")
    from kernels import split_qkv
    from kernels.flash import gluon_fwd, op

    qkv = torch.randn(3, 301, 3, 4, 64, device="cuda", dtype=torch.bfloat16)  # (B, N, 3, H, d)
    q, k, v = split_qkv(qkv)
    _check_forward(q, k, v)
    out, lse = gluon_fwd.fwd(q, k, v, 0.125, block_m=block_m, block_n=block_n, stages=stages, num_warps=num_warps)
    ref_out, ref_lse = op._fwd(q, k, v, 0.125)
    assert max_err(out, ref_out) <= 2e-2 and max_err(lse, ref_lse) <= 1e-4


def test_a_tensor_off_a_hopper_gpu_is_a_clear_error():
    from kernels.flash import gluon_fwd

    q = torch.randn(1, 1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="Hopper GPU"):
        gluon_fwd.fwd(q, q, q, 0.125)


@pytest.mark.gpu
def test_gpu_bad_tiles_are_a_clear_error():
    if not is_hopper():
        pytest.skip("the Gluon forward is written for Hopper (compute capability 9.0)")
    from kernels.flash import gluon_fwd

    q = torch.randn(1, 1, 8, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="stages=2 at least 3"):
        gluon_fwd.fwd(q, q, q, 0.125, stages=2)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        gluon_fwd.fwd(q.float(), q.float(), q.float(), 0.125)
    with pytest.raises(ValueError, match="one .B, H, N, d. shape"):
        gluon_fwd.fwd(q, q[:, :, :4], q, 0.125)
    with pytest.raises(ValueError, match="d ≤ 128"):
        wide = torch.randn(1, 1, 8, 256, dtype=torch.bfloat16, device="cuda")
        gluon_fwd.fwd(wide, wide, wide, 0.125)
    odd = torch.randn(1, 1, 8, 68, dtype=torch.bfloat16, device="cuda")[..., :64]  # row stride 68
    with pytest.raises(ValueError, match="multiples of 8"):
        gluon_fwd.fwd(odd, odd, odd, 0.125)
    with pytest.raises(ValueError, match="shared memory"):
        big = torch.randn(1, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
        gluon_fwd.fwd(big, big, big, 0.125, block_n=128, stages=4)
    from kernels.flash import gluon_bwd

    lse = torch.zeros(1, 1, 7, device="cuda")
    with pytest.raises(ValueError, match="lse must be a contiguous float32"):
        gluon_bwd.bwd(q, q, q, q, q, lse, 0.125)  # before any kernel writes delta


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [32, 64, 72, 80, 128])
@pytest.mark.parametrize("seq_len", [1, 17, 197, 577, 1025, 4096])
def test_gpu_gluon_backward_matches_float64(seq_len, head_dim, dtype):
    """dq, dk and dv (gluon_bwd.bwd: both Gluon kernels) against float64 within 2× the naive backend's error at the
    same dtype; and against the Triton backward's from the same out and lse."""
    if not is_hopper():
        pytest.skip("the Gluon kernels are written for Hopper (compute capability 9.0)")
    from conftest import forward_backward, reference_attention

    from kernels.flash import gluon_bwd, op
    from kernels.naive import attention as naive

    q, k, v = make_qkv(2, 3, seq_len, head_dim, dtype=dtype, device="cuda")
    scale = head_dim ** -0.5
    ref_out, (rq, rk, rv) = reference_attention(q, k, v, scale)
    q, k, v = (t.detach() for t in (q, k, v))
    do = torch.randn_like(ref_out)
    ref_out.backward(do)
    do = do.to(dtype)
    out, lse = op._fwd(q, k, v, scale)
    grads = gluon_bwd.bwd(do, q, k, v, out, lse, scale)
    _, *base = forward_backward(naive, q, k, v, do, scale)
    triton_grads = op._bwd(do, q, k, v, out, lse, scale)
    for name, got, ref, b, tri in zip(("dq", "dk", "dv"), grads, (rq.grad, rk.grad, rv.grad), base, triton_grads):
        floor = error_floor(ref, dtype)
        err, base_err = max_err(got, ref), max_err(b, ref)
        assert torch.isfinite(got).all() and err <= 2 * base_err + floor, (name, err, base_err, floor)
        assert max_err(got, tri) <= 2 * max_err(tri, ref) + floor, (name, max_err(got, tri))


def _packed_backward_case(head_dim):
    """The ViT's strided (B, N, 3, H, d) q, k, v views at N = 301 (ragged tiles), a random dO, the forward's lse, delta,
    the Triton backward's (dq, dk, dv) and a NaN-filled packed gradient: (q, k, v, do, lse, delta, scale, refs, dqkv)."""
    from kernels import split_qkv
    from kernels.flash import op

    qkv = torch.randn(3, 301, 3, 4, head_dim, device="cuda", dtype=torch.bfloat16)  # (B, N, 3, H, d)
    q, k, v = split_qkv(qkv)
    scale = head_dim ** -0.5
    do = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16)
    out, lse = op._fwd(q, k, v, scale)
    delta = torch.empty_like(lse)
    op.launch_preprocess(out, do, delta)
    refs = op._bwd(do, q, k, v, out, lse, scale)
    return q, k, v, do, lse, delta, scale, refs, torch.full_like(qkv, float("nan"))


@pytest.mark.gpu
@pytest.mark.parametrize("block_m, block_n, stages, num_warps", [(None, 128, 4, 8), (None, 64, 3, 4), (32, 64, 4, 4)])
@pytest.mark.parametrize("head_dim", [64, 72])
def test_gpu_gluon_dkdv_tiles_packed_views_and_given_outputs(block_m, block_n, stages, num_warps, head_dim):
    """Other tiles, stage counts (a ring with two tiles in flight) and 4 warps, on the ViT's strided (B, N, 3, H, d)
    views, writing into slices of one packed gradient, against the Triton backward; N = 301 leaves ragged tiles."""
    if not is_hopper():
        pytest.skip("the Gluon kernels are written for Hopper (compute capability 9.0)")
    from kernels import split_qkv
    from kernels.flash import gluon_bwd

    q, k, v, do, lse, delta, scale, (_, dk_ref, dv_ref), dqkv = _packed_backward_case(head_dim)
    _, dk, dv = split_qkv(dqkv)
    gluon_bwd.dkdv(q, k, v, do, lse, delta, scale, dk, dv, block_m, block_n, stages, num_warps)
    assert torch.isnan(dqkv[:, :, 0]).all(), "wrote outside dk and dv"
    for name, got, ref in (("dk", dk, dk_ref), ("dv", dv, dv_ref)):
        assert max_err(got, ref) <= 2e-2 * max(1.0, ref.abs().max().item()), (name, max_err(got, ref))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal; on a GPU the command runs for minutes")
def test_the_readme_gluon_bench_command_parses_and_refuses_a_cpu():
    proc = subprocess.run([sys.executable, "benchmarks/flash_bench.py", "--gluon"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode != 0 and "needs a CUDA GPU" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("block_m, block_n, stages, num_warps", [(128, 64, 4, 8), (64, 64, 3, 4), (128, 32, 5, 8)])
@pytest.mark.parametrize("head_dim", [64, 72])
def test_gpu_gluon_dq_tiles_packed_views_and_given_output(block_m, block_n, stages, num_warps, head_dim):
    """The dQ kernel at other tiles and stage counts, on strided (B, N, 3, H, d) views, into a slice of one packed
    gradient, against the Triton backward; N = 301 leaves ragged tiles."""
    if not is_hopper():
        pytest.skip("the Gluon kernels are written for Hopper (compute capability 9.0)")
    from kernels import split_qkv
    from kernels.flash import gluon_bwd

    q, k, v, do, lse, delta, scale, (dq_ref, _, _), dqkv = _packed_backward_case(head_dim)
    dq = split_qkv(dqkv)[0]
    gluon_bwd.dq_grad(q, k, v, do, lse, delta, scale, dq, block_m, block_n, stages, num_warps)
    assert torch.isnan(dqkv[:, :, 1:]).all(), "wrote outside dq"
    assert max_err(dq, dq_ref) <= 2e-2 * max(1.0, dq_ref.abs().max().item()), max_err(dq, dq_ref)
