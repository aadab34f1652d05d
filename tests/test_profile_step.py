"""benchmarks/profile_step.py: kernel names land in the right bucket; no GPU, a clear refusal."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `benchmarks` is run as `python -m benchmarks.x` from the repo root
    sys.path.insert(0, str(ROOT))

from benchmarks.profile_step import bucket, main


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
