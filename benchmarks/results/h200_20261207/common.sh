set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD WANDB_MODE=offline WANDB_SILENT=true CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0a
unset TRITON_INTERPRET
cp .device/COMMIT $OUT/commit.txt
START=$(date +%s)
BUDGET=${BUDGET:-560}
phase() {
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if [ $left -lt 20 ]; then echo "$name skipped (no time)" >> $OUT/phases.txt; return; fi
  [ $limit -gt $left ] && limit=$left
  local t0=$(date +%s)
  timeout $limit "$@" > $OUT/$name.log 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s (limit $limit)" >> $OUT/phases.txt
}
finish() { cd $OUT && tar czf all.tgz *.log *.txt $(ls *.md *.json 2>/dev/null); cat phases.txt; }
