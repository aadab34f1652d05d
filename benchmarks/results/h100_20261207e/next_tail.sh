# Not run yet: one call (about 8 minutes, any Hopper GPU; run it first, the machine warm for next_h200.sh after) for
# branch wip/fwd-tail (tails.patch beside this file: the sequential forward consumers cut the last key tile's
# products to 16 or 80 keys where N leaves no more, N = 197, 577, 1025, 4097 in a ViT, and a consumer with no query
# row below N skips its products; the ordered backward consumer's last query step cut to 80 of 128 or 16 of 64
# queries) and main's opt-in short forward (VIT_CUDA_FWD_SM90=short, never GPU-run). GPU tests of the patched copy
# (its float64 tests cover tails of 1, 17, 69, 65 and 1 keys; the ping-pong forward and backward, which keep full
# tiles, must still equal the sequential ones bitwise), the short forward's own tests on main, then cuda_bench on
# main and the patched copy, alternating twice.
# Setup on the main checkout: this file, tails.patch and benchmarks/results/h200_20261203/common.sh in .device/,
# `git rev-parse --short HEAD > .device/COMMIT`, carry [".whl", ".device"]. Merge the patch if it passes and is faster.
source .device/common.sh
BUDGET=585
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build_main 150 python3 -u -c "from kernels.cuda import build; build.extension()"
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/tails.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
phase tests_short 90 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "short"
S=""; for r in cuda-auto cuda-sm90-persistent cuda-sm90-wide cuda-sm90-short; do S="$S --only $r"; done
phase bench_main1 45 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main1.json
phase bench_wip1 45 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip1.json"
phase tests_wip 230 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k 'not short'"
phase bench_main2 45 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main2.json
phase bench_wip2 45 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip2.json"
finish
tail -n 2 $OUT/tests_short.log $OUT/tests_wip.log; for f in bench_main1 bench_wip1 bench_main2 bench_wip2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done
