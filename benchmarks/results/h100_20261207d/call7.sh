# Seventh call on the warm machine: ViT-B/16 at 512 px, batch 64, compiled, timm + SDPA and flash, on the patched
# copy (combo.patch).
source .device/common.sh
BUDGET=240
export MAX_JOBS=16
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/combo.patch) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
phase c512 200 bash -c "cd /tmp/wip && $WIP python3 -m benchmarks.train --models vit_base_patch16_512 --eager --compiled timm flash --rounds 2 --steps 20 --max-minutes 3.0 --out $OUT --name c512"
finish
for f in c512; do grep "^| vit" $OUT/$f.md 2>/dev/null | cut -d'|' -f2-8; done
