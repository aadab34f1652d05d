"""kernels/flash/hopper.py: the TMA-descriptor kernels compute what the pointer kernels compute.

They are not the production path (on the H200 they measured no faster: benchmarks/results/
flash_h200_20261201.md), but they are kept, swept by ``benchmarks/flash_bench.py --sweep``, and must stay
right: masked tails (N not a multiple of the tiles), padded head dims (80 -> 128 columns), strided
packed-qkv views. CPU: Triton's interpreter, fp16 and fp32. On a Hopper GPU (``-m gpu``) also against float64 in
bf16 at the sweep's tiles, with and without warp specialisation.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import triton
from conftest import ERROR_FLOOR, is_hopper, max_err, reference_attention

from kernels import split_qkv
from kernels.flash import configs, hopper, op
from kernels.flash.kernels import LOG2E

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TILES = {"fwd": (32, 16), "dkdv": (16, 32), "dq": (32, 16)}


def _launch_all(q, k, v, do, out_ref, lse_ref, scale, tiles=TILES, warp_specialize=False):
    """The three TMA kernels (small tiles by default); returns out, lse, dq, dk, dv."""
    B, H, N, d = q.shape
    if DEVICE == "cuda":
        hopper.ensure_allocator()  # device-side descriptors need scratch memory
    common = {"HEAD_DIM": d, "HEAD_DIM_PADDED": configs.head_dim_padded(d), "IEEE": q.dtype == torch.float32,
              "WARP_SPECIALIZE": warp_specialize}
    out, lse = op._empty_out(q), torch.empty(B, H, N, device=DEVICE)
    bm, bn = tiles["fwd"]
    hopper.flash_fwd_tma_kernel[(triton.cdiv(N, bm) * B * H,)](
        q, k, v, out, lse, out, scale * LOG2E, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        H, N, configs.n_bucket(N), STORE_RES=False, UNSCALED_MAX=False, BLOCK_M=bm, BLOCK_N=bn, **common)
    delta = torch.empty(B, H, N, device=DEVICE)
    op.launch_preprocess(out_ref, do, delta)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    bm, bn = tiles["dkdv"]
    hopper.flash_bwd_dkdv_tma_kernel[(triton.cdiv(N, bn) * B * H,)](
        q, k, v, do, dk, dv, lse_ref, delta, scale, scale * LOG2E, *q.stride(), *k.stride(), *v.stride(),
        *do.stride(), *dk.stride(), *dv.stride(), H, N, configs.n_bucket(N), BLOCK_M1=bm, BLOCK_N1=bn, **common)
    bm, bn = tiles["dq"]
    hopper.flash_bwd_dq_tma_kernel[(triton.cdiv(N, bm) * B * H,)](
        q, k, v, do, dq, lse_ref, delta, scale, scale * LOG2E, *q.stride(), *k.stride(), *v.stride(),
        *do.stride(), *dq.stride(), H, N, configs.n_bucket(N), BLOCK_M2=bm, BLOCK_N2=bn, **common)
    return out, lse, dq, dk, dv


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("B, H, N, d", [(2, 3, 37, 32), (1, 2, 70, 80), (1, 1, 16, 64)])
def test_tma_kernels_match_the_pointer_kernels(B, H, N, d, dtype):
    qkv = torch.randn(B, N, 3, H, d, device=DEVICE).to(dtype)  # (B, N, 3, H, d): the ViT's strided views
    q, k, v = split_qkv(qkv)
    scale = d ** -0.5
    out_ref, lse_ref = op._fwd(q, k, v, scale)
    do = torch.randn_like(out_ref)
    dq_ref, dk_ref, dv_ref = op._bwd(do, q, k, v, out_ref, lse_ref, scale)
    got = _launch_all(q, k, v, do, out_ref, lse_ref, scale)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, (out_ref, lse_ref, dq_ref, dk_ref, dv_ref)):
        assert max_err(a, b) <= tol * max(1.0, b.abs().max().item()), (name, max_err(a, b))



def _launch_fused(q, k, v, do, out, lse, scale, tiles, dq_reduce, warp_specialize=False):
    """flash_bwd_fused_tma_kernel (DQ_REDUCE 1: tl.atomic_add, 2: TMA reduce-add); returns dq, dk, dv."""
    B, H, N, d = q.shape
    if DEVICE == "cuda":
        hopper.ensure_allocator()
    delta = torch.empty(B, H, N, device=DEVICE)
    op.launch_preprocess(out, do, delta)
    dqacc = torch.zeros(B, H, N, d, device=DEVICE)  # float32, contiguous
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    bm, bn = tiles
    hopper.flash_bwd_fused_tma_kernel[(triton.cdiv(N, bn) * B * H,)](
        q, k, v, do, dk, dv, dqacc, lse, delta, scale, scale * LOG2E, *q.stride(), *k.stride(), *v.stride(),
        *do.stride(), *dk.stride(), *dv.stride(), H, N, configs.n_bucket(N), HEAD_DIM=d,
        HEAD_DIM_PADDED=configs.head_dim_padded(d), IEEE=q.dtype == torch.float32, BLOCK_M1=bm, BLOCK_N1=bn,
        WARP_SPECIALIZE=warp_specialize, DQ_REDUCE=dq_reduce)
    return dqacc.to(q.dtype), dk, dv



@pytest.mark.gpu
@pytest.mark.parametrize("warp_specialize", [False, True], ids=["plain", "ws"])
@pytest.mark.parametrize("B, H, N, d", [(2, 3, 197, 64), (1, 2, 577, 80), (1, 2, 1025, 128), (2, 2, 17, 32)])
def test_gpu_tma_kernels_match_float64(B, H, N, d, warp_specialize):
    """On a Hopper GPU, bf16, the sweep's tiles: the TMA kernels' out, lse, dq, dk, dv and the fused backward's dq
    (TMA reduce-add), dk, dv against float64, each within 2x the pointer kernels' own error on the same inputs (those
    are held to 2x PyTorch's in test_flash.py) plus bf16's floor; with and without Triton's warp specialisation (a
    producer warp for the TMA loads)."""
    if not is_hopper():
        pytest.skip("TMA descriptors and the Hopper kernels need a compute capability 9.0 GPU (H100, H200)")
    qkv = torch.randn(B, N, 3, H, d, device="cuda", dtype=torch.bfloat16)  # (B, N, 3, H, d): strided views
    q, k, v = split_qkv(qkv)
    scale = d ** -0.5
    ref_out, (rq, rk, rv) = reference_attention(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), scale)
    do = torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16)
    ref_out.backward(do.double())
    ref_lse = torch.logsumexp(rq.detach() @ rk.detach().transpose(-2, -1) * scale, dim=-1)
    refs = (ref_out.detach(), ref_lse, rq.grad, rk.grad, rv.grad)
    q, k, v = q.detach(), k.detach(), v.detach()
    out_ptr, lse_ptr = op._fwd(q, k, v, scale)
    pointer = (out_ptr, lse_ptr, *op._bwd(do, q, k, v, out_ptr, lse_ptr, scale))
    tiles = {"fwd": (64, 64), "dkdv": (64, 64), "dq": (64, 64)}
    got = _launch_all(q, k, v, do, out_ptr, lse_ptr, scale, tiles, warp_specialize)
    got += _launch_fused(q, k, v, do, out_ptr, lse_ptr, scale, (64, 64), 2, warp_specialize)
    floor = ERROR_FLOOR[torch.bfloat16]
    names = ("out", "lse", "dq", "dk", "dv", "fused dq", "fused dk", "fused dv")
    for name, a, p, ref in zip(names, got, pointer + pointer[2:], refs + refs[2:]):
        bound = 2 * max_err(p, ref) + floor * max(1.0, ref.abs().max().item())
        assert max_err(a, ref) <= bound, (name, max_err(a, ref), bound)


def test_tma_forward_takes_every_argument_of_the_pointer_forward():
    """op.launch_fwd (benchmarks/flash_bench.py's fwd_tma sweep) passes the pointer kernel's constexprs by name;
    a compiled Triton kernel rejects a keyword it lacks (the interpreter drops it silently)."""
    from kernels.flash import kernels

    assert hopper.flash_fwd_tma_kernel.arg_names == [*kernels.flash_fwd_kernel.arg_names, "WARP_SPECIALIZE"]


@pytest.mark.parametrize("B, H, N, d", [(2, 3, 37, 32), (1, 2, 70, 80)])
def test_tma_forward_with_residual_matches_the_pointer_kernel(B, H, N, d):
    """fp32_delta's forward (STORE_RES, UNSCALED_MAX): out, lse and the rounding residual as the pointer kernel's."""
    q, k, v = split_qkv(torch.randn(B, N, 3, H, d, device=DEVICE).to(torch.float16))
    scale = d ** -0.5
    res_ref = op._empty_out(q)
    out_ref, lse_ref = op._fwd(q, k, v, scale, res=res_ref)
    if DEVICE == "cuda":
        hopper.ensure_allocator()
    out, lse, res = op._empty_out(q), torch.empty(B, H, N, device=DEVICE), op._empty_out(q)
    bm, bn = TILES["fwd"]
    hopper.flash_fwd_tma_kernel[(triton.cdiv(N, bm) * B * H,)](
        q, k, v, out, lse, res, scale * LOG2E, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        H, N, configs.n_bucket(N), HEAD_DIM=d, HEAD_DIM_PADDED=configs.head_dim_padded(d), IEEE=False,
        STORE_RES=True, UNSCALED_MAX=True, BLOCK_M=bm, BLOCK_N=bn, WARP_SPECIALIZE=False)
    assert max_err(lse, lse_ref) <= 1e-5 * max(1.0, lse_ref.abs().max().item())
    full, full_ref = out.float() + res.float(), out_ref.float() + res_ref.float()  # the float32 outputs
    assert max_err(full, full_ref) <= 1e-3 * max(1.0, full_ref.abs().max().item())
    assert res_ref.abs().max() > 0, "the residual should hold out's rounding error"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("B, H, N, d", [(2, 3, 37, 32), (1, 2, 70, 80), (1, 1, 16, 64)])
def test_fused_backward_matches_the_pointer_kernels(B, H, N, d, dtype):
    """flash_bwd_fused_tma_kernel (five products, dQ reduce-added; DQ_REDUCE=1, tl.atomic_add, which the
    interpreter runs): dq, dk, dv as the two-kernel backward's, within rounding (the adds' order differs)."""
    q, k, v = split_qkv(torch.randn(B, N, 3, H, d, device=DEVICE).to(dtype))
    scale = d ** -0.5
    out, lse = op._fwd(q, k, v, scale)
    do = torch.randn_like(out)
    dq_ref, dk_ref, dv_ref = op._bwd(do, q, k, v, out, lse, scale)
    dq, dk, dv = _launch_fused(q, k, v, do, out, lse, scale, TILES["dkdv"], dq_reduce=1)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for name, a, b in (("dq", dq, dq_ref), ("dk", dk, dk_ref), ("dv", dv, dv_ref)):
        assert max_err(a, b) <= tol * max(1.0, b.abs().max().item()), (name, max_err(a, b))


def test_fused_backward_compiles_its_dq_adds_to_tma_reduce_adds():
    """python -m benchmarks.flash_aot compiles the fused backward for sm_90 without a GPU: DQ_REDUCE=2's dQ adds
    are TMA bulk reduce-adds (UTMAREDG in the SASS), DQ_REDUCE=1's are not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.flash_aot"], cwd=Path(__file__).parents[1], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("DQ_REDUCE=")]
    assert len(lines) == 4
    for line in lines:
        assert ("UTMAREDG" in line) == line.startswith("DQ_REDUCE=2") and "HGMMA" in line, line
