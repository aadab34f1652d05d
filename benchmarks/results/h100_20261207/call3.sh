# Call 3: the fwd_sm90_wide head_dim check again (a child process), and ViT-B/16 at 512 px with attention=cuda (auto:
# three-consumer forward at N = 1025) beside timm + SDPA, eager and compiled.
source .device/common.sh
BUDGET=420
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase tests 60 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "refuses or wide_forward_equals"
phase train512 260 python3 -m benchmarks.train --preset range --models vit_base_patch16_512 --eager timm cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 3.4 --out $OUT --name train512
finish
tail -3 $OUT/tests.log; grep "^| vit" $OUT/train512.md | cut -d'|' -f2-8
