# Not run yet: the H200 re-measure of h100_20261207b.md's H100 rows, peers in the same run. Two calls, each under the
# 10-minute limit: `bash .device/next_h200.sh a`, then `... b` on the warm machine; `... c` runs the flash backend's
# Gluon kernels' GPU tests and timing (built 2026-12-02, never GPU-run; issue 11). Setup as next_ab.sh's (this file
# and benchmarks/results/h200_20261203/common.sh in .device/, .device/COMMIT, carry [".whl", ".device"]). If
# next_ab.sh has merged the wip patch, run this after it.
source .device/common.sh
BUDGET=590
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build 150 python3 -u -c "from kernels.cuda import build; build.extension()"
if [ "$1" = a ]; then
  phase refuse 80 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "refuses or (test_sm90_kernels_finish and persistent)"
  S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong cuda-sm90-wide cuda-sm90-persistent; do S="$S --skip $r"; done
  phase bench 100 python3 -u benchmarks/cuda_bench.py --attention-only --rounds 3 $S --json $OUT/bench.json
  phase train1024 330 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm flash cuda --compiled timm flash cuda --rounds 2 --steps 20 --max-minutes 5.2 --out $OUT --name train1024
elif [ "$1" = c ]; then
  phase gluon_tests 300 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_flash_gluon.py
  phase gluon_bench 200 python3 -u benchmarks/flash_bench.py --gluon
else
  phase train512 240 python3 -m benchmarks.train --preset range --models vit_base_patch16_512 --eager timm flash cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 3.8 --out $OUT --name train512
  phase train224 240 python3 -m benchmarks.train --models vit_base_patch16_224 --batch-size 256 --eager timm flash cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 3.8 --out $OUT --name train224
fi
finish
tail -2 $OUT/refuse.log $OUT/gluon_tests.log 2>/dev/null; tail -30 $OUT/gluon_bench.log 2>/dev/null; grep -E "^\| [0-9]" $OUT/bench.log 2>/dev/null | cut -d'|' -f2-9; for f in train1024 train512 train224; do grep "^| vit" $OUT/$f.md 2>/dev/null | cut -d'|' -f2-8; done
