# The working tree (main at 50da28c) against a copy with .device/combo.patch (combo.patch beside this file; branch
# wip/fwd128): the ping-pong forward's block boundary as brkpt (at head_dim 128 the softmax under P·V in the SASS),
# wip_pp_ordered.patch (the ping-pong backward consumer in the ordered step's order), and a brkpt boundary that puts
# the backward's exponentials under dPᵀ at head_dim 128. The patched copy's CUDA GPU tests, cuda_bench main against it
# twice, alternating, then ViT-B/16 at 1024 px on the patched copy (its compiled rows did not run: --max-minutes 3.6
# is below the harness's 3 x 75 s estimate). Setup: this file, combo.patch and benchmarks/results/h200_20261203/common.sh
# in .device/, .device/COMMIT, carry [".whl", ".device"].
source .device/common.sh
BUDGET=590
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build_main 150 python3 -u -c "from kernels.cuda import build; build.extension()"
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/combo.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
phase tests_wip 210 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py"
S="--skip sdpa-flash"; for r in cuda-auto cuda-sm90-pingpong cuda-sm90-persistent-pingpong cuda-sm90-dqcols-tma cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong; do S="$S --only $r"; done
for i in 1 2; do
  phase bench_main$i 45 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main$i.json
  phase bench_wip$i 45 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip$i.json"
done
phase train1024 240 bash -c "cd /tmp/wip && $WIP python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm flash cuda --compiled timm flash cuda --rounds 2 --steps 20 --max-minutes 3.6 --out $OUT --name train1024"
finish
tail -2 $OUT/tests_wip.log; for f in bench_main1 bench_wip1 bench_main2 bench_wip2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done; grep "^| vit" $OUT/train1024.md 2>/dev/null | cut -d'|' -f2-8
