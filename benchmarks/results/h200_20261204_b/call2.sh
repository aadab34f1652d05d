source .device/common.sh
BUDGET=570
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase warm 120 python3 -u benchmarks/flash_bench.py --warm --warm-tests --no-table
phase tests 150 python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_flash_hopper.py tests/test_flash_tails.py -rfEs --durations=8
phase sweep 200 python3 -u benchmarks/flash_bench.py --sweep --kernels fwd,fwd_tma,dkdv,dkdv_tma --shapes "8,16,4096,128;256,12,197,128"
phase table 90 python3 -u benchmarks/flash_bench.py --shapes "8,16,4096,128;256,12,197,128;8,12,4096,64;256,12,197,64"
finish
tail -4 $OUT/tests.log; tail -30 $OUT/table.log | cut -c1-150
