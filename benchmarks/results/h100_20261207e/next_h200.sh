# Not run yet: the H200 measurements that issues 11 and 12's "done when" read, main with the peers in the same calls.
# Three calls, each under the 10-minute limit, on one warm machine: `bash .device/next_h200.sh a`, then `b`, then `c`.
# Setup on the main checkout: this file and benchmarks/results/h200_20261203/common.sh in .device/,
# `git rev-parse --short HEAD > .device/COMMIT`, carry [".whl", ".device"].
#   a: kernels and CPU cost: cuda_bench (cuda-auto, the opt-in short forward beside persistent, both peers, 2
#      rounds), flash_bench (baseline shapes), launch_overhead (--profile: where the cuda and flash calls spend their
#      CPU); ViT-B/16 224 px at batch 16 and 64, eager (timm, sdpa, flash, cuda).
#   b: 224 px batch 256 and 512 px batch 64, eager and compiled (timm, flash, cuda).
#   c: 1024 px batch 8, eager and compiled (timm, flash, cuda); the CUDA kernels' GPU tests.
source .device/common.sh
BUDGET=570
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build 150 python3 -u -c "from kernels.cuda import build; build.extension()"
T="python3 -m benchmarks.train --rounds 2 --steps 20 --out $OUT"
if [ "$1" = a ]; then
  phase bench 90 python3 -u benchmarks/cuda_bench.py --attention-only --rounds 2 --only cuda-auto --only cuda-sm90-short --only cuda-sm90-persistent --json $OUT/bench.json
  phase flash 150 python3 -u benchmarks/flash_bench.py
  phase overhead 100 python3 -u -m benchmarks.launch_overhead --rounds 3 --profile
  phase b16 110 $T --models vit_base_patch16_224 --batch-size 16 --eager timm sdpa flash cuda --compiled --max-minutes 1.8 --name b16
  phase b64 110 $T --models vit_base_patch16_224 --batch-size 64 --eager timm sdpa flash cuda --compiled --max-minutes 1.8 --name b64
elif [ "$1" = b ]; then
  phase t224 250 $T --models vit_base_patch16_224 --batch-size 256 --eager timm flash cuda --compiled timm flash cuda --max-minutes 6 --name t224
  phase t512 250 $T --models vit_base_patch16_512 --eager timm flash cuda --compiled timm flash cuda --max-minutes 6 --name t512
else
  phase t1024 300 $T --models vit_base_patch16_1024 --eager timm flash cuda --compiled timm flash cuda --max-minutes 7 --name t1024
  phase tests_cuda 240 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py tests/test_cuda_eager.py
fi
finish
tail -n 2 $OUT/tests_cuda.log 2>/dev/null; grep -E "^\| [0-9]" $OUT/bench.log 2>/dev/null | cut -d'|' -f2-9; grep -A8 "ours / peer" $OUT/flash.log 2>/dev/null; tail -n 25 $OUT/overhead.log 2>/dev/null; for f in b16 b64 t224 t512 t1024; do grep "^| vit" $OUT/$f.md 2>/dev/null | cut -d'|' -f2-8; done
