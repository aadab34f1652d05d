# Call 2: the new auto forward (three consumers at head_dim 64 where they pay) in the GPU tests, the kernel bench beside
# cuDNN, and ViT-B/16 at 1024 px with attention=cuda beside timm + SDPA, eager and compiled.
source .device/common.sh
BUDGET=560
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase tests 100 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "wide or refuses or auto_defaults or auto_runs"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong cuda-auto-deterministic cuda-sm90-wide; do S="$S --skip $r"; done
phase bench 40 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench.json
phase train1024 330 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 3.2 --out $OUT --name train1024
finish
tail -3 $OUT/tests.log; grep -E "^\| [0-9]" $OUT/bench.log | cut -d'|' -f2-11; grep "^| vit" $OUT/train1024.md | cut -d'|' -f2-8
