#!/usr/bin/env bash
# Re-measure on one H200 (device kind nvidia-h200) everything behind the README's GPU tables, one device
# call of under 10 minutes per part (wheels in .whl, carried):
#   PART=1: build the CUDA extension; pytest -m gpu: the packed-path tests (gpu_tests_h200_packed.log), then the
#           rest of flash, cuda and the vector add (gpu_tests_h200_all.log).
#   PART=2: ViT-S/16, ViT-B/16 and ViT-B/16 384 px, eager and compiled, ours (flash) beside timm (train_vit.*);
#           ViT-B/16 again with what is alive at each peak (train_vitb_memory_peak.*); CPU vs GPU time per
#           flash call (launch_overhead_h200.log).
#   PART=3: the attention baseline, kernels alone and in the ViT's packed layout (attention_baseline*.*).
#   PART=4: the full attention preset (attention_full.*; bf16 and fp16 need about 7 minutes).
# Everything lands in $OUT/results.tgz (one file, so the device's limit on returned files holds).
#   device run, carry [".whl"]:  PART=1 bash benchmarks/h200_remeasure.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0 WANDB_MODE=disabled
R=/tmp/results
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/gpu.txt"
case "${PART:-1}" in
  1)
    python3 -m kernels.cuda.build 2>&1 | tail -2
    NEW="qkvpacked_compiled or vit_small_trains_like_sdpa"
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs -k "$NEW" \
      tests/test_flash.py > "$R/gpu_tests_h200_packed.log" 2>&1
    echo "pytest (packed path) exit $? at ${SECONDS}s"; tail -n 3 "$R/gpu_tests_h200_packed.log"
    timeout $((540 - SECONDS)) python3 -m pytest -m gpu -q -p no:cacheprovider -rs -k "not ($NEW)" \
      tests/test_flash.py tests/test_cuda_kernels.py tests/test_vector_add.py > "$R/gpu_tests_h200_all.log" 2>&1
    echo "pytest (the rest) exit $? at ${SECONDS}s"; tail -n 3 "$R/gpu_tests_h200_all.log"
    ;;
  2)
    timeout 60 python3 -m benchmarks.launch_overhead 2>&1 | grep -v tuned | tee "$R/launch_overhead_h200.log"
    timeout 300 python3 -m benchmarks.train --models vit_small_patch16_224 vit_base_patch16_224 vit_base_patch16_384 \
      --eager timm flash --compiled timm flash --max-minutes 5.5 --out "$R" --name train_vit > "$R/train_vit.log" 2>&1
    grep "img/s" "$R/train_vit.log"
    timeout $((570 - SECONDS)) python3 -m benchmarks.train --models vit_base_patch16_224 --eager timm flash \
      --compiled timm flash --memory-peak --max-minutes 3.2 --out "$R" --name train_vitb_memory_peak \
      > "$R/train_vitb_memory_peak.log" 2>&1
    grep "img/s" "$R/train_vitb_memory_peak.log"
    ;;
  3)
    timeout 100 python3 -m benchmarks.attention --preset baseline --out "$R" > "$R/attention_baseline.log" 2>&1
    timeout 100 python3 -m benchmarks.attention --preset baseline --layout packed --backends sdpa-flash sdpa-cudnn \
      flash --out "$R" > "$R/attention_baseline_packed.log" 2>&1
    tail -n 2 "$R/attention_baseline.log" "$R/attention_baseline_packed.log"
    ;;
  4)
    timeout 560 python3 -m benchmarks.attention --preset full --out "$R" > "$R/attention_full.log" 2>&1
    tail -n 2 "$R/attention_full.log"
    ;;
esac
tar czf "$OUT/results.tgz" -C "$R" .
echo "done at ${SECONDS}s"
