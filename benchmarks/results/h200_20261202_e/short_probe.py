"""Probe (run from the repository root): the one-program-per-head short backward (short_bwd.py, beside this file) at
several configs, beside the two-kernel backward and cuDNN, on rotated inputs; and its error against float64 beside the
two-kernel one's. Output: short_probe.log (call T)."""
import importlib.util
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.getcwd())
from benchmarks.flash_bench import _median_ms, _n_sets, _sdpa
from kernels.flash import configs, op
from kernels.flash.kernels import LOG2E

_spec = importlib.util.spec_from_file_location("short_bwd", os.path.join(os.path.dirname(__file__), "short_bwd.py"))
short = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(short)

CFGS = [(16, 8, 2, None), (32, 8, 2, None), (16, 4, 2, None), (32, 4, 2, None), (64, 8, 2, None), (16, 16, 2, None),
        (32, 16, 2, None), (16, 8, 3, None), (16, 8, 1, None), (64, 16, 2, None)]  # BLOCK_M, warps, stages, maxnreg
SHAPES = [(256, 12, 197, 64), (64, 12, 197, 64), (16, 12, 197, 64), (256, 12, 50, 64), (128, 12, 145, 64),
          (256, 12, 197, 128), (256, 12, 128, 64), (256, 12, 100, 128)]


def launch(cfg, q, k, v, do, out, lse, scale, dq, dk, dv):
    bm, w, st, mr = cfg
    B, H, N, d = q.shape
    short.flash_bwd_short_kernel[(B * H,)](
        q, k, v, do, dq, dk, dv, out, lse, scale, scale * LOG2E, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *dq.stride(), *dk.stride(), *dv.stride(), *out.stride(), H, N, configs.n_bucket(N), HEAD_DIM=d,
        HEAD_DIM_PADDED=configs.head_dim_padded(d), IEEE=False, KEYS=max(16, 1 << (N - 1).bit_length()),
        BLOCK_M=bm, num_warps=w, num_stages=st, maxnreg=mr)


def errors(shape, bwd):
    """Largest |dq|, |dk|, |dv| error against float64 at (2, 3, N, d)."""
    q, k, v, do = (torch.randn(2, 3, *shape[2:], device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = shape[3] ** -0.5
    out, lse = op._fwd(q, k, v, scale, True)
    got = bwd(q, k, v, do, out, lse, scale)
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    (torch.softmax(qr @ kr.transpose(-1, -2) * scale, -1) @ vr).backward(do.double())
    return " ".join(f"{(g.double() - r.grad).abs().max().item():.1e}" for g, r in zip(got, (qr, kr, vr)))


def short_bwd(cfg):
    def bwd(q, k, v, do, out, lse, scale):
        grads = [torch.empty_like(t) for t in (q, k, v)]
        launch(cfg, q, k, v, do, out, lse, scale, *grads)
        return grads
    return bwd


def probe(shape):
    scale = shape[3] ** -0.5
    n = _n_sets(shape)
    sets = []
    for _ in range(n):
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        out, lse = op._fwd(q, k, v, scale, True)
        sets.append((q, k, v, do, out, lse, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)))

    def two(i):
        s = sets[i]
        op._bwd_into(s[3], *s[:3], s[4], s[5], scale, *s[6:], True)

    two(0)
    t_two = _median_ms(two, n)
    fwd = _median_ms(lambda i: op._fwd(*sets[i][:3], scale, True), n)
    cudnn = _sdpa("CUDNN_ATTENTION")
    leaves = [[t.detach().requires_grad_(True) for t in s[:3]] + [s[3]] for s in sets]

    def cudnn_fwd_bwd(i):
        q, k, v, do = leaves[i]
        torch.autograd.grad(cudnn(q, k, v), (q, k, v), do)

    cudnn_fwd_bwd(0)
    t_cudnn = _median_ms(cudnn_fwd_bwd, n)
    t_cudnn_fwd = _median_ms(lambda i: cudnn(*sets[i][:3]), n)
    two_err = errors(shape, lambda q, k, v, do, o, lse, s: op._bwd(do, q, k, v, o, lse, s, True))
    print(f"{shape}: ours fwd {fwd:.4f} two-kernel bwd {t_two:.4f} (fwd+bwd {fwd + t_two:.4f}) | cudnn fwd "
          f"{t_cudnn_fwd:.4f} fwd+bwd {t_cudnn:.4f} | two-kernel err {two_err}", flush=True)
    for cfg in CFGS:
        if shape[3] == 128 and cfg[1] < 8:
            continue
        try:
            def fn(i, cfg=cfg):
                launch(cfg, *sets[i][:6], scale, *sets[i][6:])

            t0 = time.time()
            fn(0)
            torch.cuda.synchronize()
            compile_s = time.time() - t0
            ms = _median_ms(fn, n)
            print(f"  short {cfg}: {ms:.4f} ms = {ms / t_two:.3f} of two-kernel; ours fwd+short ÷ cudnn fwd+bwd "
                  f"{(fwd + ms) / t_cudnn:.3f} (vs {(fwd + t_two) / t_cudnn:.3f}); compile {compile_s:.1f}s; "
                  f"err {errors(shape, short_bwd(cfg))}", flush=True)
        except Exception as e:  # noqa: BLE001  a config that does not fit is one line
            print(f"  short {cfg}: {type(e).__name__} {str(e)[:150]}", flush=True)


if __name__ == "__main__":
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    for shape in SHAPES:
        probe(shape)
