#!/usr/bin/env bash
# Regenerate every table the README shows, on a CUDA machine with the project installed (pip install -e .):
#
#   bash benchmarks/reproduce.sh [attention|train|scale|all|<step> ...]      (default: all)
#
#   attention  the kernels alone (attention_baseline, also the README's figure) and as the ViT calls them
#              (attention_baseline_packed); the full preset (attention_full: ViT-S/B/L at 224 and 384 px, N up
#              to 16384, bf16 and fp16); CPU against GPU time per flash call (launch_overhead, _profile);
#              flash beside SDPA's cuDNN and FA2 kernels, and with fp32_delta (flash_bench, flash_bench_fp32_delta);
#              flash beside cuDNN at ViT sequence lengths, 64·k + 1 (attention_vit_lengths)
#   train      ViT-S/16, ViT-B/16 and ViT-B/16 at 384 px, ours (flash) beside timm, eager and compiled
#              (train_vit); what is alive at ViT-B/16's memory peak (train_vitb_memory_peak); ViT-B/16 across
#              the range in interleaved rounds: batch 16 and 64, batch 256, 512 and 1024 px
#              (train_small_batch_rounds, train_b256_rounds, train_hires_rounds), and all of it in one run
#              (train_range); the input pipeline with 8 and 15 workers (input_pipeline)
#   scale      train.py itself (scale): flash eager and compiled, cuda, DDP and FSDP2 on 2 GPUs, 1024 px with
#              and without grad_ckpt, naive at 1024 px (stops with the out-of-memory message). The 2-process
#              rows need 2 GPUs; with one they say "not run".
#   <step>     one of the names in parentheses: that table alone
#
# Every run goes to the end (no time budget; the full attention preset alone took more than 9 minutes on an
# H200). Results go to $OUT (default outputs/benchmarks/ under the repository), one .md/.json (+ .png, .log)
# per table; benchmarks/README.md says which file backs which README table. Copying a file into
# benchmarks/results/ is what updates the committed record.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/benchmarks}
PYTHON=${PYTHON:-python}
FLASH_BENCH_STEPS="flash_bench flash_bench_fp32_delta"
PARTS_attention="cuda_build attention_baseline attention_baseline_packed attention_full attention_vit_lengths launch_overhead launch_overhead_profile $FLASH_BENCH_STEPS"
PARTS_train="train_vit train_vitb_memory_peak train_small_batch_rounds train_b256_rounds train_hires_rounds train_range input_pipeline"
PARTS_scale="scale"
PARTS_all="$PARTS_attention $PARTS_train $PARTS_scale"

steps=()
for arg in "${@:-all}"; do
  var=PARTS_$arg
  if [ -n "${!var:-}" ]; then
    read -r -a more <<< "${!var}"; steps+=("${more[@]}")
  elif [[ " $PARTS_all " == *" $arg "* ]]; then
    steps+=("$arg")
  else
    echo "usage: bash benchmarks/reproduce.sh [attention|train|scale|all|<step> ...]; steps: $PARTS_all" >&2
    exit 2
  fi
done
"$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else
  'benchmarks/reproduce.sh measures GPU tables and needs a CUDA GPU; on a CPU: python -m benchmarks.attention --preset smoke')"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# run NAME CMD...: CMD, its console output also in $OUT/NAME.log
run() { local name=$1; shift; echo "== $name: $*"; "$@" 2>&1 | tee "$OUT/$name.log"; }

cuda_build() { run cuda_build "$PYTHON" -m kernels.cuda.build; }  # once, so that no timed case includes the build
attention_baseline() { run attention_baseline "$PYTHON" -m benchmarks.attention --preset baseline --out "$OUT"; }
attention_baseline_packed() {
  run attention_baseline_packed "$PYTHON" -m benchmarks.attention --preset baseline --layout packed \
    --backends sdpa-flash sdpa-cudnn flash --out "$OUT"
}
attention_full() { run attention_full "$PYTHON" -m benchmarks.attention --preset full --out "$OUT"; }
attention_vit_lengths() {
  run attention_vit_lengths "$PYTHON" -m benchmarks.attention --backends flash sdpa-cudnn --dtypes bf16 --no-plot \
    --shapes "256,12,197,64;128,16,577,64;32,12,1025,64;8,12,4097,64;32,12,1024,64;256,12,197,128;8,16,4096,128;8,16,4097,128" \
    --out "$OUT" --name attention_vit_lengths
}
launch_overhead() { run launch_overhead "$PYTHON" -m benchmarks.launch_overhead; }
launch_overhead_profile() { run launch_overhead_profile "$PYTHON" -m benchmarks.launch_overhead --profile; }
train_vit() {
  run train_vit "$PYTHON" -m benchmarks.train --models vit_small_patch16_224 vit_base_patch16_224 \
    vit_base_patch16_384 --eager timm flash --compiled timm flash --max-minutes inf --out "$OUT" --name train_vit
}
train_vitb_memory_peak() {
  run train_vitb_memory_peak "$PYTHON" -m benchmarks.train --models vit_base_patch16_224 --eager timm flash \
    --compiled timm flash --memory-peak --max-minutes inf --out "$OUT" --name train_vitb_memory_peak
}
flash_bench() { run flash_bench_h200 "$PYTHON" -m benchmarks.flash_bench; }
flash_bench_fp32_delta() { run flash_bench_h200_fp32_delta "$PYTHON" -m benchmarks.flash_bench --fp32-delta; }
train_small_batch_rounds() {
  run train_small_batch_rounds "$PYTHON" -m benchmarks.train --models vit_base_patch16_224_b16 vit_base_patch16_224_b64 \
    --eager timm flash sdpa --compiled --rounds 4 --steps 80 --max-minutes inf --out "$OUT" --name train_small_batch_rounds
}
train_b256_rounds() {
  run train_b256_rounds "$PYTHON" -m benchmarks.train --models vit_base_patch16_224 --eager timm flash \
    --compiled timm flash --rounds 2 --steps 40 --max-minutes inf --out "$OUT" --name train_b256_rounds
}
train_hires_rounds() {
  run train_hires_rounds "$PYTHON" -m benchmarks.train --models vit_base_patch16_512 vit_base_patch16_1024 \
    --eager timm flash --compiled timm flash --rounds 2 --steps 30 --max-minutes inf --out "$OUT" --name train_hires_rounds
}
train_range() {
  run train_range "$PYTHON" -m benchmarks.train --preset range --eager timm flash --compiled timm flash --rounds 4 \
    --max-minutes inf --out "$OUT" --name train_range
}
input_pipeline() { run input_pipeline "$PYTHON" -m benchmarks.train --input-pipeline --workers 8 15 --out "$OUT"; }
scale() { "$PYTHON" -m benchmarks.scale --out "$OUT"; }  # writes scale.{md,json,log} itself

for step in "${steps[@]}"; do
  "$step"
done
echo "results in $OUT (which file backs which README table: benchmarks/README.md)"
