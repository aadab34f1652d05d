# One call, any Hopper GPU: main against main + fwd128_n176.patch (the forward's key tile 176 at head_dim 128).
# GPU tests of the patched tree, then cuda_bench twice each side, alternating.
source .device/common.sh
BUDGET=585
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build_main 150 python3 -u -c "from kernels.cuda import build; build.extension()"
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/fwd128_n176.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
S=""; for r in cuda-auto cuda-sm90-pingpong cuda-sm90-persistent-pingpong cuda-sm90-persistent; do S="$S --only $r"; done
phase bench_main1 45 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main1.json
phase bench_wip1 45 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip1.json"
phase tests_d128 200 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k '128 or pingpong or persistent or auto_defaults or finish or each_stage'"
phase bench_main2 45 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main2.json
phase bench_wip2 45 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip2.json"
phase tests_rest 150 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k 'not (128 or pingpong or persistent or auto_defaults or finish or each_stage)'"
finish
tail -3 $OUT/tests_d128.log $OUT/tests_rest.log; for f in bench_main1 bench_wip1 bench_main2 bench_wip2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done
