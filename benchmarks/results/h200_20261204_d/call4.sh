source .device/common.sh
BUDGET=460
export MAX_JOBS=12
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/env.txt 2>&1
python3 -u -c "from kernels.flash import native; native.load()" > $OUT/flash_native_build.log 2>&1 &
(cd .device/old && VIT_KERNELS_BUILD_DIR=/tmp/oldbuild PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -u -c "from kernels.cuda import build; build.extension()") > $OUT/oldbuild.log 2>&1 &
phase build 200 python3 -u -c "from kernels.cuda import build; build.extension()"
wait
for i in 1 2 3; do
  phase new$i 45 python3 -u -m benchmarks.launch_overhead --rounds 7 --cases "cuda fwd,cuda packed,sdpa"
  (cd .device/old && VIT_KERNELS_BUILD_DIR=/tmp/oldbuild PYTHONPATH=/tmp/site:$PWD timeout 45 python3 -u -m benchmarks.launch_overhead --rounds 7 --cases "cuda fwd,cuda packed,sdpa") > $OUT/old$i.log 2>&1
  echo "old$i rc=$?" >> $OUT/phases.txt
done
phase flashtests 260 python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_flash_launch.py tests/test_flash_native.py tests/test_flash.py -rfE
finish
for f in new1 old1 new2 old2 new3 old3; do echo "== $f"; grep "ms/call" $OUT/$f.log | sed 's/ms\/call//g' | cut -c1-120; done; tail -3 $OUT/flashtests.log
