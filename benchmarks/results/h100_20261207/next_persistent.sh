# Not run yet (no device time left on 2026-12-07): the persistent Hopper forward (VIT_CUDA_FWD_SM90=persistent) and the
# backward's key-tile walk (VIT_CUDA_BWD_SM90=persistent) in their GPU tests, then timed beside the one-CTA-a-tile
# kernels, the defaults and cuDNN. Run as the calls above: copy this and
# benchmarks/results/h200_20261203/common.sh to .device/, `git rev-parse --short HEAD > .device/COMMIT`, carry .whl and .device.
source .device/common.sh
BUDGET=400
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase finish 130 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "test_sm90_kernels_finish and persistent"
grep -q " passed" $OUT/finish.log && ! grep -q "failed" $OUT/finish.log && \
  phase tests 120 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "persistent"
S=""; for r in cuda-sm80 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong cuda-auto-deterministic; do S="$S --skip $r"; done
grep -q "failed" $OUT/tests.log $OUT/finish.log && S="$S --skip cuda-sm90-persistent --skip cuda-sm90-bwd-persistent"
for i in 1 2; do phase bench$i 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench$i.json; done
finish
tail -3 $OUT/finish.log $OUT/tests.log; for f in bench1 bench2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done
