source .device/common.sh
BUDGET=590
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase finish 90 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "test_sm90_kernels_finish and (persistent or wide)"
phase ptests 150 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE -x tests/test_cuda_kernels.py -k "persistent"
S=""; for r in sdpa-flash cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong cuda-auto-deterministic; do S="$S --skip $r"; done
phase bench 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench.json
phase train1024c 300 python3 -m benchmarks.train --models vit_base_patch16_1024 --compiled timm flash cuda --rounds 2 --steps 20 --max-minutes 4.8 --out $OUT --name train1024c
finish
tail -3 $OUT/finish.log; tail -3 $OUT/ptests.log; grep -E "^\| [0-9]" $OUT/bench.log | cut -d'|' -f2-9; grep "^| vit" $OUT/train1024c.md | cut -d'|' -f2-8
