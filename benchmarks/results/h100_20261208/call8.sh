# One short call on an H200 (about 4 minutes): main's error-floor fix in the two cuda tests it changed, then ViT-B/16
# at 1024 px (N = 4097), batch 8, compiled: timm + SDPA, flash, cuda, one round (issue 11 and 12's 1024 px row).
# Setup: this file and benchmarks/results/h200_20261203/common.sh in .device/, `git rev-parse --short HEAD >
# .device/COMMIT`, carry [".whl", ".device"].
source .device/common.sh
BUDGET=${BUDGET_S:-300}
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build 120 python3 -u -c "from kernels.cuda import build; build.extension()"
phase tests_fix 45 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "strided_qkv_from_fused or non_unit_last"
phase t1024 200 python3 -m benchmarks.train --rounds 1 --steps 20 --out $OUT --models vit_base_patch16_1024 --compiled timm flash cuda --max-minutes 3.0 --name t1024
finish
tail -n 2 $OUT/tests_fix.log; grep "^| vit" $OUT/t1024.md 2>/dev/null | cut -d'|' -f2-8
