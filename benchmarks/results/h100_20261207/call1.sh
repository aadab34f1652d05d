# Call 1 (2026-12-07, third session): the three-consumer forward (VIT_CUDA_FWD_SM90=wide) tested and timed beside the
# defaults and cuDNN; the cuda auto-default GPU tests at the new auto (ping-pong backward at head_dim 128); the
# deterministic backward's slice-count sweep; Nsight Compute on flash, cuda and cuDNN if time is left.
source .device/common.sh
BUDGET=540
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; ncu --version | tail -1; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase widetests 90 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "wide"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong cuda-auto-deterministic; do S="$S --skip $r"; done
grep -q "failed" $OUT/widetests.log && S="$S --skip cuda-sm90-wide"
phase bench1 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench1.json
phase autotests 90 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "auto_defaults or auto_runs"
sed -n '/^cat > \/tmp\/sweep.py/,/^PY$/p' benchmarks/results/h200_20261207/next_splits_sweep.sh | sed '1d;$d' > /tmp/sweep.py
phase sweep 100 python3 -u /tmp/sweep.py
phase bench2 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench2.json
phase ncu 150 ncu --profile-from-start off --set full --import-source no --clock-control none -f -o $OUT/probe python3 -u .device/ncu_probe.py
[ -f $OUT/probe.ncu-rep ] && phase ncudetails 30 ncu --import $OUT/probe.ncu-rep --page details --print-units base
finish
tail -3 $OUT/widetests.log; tail -3 $OUT/autotests.log; cat $OUT/sweep.log
for f in bench1 bench2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done
