# Call 1: the ping-pong backward consumers (VIT_CUDA_BWD_SM90=pingpong, head_dim 64 and 128): build, their GPU tests, cuda_bench A/B.
source .device/common.sh
BUDGET=170
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase finish 45 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "test_sm90_kernels_finish and pingpong"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-auto-deterministic; do S="$S --skip $r"; done
for i in 1; do phase bench$i 50 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench$i.json; done
phase pptests 40 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "pingpong_backward_equals or tma-pp"
finish
for f in bench1; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-8; done; tail -5 $OUT/finish.log; tail -8 $OUT/pptests.log
