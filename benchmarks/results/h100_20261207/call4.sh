# Call 4: every cuda GPU test at this commit (the forward kernels' template arguments changed), then ViT-B/16 at 224 px,
# batch 256, attention=cuda beside timm + SDPA, eager and compiled, with what time is left.
source .device/common.sh
BUDGET=400
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase tests 200 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_eager.py tests/test_cuda_kernels.py
phase train224 170 python3 -m benchmarks.train --models vit_base_patch16_224 --batch-size 256 --eager timm cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 2.6 --out $OUT --name train224
finish
tail -4 $OUT/tests.log; grep "^| vit" $OUT/train224.md | cut -d'|' -f2-8
