"""Compile kernels.flash.gluon_fwd for sm_90 ahead of time, on any machine (no GPU needed): registers, shared memory,
spills, and whether the softmax's exponentials sit between the wait for S and the wait for the P·V product.

    python -m benchmarks.flash_gluon_aot        # with TRITON_INTERPRET unset
    python -m benchmarks.flash_gluon_aot --ws   # the TMA producer-warp forward (kernels.flash.gluon_ws) instead

``sass order`` is the order of the wgmma waits (W1: all but one product done, W0: all) and of the runs of exponentials
(EXP) in the machine code: ``W1 EXP W0`` in the loop means the exponentials of tile j run while P_{j-1}·V_{j-1} is
still in flight. The PTX can have that order while ptxas moves the wait for P·V above the exponentials.
"""
from __future__ import annotations

import os
import re
import sys

import triton
from triton.backends.compiler import GPUTarget

from benchmarks.flash_aot import registers_and_sass

CASES = [(64, 128, 64, 3, 8), (128, 128, 64, 3, 8), (80, 128, 64, 3, 8), (72, 128, 64, 3, 8),
         (64, 64, 64, 4, 4)]  # d, tiles, stages, warps
BWD_CASES = [(64, 64, 128, 3, 8), (128, 32, 128, 3, 8), (64, 64, 64, 3, 4), (72, 32, 128, 3, 8)]  # d, query and key tiles, stages, warps
WS_CASES = [(64, 128, 128, 2, 8), (64, 128, 64, 3, 8), (128, 128, 64, 2, 8), (80, 128, 128, 2, 8)]
DQ_CASES = [(64, 128, 64, 3, 8), (128, 128, 64, 3, 8), (72, 128, 64, 3, 8)]  # d, query and key tiles, stages, warps


def _compile(fn, const: dict, pointers: dict, num_warps: int):
    """``fn`` compiled for sm_90 with ``const`` constexprs, ``pointers`` dtypes (or TMA descriptor types), other
    arguments i32 (fp32 for the scales): a ``CompiledKernel``. The pointers are marked divisible by 16, as the JIT marks them; the strides are
    marked only where head_dim is a multiple of 16 (at d = 72 and odd N the JIT sees no multiple of 16 in them)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    floats = {"qk_scale", "softmax_scale"}
    sig = {n: "constexpr" if n in const else pointers.get(n, "fp32" if n in floats else "i32") for n in fn.arg_names}
    strides_16 = const["HEAD_DIM"] % 16 == 0
    aligned = [n for n in fn.arg_names if sig[n].startswith("*") or (strides_16 and n.startswith("stride_"))]
    src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                         attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def _const(head_dim, block_m, block_n, stages, num_warps) -> dict:
    from kernels.flash.configs import head_dim_padded

    return {"HEAD_DIM": head_dim, "D": head_dim_padded(head_dim), "BLOCK_M": block_m,
            "BLOCK_N": block_n, "STAGES": stages, "num_warps": num_warps}


def compile_forward(head_dim: int, block_m: int, block_n: int, stages: int, num_warps: int):
    """The Gluon forward for sm_90 (bf16)."""
    from kernels.flash import gluon_fwd

    pointers = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Out": "*bf16", "Lse": "*fp32"}
    return _compile(gluon_fwd.flash_fwd_gluon_kernel, _const(head_dim, block_m, block_n, stages, num_warps),
                    pointers, num_warps)


def compile_ws(head_dim: int, block_m: int, block_n: int, stages: int, num_warps: int):
    """The TMA producer-warp forward for sm_90 (bf16), its descriptors' boxes as :func:`gluon_ws.descriptor` makes
    them."""
    from triton.experimental.gluon import language as gl

    from kernels.flash import gluon_ws
    from kernels.flash.configs import head_dim_padded

    def desc(rows):
        box = [1, 1, rows, head_dim_padded(head_dim)]
        return f"tensordesc<bf16{box},{gl.NVMMASharedLayout.get_default_for(box, gl.bfloat16)!r}>"

    pointers = {"desc_q": desc(block_m), "desc_k": desc(block_n), "desc_v": desc(block_n), "Out": "*bf16",
                "Lse": "*fp32"}
    return _compile(gluon_ws.flash_fwd_ws_kernel, _const(head_dim, block_m, block_n, stages, num_warps), pointers,
                    num_warps)


def describe_ws(kernel) -> str:
    """Registers, spill stores, shared bytes, HGMMA and UTMALDG in the SASS, and the setmaxnreg counts."""
    regs, sass = registers_and_sass(kernel)
    counts = sorted({int(n, 16) for n in re.findall(r"USETMAXREG\.\w+\.CTAPOOL (?:UP\d, )?(0x[0-9a-f]+)", sass)})
    return (f"{regs} registers, {sass.count('STL')} spill stores, {kernel.metadata.shared} B shared, "
            f"HGMMA {'HGMMA' in sass}, UTMALDG {'UTMALDG' in sass}, setmaxnreg {counts}")


def compile_dq(head_dim: int, block_m: int, block_n: int, stages: int, num_warps: int):
    """The Gluon dQ kernel for sm_90 (bf16)."""
    from kernels.flash import gluon_bwd

    pointers = {**dict.fromkeys(("Q", "K", "V", "DO", "DQ"), "*bf16"), "Lse": "*fp32", "Delta": "*fp32"}
    return _compile(gluon_bwd.flash_bwd_dq_gluon_kernel, _const(head_dim, block_m, block_n, stages, num_warps),
                    pointers, num_warps)


def compile_dkdv(head_dim: int, block_m: int, block_n: int, stages: int, num_warps: int):
    """The Gluon dK, dV kernel for sm_90 (bf16)."""
    from kernels.flash import gluon_bwd

    pointers = {**dict.fromkeys(("Q", "K", "V", "DO", "DK", "DV"), "*bf16"), "Lse": "*fp32", "Delta": "*fp32"}
    return _compile(gluon_bwd.flash_bwd_dkdv_gluon_kernel, _const(head_dim, block_m, block_n, stages, num_warps),
                    pointers, num_warps)


def sass_order(sass: str) -> str:
    """The SASS's wgmma waits (``WARPGROUP.DEPBAR`` gsb0 n, as Wn) and runs of ``MUFU.EX2``, in order."""
    events = []
    for line in sass.splitlines():
        wait = re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", line)
        if wait:
            events.append(f"W{int(wait.group(1))}")
        elif "MUFU.EX2" in line and (not events or events[-1] != "EXP"):
            events.append("EXP")
    return " ".join(events)


def describe(kernel) -> str:
    """Registers, spill stores, shared bytes, whether the SASS has HGMMA, and :func:`sass_order`."""
    regs, sass = registers_and_sass(kernel)
    return (f"{regs} registers, {sass.count('STL')} spill stores, {kernel.metadata.shared} B shared, "
            f"HGMMA {'HGMMA' in sass}; sass order: {sass_order(sass)}")


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter compiles nothing")
    if "--ws" in sys.argv[1:]:
        for head_dim, block_m, block_n, stages, warps in WS_CASES:
            kernel = compile_ws(head_dim, block_m, block_n, stages, warps)
            print(f"ws d={head_dim} tiles=({block_m},{block_n}) stages={stages} warps={warps}: {describe_ws(kernel)}",
                  flush=True)
        print(f"triton {triton.__version__}")
        return
    for label, compile_fn, cases in (("", compile_forward, CASES), ("dkdv ", compile_dkdv, BWD_CASES),
                                     ("dq ", compile_dq, DQ_CASES)):
        for head_dim, block_m, block_n, stages, warps in cases:
            kernel = compile_fn(head_dim, block_m, block_n, stages, warps)
            print(f"{label}d={head_dim} tiles=({block_m},{block_n}) stages={stages} warps={warps}: {describe(kernel)}",
                  flush=True)
    print(f"triton {triton.__version__}")


if __name__ == "__main__":
    main()
