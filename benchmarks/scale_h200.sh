#!/usr/bin/env bash
# Scale-out on 2 H200s (device kind nvidia-h200-x2), all through train.py on synthetic data:
#   1 flash eager 1 GPU | 2 flash compile | 3 cuda eager | 4 flash 2 GPUs DDP (scaling vs 1)
#   5 flash 2 GPUs FSDP2 | 6 flash 1024 px (N=4097) | 7 naive 1024 px (must stop with the OOM message)
#   8 flash 1024 px grad_ckpt (lower peak memory than 6)
# Writes $OUT/scale_h200.log (every run's output), $OUT/scale_h200.json (every run's summary.json),
# $OUT/scale_h200.md (the table printed at the end). Whole script: under 7 minutes (runs are skipped,
# and said so, once the deadline nears).
#   bash benchmarks/scale_h200.sh                  # on the device (installs the wheels in .whl first)
#   DRY_RUN=1 bash benchmarks/scale_h200.sh        # on a CPU: same steps, tiny model, gloo, no install
#   ONLY="1 2 3" bash benchmarks/scale_h200.sh     # only these runs (the log is appended to, the table covers all)
if [ -z "${DRY_RUN:-}" ] && [ -z "${SKIP_INSTALL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export WANDB_MODE=disabled HYDRA_FULL_ERROR=1
OUT=${OUT:-/tmp/scale_out}
RUNS=${RUNS_DIR:-/tmp/scale_runs}
mkdir -p "$OUT" "$RUNS"
LOG=$OUT/scale_h200.log
[ -n "${ONLY:-}" ] || : > "$LOG"
DEADLINE=${DEADLINE:-390}  # seconds for the runs; the table and the install come on top

if [ -z "${DRY_RUN:-}" ]; then
  PY=python3; FLASH=flash
  BASE="model=base data=synthetic"
  LO="data.img_size=224 data.val_samples=256"; B1=256; STEPS=40
  HI="data.img_size=1024 data.val_samples=16"; HB=16; HSTEPS=12
else  # tiny CPU rehearsal of the same command lines
  PY=${PY:-.venv/bin/python}; FLASH=sdpa  # Triton's interpreter is too slow for a rehearsal
  export TRITON_INTERPRET=1 OMP_NUM_THREADS=1
  BASE="model=debug data=synthetic data.num_classes=10 device=cpu"
  LO="data.img_size=32 data.val_samples=16"; B1=8; STEPS=8
  HI="data.img_size=64 data.val_samples=4"; HB=2; HSTEPS=6
fi
COMMON="epochs=1 logger=none progress=false log_every=5 checkpoint.keep_last=1"
TORCHRUN="$PY -m torch.distributed.run --standalone --nproc_per_node=2"
$PY -c "import torch, sys; print('torch', torch.__version__, '| GPUs', torch.cuda.device_count(), '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu', '| python', sys.version.split()[0])" | tee -a "$LOG"
date -u +"date %Y-%m-%dT%H:%M:%SZ" | tee -a "$LOG"

# run NAME CAP_SECONDS LAUNCHER ARGS...: one train.py run into $RUNS/NAME, output appended to $LOG
run() {
  local name=$1 cap=$2 left; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" ${name%%_*} "* ]]; then return; fi
  left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 30 ]; then echo "=== $name: skipped (time budget spent)" | tee -a "$LOG"; return; fi
  [ "$cap" -gt "$left" ] && cap=$left
  rm -rf "${RUNS:?}/$name"
  echo "=== $name (t=${SECONDS}s, cap ${cap}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 10 "$cap" "$@" out_dir="$RUNS/$name" >> "$LOG" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$LOG"
  echo "$rc" > "$RUNS/$name.rc"
}

N1=$((B1 * STEPS))
run 1_flash_eager 70 $PY train.py $BASE $LO $COMMON attention=$FLASH batch_size=$B1 data.train_samples=$N1
run 2_flash_compile 130 env TORCH_LOGS=graph_breaks $PY train.py $BASE $LO $COMMON attention=$FLASH batch_size=$B1 data.train_samples=$N1 compile=true
if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" 3 "* ]]; then
  :
elif [ -z "${DRY_RUN:-}" ]; then
  echo "=== build cuda extension (t=${SECONDS}s)" | tee -a "$LOG"
  timeout 90 $PY -m kernels.cuda.build >> "$LOG" 2>&1; echo "=== build rc=$?" | tee -a "$LOG"
  run 3_cuda_eager 60 $PY train.py $BASE $LO $COMMON attention=cuda batch_size=$B1 data.train_samples=$N1
else
  echo "=== 3_cuda_eager: skipped (dry run: no GPU)" | tee -a "$LOG"
fi
run 4_flash_ddp2 80 $TORCHRUN train.py $BASE $LO $COMMON attention=$FLASH batch_size=$((2 * B1)) data.train_samples=$((2 * N1))
run 5_flash_fsdp2 70 $TORCHRUN train.py $BASE $LO $COMMON attention=$FLASH batch_size=$((2 * B1)) \
  data.train_samples=$((2 * B1 * STEPS / 2)) strategy=fsdp
run 6_flash_1024 60 $PY train.py $BASE $HI $COMMON attention=$FLASH batch_size=$HB data.train_samples=$((HB * HSTEPS))
run 7_naive_1024 50 $PY train.py $BASE $HI $COMMON attention=naive batch_size=$HB data.train_samples=$((HB * HSTEPS))
run 8_flash_1024_ckpt 60 $PY train.py $BASE $HI $COMMON attention=$FLASH batch_size=$HB data.train_samples=$((HB * HSTEPS)) \
  grad_ckpt=true

RUNS="$RUNS" OUT="$OUT" $PY - <<'EOF' 2>&1 | tee "$OUT/scale_h200.md"
import json, os
from pathlib import Path
runs, out = Path(os.environ["RUNS"]), Path(os.environ["OUT"])
names = ["1_flash_eager", "2_flash_compile", "3_cuda_eager", "4_flash_ddp2", "5_flash_fsdp2", "6_flash_1024",
         "7_naive_1024", "8_flash_1024_ckpt"]
log = (out / "scale_h200.log").read_text(errors="replace")
rows, sums = [], {}
for name in names:
    rc_file, summary = runs / f"{name}.rc", runs / name / "summary.json"
    rc = rc_file.read_text().strip() if rc_file.exists() else "not run"
    s = json.loads(summary.read_text()) if summary.exists() else None
    sums[name] = {"rc": rc, "summary": s}
    if s:
        ips = s["train/steady_images_per_s"]
        rows.append(f"| {name} | {s['backend']} | {s['world_size']} | {s['strategy']} | {s['compile']} | {s['grad_ckpt']} "
                    f"| {s['img_size']} | {s['seq_len']} | {s['batch_size']} | {s['steady_steps']} "
                    f"| {ips:.0f} | {s['peak_mem_allocated_mb'] / 1024:.2f} | rc {rc} |")
    else:
        rows.append(f"| {name} | | | | | | | | | | | | rc {rc}, no summary |")
(out / "scale_h200.json").write_text(json.dumps(sums, indent=1) + "\n")
env = next((v["summary"]["env"] for v in sums.values() if v["summary"]), {})
print(f"# Scale-out on {env.get('gpu', '?')} × {env.get('gpu_count', '?')}: torch {env.get('torch')}, "
      f"triton {env.get('triton')}, CUDA {env.get('cuda')}\n")
print("images/s: steady state (global, all GPUs), optimizer steps after the first 5; peak: rank 0's max_memory_allocated\n")
print("| run | attention | GPUs | strategy | compile | grad_ckpt | px | N | batch | timed steps | images/s | peak GiB | status |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
def ips(n):
    s = sums[n]["summary"]
    return s and s["train/steady_images_per_s"]
def mem(n):
    s = sums[n]["summary"]
    return s and s["peak_mem_allocated_mb"]
print()
if ips("1_flash_eager") and ips("4_flash_ddp2"):
    print(f"DDP scaling (2 GPUs / 1 GPU, flash, same batch per GPU): {ips('4_flash_ddp2') / ips('1_flash_eager'):.3f} (target >= 1.9)")
if ips("1_flash_eager") and ips("2_flash_compile"):
    print(f"compile / eager (flash, 1 GPU): {ips('2_flash_compile') / ips('1_flash_eager'):.3f}")
if ips("1_flash_eager") and ips("3_cuda_eager"):
    print(f"cuda / flash (eager, 1 GPU): {ips('3_cuda_eager') / ips('1_flash_eager'):.3f}")
if mem("6_flash_1024") and mem("8_flash_1024_ckpt"):
    print(f"1024 px peak memory, grad_ckpt / plain (flash): {mem('8_flash_1024_ckpt') / mem('6_flash_1024'):.3f}")
breaks = log.count("graph break") + log.count("Graph break")
print(f"'graph break' mentions in the log: {breaks}")
oom = "TrainingOutOfMemoryError" in log and "use attention=flash" in log
print(f"naive at 1024 px: {'stopped with the out-of-memory message' if oom else 'NO out-of-memory message (rc ' + sums['7_naive_1024']['rc'] + ')'}")
for line in log.splitlines():
    if "TrainingOutOfMemoryError:" in line:
        print("  " + line.strip()[:600])
        break
EOF
echo "total ${SECONDS} s"
