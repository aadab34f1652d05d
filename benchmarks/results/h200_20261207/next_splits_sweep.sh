# Ran on an H100 in the next session (benchmarks/results/h100_20261207/call1_sweep.log, before bwd_sm90 took key_ctas;
# the call below passes key_ctas = 0 since): the deterministic Hopper backward's fwd+bwd-less-fwd time at each
# dq slice count, beside the non-deterministic backward, to see whether ops.sm90_dq_splits's one slice at
# (8, 16, 4096, 128) (128 CTAs walking 32 tiles each, 1.30-1.35x the non-deterministic time) should be more.
source .device/common.sh
BUDGET=200
export MAX_JOBS=16
phase build 60 python3 -u -c "from kernels.cuda import build; build.extension()"
cat > /tmp/sweep.py <<'PY'
import torch
from kernels.cuda import build, ops
ext = build.extension()
for B, H, N, d in ((8, 16, 4096, 128), (8, 12, 4096, 64), (2, 12, 16384, 64)):
    q, k, v, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = ext.fwd_sm90(q, k, v, d**-0.5)
    flags = (d == 128, False, d == 64, True, False)
    def t(splits):
        fn = lambda: ext.bwd_sm90(do, q, k, v, out, lse, d**-0.5, None, *flags, 0, splits)  # key_ctas 0
        for _ in range(3): fn()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); [fn() for _ in range(10)]; e1.record(); torch.cuda.synchronize()
        return e0.elapsed_time(e1) / 10
    tiles = -(-N // 128)
    print((B, H, N, d), "auto splits", ops.sm90_dq_splits(q), "non-deterministic", round(t(0), 3), "ms",
          {s: round(t(s), 3) for s in (1, 2, 3, 4, 6, 8, 16, 32) if s <= tiles}, flush=True)
PY
phase sweep 120 python3 -u /tmp/sweep.py
finish
cat $OUT/sweep.log
