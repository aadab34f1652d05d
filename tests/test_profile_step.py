"""benchmarks/profile_step.py: kernel names land in the right bucket; idle gaps between kernels; no GPU, a clear
refusal."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `benchmarks` is run as `python -m benchmarks.x` from the repo root
    sys.path.insert(0, str(ROOT))

from benchmarks.profile_step import bucket, idle_gaps, main


@pytest.mark.parametrize("name, want", [
    ("flash_bwd_dkdv_kernel", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4>>", "attention"),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNT", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "matmul"),
    ("triton_tem_fused_addmm_0", "matmul"),
    ("triton_per_fused_native_layer_norm_3", "norm / softmax / elementwise (fused by Inductor)"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise (eager)"),
    ("some_unknown_kernel", "other"),
])
def test_kernel_names_land_in_their_bucket(name, want):
    assert bucket(name) == want


def test_refuses_without_cuda(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit, match="CUDA GPU"):
        main([])


def test_idle_gaps_sum_the_waits_between_kernels_by_pair():
    # two steps of a -> b -> c; b overlaps a in step 1 (no gap), a long kernel hides a short one's end
    spans = [("a", 0.0, 10.0), ("b", 8.0, 12.0), ("c", 15.0, 20.0),
             ("a", 100.0, 110.0), ("b", 111.0, 115.0), ("c", 115.0, 116.0),
             ("long", 200.0, 300.0), ("short", 210.0, 220.0), ("d", 305.0, 306.0)]
    rows = {(before, after): (ms, count) for before, after, ms, count in idle_gaps(spans, steps=2)}
    assert rows[("b", "c")] == pytest.approx((3e-3 / 2, 0.5))
    assert rows[("a", "b")] == pytest.approx((1e-3 / 2, 0.5))
    assert rows[("c", "a")] == pytest.approx((80e-3 / 2, 0.5))
    assert rows[("c", "long")] == pytest.approx((84e-3 / 2, 0.5))
    assert rows[("long", "d")] == pytest.approx((5e-3 / 2, 0.5))  # not "short": long ended last
    assert len(rows) == 5
    assert idle_gaps(spans, steps=2)[0][:2] == ("c", "long")
