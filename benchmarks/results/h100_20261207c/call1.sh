# Call 1 of 2026-12-07 (fifth session): next_ab.sh's A/B of wip_bwd_ordered.patch (its GPU tests, cuda_bench main
# against the patch twice, alternating), then the flash backend's Gluon kernels' GPU tests and timing (never GPU-run
# before). Setup: this file and benchmarks/results/h200_20261203/common.sh in .device/, .device/COMMIT,
# carry [".whl", ".device"].
source .device/common.sh
BUDGET=590
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build_main 150 python3 -u -c "from kernels.cuda import build; build.extension()"
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
(cd /tmp/wip && patch -p1 < benchmarks/results/h100_20261207b/wip_bwd_ordered.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
phase tests_wip 230 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_eager.py tests/test_cuda_kernels.py"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma-pingpong cuda-sm90-wide cuda-sm90-persistent sdpa-flash; do S="$S --skip $r"; done
for i in 1 2; do
  phase bench_main$i 45 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main$i.json
  phase bench_wip$i 45 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip$i.json"
done
phase gluon_tests 150 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE -x tests/test_flash_gluon.py
phase gluon_bench 120 python3 -u benchmarks/flash_bench.py --gluon
finish
tail -3 $OUT/tests_wip.log $OUT/gluon_tests.log; for f in bench_main1 bench_wip1 bench_main2 bench_wip2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done; tail -20 $OUT/gluon_bench.log
