set -u
export PYTHONPATH=$PWD CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
unset TRITON_INTERPRET
cp .device/COMMIT $OUT/commit.txt
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
t0=$(date +%s)
timeout 110 python3 -u benchmarks/flash_bench.py --warm --warm-tests --no-table > $OUT/warm.log 2>&1
echo "warm rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/phases.txt
t1=$(date +%s)
PYTHONFAULTHANDLER=1 timeout -s ABRT 300 python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_flash.py tests/test_flash_tails.py tests/test_flash_fp32_delta.py tests/test_flash_launch.py tests/test_flash_native.py tests/test_flash_tuning.py tests/test_flash_hopper.py -rfEs --durations=15 > $OUT/gpu_flash.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 ))s, ended $(date -u +%T)" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -5 $OUT/gpu_flash.log
