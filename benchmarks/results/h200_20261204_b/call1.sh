source .device/common.sh
BUDGET=570
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 240 python3 -u -c "from kernels.cuda import build; build.extension(verbose=True)"
T="python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -rfEs"
phase finish 120 $T -k sm90_kernels_finish
if grep -q " passed" $OUT/finish.log && ! grep -q "failed" $OUT/finish.log; then
  phase tests 150 $T -k "sm90_matches and (dqtma or dqcols-tma or overlap or dqsum) or overlap_backward_equals or summed_dq_leaves or size_one or each_stage"
  phase bench 200 python3 -u benchmarks/cuda_bench.py --attention-only --skip cuda-sm80 --skip cuda-sm90-pingpong --skip cuda-auto-deterministic --json $OUT/cuda_bench.json
  cat > /tmp/san.py <<'PY'
import sys, torch
from kernels.cuda import attention, ops
ops.FWD_PATH = ops.BWD_PATH = "sm90"; ops.BWD_DQ = sys.argv[1]; ops.BWD_SM90 = "sequential"
q, k, v = (torch.randn(1, 2, 300, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
attention(q, k, v).sum().backward(); torch.cuda.synchronize(); print("done")
PY
  phase racecheck 60 /usr/local/cuda/bin/compute-sanitizer --tool racecheck --kernel-name regex:bwd python3 /tmp/san.py sum
  phase synccheck 50 /usr/local/cuda/bin/compute-sanitizer --tool synccheck --kernel-name regex:bwd python3 /tmp/san.py sum-tma
fi
cp /root/.cache/vit-kernels/*/build.ninja $OUT/ 2>/dev/null
finish
tail -3 $OUT/finish.log $OUT/tests.log 2>/dev/null; grep -E "4096 \| 64|16384|4096 \| 128" $OUT/bench.log | cut -c1-140
