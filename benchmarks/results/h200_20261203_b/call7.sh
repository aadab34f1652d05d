BUDGET=520; source .device/common.sh
phase warm 70 python3 benchmarks/flash_bench.py --warm --warm-tests --no-table
phase gpu_flash 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_flash.py tests/test_flash_tails.py tests/test_flash_fp32_delta.py tests/test_flash_launch.py tests/test_flash_native.py tests/test_flash_tuning.py -rfE
phase flash_table 150 python3 benchmarks/flash_bench.py
finish
