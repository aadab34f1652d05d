"""Registers, stack and shared memory per flash config row: Triton AOT for sm_90, then cuobjdump -res-usage (no GPU)."""
import os
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.flash import configs
from kernels.flash import kernels as K

CUOBJ = os.path.dirname(triton.__file__) + "/backends/nvidia/bin/cuobjdump"
KERN = {"fwd": (K.flash_fwd_kernel, ("BLOCK_M", "BLOCK_N"), {"STORE_RES": False, "UNSCALED_MAX": False}),
        "dkdv": (K.flash_bwd_dkdv_kernel, ("BLOCK_M1", "BLOCK_N1"), {"SPLIT_DS": False}),
        "dq": (K.flash_bwd_dq_kernel, ("BLOCK_M2", "BLOCK_N2"), {"ADD_RES": False})}
def comp(which, d, row, flagged=False):
    fn, names, flags = KERN[which]
    if flagged:  # fp32_delta's variants
        flags = {k: True for k in flags}
    const = {"HEAD_DIM": d, "HEAD_DIM_PADDED": d, "IEEE": False, **flags, **dict(zip(names, row[:2]))}
    sig = {}
    for n in fn.arg_names:
        if n in const: sig[n] = "constexpr"
        elif n in ("Lse", "Delta"): sig[n] = "*fp32"
        elif n[0].isupper() and not n.startswith(("HEAD", "N_", "BLOCK")) and n not in ("H", "N"): sig[n] = "*bf16"
        elif n in ("qk_scale", "softmax_scale"): sig[n] = "fp32"
        else: sig[n] = "i32"
    for n in fn.arg_names:
        if n.startswith("stride_") and n.endswith("d"): const[n] = 1; sig[n] = "constexpr"
    div = [n for n in fn.arg_names if sig[n] not in ("constexpr", "fp32")]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()}, attrs=attrs)
    opts = {"num_warps": row[2], "num_stages": row[3]}
    if len(row) > 4: opts["maxnreg"] = row[4]
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    with open("/tmp/k.cubin", "wb") as f:
        f.write(k.asm["cubin"])
    out = subprocess.run([CUOBJ, "-res-usage", "/tmp/k.cubin"], capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if "REG" in line).strip()
    return line, k.metadata.shared
FLAGGED = "--fp32-delta" in sys.argv
for which, table in (("fwd", configs._FWD), ("dkdv", configs._DKDV), ("dq", configs._DQ)):
    for d in (64, 128):
        rows = list(table[d])
        extra = [r[:4] for r in rows if len(r) > 4]
        for row in rows + extra:
            line, shared = comp(which, d, row, FLAGGED)
            print(f"{which} d={d} {row}{' fp32_delta' if FLAGGED else ''}: {line} smem {shared}", flush=True)
