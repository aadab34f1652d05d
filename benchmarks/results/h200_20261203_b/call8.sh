BUDGET=290; source .device/common.sh
date +%T > $OUT/t0.txt
PYTHONFAULTHANDLER=1 timeout -s ABRT 265 python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_flash.py tests/test_flash_tails.py tests/test_flash_fp32_delta.py tests/test_flash_launch.py tests/test_flash_native.py tests/test_flash_tuning.py -rfEs --durations=12 > $OUT/gpu_flash_u.log 2>&1
echo "rc=$? at $(date +%T)" >> $OUT/t0.txt
cd $OUT && tar czf all.tgz *.log *.txt; cat t0.txt
