# Not run yet: the H200 re-measure of this session's H100 rows (the three-consumer forward by default at head_dim 64 and
# N >= 1025), with the peers in the same run, plus the persistent kernels if their tests pass. Run as the calls above:
# copy this and benchmarks/results/h200_20261203/common.sh to .device/, `git rev-parse --short HEAD > .device/COMMIT`,
# carry .whl and .device. About 9 minutes.
source .device/common.sh
BUDGET=590
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase finish 90 python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_kernels.py -k "(test_sm90_kernels_finish and (persistent or wide)) or refuses"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-sm90-dqrows-tma-pingpong cuda-sm90-dqcols-tma-pingpong cuda-auto-deterministic cuda-sm90-wide; do S="$S --skip $r"; done
grep -q "failed" $OUT/finish.log && S="$S --skip cuda-sm90-persistent --skip cuda-sm90-bwd-persistent"
phase bench 60 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench.json
phase train1024 200 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm flash cuda --compiled timm flash cuda --rounds 2 --steps 20 --max-minutes 3.3 --out $OUT --name train1024
phase train512 170 python3 -m benchmarks.train --preset range --models vit_base_patch16_512 --eager timm cuda --compiled timm cuda --rounds 2 --steps 20 --max-minutes 2.6 --out $OUT --name train512
finish
tail -3 $OUT/finish.log; grep -E "^\| [0-9]" $OUT/bench.log | cut -d'|' -f2-9; for f in train1024 train512; do grep "^| vit" $OUT/$f.md | cut -d'|' -f2-8; done
