BUDGET=395; source .device/common.sh
phase gaps1024_flash 80 python3 -m benchmarks.profile_step --model vit_base_patch16_1024 --top 6 --gaps 12
phase gaps1024_timm 70 python3 -m benchmarks.profile_step --model vit_base_patch16_1024 --timm --top 6 --gaps 12
phase gaps224_flash 50 python3 -m benchmarks.profile_step --top 4 --gaps 12
phase gaps224_timm 50 python3 -m benchmarks.profile_step --timm --top 4 --gaps 12
phase gpu_tests 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_flash.py tests/test_flash_launch.py tests/test_flash_native.py tests/test_flash_tails.py tests/test_flash_tuning.py tests/test_flash_fp32_delta.py -rfE
finish
