"""Attention statistics: the fused Triton kernel (kernels/flash/stats.py) against the materialising reference.

Each statistic (distance in pixels, entropy in nats, max logit) and the output are compared with a float64
computation of the same formula: the kernel's error may be at most 2× the naive float32 reference's plus
``ACCUM_ROUNDING`` float32 epsilons of the largest value (conftest's rule), i.e. the two agree within float32
rounding. On the CPU the kernel runs on Triton's interpreter (fp32, fp16: its bf16 dot is not exact); the
GPU tests run the same check at ViT-B sizes up to 1024 px (N = 4097).
"""
from __future__ import annotations

import math

import pytest
import torch
from conftest import HAS_CUDA, error_floor, make_qkv, max_err

from kernels.naive import attention_stats as naive_stats
from kernels.naive import patch_distances

NAMES = ("out", "distance", "entropy", "max_logit")


def flash_stats(*args, **kwargs):
    from kernels.flash.stats import attention_stats

    with torch.no_grad():
        return attention_stats(*args, **kwargs)


def check_stats(q, k, v, grid, patch_size, prefix):
    """Assert flash's outputs are within 2× naive's float32 error of float64 (+ rounding floor); return the errors."""
    got = flash_stats(q, k, v, grid, patch_size, prefix)
    base = naive_stats(q, k, v, grid, patch_size, prefix)
    ref = naive_stats(*(t.detach().double() for t in (q, k, v)), grid, patch_size, prefix)
    report = {}
    for name, g, b, r in zip(NAMES, got, base, ref):
        assert g.shape == r.shape and torch.isfinite(g).all(), f"{name}: shape {tuple(g.shape)} or non-finite values"
        dtype = q.dtype if name == "out" else torch.float32
        floor = error_floor(r, dtype)
        err, base_err = max_err(g, r), max_err(b, r)
        report[name] = (err, base_err)
        assert err <= 2 * base_err + floor, (f"{name}: error {err:.3e} > 2 × naive's {base_err:.3e} + {floor:.1e} "
                                             f"(shape {tuple(q.shape)}, {q.dtype}, grid {grid}, prefix {prefix})")
    return report


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("N", [5, 17, 65, 197])
def test_fused_stats_equal_the_reference(N, dtype):
    side = math.isqrt(N - 1)
    q, k, v = make_qkv(2, 2, N, 32, dtype, requires_grad=False)
    check_stats(q, k, v, (side, side), 16, 1)


@pytest.mark.parametrize("prefix", [0, 1])
def test_fused_stats_on_a_rectangular_grid(prefix):
    q, k, v = make_qkv(1, 2, 3 * 23 + prefix, 16, requires_grad=False)  # 3 rows × 23 columns: 2 key tiles + tail
    check_stats(q, k, v, (3, 23), 14, prefix)


def test_fused_entropy_stays_exact_at_large_logits():
    """Logits ~±300: entropy is computed from Σ P·(s − m), which does not cancel as Σ P·s − m would."""
    q, k, v = make_qkv(1, 2, 65, 32, scale=8.0, requires_grad=False)
    errors = check_stats(q, k, v, (8, 8), 16, 1)
    assert errors["max_logit"][1] > 0  # the scores are large enough to carry float32 rounding


def test_reference_on_hand_computed_cases():
    """2×2 grid of 16 px patches plus a class token. Uniform attention (q = 0): entropy ln 5; patch (0, 0)
    averages distances 0 (class), 0, 16, 16, 16√2 px over 5 keys. One-hot attention: entropy 0."""
    dist = patch_distances((2, 2), 16)
    assert dist[1, 4] == pytest.approx(16 * math.sqrt(2)) and dist[2, 3] == pytest.approx(16 * math.sqrt(2))
    assert dist[0].abs().sum() == 0 and dist[:, 0].abs().sum() == 0 and dist[1, 2] == 16
    q, k, v = torch.zeros(1, 1, 5, 4), torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    out, distance, entropy, max_logit = naive_stats(q, k, v, (2, 2), 16, 1)
    assert entropy.flatten().tolist() == pytest.approx([math.log(5)] * 5)
    assert distance[0, 0, 1].item() == pytest.approx((32 + 16 * math.sqrt(2)) / 5) and distance[0, 0, 0] == 0
    assert max_logit.abs().max() == 0 and torch.allclose(out, v.mean(2, keepdim=True).expand_as(v))
    k = torch.eye(5, 4)[None, None] * 1e3  # key j ≠ 4 aligned with q = e_j; token 4's key is 0
    _, distance, entropy, _ = naive_stats(torch.eye(5, 4)[None, None], k, v, (2, 2), 16, 1, softmax_scale=1.0)
    assert entropy[0, 0, :4].abs().max() < 1e-6 and distance[0, 0, :4].abs().max() < 1e-6  # each row on itself


def test_bad_grid_and_gradients_are_refused():
    q, k, v = make_qkv(1, 1, 17, 16, requires_grad=False)
    for fn in (naive_stats, flash_stats):
        with pytest.raises(ValueError, match=r"1 prefix tokens \+ a 3×5 patch grid is 16 tokens, but q has seq_len=17"):
            fn(q, k, v, (3, 5), 16, 1)
    from kernels.flash.stats import attention_stats

    with pytest.raises(RuntimeError, match="forward-only"):
        attention_stats(q.requires_grad_(), k, v, (4, 4), 16, 1)


@pytest.mark.skipif(HAS_CUDA, reason="the no-GPU error needs a machine without one")
def test_the_no_gpu_error_names_analyzes_option(monkeypatch):
    """analyze.py has a stats= key, not attention=: the fused kernel's no-GPU error says which to use."""
    from kernels.flash import configs
    from kernels.flash.stats import attention_stats

    monkeypatch.setattr(configs, "INTERPRETED", False)
    q, k, v = make_qkv(1, 1, 17, 16, requires_grad=False)
    with pytest.raises(RuntimeError, match=r"use stats=naive \(analyze.py\)"):
        attention_stats(q, k, v, (4, 4), 16, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("N", [197, 577, 1025, 4097])
def test_fused_stats_equal_the_reference_gpu(N, dtype):
    """ViT-B/16 heads (d = 64) at 224, 384, 512 and 1024 px; the float64 reference at N = 4097 takes
    2·12·4097²·8 B = 3.2 GB per N×N tensor."""
    assert HAS_CUDA
    side = math.isqrt(N - 1)
    q, k, v = make_qkv(2, 12, N, 64, dtype, device="cuda", requires_grad=False)
    check_stats(q, k, v, (side, side), 16, 1)


def test_fused_stats_run_under_the_inputs_device_when_it_is_not_current(monkeypatch):
    """analyze.py device=cuda:1 sets no current device: the stats kernel must launch under torch.cuda.device(q.device)
    (CPU: _elsewhere and torch.cuda.device stood in for)."""
    import contextlib

    import kernels.flash

    entered = []
    monkeypatch.setattr(torch.cuda, "device", lambda d: entered.append(d) or contextlib.nullcontext())
    q, k, v = make_qkv(1, 2, 5, 16, requires_grad=False)
    for elsewhere in (False, True):
        monkeypatch.setattr(kernels.flash, "_elsewhere", lambda t, e=elsewhere: e)
        flash_stats(q, k, v, (2, 2), 16.0, 1)
    assert entered == [q.device]
