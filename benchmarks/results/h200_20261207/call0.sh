# The smallest useful call (build, then cuda_bench with cuda-auto beside the ping-pong rows and the peers), for when
# little device time is left: about 2 min on a warm image.
source .device/common.sh
BUDGET=130
export MAX_JOBS=16
phase build 90 python3 -u -c "from kernels.cuda import build; build.extension()"
S=""; for r in cuda-sm80 cuda-sm90 cuda-sm90-bwd90 cuda-sm90-pingpong cuda-sm90-dqcols cuda-sm90-dqtma cuda-sm90-dqcols-tma cuda-sm90-overlap cuda-sm90-dqtma-overlap cuda-sm90-dqsum cuda-sm90-dqsum-tma cuda-sm90-dqsum-tma-overlap cuda-sm90-dqrows cuda-sm90-dqrows-tma cuda-auto-deterministic; do S="$S --skip $r"; done
phase bench 40 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench.json
finish
grep -E "^\| [0-9]" $OUT/bench.log | cut -d'|' -f2-8
