# Not run yet: branch wip/bwd-elementwise (the Hopper backward's scale applied once, the staged consumers without the
# query-row mask, the rows-tma and columns-tma sequential consumers in FlashAttention-3's product order) against main,
# in one call: its GPU tests, then cuda_bench twice each, alternating. Rows to read: cuda-auto (rows-tma at 64),
# cuda-sm90-dqrows-tma, cuda-sm90-dqcols-tma (sequential at 128: ordered on the branch) against
# cuda-sm90-dqcols-tma-pingpong (auto's at 128), cuda-auto-deterministic and cuda-sm90-bwd-persistent. The branch's
# change against main is wip_bwd_ordered.patch beside this script (`git diff main wip/bwd-elementwise`), applied here
# to a copy of the tree. Setup on the main checkout: copy this and benchmarks/results/h200_20261203/common.sh to
# .device/, `git rev-parse --short HEAD > .device/COMMIT`, carry [".whl", ".device"]. About 6 minutes.
source .device/common.sh
BUDGET=590
export MAX_JOBS=16
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
finish
tail -3 $OUT/tests_wip.log; for f in bench_main1 bench_wip1 bench_main2 bench_wip2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done
