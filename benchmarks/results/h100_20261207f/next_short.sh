# One short call (about 4 minutes, any Hopper GPU) for what the session's last device time can hold: main's changes
# not yet GPU-run (tests/test_cuda_eager.py, tests/test_flash_native.py: the C++ nodes with the shared
# once_differentiable header; auto's short forward), then branch wip/bwd-tail (bwd_tail.patch beside this file): the
# GPU tests of the kernels it changes (the ordered consumer's modes rows-tma, columns-tma, deterministic, persistent;
# auto; the ping-pong equality it extends) and cuda_bench, main against the patched copy, one round each.
# Setup: this file, bwd_tail.patch and common.sh in .device/, `git rev-parse --short HEAD > .device/COMMIT`,
# carry [".whl", ".device"].
source .device/common.sh
BUDGET=${BUDGET_S:-250}
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build_main 120 python3 -u -c "from kernels.cuda import build; build.extension()"
phase tests_main 75 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_eager.py tests/test_flash_native.py
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/bwd_tail.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 120 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
phase bench_main1 40 python3 -u benchmarks/cuda_bench.py --attention-only --only cuda-auto --json $OUT/bench_main1.json
phase bench_wip1 40 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only --only cuda-auto --json $OUT/bench_wip1.json"
K="(test_sm90_matches_float64 and (dqrows-tma- or dqcols-tma- or sm90-det or persistent-bwd) and not pp) or test_auto_defaults or test_sm90_pingpong_backward_equals or test_sm90_deterministic_slices"
phase tests_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k '$K'"
finish
tail -n 3 $OUT/tests_main.log $OUT/tests_wip.log; for f in bench_main1 bench_wip1; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done
