# Not run yet. The H200 measurements that issues 11 and 12's "done when" read, peers in the same call; alone, they
# measure main. On a machine next_bwd_tail.sh (or cpu_20261208/next_dqflat.sh, which runs it with that branch's patch)
# left warm with /tmp/wip_ok, they measure that patched copy instead (commit.txt says which).
#   ab (added 2026-12-08): the rows both issues read most, in one call; the phases are ordered by what they decide, and
#       those left when the budget runs out are skipped and named in phases.txt: cuda_bench (cuda-auto, short,
#       persistent, both peers, 2 rounds), 1024 px batch 8 and 224 px batch 256 eager and compiled (timm, flash, cuda),
#       flash_bench, 224 px batch 16, launch_overhead --profile. Pass BUDGET_S=565 for a call of its own.
#   a: cuda_bench, flash_bench, launch_overhead --profile, ViT-B/16 224 px batch 16, eager and compiled (timm, sdpa,
#      flash, cuda).
#   b: 224 px batch 256 and 1024 px batch 8, eager and compiled (timm, flash, cuda).
#   c: 1024 px batch 8 alone (for a call with little device time left).
# Setup: this file and benchmarks/results/h100_20261205/common.sh in .device/, `git rev-parse --short HEAD >
# .device/COMMIT`, carry [".whl", ".device"]; `BUDGET_S=565 bash .device/next_h200.sh ab`, or `a` then `b`.
source .device/common.sh
BUDGET=${BUDGET_S:-520}
export MAX_JOBS=16
if [ -f /tmp/wip_ok ] && [ -d /tmp/wip ]; then
  echo "+ the patched copy in /tmp/wip" >> $OUT/commit.txt
  cd /tmp/wip; export VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip
fi
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build 150 python3 -u -c "from kernels.cuda import build; build.extension()"
T="python3 -m benchmarks.train --rounds 2 --steps 20 --out $OUT"
# Each measurement once: `name limit_s [training minutes]`.
bench() { phase bench $1 python3 -u benchmarks/cuda_bench.py --attention-only --rounds 2 --only cuda-auto --only cuda-sm90-short --only cuda-sm90-persistent --json $OUT/bench.json; }
flash() { phase flash $1 python3 -u benchmarks/flash_bench.py; }
overhead() { phase overhead $1 python3 -u -m benchmarks.launch_overhead --rounds 3 --profile; }
b16() { phase b16 $1 $T --models vit_base_patch16_224 --batch-size 16 --eager timm sdpa flash cuda --compiled timm flash cuda --max-minutes 2.4 --name b16; }
t224() { phase t224 $1 $T --models vit_base_patch16_224 --batch-size 256 --eager timm flash cuda --compiled timm flash cuda --max-minutes $2 --name t224; }
t1024() { phase t1024 $1 $T --models vit_base_patch16_1024 --eager timm flash cuda --compiled timm flash cuda --max-minutes $2 --name t1024; }
case "$1" in
  ab) bench 60; t1024 200 3.2; t224 200 3.2; flash 130; b16 150; overhead 90 ;;
  a) bench 90; flash 130; overhead 90; b16 150 ;;
  c) t1024 250 4.1 ;;
  *) t224 220 3.6; t1024 250 4.1 ;;
esac
finish
grep -E "^\| [0-9]" $OUT/bench.log 2>/dev/null | cut -d'|' -f2-9; grep -A8 "ours / peer" $OUT/flash.log 2>/dev/null; tail -n 25 $OUT/overhead.log 2>/dev/null; for f in b16 t224 t1024; do grep "^| vit" $OUT/$f.md 2>/dev/null | cut -d'|' -f2-8; done
