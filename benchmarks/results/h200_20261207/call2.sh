# Call 2: attention=cuda in ViT-B/16 training at 1024 px with the sequential and the ping-pong backward consumers
# (each process beside timm + SDPA), then every attention=cuda GPU test.
source .device/common.sh
BUDGET=560
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, timm, torchvision; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 200 python3 -u -c "from kernels.cuda import build; build.extension()"
phase trainseq 170 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm cuda --compiled timm cuda --rounds 2 --steps 21 --max-minutes 2.6 --out $OUT --name train_seq
VIT_CUDA_BWD_SM90=pingpong phase trainpp 170 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm cuda --compiled timm cuda --rounds 2 --steps 21 --max-minutes 2.6 --out $OUT --name train_pp
phase tests 200 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_eager.py tests/test_cuda_kernels.py
finish
for f in train_seq train_pp; do echo "== $f"; grep "^| vit" $OUT/$f.md | cut -d'|' -f2-8; done; tail -3 $OUT/tests.log
