#!/usr/bin/env bash
# The whole GPU session on one nvidia-h200-x2 machine (2 H200s), in one device call, in phases so
# that the two GPUs stay busy and timed runs never share a GPU:
#   1. GPU 0: scale runs 1-3 (flash eager, flash compile, cuda eager: benchmarks/scale_h200.sh)
#      GPU 1: benchmarks/train.py (ViT-B/16: ours per backend beside timm, eager and compiled)
#   2. both GPUs: scale runs 4-5 (DDP and FSDP2 on 2 GPUs)
#   3. GPU 0: scale runs 6-8 (1024 px: flash, naive out of memory, flash + grad_ckpt)
#      GPU 1: pytest -m gpu for the flash and cuda kernels and the vector add
# Then the scale table. Outputs in $OUT: scale_h200.{log,json,md}, train_vitb.{json,md,log}, gpu_tests_h200.log.
#   device run, carry [".whl"]:  bash benchmarks/h200_x2_session.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0 SKIP_INSTALL=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,driver_version --format=csv
python3 -m kernels.cuda.build 2>&1 | tail -2

CUDA_VISIBLE_DEVICES=1 timeout 210 python3 -m benchmarks.train --models vit_base_patch16_224 \
  --eager timm flash sdpa cuda --compiled timm flash --max-minutes 2.4 --out "$OUT" --name train_vitb \
  > "$OUT/train_vitb.log" 2>&1 &
GPU1=$!
CUDA_VISIBLE_DEVICES=0 ONLY="1 2 3" DEADLINE=210 bash benchmarks/scale_h200.sh > /dev/null
wait $GPU1
echo "phase 1 done at ${SECONDS}s"
ONLY="4 5" DEADLINE=130 bash benchmarks/scale_h200.sh > /dev/null
echo "phase 2 done at ${SECONDS}s"
CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/test_flash.py tests/test_cuda_kernels.py tests/test_vector_add.py > "$OUT/gpu_tests_h200.log" 2>&1 &
GPU1=$!
CUDA_VISIBLE_DEVICES=0 ONLY="6 7 8" DEADLINE=150 bash benchmarks/scale_h200.sh
wait $GPU1
echo "phase 3 done at ${SECONDS}s"
tail -3 "$OUT/gpu_tests_h200.log"
tail -12 "$OUT/train_vitb.log"
