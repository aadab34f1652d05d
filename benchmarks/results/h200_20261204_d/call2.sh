source .device/common.sh
BUDGET=540
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, timm, torchvision; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
python3 -u -c "from kernels.flash import native; native.load()" > $OUT/flash_native_build.log 2>&1 &
phase build 150 python3 -u -c "from kernels.cuda import build; build.extension()"
wait
phase tests 230 python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_eager.py tests/test_cuda_kernels.py -rfE
phase launch 100 python3 -u -m benchmarks.launch_overhead --rounds 3 --cases "cuda,sdpa,attention fwd+bwd,packed fwd+bwd"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma; do S="$S --skip $r"; done
phase bench 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/cuda_bench.json
phase trainsmall 120 python3 -m benchmarks.train --models vit_base_patch16_224_b16 vit_base_patch16_224_b64 --eager timm sdpa flash cuda --compiled --rounds 3 --steps 21 --max-minutes 2 --out $OUT --name train_small
finish
tail -4 $OUT/tests.log; grep "ms/call" $OUT/launch.log; grep -E "^\| [0-9]" $OUT/bench.log | cut -d'|' -f2-10; grep "^| vit" $OUT/train_small.md | cut -d'|' -f2-8
