# Not run yet (the session's device time ran out): branch wip/pp-ordered, the ping-pong backward consumer (auto's at
# head_dim 128, opt-in at 64) in the ordered step's order within its batches: Sᵀ and dPᵀ as two groups with the
# exponentials under dPᵀ, the previous step's dQ issued first and staged while dV and dK run. Its change against main
# is wip_pp_ordered.patch beside this script, applied here to a copy of the tree. One call of about 8 minutes: the
# patched tree's ping-pong tests (float64, bitwise dk/dv against the sequential consumers, the finish tests), then
# cuda_bench twice each, main against the patch, alternating, then ViT-B/16 at 1024 px eager and compiled (timm + SDPA,
# flash, cuda) on main. Setup on the main checkout: this file and benchmarks/results/h200_20261203/common.sh in
# .device/, `git rev-parse --short HEAD > .device/COMMIT`, carry [".whl", ".device"].
source .device/common.sh
BUDGET=590
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build_main 150 python3 -u -c "from kernels.cuda import build; build.extension()"
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
(cd /tmp/wip && patch -p1 < benchmarks/results/h100_20261207c/wip_pp_ordered.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
phase tests_wip 120 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k 'pingpong_backward_equals or tma-pp or (kernels_finish and pingpong)'"
S="--skip sdpa-flash"; for r in cuda-auto cuda-auto-deterministic cuda-sm90-dqrows-tma cuda-sm90-dqcols-tma cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong; do S="$S --only $r"; done
for i in 1 2; do
  phase bench_main$i 45 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main$i.json
  phase bench_wip$i 45 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip$i.json"
done
phase train1024 200 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm flash cuda --compiled timm flash cuda --rounds 2 --steps 20 --max-minutes 4.9 --out $OUT --name train1024
finish
tail -2 $OUT/tests_wip.log; for f in bench_main1 bench_wip1 bench_main2 bench_wip2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done; grep "^| vit" $OUT/train1024.md 2>/dev/null | cut -d'|' -f2-8
