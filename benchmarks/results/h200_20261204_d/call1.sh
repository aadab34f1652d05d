source .device/common.sh
BUDGET=300
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, timm, torchvision; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
git diff HEAD --stat > $OUT/diff_stat.txt 2>&1
export MAX_JOBS=16
python3 -u -c "from kernels.flash import native; native.load()" > $OUT/flash_native_build.log 2>&1 &
phase build 150 python3 -u -c "from kernels.cuda import build; build.extension()"
wait
phase launch 120 python3 -u -m benchmarks.launch_overhead --rounds 3 --cases "cuda,sdpa,attention fwd+bwd" --profile
S=""; for r in cuda-sm80 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma-overlap cuda-auto-deterministic; do S="$S --skip $r"; done
phase bench 80 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/cuda_bench.json
finish
grep -v "^$" $OUT/launch.log | grep "ms/call"; grep -E "^\| [0-9]" $OUT/bench.log | cut -d'|' -f2-10
