# Call 2 of 2026-12-07 (third session): the ping-pong backward's new order (its GPU tests), cuda_bench with the ordered
# backward on main. Setup: this file and benchmarks/results/h200_20261203/common.sh in .device/,
# .device/COMMIT, carry [".whl", ".device"].
source .device/common.sh
BUDGET=150
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build 150 python3 -u -c "from kernels.cuda import build; build.extension()"
phase pptests 90 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "pingpong_backward_equals or tma-pp or (kernels_finish and pingpong)"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-wide cuda-sm90-persistent cuda-sm90-bwd-persistent cuda-sm90-persistent-pingpong; do S="$S --skip $r"; done
phase bench 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench.json
finish
head -2 $OUT/env.txt; tail -2 $OUT/pptests.log; grep -E "^\| [0-9]" $OUT/bench.log | cut -d'|' -f2-10; for f in train1024 train224; do grep "^| vit" $OUT/$f.md 2>/dev/null | cut -d'|' -f2-8; done
