source .device/common.sh
BUDGET=560
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, timm, torchvision; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
git diff HEAD --stat > $OUT/diff_stat.txt 2>&1
export MAX_JOBS=16
python3 -u -c "from kernels.flash import native; native.load()" > $OUT/flash_native_build.log 2>&1 &
(cd .device/old && VIT_KERNELS_BUILD_DIR=/tmp/oldbuild PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -u -c "from kernels.cuda import build; build.extension()") > $OUT/oldbuild.log 2>&1 &
phase build 200 python3 -u -c "from kernels.cuda import build; build.extension()"
wait
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-auto-deterministic; do S="$S --skip $r"; done
for i in 1 2; do
  phase new$i 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/new$i.json
  (cd .device/old && VIT_KERNELS_BUILD_DIR=/tmp/oldbuild PYTHONPATH=/tmp/site:$PWD timeout 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/old$i.json) > $OUT/old$i.log 2>&1
  echo "old$i rc=$?" >> $OUT/phases.txt
done
phase tests 200 python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_eager.py tests/test_cuda_kernels.py -rfE -x
phase ncu 60 ncu --kernel-name regex:bwd_sm90 --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy python3 .device/ncu_bwd.py 8 12 4096 64
phase flashtests 200 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE $(cat .device/flash_rest.txt)
finish
for f in new1 old1 new2 old2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-6; done; tail -3 $OUT/tests.log; grep -E "Throughput|Duration|Stall|Issued|Pipe" $OUT/ncu.log | head -30; tail -3 $OUT/flashtests.log
