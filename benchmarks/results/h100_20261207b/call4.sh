source .device/common.sh
BUDGET=570
export MAX_JOBS=16
{ g++ --version | head -1; python3 -c "import torch; print(torch._C._GLIBCXX_USE_CXX11_ABI); print(torch.__config__.show())" | head -8; } > $OUT/cxx.txt 2>&1
phase build 150 python3 -u -c "from kernels.cuda import build; build.extension()"
phase segv2 90 python3 -u .device/segv2.py
phase tests 200 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_eager.py tests/test_cuda_kernels.py
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong cuda-auto-deterministic cuda-sm90-wide cuda-sm90-persistent; do S="$S --skip $r"; done
phase bench 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench.json
phase train224 230 python3 -m benchmarks.train --models vit_base_patch16_224 --batch-size 256 --eager timm cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 3.7 --out $OUT --name train224
finish
cat $OUT/cxx.txt | head -3; cat $OUT/segv2.log | tail -6; tail -3 $OUT/tests.log; grep -E "^\| [0-9]" $OUT/bench.log | cut -d'|' -f2-9; grep "^| vit" $OUT/train224.md | cut -d'|' -f2-8
