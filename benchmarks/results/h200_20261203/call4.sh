source .device/common.sh
phase prof1024_flash 90 python3 -m benchmarks.profile_step --model vit_base_patch16_1024 --top 14
phase prof1024_timm 90 python3 -m benchmarks.profile_step --model vit_base_patch16_1024 --timm --top 14
phase flash_table 200 python3 benchmarks/flash_bench.py
phase gpu_flash 170 python3 -m pytest -q -m gpu tests/test_flash.py tests/test_flash_launch.py -x -q
finish
