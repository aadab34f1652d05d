# Second call on the warm machine: the patched copy (combo.patch) timed with --rounds 3 on the rows that decide auto,
# then ViT-B/16 at 1024 px compiled (timm + SDPA, flash, cuda) on the patched copy.
source .device/common.sh
BUDGET=560
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/combo.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
S="--skip sdpa-flash"; for r in cuda-auto cuda-sm90-persistent-pingpong cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong; do S="$S --only $r"; done
phase bench_wip 120 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only --rounds 3 $S --json $OUT/bench_wip.json"
phase train1024c 330 bash -c "cd /tmp/wip && $WIP python3 -m benchmarks.train --models vit_base_patch16_1024 --eager --compiled timm flash cuda --rounds 2 --steps 20 --max-minutes 5.3 --out $OUT --name train1024c"
finish
grep -E "^\| [0-9]" $OUT/bench_wip.log | cut -d'|' -f2-9; grep "^| vit" $OUT/train1024c.md 2>/dev/null | cut -d'|' -f2-8
