# Call 1: the ping-pong backward consumers (VIT_CUDA_BWD_SM90=pingpong) and the deterministic Hopper backward (dq slices),
# head_dim 64 and 128: build, deadlock smoke tests, cuda_bench A/B, their GPU tests.
source .device/common.sh
BUDGET=400
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase finish 45 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "test_sm90_kernels_finish and (pingpong or deterministic)"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma; do S="$S --skip $r"; done
DET=1; if grep -q "deterministic.*FAILED\|FAILED.*deterministic" $OUT/finish.log; then S="$S --skip cuda-auto-deterministic"; DET=0; fi
for i in 1 2; do phase bench$i 50 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench$i.json; done
[ $DET = 1 ] && phase dettests 100 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py tests/test_cuda_eager.py -k "deterministic or sm90-det or each_stage"
phase pptests 90 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "pingpong_backward_equals or tma-pp"
finish
for f in bench1 bench2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-8; done; tail -5 $OUT/finish.log; tail -4 $OUT/dettests.log; tail -4 $OUT/pptests.log
