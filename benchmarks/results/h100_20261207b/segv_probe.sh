# Which of the extension's failing checks end the process (rc -11) instead of raising?
cat > /tmp/probe.py <<'PY'
import sys, torch
from kernels.cuda import build
ext = build.extension()
q = torch.randn(1, 1, 17, 64, device="cuda", dtype=torch.bfloat16)
out, lse = ext.fwd(q, q, q, 0.1)
case = sys.argv[1]
try:
    if case == "fwd_scale": ext.fwd(q, q, q, -1.0)                      # formatted double
    if case == "fwd_headdim": ext.fwd(q[..., :48], q[..., :48], q[..., :48], 0.1)  # formatted int via check_qkv
    if case == "bwd_warps": ext.bwd(out, q, q, q, out, lse, 0.1, 5, 0, None)  # formatted int
    if case == "bwd_splits": ext.bwd(out, q, q, q, out, lse, 0.1, 8, 99, None)  # formatted int
    if case == "sm90_cols": ext.bwd_sm90(out, q, q, q, out, lse, 0.1, None, True, False, False, False, False, 0, 0)

    if case == "sm90_literal": ext.bwd_sm90(out, q, q, q, out, lse, 0.1, None, False, True, True, False, False, 0, 0)
    print("no error")
except (ValueError, TypeError, RuntimeError) as exc:
    print(type(exc).__name__, str(exc)[:200])
PY
for c in fwd_scale fwd_headdim bwd_warps bwd_splits sm90_cols sm90_literal; do
  timeout 60 python3 /tmp/probe.py $c > /tmp/p.txt 2>&1; echo "$c rc=$? $(tail -1 /tmp/p.txt)"
done
which gdb && timeout 90 gdb -q -batch -ex run -ex bt --args python3 /tmp/probe.py sm90_cols 2>&1 | tail -40
