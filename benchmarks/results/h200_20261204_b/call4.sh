source .device/common.sh
BUDGET=300
export MAX_JOBS=16
phase build 120 python3 -u -c "from kernels.cuda import build; build.extension()"
phase auto128 40 python3 -u benchmarks/results/cuda_gpu_auto128_check.py
phase train1024 220 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm cuda flash --compiled timm cuda --rounds 4 --out $OUT --name train1024_b8
finish
tail -4 $OUT/auto128.log; grep "^| vit" $OUT/train1024_b8.md | cut -d'|' -f3-8
