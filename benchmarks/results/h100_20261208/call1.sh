# One call (about 8 minutes, any Hopper GPU): branch wip/bwd80 (bwd80.patch beside this file, on main): the 80-row
# head_dim-128 backward with dQ transposed (VIT_CUDA_BWD_DQ=swap-tma), and main's changes not yet GPU-run (the shared
# once_differentiable and packed_views headers, auto's short forward), all in the one patched copy:
# tests/test_cuda_eager.py, tests/test_flash_native.py, the swap-tma GPU tests and auto's float64 test, then
# cuda_bench (cuda-auto against the swap-tma backward, peers in the same run), two rounds.
# Setup: this file, bwd80.patch and benchmarks/results/h200_20261203/common.sh in .device/,
# `git rev-parse --short HEAD > .device/COMMIT` on main, carry [".whl", ".device"].
source .device/common.sh
BUDGET=${BUDGET_S:-520}
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/bwd80.patch) > $OUT/patch.log 2>&1 || exit 1
cd /tmp/wip; export VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip
phase build 170 python3 -u -c "from kernels.cuda import build; build.extension()"
phase tests_swap 120 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_cuda_kernels.py -k "swap"
phase bench1 60 python3 -u benchmarks/cuda_bench.py --attention-only --only cuda-auto --only cuda-sm90-dqswap-tma --only cuda-auto-bwd-sequential --json $OUT/bench1.json
phase tests_eager 100 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_eager.py tests/test_flash_native.py
phase tests_auto 60 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "test_auto_defaults or test_auto_runs"
phase bench2 60 python3 -u benchmarks/cuda_bench.py --attention-only --only cuda-auto --only cuda-sm90-dqswap-tma --only cuda-auto-bwd-sequential --json $OUT/bench2.json
finish
tail -n 3 $OUT/tests_*.log; grep "bitwise" $OUT/tests_swap.log | head -8; for f in bench1 bench2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done
