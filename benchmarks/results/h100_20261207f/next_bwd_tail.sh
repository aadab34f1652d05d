# Not run yet: one call (about 7 minutes, any Hopper GPU; run it first, the machine then warm for next_h200.sh) for
# branch wip/bwd-tail (bwd_tail.patch beside this file: tails.patch's backward half alone, the ordered backward
# consumer's last query step cut to 80 of 128 or 16 of 64 queries where N leaves no more). The CUDA kernel suite on the
# patched copy, then cuda_bench alternating main and the copy twice; /tmp/wip_ok is written when the copy passes its
# tests and its cuda-auto fwd+bwd is no slower overall (geometric mean) and at most 3 % slower at any shape, so that
# next_h200.sh on this warm machine measures it. Merge the branch if so.
# Setup on the main checkout: this file, bwd_tail.patch and benchmarks/results/h200_20261203/common.sh in .device/,
# `git rev-parse --short HEAD > .device/COMMIT`, carry [".whl", ".device"].
# Another branch's patch: PATCH (a file in .device/) and ROWS (cuda_bench rows timed; the decision reads cuda-auto),
# as cpu_20261208/next_dqflat.sh sets them. Their defaults are what ran as call 4 of h100_20261208.md.
source .device/common.sh
BUDGET=${BUDGET_S:-360}
export MAX_JOBS=16
rm -f /tmp/wip_ok
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
phase build_main 150 python3 -u -c "from kernels.cuda import build; build.extension()"
rm -rf /tmp/wip && mkdir /tmp/wip && cp -r kernels vit benchmarks tests configs *.py pyproject.toml /tmp/wip/
REPO=$PWD; (cd /tmp/wip && patch -p1 < $REPO/.device/${PATCH:-bwd_tail.patch}) > $OUT/patch.log 2>&1 || exit 1
WIP="env VIT_KERNELS_BUILD_DIR=/tmp/wipbuild PYTHONPATH=/tmp/site:/tmp/wip"
phase build_wip 150 bash -c "cd /tmp/wip && $WIP python3 -u -c 'from kernels.cuda import build; build.extension()'"
S=""; for r in ${ROWS:-cuda-auto}; do S="$S --only $r"; done
phase bench_main1 45 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main1.json
phase bench_wip1 45 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip1.json"
phase tests_wip 270 bash -c "cd /tmp/wip && $WIP python3 -u -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_cuda_eager.py tests/test_cuda_kernels.py"
phase bench_main2 45 python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_main2.json
phase bench_wip2 45 bash -c "cd /tmp/wip && $WIP python3 -u benchmarks/cuda_bench.py --attention-only $S --json $OUT/bench_wip2.json"
python3 - > $OUT/decision.txt 2>&1 <<'PY'
import json, math, os
out = os.environ["OUT"]
def auto(name):
    rows = {}
    for i in (1, 2):  # round 2 may have been skipped for time
        if not os.path.exists(f"{out}/{name}{i}.json") or not os.path.exists(f"{out}/bench_wip{i}.json"):
            continue
        for r in json.load(open(f"{out}/{name}{i}.json"))["attention"]:
            if r["backend"] == "cuda-auto":
                rows.setdefault((r["B"], r["H"], r["N"], r["d"]), []).append(r["fwd_bwd_ms"])
    return {k: sum(v) / len(v) for k, v in rows.items()}
main, wip = auto("bench_main"), auto("bench_wip")
ratios = {k: main[k] / wip[k] for k in main}
for k, r in ratios.items():
    print(k, f"main {main[k]:.3f} ms, patched {wip[k]:.3f} ms, main/patched {r:.3f}")
gm = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
tail = open(f"{out}/tests_wip.log").read().strip().splitlines()[-1]
ok = gm >= 1.0 and min(ratios.values()) >= 0.97 and " passed" in tail and "failed" not in tail and "error" not in tail
print(f"geomean {gm:.3f}; tests: {tail}; wip_ok={ok}")
if ok:
    open("/tmp/wip_ok", "w").write("1")
PY
finish
cat $OUT/decision.txt; tail -n 3 $OUT/tests_wip.log; for f in bench_main1 bench_wip1 bench_main2 bench_wip2; do echo "== $f"; grep -E "^\| [0-9]" $OUT/$f.log | cut -d'|' -f2-9; done
