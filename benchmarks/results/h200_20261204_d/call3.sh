source .device/common.sh
BUDGET=300
export MAX_JOBS=16
cp .device/COMMIT $OUT/commit.txt
(cd .device/old && VIT_KERNELS_BUILD_DIR=/tmp/oldbuild PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -u -c "from kernels.cuda import build; build.extension()") > $OUT/oldbuild.log 2>&1
echo "oldbuild rc=$?" >> $OUT/phases.txt
python3 -u -c "from kernels.cuda import build; build.extension()" > $OUT/build.log 2>&1
for i in 1 2; do
  phase new$i 60 python3 -u -m benchmarks.launch_overhead --rounds 5 --cases "cuda,sdpa"
  (cd .device/old && VIT_KERNELS_BUILD_DIR=/tmp/oldbuild PYTHONPATH=/tmp/site:$PWD timeout 60 python3 -u -m benchmarks.launch_overhead --rounds 5 --cases "cuda,sdpa") > $OUT/old$i.log 2>&1
  echo "old$i rc=$?" >> $OUT/phases.txt
done
finish
for f in new1 old1 new2 old2; do echo "== $f"; grep "ms/call" $OUT/$f.log; done
