# Fifth call on the warm machine: ViT-B/16 at 224 px, batch 16 and 64, timm + SDPA, flash, cuda, on the patched copy
# (combo.patch). Its compiled rows did not run: benchmarks.train's --max-minutes 3.0 is below 3 x 75 s.
source .device/common.sh
BUDGET=450
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/combo.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
phase b16 190 bash -c "cd /tmp/wip && $WIP python3 -m benchmarks.train --models vit_base_patch16_224 --batch-size 16 --eager timm flash cuda --compiled timm flash cuda --rounds 2 --steps 20 --max-minutes 3.0 --out $OUT --name b16"
phase b64 190 bash -c "cd /tmp/wip && $WIP python3 -m benchmarks.train --models vit_base_patch16_224 --batch-size 64 --eager timm flash cuda --compiled timm flash cuda --rounds 2 --steps 20 --max-minutes 3.0 --out $OUT --name b64"
finish
for f in b16 b64; do grep "^| vit" $OUT/$f.md 2>/dev/null | cut -d'|' -f2-8; done
