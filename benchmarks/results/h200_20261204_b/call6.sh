source .device/common.sh
BUDGET=400
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
python3 -u -c "from kernels.cuda import build; build.extension()" > $OUT/build.log 2>&1 &
BUILD=$!
phase sweep 150 python3 -u benchmarks/flash_bench.py --sweep --kernels dkdv,dq,bwd_short --shapes "256,12,197,64;64,12,197,64;16,12,197,64;256,12,50,64"
phase shorttests 120 python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_flash_short.py -rfEs -x
wait $BUILD
phase cudatests 120 python3 -u -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -rfEs -k "auto_runs or qkvpacked or trains or compile or deterministic or strided or misaligned or fully_written"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-auto-deterministic cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap; do S="$S --skip $r"; done
phase bench 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/cuda_bench.json
phase train224 90 python3 -m benchmarks.train --models vit_base_patch16_224 --eager timm cuda --compiled --rounds 4 --out $OUT --name train224_cuda
finish
grep "^sweep" $OUT/sweep.log | cut -c1-330; tail -3 $OUT/shorttests.log $OUT/cudatests.log; grep -E "auto|cudnn" $OUT/bench.log | cut -c1-110; grep "^| vit" $OUT/train224_cuda.md | cut -d'|' -f3-8
