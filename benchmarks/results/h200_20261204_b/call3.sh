source .device/common.sh
BUDGET=540
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 120 python3 -u -c "from kernels.cuda import build; build.extension()"
phase tests 150 python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -rfEs -k "auto_runs or kernels_finish or (sm90_matches and (sm90-dqcols-tma or sm90-dqsum-tma)) or qkvpacked or deterministic or 16384 or strided or compile or trains"
phase auto128 40 python3 -u benchmarks/results/cuda_gpu_auto128_check.py
S="--skip cuda-sm80 --skip cuda-sm90-pingpong --skip cuda-auto-deterministic --skip cuda-sm90-dqcols --skip cuda-sm90-dqtma --skip cuda-sm90-overlap --skip cuda-sm90-dqtma-overlap --skip cuda-sm90-dqsum --skip cuda-sm90-dqsum-tma-overlap"
phase bench 110 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/cuda_bench.json
phase train1024 200 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm cuda flash --compiled timm cuda --rounds 3 --out $OUT --name train1024_b8
finish
tail -3 $OUT/tests.log $OUT/auto128.log; grep -E "cuda-auto|cudnn" $OUT/bench.log | cut -c1-120; grep "^| vit" $OUT/train1024_b8.md | cut -d'|' -f3-8
