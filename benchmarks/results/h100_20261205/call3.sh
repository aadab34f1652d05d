source .device/common.sh
BUDGET=560
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, timm, torchvision; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
python3 -u -c "from kernels.flash import native; native.load()" > $OUT/flash_native_build.log 2>&1 &
phase build 200 python3 -u -c "from kernels.cuda import build; build.extension()"
wait
phase trainsmall 150 python3 -m benchmarks.train --models vit_base_patch16_224_b16 vit_base_patch16_224_b64 --eager timm sdpa flash cuda --compiled --rounds 3 --steps 21 --max-minutes 2.3 --out $OUT --name train_small
phase trainrange 330 python3 -m benchmarks.train --models vit_base_patch16_224 vit_base_patch16_1024 --eager timm flash --compiled timm flash --rounds 3 --steps 21 --max-minutes 5.2 --out $OUT --name train_range
finish
grep "^| vit" $OUT/train_small.md | cut -d'|' -f2-8; grep "^| vit" $OUT/train_range.md | cut -d'|' -f2-8
