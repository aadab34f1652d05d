# Third call on the warm machine: ViT-B/16 training at 512 px (batch 64) and 224 px (batch 256), eager and compiled,
# timm + SDPA against flash and cuda, on the patched copy (combo.patch).
source .device/common.sh
BUDGET=540
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/combo.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
phase train512 250 bash -c "cd /tmp/wip && $WIP python3 -m benchmarks.train --preset range --models vit_base_patch16_512 --eager timm flash cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 4.0 --out $OUT --name train512"
phase train224 240 bash -c "cd /tmp/wip && $WIP python3 -m benchmarks.train --models vit_base_patch16_224 --batch-size 256 --eager timm flash cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 3.8 --out $OUT --name train224"
finish
for f in train512 train224; do grep "^| vit" $OUT/$f.md 2>/dev/null | cut -d'|' -f2-8; done
