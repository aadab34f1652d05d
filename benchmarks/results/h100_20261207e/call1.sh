# Not run yet: one device call (about 8 minutes, any Hopper GPU) for the two branches built after this record's calls,
# each applied to a copy of the tree: wip/bwd64-brkpt (bwd64_brkpt.patch beside this file: a second brkpt block
# boundary, all 64 of Pᵀ's exponentials under dPᵀ at head_dim 64, no spills) and wip/flash-pipeline
# (flash_pipeline.patch: the flash forward's pipelined key loop, each forward config tuned plain and pipelined).
# Their GPU tests, then main against the patched copy: cuda_bench twice each, alternating, and flash_bench's table
# (the tuner picks plain or pipelined per shape) once each. Setup on the main checkout: this file, the two patches and
# benchmarks/results/h200_20261203/common.sh in .device/, `git rev-parse --short HEAD > .device/COMMIT`,
# carry [".whl", ".device"]. Merge what passes its tests and is faster.
source .device/common.sh
BUDGET=590
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build_main 150 python3 -u -c "from kernels.cuda import build; build.extension()"
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/bwd64_brkpt.patch && patch -p1 < $REPO/.device/flash_pipeline.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
phase tests_cuda 180 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py"
phase tests_flash 150 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_flash_pipelined.py tests/test_flash.py tests/test_flash_launch.py"
SH="8,16,4096,128;8,12,4096,64;32,12,1024,64;256,12,197,64;256,12,197,128"
phase flash_main 60 python3 -u benchmarks/flash_bench.py --shapes "$SH"
phase flash_wip 75 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/flash_bench.py --shapes '$SH'"
S="--skip sdpa-flash"; for r in cuda-auto cuda-auto-bwd-sequential; do S="$S --only $r"; done
for i in 1 2; do
  phase bench_main$i 40 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main$i.json
  phase bench_wip$i 40 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip$i.json"
done
finish
tail -2 $OUT/tests_cuda.log $OUT/tests_flash.log; grep -E "^\| [0-9]" $OUT/flash_main.log $OUT/flash_wip.log | cut -d'|' -f2-11; for f in bench_main1 bench_wip1 bench_main2 bench_wip2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done
