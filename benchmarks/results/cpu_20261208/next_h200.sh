# Not run yet (written 2026-12-08; no machine was lent that session). The H200 measurements that issues 11 and 12's
# "done when" read, peers in the same call. The tree is main, or main + wip/dqflat when next_dqflat.sh on this warm
# machine left /tmp/wip_ok (commit.txt says which).
#   ab: the rows both issues read most, in one call (the phases ordered by what they decide; those left when the
#       budget runs out are skipped and named in phases.txt): cuda_bench (cuda-auto, short, persistent, both peers,
#       2 rounds), 1024 px batch 8 and 224 px batch 256 eager and compiled (timm, flash, cuda), flash_bench,
#       224 px batch 16, launch_overhead --profile. Pass BUDGET_S=565 for a call of its own.
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
if [ "$1" = ab ]; then
  phase bench 60 python3 -u benchmarks/cuda_bench.py --attention-only --rounds 2 --only cuda-auto --only cuda-sm90-short --only cuda-sm90-persistent --json $OUT/bench.json
  phase t1024 200 $T --models vit_base_patch16_1024 --eager timm flash cuda --compiled timm flash cuda --max-minutes 3.2 --name t1024
  phase t224 200 $T --models vit_base_patch16_224 --batch-size 256 --eager timm flash cuda --compiled timm flash cuda --max-minutes 3.2 --name t224
  phase flash 130 python3 -u benchmarks/flash_bench.py
  phase b16 150 $T --models vit_base_patch16_224 --batch-size 16 --eager timm sdpa flash cuda --compiled timm flash cuda --max-minutes 2.4 --name b16
  phase overhead 90 python3 -u -m benchmarks.launch_overhead --rounds 3 --profile
elif [ "$1" = a ]; then
  phase bench 90 python3 -u benchmarks/cuda_bench.py --attention-only --rounds 2 --only cuda-auto --only cuda-sm90-short --only cuda-sm90-persistent --json $OUT/bench.json
  phase flash 130 python3 -u benchmarks/flash_bench.py
  phase overhead 90 python3 -u -m benchmarks.launch_overhead --rounds 3 --profile
  phase b16 150 $T --models vit_base_patch16_224 --batch-size 16 --eager timm sdpa flash cuda --compiled timm flash cuda --max-minutes 2.4 --name b16
elif [ "$1" = c ]; then
  phase t1024 250 $T --models vit_base_patch16_1024 --eager timm flash cuda --compiled timm flash cuda --max-minutes 4.1 --name t1024
else
  phase t224 220 $T --models vit_base_patch16_224 --batch-size 256 --eager timm flash cuda --compiled timm flash cuda --max-minutes 3.6 --name t224
  phase t1024 250 $T --models vit_base_patch16_1024 --eager timm flash cuda --compiled timm flash cuda --max-minutes 4.1 --name t1024
fi
finish
grep -E "^\| [0-9]" $OUT/bench.log 2>/dev/null | cut -d'|' -f2-9; grep -A8 "ours / peer" $OUT/flash.log 2>/dev/null; tail -n 25 $OUT/overhead.log 2>/dev/null; for f in b16 t224 t1024; do grep "^| vit" $OUT/$f.md 2>/dev/null | cut -d'|' -f2-8; done
