"""Registers, shared memory, spills and key SASS instructions of every CUDA attention kernel, without a GPU.

    python -m benchmarks.cuda_resources            # a markdown table on stdout

Each translation unit of ``kernels/cuda/csrc`` is compiled as the extension's build compiles it (nvcc, the build's
flags): the mma.sync kernels for sm_80, the Hopper ones for sm_90a. Per kernel: ptxas's registers a thread
(``-Xptxas -v``), spill bytes, static shared memory, and counts of the instructions that show which machinery runs
(HGMMA wgmma, HMMA mma.sync, UTMALDG TMA loads, UTMAREDG TMA reduce-adds, RED/REDG float atomics, MUFU.EX2
exponentials), read from the SASS with cuobjdump. Dynamic shared memory is each kernel's traits constant (what its
launcher passes to cudaFuncSetAttribute), printed by a host program built from the same headers.

Needs nvcc (``CUDA_HOME``) and cuobjdump (the CUDA toolkit's, or the one the triton wheel carries).
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kernels.cuda import build

DEFINES = [*build.TORCH_NVCC_DEFINES, "-DVITK_SM90A"]
COUNTED = {"HGMMA": r"\bHGMMA\.", "HMMA": r"\bHMMA\.", "UTMALDG": r"\bUTMALDG\.", "UTMAREDG": r"\bUTMAREDG\.",
           "RED(G)": r"\bREDG?\.", "MUFU.EX2": r"\bMUFU\.EX2\b"}  # column: what its regex counts in the SASS
DQ_MODES = {"0": "own", "1": "columns", "2": "sum", "3": "rows"}
# The Hopper kernels' dynamic shared memory, from their traits (the launchers pass these to cudaFuncSetAttribute).
_SMEM_PROGRAM = r"""
#include <cstdio>
#include "fwd.cuh"
#include "bwd_sm90.cuh"
using namespace vitk;
template <int D, int DQ, bool TMA, bool PP = false> void bwd() {
  std::printf("bwd %d %d %d %d %d\n", D, DQ, int(TMA), int(PP), BwdSm90Variant<D, DQ, TMA, PP>::kSmemBytes);
}
template <int D> void sm80() {
  std::printf("fwd80 %d %d\nbwd80 %d 4 %d\nbwd80 %d 8 %d\n", D, FwdTraits<D>::kSmemBytes, D, BwdTraits<D, 4>::kSmemBytes, D,
              BwdTraits<D, 8>::kSmemBytes);
}
int main() {
  sm80<32>(); sm80<64>(); sm80<128>();
  std::printf("fwd 64 2 128 %d\nfwd 128 2 128 %d\nfwd 64 3 128 %d\nfwd 64 2 208 %d\n", FwdSm90Traits<64>::kSmemBytes,
              FwdSm90Traits<128>::kSmemBytes, FwdSm90Traits<64, 3>::kSmemBytes, FwdSm90Traits<64, 2, 208>::kSmemBytes);
  bwd<64, kDqOwn, false>(); bwd<64, kDqOwn, true>(); bwd<64, kDqSum, false>(); bwd<64, kDqSum, true>();
  bwd<64, kDqRows, false>(); bwd<64, kDqRows, true>(); bwd<64, kDqRows, true, true>();
  bwd<128, kDqOwn, false>(); bwd<128, kDqOwn, true>(); bwd<128, kDqCols, false>(); bwd<128, kDqCols, true>();
  bwd<128, kDqCols, true, true>();
}
"""


def cuobjdump() -> str:
    """:func:`kernels.cuda.build.find_cuobjdump`'s; raises FileNotFoundError if there is none."""
    found = build.find_cuobjdump()
    if found is None:
        raise FileNotFoundError("cuobjdump not found: install the CUDA toolkit or the triton wheel")
    return found


def _nvcc() -> str:
    nvcc = build.find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found: install the CUDA toolkit and set CUDA_HOME=/usr/local/cuda")
    return nvcc


def compile_unit(src: Path, arch: str, out: Path) -> tuple[Path, str]:
    """``src`` compiled to a cubin for ``arch``: (cubin, ptxas's report)."""
    cubin = out / f"{src.stem}.{arch}.cubin"
    cmd = [_nvcc(), "-cubin", f"-arch={arch}", *build.NVCC_FLAGS, "-std=c++17", *DEFINES, "-Xptxas", "-v",
           "-I", str(build.CSRC), str(src), "-o", str(cubin)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return cubin, proc.stderr


def ptxas_rows(report: str) -> dict[str, dict]:
    """{mangled kernel: registers, spill bytes, static shared bytes} from a ``-Xptxas -v`` report."""
    rows, name = {}, None
    for line in report.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            name = m.group(1)
            rows[name] = {}
        elif name and (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            rows[name]["spills"] = int(m.group(1)) + int(m.group(2))
        elif name and (m := re.search(r"Used (\d+) registers", line)):
            smem = re.search(r"(\d+) bytes smem", line)
            rows[name].update(registers=int(m.group(1)), static_smem=int(smem.group(1)) if smem else 0)
    return rows


def sass_counts(cubin: Path) -> dict[str, dict]:
    """{mangled kernel: {instruction: count}} for the COUNTED instructions."""
    sass = subprocess.run([cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    counts = {}
    for part in re.split(r"\n\s+Function : ", sass)[1:]:
        name, body = part.split("\n", 1)
        counts[name.strip()] = {op: len(re.findall(pattern, body)) for op, pattern in COUNTED.items()}
    return counts


def dynamic_smem(out: Path) -> dict[tuple, int]:
    """{("fwd", D, consumers, key tile) or ("bwd", D, dq mode, tma, pingpong): bytes} from the traits, by a host program
    built from the headers."""
    src, exe = out / "smem.cu", out / "smem"
    src.write_text(_SMEM_PROGRAM)
    subprocess.run([_nvcc(), "-std=c++17", "-arch=sm_90a", *DEFINES, "-I", str(build.CSRC), str(src), "-o", str(exe)],
                   capture_output=True, text=True, check=True)
    sizes = {}
    for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines():
        kind, *nums = line.split()
        sizes[(kind, *map(int, nums[:-1]))] = int(nums[-1])
    return sizes


def describe(unit: str, kernel: str, smem: dict) -> tuple[str, int]:
    """A readable name for a mangled kernel of ``unit`` and its dynamic shared memory (0 where none)."""
    args = re.search(r"ILi(\d)ELi(\d+)E(.*?)EEv", kernel)
    if "delta_kernel" in kernel:  # delta = rowsum(dO ∘ O), and dq_accum zeroed
        d = re.search(r"ILi\d+ELi(\d+)", kernel).group(1)
        return f"delta {unit.split('_')[-1]} d{d}", 0
    if "bwd_dq_kernel" in kernel:  # dq = dq_accum in the input dtype
        d = re.search(r"ILi\d+ELi(\d+)", kernel).group(1)
        return f"dq from dq_accum {unit.split('_')[-1]} d{d}", 0
    if args is None:
        return f"{unit}: {kernel[:40]}", 0
    dtype, d, rest = "bf16" if args.group(1) == "1" else "fp16", int(args.group(2)), args.group(3)
    if "bwd_sm90_kernel" in kernel:
        mode, tma, overlap, splits, walk = re.search(r"Li(\d)ELb(\d)ELb(\d)ELb(\d)(?:ELb(\d))?", rest).groups()
        pp = mode in ("1", "3") and overlap == "1"  # OVERLAP with a split dQ: the ping-pong consumer
        name = f"bwd_sm90 {dtype} d{d} dQ {DQ_MODES[mode]}{' tma' if tma == '1' else ''}" \
               f"{' pingpong' if pp else ' overlap' if overlap == '1' else ''}" \
               f"{' deterministic' if splits == '1' else ''}{' persistent' if walk == '1' else ''}"
        return name, smem.get(("bwd", d, int(mode), int(tma), int(pp)), 0)
    if "fwd_sm90_kernel" in kernel:  # <dtype, D, schedule (0 sequential, 1 pingpong, 2 wide, 3 short), consumers, persistent>
        schedule, consumers, persist = re.search(r"Li(\d)ELi(\d)ELb(\d)", rest).groups()
        label = ('', ' pingpong', ' wide', ' short')[int(schedule)]
        return f"fwd_sm90 {dtype} d{d}{label}{' persistent' * (persist == '1')}", \
            smem.get(("fwd", d, int(consumers), 208 if schedule == "3" else 128), 0)
    if "bwd_kernel" in kernel:  # mma.sync: <dtype, D, warps, dq slices (deterministic)>
        warps, split = re.search(r"Li(\d+)ELb(\d)", rest).groups()
        return f"bwd {dtype} d{d} {warps} warps{' deterministic' if split == '1' else ''}", \
            smem.get(("bwd80", d, int(warps)), 0)
    if "fwd_kernel" in kernel:
        return f"fwd {dtype} d{d}", smem.get(("fwd80", d), 0)
    return f"{unit}: {kernel[:40]}", 0


def main() -> None:
    units = [(src, "sm_90a" if "sm90" in src.name else "sm_80") for src in build.sources("8.0;9.0a")
             if src.suffix == ".cu" and src.name != "vector_add.cu"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        with ThreadPoolExecutor(max_workers=4) as pool:
            built = list(pool.map(lambda job: (job, compile_unit(job[0], job[1], out)), units))
        smem = dynamic_smem(out)
        print("| kernel | arch | registers | spill bytes | static smem B | dynamic smem B | " + " | ".join(COUNTED) + " |")
        print("|---" * (6 + len(COUNTED)) + "|")
        for (src, arch), (cubin, report) in built:
            counts = sass_counts(cubin)
            for kernel, row in ptxas_rows(report).items():
                name, dyn = describe(src.stem, kernel, smem)
                ops = " | ".join(str(counts.get(kernel, {}).get(op, "?")) for op in COUNTED)
                print(f"| {name} | {arch} | {row.get('registers', '?')} | {row.get('spills', '?')} | "
                      f"{row.get('static_smem', '?')} | {dyn} | {ops} |")


if __name__ == "__main__":
    main()
