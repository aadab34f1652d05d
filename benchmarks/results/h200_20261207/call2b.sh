# Call 2: every attention=cuda GPU test (the deterministic Hopper backward now the default for deterministic=true),
# then ViT-B/16 training at 1024 px with the sequential and the ping-pong backward consumers (each beside timm + SDPA).
source .device/common.sh
BUDGET=330
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, timm, torchvision; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 100 python3 -u -c "from kernels.cuda import build; build.extension()"
phase trainseq 150 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 2.2 --out $OUT --name train_seq
VIT_CUDA_BWD_SM90=pingpong phase trainpp 150 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 2.2 --out $OUT --name train_pp
finish
for f in train_seq train_pp; do echo "== $f"; grep "^| vit" $OUT/$f.md | cut -d'|' -f2-8; done; tail -3 $OUT/tests.log
