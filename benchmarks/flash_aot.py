"""Compile kernels.flash.hopper.flash_bwd_fused_tma_kernel for sm_90 ahead of time, on any machine (no GPU needed):
registers, shared memory, and which instructions its dQ adds became (PTX, and SASS read with the cuobjdump that
Triton ships).

    python -m benchmarks.flash_aot        # with TRITON_INTERPRET unset

DQ_REDUCE=1 is ``tl.atomic_add`` (element-wise atom/red), DQ_REDUCE=2 the descriptor's ``atomic_add``: a TMA bulk
reduce-add, ``cp.reduce.async.bulk.tensor`` in PTX and ``UTMAREDG`` in SASS.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

CASES = [(1, 64, 64, 64, 4), (1, 128, 64, 128, 8), (2, 64, 64, 64, 4), (2, 128, 64, 128, 8)]  # DQ_REDUCE, d, tiles, warps
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
_DTYPES = {"DQacc": "*fp32", "Lse": "*fp32", "Delta": "*fp32", "softmax_scale": "fp32", "qk_scale": "fp32",
           **dict.fromkeys(("Q", "K", "V", "DO", "DK", "DV"), "*bf16")}


def compile_fused(dq_reduce: int, head_dim: int, block_m: int, block_n: int, num_warps: int):
    """The fused backward compiled for sm_90 (bf16, num_stages 3): a triton ``CompiledKernel``."""
    from kernels.flash import hopper

    fn = hopper.flash_bwd_fused_tma_kernel
    const = {"HEAD_DIM": head_dim, "HEAD_DIM_PADDED": head_dim, "IEEE": False, "BLOCK_M1": block_m,
             "BLOCK_N1": block_n, "WARP_SPECIALIZE": False, "DQ_REDUCE": dq_reduce}
    sig = {n: "constexpr" if n in const else _DTYPES.get(n, "i32") for n in fn.arg_names}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 3})


def registers_and_sass(kernel) -> tuple[str, str]:
    """A compiled kernel's registers a thread (``?`` if cuobjdump does not say) and its SASS, read with the cuobjdump
    that Triton ships."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", cubin], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    return (regs.group(1) if regs else "?"), sass


def describe(kernel) -> str:
    """Registers, shared bytes, and the reduction / TMA / wgmma instructions of a compiled kernel."""
    ptx_adds = sorted(set(re.findall(r"(cp\.reduce\.async\.bulk[\w.]*|red\.global[\w.]*|atom\.global[\w.]*)",
                                     kernel.asm["ptx"])))
    regs, sass = registers_and_sass(kernel)
    ops = sorted(set(re.findall(r"\b(UTMAREDG|UTMALDG|HGMMA)\b", sass)))
    return f"{regs} registers, {kernel.metadata.shared} B shared; PTX dQ adds: {ptx_adds}; SASS: {ops}"


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter compiles nothing")
    for dq_reduce, d, block_m, block_n, warps in CASES:
        kernel = compile_fused(dq_reduce, d, block_m, block_n, warps)
        print(f"DQ_REDUCE={dq_reduce} d={d} tiles=({block_m},{block_n}) warps={warps}: {describe(kernel)}", flush=True)
    print(f"triton {triton.__version__}")


if __name__ == "__main__":
    main()
