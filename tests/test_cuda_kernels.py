"""CUDA C++ attention backend (kernels/cuda).

CPU (CI): every mma.sync kernel source compiles with nvcc for sm_80 and sm_90a and the Hopper
kernels' for sm_90a; the SASS holds tensor-core instructions (HMMA for mma.sync; HGMMA, UTMALDG
(TMA) and mbarrier waits for the Hopper kernels) and ptxas reports no spills; the build's arch and
source selection and the kernel-path choice; the wrapper's input validation raises the documented
errors before touching a GPU or the extension.
GPU: forward and dq, dk, dv against float64 (error ≤ 2× naive's at the same dtype), awkward
seq_len and head_dim, for the mma.sync kernels and, on compute capability 9.0, the Hopper forward
and backward; eager and torch.compile(fullgraph=True), strided inputs.
"""
from __future__ import annotations

import faulthandler
import functools
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import check_against_reference, error_floor, is_hopper, make_qkv, max_err, pack_qkv, reference_attention

from kernels import cuda, get_attention, split_qkv
from kernels.cuda import attention, build, check_inputs, ops

ARCHES = ("sm_80", "sm_90a")  # torch builds compute capability 9.0 as 9.0a (build.arch_list)


def _is_sm90(name: str) -> bool:
    return "_sm90_" in name


def _sass(cubin) -> str:
    tool = build.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (CUDA toolkit or the triton wheel carries it)")
    return subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="session")
def cubins(tmp_path_factory):
    """Compile every kernel source once per arch that runs it (the Hopper kernels for sm_90a only):
    {(arch, file name): (cubin path, ptxas report)}."""
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found: install the CUDA toolkit and set CUDA_HOME=/usr/local/cuda")
    out = tmp_path_factory.mktemp("cubins")
    jobs = [(arch, src) for arch in ARCHES for src in build.sources("8.0;9.0a")
            if src.suffix == ".cu" and (arch == "sm_90a" or not _is_sm90(src.name))]

    def compile_one(job):
        arch, src = job
        cubin = out / f"{src.stem}.{arch}.cubin"
        cmd = [nvcc, "-cubin", f"-arch={arch}", *build.NVCC_FLAGS, "-std=c++17", *build.TORCH_NVCC_DEFINES,
               "-Xptxas", "-v", "-I", str(build.CSRC), str(src), "-o", str(cubin)]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
        return job, cubin, proc

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(compile_one, jobs))
    for (arch, src), _, proc in results:
        assert proc.returncode == 0, f"nvcc failed on {src.name} for {arch}:\n{proc.stderr}"
    return {(arch, src.name): (cubin, proc.stderr) for (arch, src), cubin, proc in results}


@pytest.mark.parametrize("arch", ARCHES)
def test_attention_sass_uses_tensor_cores(cubins, arch):
    names = [name for (a, name) in cubins if a == arch and name.startswith(("fwd_", "bwd_")) and not _is_sm90(name)]
    assert len(names) == 12, names  # 2 dtypes x 3 head dims x (fwd, bwd)
    for name in names:
        sass = _sass(cubins[(arch, name)][0])
        assert re.search(r"\bHMMA\.16816", sass), f"{name} ({arch}): no mma.sync (HMMA.16816) in the SASS"
        assert "LDSM" in sass, f"{name} ({arch}): no ldmatrix (LDSM) in the SASS"
        assert "LDGSTS" in sass, f"{name} ({arch}): no cp.async (LDGSTS) in the SASS"


def test_sm90_forward_sass_uses_wgmma_and_tma(cubins):
    """The Hopper forward, every consumer schedule. Sequential (two consumers, also in persistent CTAs, and at head_dim
    64 also three: wide):
    per key tile D/16 HGMMA for S = Q Kᵀ (m64n128, both operands from shared memory) and 8 for O += P V (A from
    registers, B transposed); the short schedule (persistent, head_dim 64) the same with 208-key tiles: m64n208, 13.
    Pingpong: those twice (the first tile's S and the last tile's P·V are issued apart), all
    of a tile's products after one WARPGROUP.ARRIVE (not serialised: ptxas does so when registers a wgmma reads are
    written while one is in flight), a wait that leaves P·V running (DEPBAR.LE gsb0, 0x1; what runs under it:
    test_sm90_pingpong_softmax_overlaps_pv), and named-barrier arrivals; in persistent CTAs too.
    All: TMA loads, mbarrier waits, setmaxnreg, no local memory."""
    names = [name for (_, name) in cubins if name.startswith("fwd_sm90_")]
    assert len(names) == 4, names  # 2 dtypes x head_dim {64, 128}
    kinds = {("0", "0"): "sequential", ("1", "0"): "pingpong", ("2", "0"): "wide", ("0", "1"): "persistent",
             ("1", "1"): "persistent-pingpong", ("3", "1"): "short"}
    for name in names:  # fwd_sm90_kernel<DTYPE, D, SCHEDULE, C, PERSIST>
        d, ty = re.match(r"fwd_sm90_hdim(\d+)_(bf16|fp16)", name).groups()
        functions = _functions(_sass(cubins[("sm_90a", name)][0]))
        schedules = {kinds[re.search(r"fwd_sm90_kernelILi\d+ELi\d+ELi(\d)ELi\dELb(\d)E", f).groups()]: sass
                     for f, sass in functions.items() if "fwd_sm90_kernel" in f}
        expected = {"sequential", "pingpong", "persistent", "persistent-pingpong"}
        expected |= {"wide", "short"} if d == "64" else set()
        assert set(schedules) == expected, f"{name}: {list(functions)}"
        suffix = r"\.BF16" if ty == "bf16" else ""  # ptxas writes fp16 HGMMA as plain .F32
        rs = rf"HGMMA\.64x{d}x16\.F32{suffix} R\d+, R\d+, gdesc\[UR\d+\]\.tnspB"
        for schedule, sass in schedules.items():
            copies = 2 if schedule.endswith("pingpong") else 1
            keys = 208 if schedule == "short" else 128  # the key tile (FwdSm90Traits' BN)
            ss = rf"HGMMA\.64x{keys}x16\.F32{suffix} R\d+, gdesc"
            where = f"{name} ({schedule})"
            assert len(re.findall(ss, sass)) == copies * int(d) // 16, f"{where}: S = Q Kᵀ is not {int(d) // 16} HGMMA"
            assert len(re.findall(rs, sass)) == copies * keys // 16, f"{where}: O += P V is not {keys // 16} HGMMA"
            assert "UTMALDG.4D" in sass, f"{where}: no TMA load (UTMALDG) in the SASS"
            assert "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass, f"{where}: no mbarrier wait in the SASS"
            assert "USETMAXREG.DEALLOC" in sass and "USETMAXREG.TRY_ALLOC" in sass, f"{where}: no setmaxnreg"
            assert "HMMA.16816" not in sass and "LDGSTS" not in sass, f"{where}: mma.sync or cp.async left in"
            assert "STL" not in sass and "LDL" not in sass, f"{where}: registers spilled to local memory"
        for schedule in ("pingpong", "persistent-pingpong"):
            pingpong = schedules[schedule]
            assert pingpong.count("WARPGROUP.ARRIVE") == 3, f"{name} ({schedule}): its wgmmas are serialised"
            assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in pingpong, f"{name} ({schedule}): no wait leaving P·V in flight"
            assert "BAR.ARV" in pingpong and "BAR.SYNC" in pingpong, f"{name} ({schedule}): no named-barrier hand-off"


@pytest.mark.parametrize("head_dim", [64, 128])
def test_sm90_pingpong_softmax_overlaps_pv(cubins, head_dim):
    """The intra-warpgroup overlap in the SASS: the softmax's exponentials (MUFU.EX2, 64 and the 2 rescale factors)
    between the wait that leaves P·V running (DEPBAR.LE gsb0, 0x1) and the wait for it (0x0), in the ping-pong kernel
    and in its persistent twin."""
    for name in [name for (_, name) in cubins if name.startswith(f"fwd_sm90_hdim{head_dim}_")]:
        kernels = {k: f for k, f in _functions(_sass(cubins[("sm_90a", name)][0])).items()
                   if re.search(r"fwd_sm90_kernelILi\d+ELi\d+ELi1E", k)}  # SCHEDULE 1: pingpong, PERSIST or not
        assert len(kernels) == 2, (name, list(kernels))
        for kernel, sass in kernels.items():
            between = sass.split("WARPGROUP.DEPBAR.LE gsb0, 0x1", 1)[1].split("WARPGROUP.DEPBAR.LE gsb0, 0x0", 1)[0]
            assert between.count("MUFU.EX2") == 66, f"{name} {kernel}: the softmax waits for P·V"


def _functions(sass: str) -> dict[str, str]:
    """cuobjdump's SASS split per kernel: {mangled name: its instructions}."""
    parts = re.split(r"\n\s+Function : ", sass)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_sm90_backward_sass_uses_wgmma_and_tma(cubins):
    """The Hopper backward per 64-query step: Sᵀ and dPᵀ (2·D/16 HGMMA m64n64, K-major), dV and dK
    (2·4 with A from registers, B transposed), dQ (4 with both operands transposed), TMA, REDG.F32x2.
    At head_dim 128 also the column-split dQ kernel (DQ_COLS): dQ as 8 m64n64 HGMMA over all 128 keys
    and half the default kernel's float2 atomics. Each also as a DQ_TMA kernel: no atomics, one TMA reduce-add
    (UTMAREDG) per 32 columns of dQ the warpgroup adds, written through shared memory as float2 stores. Each of those
    also with the OVERLAP consumer: all 32 exponentials of Pᵀ between the wait for Sᵀ (DEPBAR.LE gsb0, 0x1, dPᵀ still
    running) and the wait for dPᵀ; the rows-tma and columns-tma sequential kernels (bwd_sm90_ordered_step) and the
    ping-pong kernels (in their first and later steps) all of them there at head_dim 128, at least half at 64, and all
    of dQ's staging stores between the wait for dQ (dK still running) and the wait for dK. At head_dim 64 each also with the summed dQ (kDqSum): consumer 1 reads consumer 0's
    dQ_w back (LDS.64) after a barrier of both consumers (named barrier 4) and adds the sum once; and with the row-split
    dQ (kDqRows, 128 query rows a step): Sᵀ and dPᵀ as HGMMA m64n128, dV and dK as 2·8, dQ as 8 m64n64 over all 128
    keys, the default kernel's float2 atomics per step (each consumer adds 64 of the 128 rows once). The deterministic
    kernels (dq slices: rows-tma at 64, columns-tma at 128) as their one-tile twins, plus the wait for their
    reduce-adds' writes at each tile's end (cp.async.bulk.wait_group without .read: ptxas invalidates L1 after it,
    CCTL.IVALL)."""
    names = [name for (_, name) in cubins if name.startswith("bwd_sm90_")]
    assert len(names) == 4, names
    for name in names:
        d, ty = re.match(r"bwd_sm90_hdim(\d+)_(bf16|fp16)", name).groups()
        d = int(d)
        kernels = {k: v for k, v in _functions(_sass(cubins[("sm_90a", name)][0])).items() if "bwd_sm90_kernel" in k}
        # (cols, tma); (sum, tma, overlap), rows; pp; slices; the key-tile walk (persistent)
        assert len(kernels) == (7 if d == 128 else 13), (name, list(kernels))
        mma = r"HGMMA\.64x{}x16\.F32" + (r"\.BF16" if ty == "bf16" else "")
        atomics = {}
        for kernel, sass in kernels.items():
            mode, tma, overlap, splits, walk = re.search(r"ELi(\d)ELb(\d)ELb(\d)ELb(\d)ELb(\d)EE", kernel).groups()
            cols, summed, rows, tma, overlap = mode == "1", mode == "2", mode == "3", tma == "1", overlap == "1"
            assert ("CCTL.IVALL" in sass) == (splits == "1"), f"{kernel}: the slices' full wait for their reduce-adds"
            if walk == "1":
                assert tma and (rows if d == 64 else cols) and not overlap and splits == "0", kernel
            pp = (rows or cols) and overlap  # the ping-pong consumer: its first step and last dQ peeled, twice the code
            copies = 2 if pp else 1
            if summed:
                assert len(re.findall(r"LDS\.64", sass)) == d // 4, f"{kernel}: consumer 0's dQ_w is not read back"
                assert "BAR.SYNC.DEFER_BLOCKING 0x4, 0x100" in sass, f"{kernel}: no barrier of both consumers"
            if pp:
                assert re.search(r"BAR\.ARV R\d+, 0x100", sass), f"{kernel}: no named barrier handing the turn over"
            if overlap and not pp:
                assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass, f"{kernel}: no wait that leaves dPᵀ running"
                between = sass.split("WARPGROUP.DEPBAR.LE gsb0, 0x1", 1)[1].split("WARPGROUP.DEPBAR.LE gsb0, 0x0", 1)[0]
                assert between.count("MUFU.EX2") == 32, f"{kernel}: Pᵀ's exponentials wait for dPᵀ"
            elif (rows or cols) and tma:  # waits that leave a product running: Sᵀ's (dPᵀ runs), dQ's (dK, dV run)
                after = [part.split("WARPGROUP.DEPBAR.LE gsb0, 0x0", 1)[0]
                         for part in sass.split("WARPGROUP.DEPBAR.LE gsb0, 0x1")[1:]]
                assert len(after) == 2 + pp, f"{kernel}: {len(after)} waits that leave a product running"
                exps = 64 if rows else 32  # a thread's Pᵀ elements a step
                under = exps if d == 128 else exps // 2  # all of them behind the block boundary at 128
                for part in after[:1 + pp]:  # bwd_sm90_ordered_step's step; the ping-pong's first and later steps
                    assert part.count("MUFU.EX2") >= under, f"{kernel}: Pᵀ's exponentials wait for dPᵀ"
                assert len(re.findall(r"STS\.64", after[-1])) == 16, f"{kernel}: dQ's staging waits for dK"  # 64 x 64
            else:
                assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in sass, kernel
            s_mma = mma.format(128 if rows else 64) + r" R\d+, gdesc\[UR\d+\], (RZ|R\d+)"
            assert len(re.findall(s_mma, sass)) == 2 * d // 16 * copies, kernel
            assert len(re.findall(mma.format(d) + r" R\d+, R\d+, gdesc\[UR\d+\]\.tnspB", sass)) == (16 if rows else 8) * copies, kernel
            dq = mma.format(64 if cols else d) + r" R\d+, gdesc\[UR\d+\]\.tnspA\.tnspB"
            assert len(re.findall(dq, sass)) == (8 if cols or rows else 4) * copies, kernel
            assert "UTMALDG.4D" in sass and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass, kernel
            assert "HMMA.16816" not in sass, f"{kernel}: mma.sync in the Hopper backward"
            reduces = len(re.findall(r"UTMAREDG\.4D\.ADD", sass))
            assert reduces == ((64 if cols else d) // 32 * copies if tma else 0), f"{kernel}: {reduces} TMA reduce-adds"
            if tma:  # NQ float32 a thread as NQ / 2 float2 (kDqSum: consumer 0's and the sum)
                stores = (64 if cols else d) // 4 * (2 if summed else 1) * copies
                assert len(re.findall(r"STS\.64", sass)) == stores, f"{kernel}: dQ's staging stores"
                assert not re.search(r"\bREDG", sass), f"{kernel}: atomics left in the TMA reduce-add kernel"
            else:
                atomics.setdefault(cols, set()).add(len(re.findall(r"REDG\.E\.ADD\.F32x2", sass)))  # sum: consumer 1's
        assert atomics[False] == {d // 4}, f"{name}: dQ is not D/4 float2 atomics per thread and step: {atomics}"
        if d == 128:
            assert atomics[True] == {d // 8}, f"{name}: the column split does not halve dQ's atomics"


# The head_dim-64 ping-pong backward consumer's second batch holds dK, dV, Pᵀ, dSᵀ and the previous step's dQ in
# registers at once (ptxas 13.0: 4 bytes of spill stores, 4 of loads); every other kernel spills none.
_PINGPONG_BWD = re.compile(r"bwd_sm90_kernelILi\dELi64ELi3ELb1ELb1E")
_PINGPONG_SPILL_BYTES = 16


@pytest.mark.parametrize("arch", ARCHES)
def test_kernels_do_not_spill(cubins, arch):
    for (a, name), (_, report) in cubins.items():
        if a != arch:
            continue
        spills = re.findall(r"Function properties for (\w+)\n.*?(\d+) bytes spill stores, (\d+) bytes spill loads",
                            report)
        assert spills, f"{name}: no ptxas report"
        for kernel, stores, loads in spills:
            limit = _PINGPONG_SPILL_BYTES if _PINGPONG_BWD.search(kernel) else 0
            assert int(stores) + int(loads) <= limit, f"{name} ({arch}): {kernel} spills registers:\n{report}"
        assert "C7513" not in report, f"{name} ({arch}): ptxas serialised its wgmmas:\n{report}"


def test_vector_add_sass_uses_16_byte_accesses(cubins):
    sass = _sass(cubins[("sm_90a", "vector_add.cu")][0])
    assert re.search(r"LDG\.E\.128", sass) and re.search(r"STG\.E\.128", sass), "vector add lost its float4 path"


def _call_arguments(text: str, open_paren: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose "(" is at ``open_paren`` (strings and nesting kept)."""
    args, depth, quote, start, i = [], 0, None, open_paren + 1, open_paren
    while True:
        c = text[i]
        if quote:
            i += 2 if c == "\\" else 1
            quote = None if c == quote else quote
            continue
        if c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return args + [text[start:i]]
        elif c == "," and depth == 1:
            args, start = args + [text[start:i]], i + 1
        i += 1


def test_extension_checks_pass_one_message():
    """Every TORCH_CHECK in the host binding gets one message, a literal or msg(...): several message arguments go
    through c10::str's ostringstream, which crashed the process instead of raising (api.cpp's msg())."""
    for name, least in (("api.cpp", 20), ("eager.cpp", 3)):
        text = (build.CSRC / name).read_text()
        checks = list(re.finditer(r"TORCH_CHECK\w*\(", text))
        assert len(checks) >= least
        for m in checks:
            args = _call_arguments(text, m.end() - 1)
            line = text.count("\n", 0, m.start()) + 1
            assert len(args) == 2, f"{name}:{line}: {m.group(0)} with {len(args) - 1} message arguments: wrap them in msg()"


@pytest.mark.slow
def test_whole_extension_builds_and_imports(tmp_path, monkeypatch):
    """The host binding (api.cpp, torch headers) too: cpp_extension builds and imports the module."""
    if build.find_nvcc() is None:
        pytest.skip("nvcc not found: install the CUDA toolkit and set CUDA_HOME=/usr/local/cuda")
    monkeypatch.setenv("VIT_KERNELS_BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # built as 9.0a, with the Hopper forward
    build.extension.cache_clear()
    try:
        module = build.extension()
    finally:
        build.extension.cache_clear()
    assert all(hasattr(module, name) for name in ("fwd", "fwd_sm90", "fwd_sm90_pingpong", "bwd", "bwd_sm90",
                                                  "backward", "attention", "attention_qkvpacked", "vector_add"))
    assert module.has_sm90


# --- input validation (no GPU, no extension) ---

def _qkv(shape=(2, 3, 17, 64), dtype=torch.bfloat16):
    return [torch.randn(shape).to(dtype) for _ in range(3)]


def test_rejects_float32():
    q, k, v = _qkv(dtype=torch.float32)
    with pytest.raises(TypeError, match="float16 and bfloat16"):
        check_inputs(q, k, v)


def test_rejects_mixed_dtypes():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="one dtype"):
        check_inputs(q, k.half(), v)


def test_rejects_non_tensor():
    q, _k, v = _qkv()
    with pytest.raises(TypeError, match="torch.Tensor"):
        check_inputs(q, [[1.0]], v)


@pytest.mark.parametrize("shape_k", [(2, 3, 16, 64), (2, 3, 17, 32), (6, 17, 64)])
def test_rejects_shape_mismatch(shape_k):
    q, _, v = _qkv()
    k = torch.randn(shape_k).bfloat16()
    with pytest.raises(ValueError, match="shape|B, H, N"):
        check_inputs(q, k, v)


def test_rejects_large_head_dim():
    q, k, v = _qkv((1, 2, 8, 160))
    with pytest.raises(ValueError, match="head_dim"):
        check_inputs(q, k, v)


def test_rejects_empty():
    q, k, v = _qkv((1, 2, 0, 64))
    with pytest.raises(ValueError, match="≥ 1"):
        check_inputs(q, k, v)


@pytest.mark.parametrize("scale", [0.0, -0.125, float("nan"), "0.1"])
def test_rejects_bad_softmax_scale(scale):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="softmax_scale"):
        check_inputs(q, k, v, softmax_scale=scale)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cpu_tensors_without_gpu_say_so():
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        get_attention("cuda")(q, k, v)


def test_missing_nvcc_says_how_to_fix(monkeypatch):
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    build.extension.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="CUDA_HOME"):
            build.extension()
    finally:
        build.extension.cache_clear()


def test_arch_list_defaults_and_override(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    assert build.arch_list() == "8.0"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0")
    assert build.arch_list() == "8.0;9.0a"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0+PTX")
    assert build.arch_list() == "9.0+PTX"
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        expected = "9.0a" if cap == (9, 0) else "{}.{}".format(*cap)
    else:
        expected = "8.0;9.0a"
    assert build.arch_list() == expected


def test_sources_hold_the_hopper_forward_only_for_sm90a():
    def names(archs):
        return {s.name for s in build.sources(archs)}

    hopper = {f"{p}_sm90_hdim{d}_{t}.cu" for p in ("fwd", "bwd") for d in (64, 128) for t in ("bf16", "fp16")}
    assert hopper <= names("8.0;9.0a") and hopper <= names("9.0a")
    assert not hopper & names("8.0") and not hopper & names("9.0+PTX")
    assert {"api.cpp", "fwd_hdim32_bf16.cu", "bwd_hdim128_fp16.cu"} <= names("8.0")


# --- which forward runs (no GPU: the capability and the extension are stand-ins) ---

class _Ext:
    def __init__(self, has_sm90):
        self.has_sm90 = has_sm90


def _paths(monkeypatch, setting, capability, head_dim=64, seq_len=4096, has_sm90=True):
    """(fwd_path, bwd_path) with both variables set to ``setting``."""
    monkeypatch.setattr(ops, "FWD_PATH", setting)
    monkeypatch.setattr(ops, "BWD_PATH", setting)
    monkeypatch.setattr(ops, "_capability", lambda device: capability)
    monkeypatch.setattr(ops, "extension", lambda: _Ext(has_sm90))
    q = torch.empty(1, 1, seq_len, head_dim, device="meta")
    return ops.fwd_path(q), ops.bwd_path(q)


def test_eager_plan_is_the_ops_choice(monkeypatch):
    """The C++ eager node's plan: the forward the ops run and the backward arguments in the extension's order."""
    from kernels.cuda import eager
    _paths(monkeypatch, "auto", (9, 0))
    q197, q4096 = torch.empty(256, 12, 197, 64, device="meta"), torch.empty(8, 16, 4096, 128, device="meta")
    assert eager.plan(q197, False) == ("fwd_sm90_short", [1, ops.BWD_WARPS, 0, 0, 0, 1, 1, 0, 0])
    assert eager.plan(q4096, False) == ("fwd_sm90_persistent_pingpong", [1, ops.BWD_WARPS, 0, 1, 0, 0, 1, 1, 0])
    monkeypatch.setattr(ops, "_sm_count", lambda index: 132)
    monkeypatch.setattr(ops, "_index", lambda device: 0)
    forward, plan = eager.plan(q4096, True)
    assert forward == "fwd_sm90_persistent_pingpong"
    assert plan == [1, ops.BWD_WARPS, ops.sm90_dq_splits(q4096), 1, 0, 0, 1, 0, 0] and plan[2] > 0
    _paths(monkeypatch, "auto", (8, 0))
    assert eager.plan(q197, False) == ("fwd", [0, ops.BWD_WARPS, 0, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("capability, head_dim, seq_len, expected", [
    # Hopper: forward and backward sm90 from N = 128 at d 64/128
    ((9, 0), 64, 4096, ("sm90", "sm90")), ((9, 0), 128, 4096, ("sm90", "sm90")),
    ((9, 0), 64, 577, ("sm90", "sm90")), ((9, 0), 128, 197, ("sm90", "sm90")),
    ((9, 0), 64, 128, ("sm90", "sm90")), ((9, 0), 128, 127, ("sm80", "sm80")), ((9, 0), 64, 127, ("sm80", "sm80")),
    ((9, 0), 64, 17, ("sm80", "sm80")), ((9, 0), 32, 4096, ("sm80", "sm80")),
    ((8, 0), 64, 4096, ("sm80", "sm80")), ((8, 9), 128, 4096, ("sm80", "sm80")),
    ((10, 0), 64, 4096, ("sm80", "sm80"))])
def test_auto_picks_each_kernel_where_it_measured_faster(monkeypatch, capability, head_dim, seq_len, expected):
    assert _paths(monkeypatch, "auto", capability, head_dim, seq_len) == expected
    assert _paths(monkeypatch, "sm80", capability, head_dim, seq_len) == ("sm80", "sm80")


@pytest.mark.parametrize("seq_len", [1, 197, 4096])
def test_forced_sm90_runs_at_any_seq_len(monkeypatch, seq_len):
    assert _paths(monkeypatch, "sm90", (9, 0), 64, seq_len) == ("sm90", "sm90")


def test_forced_sm90_where_it_cannot_run_says_why(monkeypatch):
    with pytest.raises(RuntimeError, match="compute capability 9.0 GPU.*8.9"):
        _paths(monkeypatch, "sm90", (8, 9))
    with pytest.raises(ValueError, match="head_dim"):
        _paths(monkeypatch, "sm90", (9, 0), head_dim=32)
    with pytest.raises(ValueError, match="VIT_CUDA_FWD must be one of"):
        _paths(monkeypatch, "hopper", (9, 0))
    monkeypatch.setattr(ops, "BWD_PATH", "hopper")
    with pytest.raises(ValueError, match="VIT_CUDA_BWD must be one of"):
        ops.bwd_path(torch.empty(1, 1, 1, 64, device="meta"))


def test_both_paths_default_to_auto():
    assert ops.FWD_PATH == "auto" or "VIT_CUDA_FWD" in os.environ
    assert ops.BWD_PATH == "auto" or "VIT_CUDA_BWD" in os.environ


def test_hopper_gpu_with_a_build_without_sm90a_is_an_error_not_a_fallback(monkeypatch):
    for setting in ("auto", "sm90"):
        with pytest.raises(RuntimeError, match="without sm_90a"):
            _paths(monkeypatch, setting, (9, 0), head_dim=128, has_sm90=False)


class _Sm90Ext:
    fwd_sm90, fwd_sm90_pingpong, fwd_sm90_wide = "sequential forward", "pingpong forward", "wide forward"
    fwd_sm90_persistent, fwd_sm90_persistent_pingpong = "persistent forward", "persistent-pingpong forward"
    fwd_sm90_short = "short forward"


def _picked(q):
    return getattr(_Sm90Ext, ops.sm90_forward(q))


def test_fwd_sm90_schedule_picks_the_kernel(monkeypatch):
    q128, q64 = (torch.empty(1, 1, 4096, d, device="meta") for d in (128, 64))
    assert ops.FWD_SM90 == "auto" or "VIT_CUDA_FWD_SM90" in os.environ
    assert _picked(q128) == "persistent-pingpong forward"  # auto: faster at 128, slower at 64
    assert _picked(q64) == "wide forward"  # three consumers where their tiles are no waste
    for n, d, schedule in ((197, 64, "short"), (577, 64, "short"), (785, 64, "short"), (1025, 64, "wide"),
                           (4097, 64, "wide"), (16384, 64, "wide"), (197, 128, "persistent"), (1024, 128, "persistent"),
                           (1025, 128, "persistent-pingpong")):
        assert _picked(torch.empty(1, 1, n, d, device="meta")) == f"{schedule} forward", (n, d)
    monkeypatch.setattr(ops, "FWD_SM90", "pingpong")
    assert _picked(q64) == "pingpong forward"
    monkeypatch.setattr(ops, "FWD_SM90", "sequential")
    assert _picked(q128) == "sequential forward"
    monkeypatch.setattr(ops, "FWD_SM90", "wide")
    assert _picked(q64) == "wide forward"
    with pytest.raises(ValueError, match="wide has kernels for head_dim 64 only.*got 128"):
        _picked(q128)
    monkeypatch.setattr(ops, "FWD_SM90", "short")
    assert _picked(q64) == "short forward"
    with pytest.raises(ValueError, match="short has kernels for head_dim 64 only.*got 128"):
        _picked(q128)
    monkeypatch.setattr(ops, "FWD_SM90", "persistent")
    assert _picked(q64) == _picked(q128) == "persistent forward"
    monkeypatch.setattr(ops, "FWD_SM90", "persistent-pingpong")
    assert _picked(q64) == _picked(q128) == "persistent-pingpong forward"
    monkeypatch.setattr(ops, "FWD_SM90", "ping-pong")
    with pytest.raises(ValueError, match="VIT_CUDA_FWD_SM90 must be one of"):
        _picked(q128)


def test_bwd_sm90_options_pick_the_kernel_and_check_head_dim(monkeypatch):
    """(dq_cols, dq_sum, dq_rows, dq_tma, overlap) that ops passes to the extension's bwd_sm90 under VIT_CUDA_BWD_DQ and
    VIT_CUDA_BWD_SM90."""
    q128, q64 = (torch.empty(1, 1, 4096, d, device="meta") for d in (128, 64))
    assert ops.BWD_DQ == "auto" or "VIT_CUDA_BWD_DQ" in os.environ
    assert ops.BWD_SM90 == "auto" or "VIT_CUDA_BWD_SM90" in os.environ
    monkeypatch.setattr(ops, "BWD_DQ", "auto")  # where each measured fastest: columns-tma at 128, rows-tma at 64
    monkeypatch.setattr(ops, "BWD_SM90", "auto")  # pingpong at 128 (with columns-tma), at 64 (rows-tma) from N = 512
    assert ops.sm90_bwd_options(q128) == (True, False, False, True, True)
    assert ops.sm90_bwd_options(q64) == (False, False, True, True, True)
    for n, pingpong in ((197, False), (511, False), (512, True), (577, True), (1025, True)):
        assert ops.sm90_bwd_options(torch.empty(1, 1, n, 64, device="meta")) == (False, False, True, True, pingpong), n
    assert ops.sm90_bwd_options(q128, deterministic=True) == (True, False, False, True, False)
    assert ops.sm90_bwd_options(q64, deterministic=True) == (False, False, True, True, False)
    monkeypatch.setattr(ops, "BWD_DQ", "tma")
    assert ops.sm90_bwd_options(q128) == (False, False, False, True, False)
    monkeypatch.setattr(ops, "BWD_DQ", "atomic")
    assert ops.sm90_bwd_options(q128) == ops.sm90_bwd_options(q64) == (False, False, False, False, False)
    monkeypatch.setattr(ops, "BWD_DQ", "columns")
    assert ops.sm90_bwd_options(q128) == (True, False, False, False, False)
    with pytest.raises(ValueError, match="columns has a kernel for head_dim 128.*got 64"):
        ops.sm90_bwd_options(q64)
    monkeypatch.setattr(ops, "BWD_DQ", "tma")
    assert ops.sm90_bwd_options(q128) == ops.sm90_bwd_options(q64) == (False, False, False, True, False)
    monkeypatch.setattr(ops, "BWD_SM90", "overlap")
    assert ops.sm90_bwd_options(q64) == (False, False, False, True, True)
    with pytest.raises(ValueError, match="overlap has a kernel for head_dim 64 with 64 query rows a step, got head_dim 128"):
        ops.sm90_bwd_options(q128)
    monkeypatch.setattr(ops, "BWD_DQ", "sum-tma")
    assert ops.sm90_bwd_options(q64) == (False, True, False, True, True)
    monkeypatch.setattr(ops, "BWD_SM90", "sequential")
    monkeypatch.setattr(ops, "BWD_DQ", "sum")
    assert ops.sm90_bwd_options(q64) == (False, True, False, False, False)
    with pytest.raises(ValueError, match="sum has a kernel for head_dim 64, got 128"):
        ops.sm90_bwd_options(q128)
    monkeypatch.setattr(ops, "BWD_DQ", "columns-tma")
    assert ops.sm90_bwd_options(q128) == (True, False, False, True, False)
    with pytest.raises(ValueError, match="columns-tma has a kernel for head_dim 128.*got 64"):
        ops.sm90_bwd_options(q64)
    monkeypatch.setattr(ops, "BWD_DQ", "rows-tma")
    assert ops.sm90_bwd_options(q64) == (False, False, True, True, False)
    with pytest.raises(ValueError, match="rows-tma has a kernel for head_dim 64, got 128"):
        ops.sm90_bwd_options(q128)
    monkeypatch.setattr(ops, "BWD_DQ", "rows")
    assert ops.sm90_bwd_options(q64) == (False, False, True, False, False)
    monkeypatch.setattr(ops, "BWD_SM90", "overlap")
    with pytest.raises(ValueError, match="overlap has a kernel for head_dim 64 with 64 query rows"):
        ops.sm90_bwd_options(q64)
    monkeypatch.setattr(ops, "BWD_SM90", "pingpong")  # the extension's overlap flag with the row or column split
    with pytest.raises(ValueError, match="pingpong has kernels for VIT_CUDA_BWD_DQ=rows-tma.*got VIT_CUDA_BWD_DQ=rows;"):
        ops.sm90_bwd_options(q64)
    monkeypatch.setattr(ops, "BWD_DQ", "auto")
    assert ops.sm90_bwd_options(q64) == (False, False, True, True, True)
    assert ops.sm90_bwd_options(q128) == (True, False, False, True, True)
    with pytest.raises(ValueError, match="deterministic Hopper backward.*VIT_CUDA_BWD_SM90=pingpong: unset both"):
        ops.sm90_bwd_options(q64, deterministic=True)  # the slices have the sequential consumer only
    monkeypatch.setattr(ops, "BWD_SM90", "auto")
    assert ops.sm90_bwd_options(q64, deterministic=True) == (False, False, True, True, False)
    assert ops.sm90_bwd_options(q128, deterministic=True) == (True, False, False, True, False)
    monkeypatch.setattr(ops, "BWD_DQ", "tma")
    with pytest.raises(ValueError, match="has one kernel per head_dim: VIT_CUDA_BWD_DQ=rows-tma.*got VIT_CUDA_BWD_DQ=tma"):
        ops.sm90_bwd_options(q64, deterministic=True)
    monkeypatch.setattr(ops, "BWD_SM90", "sequential")
    monkeypatch.setattr(ops, "BWD_DQ", "split")
    with pytest.raises(ValueError, match="VIT_CUDA_BWD_DQ must be one of"):
        ops.sm90_bwd_options(q128)
    monkeypatch.setattr(ops, "BWD_DQ", "auto")
    monkeypatch.setattr(ops, "BWD_SM90", "ping-pong")
    with pytest.raises(ValueError, match="VIT_CUDA_BWD_SM90 must be one of"):
        ops.sm90_bwd_options(q128)


# --- GPU: accuracy against float64 ---

SEQ_LENS = (1, 17, 197, 577, 1025, 4096)
HEAD_DIMS = (32, 64, 80, 128)  # 80 runs padded to 128
SM90_HEAD_DIMS = (64, 80, 96, 128)  # 80 and 96 padded to 128; 32 has no sm90 kernel



@pytest.fixture(autouse=True)
def _sm90_hang_guard(request):
    """A Hopper-kernel GPU test that hangs (a pipeline deadlock) ends the whole run after 180 s
    (faulthandler's watchdog thread) instead of using up the device call; the traceback, under pytest's
    capture otherwise lost, goes to $OUT/sm90_hang_traceback.txt (or the temp folder) after the test's id."""
    if "sm90" not in request.node.name or request.node.get_closest_marker("gpu") is None:
        yield
        return
    with open(Path(os.environ.get("OUT", tempfile.gettempdir())) / "sm90_hang_traceback.txt", "a") as log:
        log.write(f"{request.node.nodeid}\n")
        log.flush()
        faulthandler.dump_traceback_later(180, exit=True, file=log)
        yield
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(params=["sm80", "sm90-fwd", "sm90-fwd-bwd"])
def fwd_path(request, monkeypatch):
    """Runs the test with the mma.sync kernels, the Hopper forward, and the Hopper forward and
    backward; the last two only on compute capability 9.0 GPUs."""
    if request.param != "sm80" and not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    monkeypatch.setattr(ops, "FWD_PATH", "sm80" if request.param == "sm80" else "sm90")
    monkeypatch.setattr(ops, "BWD_PATH", "sm90" if request.param == "sm90-fwd-bwd" else "sm80")
    return request.param


_SM90_SMOKE = """
import sys
import torch
from kernels.cuda import attention, ops
ops.FWD_PATH = ops.BWD_PATH = "sm90"
ops.BWD_DQ, ops.FWD_SM90, ops.BWD_SM90 = sys.argv[1], sys.argv[2], sys.argv[3]
deterministic = sys.argv[4] == "deterministic"
if deterministic:  # dq slices counted for one SM: one CTA per (batch, head) walks every key tile
    ops._sm_count = lambda index: 1
shapes = ((1, 64), (300, 64), (300, 128)) if ops.BWD_DQ in ("atomic", "tma") else ((1, 128), (300, 128))
if ops.BWD_DQ.startswith(("sum", "rows")):
    shapes = ((1, 64), (300, 64))
if ops.BWD_DQ == "auto":
    shapes = ((1, 64), (300, 64), (1, 128), (300, 128))
if ops.BWD_SM90 == "overlap":  # head_dim 64 only
    shapes = tuple((n, d) for n, d in shapes if d == 64)
B = 96 if ops.FWD_SM90.startswith(("persistent", "short")) or ops.BWD_SM90 == "persistent" else 2  # 864 tiles at N = 300: several a CTA
if ops.BWD_SM90 == "persistent":  # key CTAs counted for one SM: one CTA per (batch, head) walks its every key tile
    ops._sm_count = lambda index: 1
for n, d in shapes:  # one tile; several, wrapping the 2-stage rings
    q, k, v = (torch.randn(B, 3, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    attention(q, k, v, deterministic=deterministic).sum().backward()
torch.cuda.synchronize()
print("finished")
"""


@pytest.mark.gpu
@pytest.mark.parametrize("dq, schedule, bwd_schedule", [
    ("atomic", "sequential", "sequential"), ("columns", "sequential", "sequential"), ("atomic", "pingpong", "sequential"),
    ("tma", "sequential", "sequential"), ("columns-tma", "sequential", "sequential"), ("atomic", "sequential", "overlap"),
    ("tma", "sequential", "overlap"), ("sum", "sequential", "sequential"), ("sum-tma", "sequential", "sequential"),
    ("sum", "sequential", "overlap"), ("sum-tma", "sequential", "overlap"), ("rows", "sequential", "sequential"),
    ("rows-tma", "sequential", "sequential"), ("rows-tma", "sequential", "pingpong"),
    ("columns-tma", "sequential", "pingpong"), ("auto", "auto", "deterministic"), ("rows-tma", "wide", "sequential"),
    ("columns-tma", "persistent", "sequential"), ("rows-tma", "persistent", "sequential"),
    ("rows-tma", "sequential", "persistent"), ("columns-tma", "sequential", "persistent"),
    ("rows-tma", "persistent-pingpong", "sequential"), ("columns-tma", "persistent-pingpong", "sequential"),
    ("rows-tma", "short", "sequential")])
def test_sm90_kernels_finish(dq, schedule, bwd_schedule):
    """First of the sm90 tests: forward (pingpong: the pipelined consumers; wide: three consumers; persistent: one CTA an
    SM looping over the Q tiles) and backward (persistent: one CTA an SM walking the key tiles, K and V reloaded through
    kv_empty) (columns: the column-split
    dQ; tma, columns-tma: dQ by TMA reduce-add; overlap: Pᵀ under dPᵀ's wgmma; rows-tma with pingpong: the consumers'
    products in turn, ten named barriers between them, and columns-tma with it at head_dim 128; deterministic: the dq
    slices, one CTA walking every key tile, K and V reloaded through kv_empty) run to the end in a child process, so
    that a pipeline deadlock (an mbarrier or named barrier never completing) fails here in 60 s instead of hanging
    the session."""
    if not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    build.extension()  # build (or load) here, outside the child's time limit
    root = Path(__file__).resolve().parent.parent
    try:
        schedules = ["auto", "deterministic"] if bwd_schedule == "deterministic" else [bwd_schedule, "-"]
        proc = subprocess.run([sys.executable, "-c", _SM90_SMOKE, dq, schedule, *schedules], cwd=root,
                              capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the sm90 kernels did not finish within 60 s (deadlock in a TMA/mbarrier pipeline?)")
    assert proc.returncode == 0 and "finished" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("bwd_warps", [4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("seq_len", SEQ_LENS)
def test_matches_float64(seq_len, head_dim, dtype, bwd_warps, monkeypatch):
    """The mma.sync kernels (forced, so they stay tested on Hopper too) and both backward tiles."""
    monkeypatch.setattr(ops, "BWD_WARPS", bwd_warps)
    monkeypatch.setattr(ops, "FWD_PATH", "sm80")
    monkeypatch.setattr(ops, "BWD_PATH", "sm80")
    B, H = (1, 2) if seq_len >= 1025 else (2, 3)
    q, k, v = make_qkv(B, H, seq_len, head_dim, dtype=dtype, device="cuda")
    check_against_reference(attention, q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", SM90_HEAD_DIMS)
@pytest.mark.parametrize("seq_len", SEQ_LENS)
@pytest.mark.parametrize("bwd", ["sm80", "sm90", "sm90-dqcols", "sm80-pingpong", "sm90-dqtma", "sm90-dqcols-tma",
                                 "sm90-overlap", "sm90-overlap-dqtma", "sm90-dqsum", "sm90-dqsum-tma",
                                 "sm90-overlap-dqsum", "sm90-overlap-dqsum-tma", "sm90-dqrows", "sm90-dqrows-tma",
                                 "sm90-dqrows-tma-pp", "sm90-dqcols-tma-pp", "sm90-det", "sm90-wide",
                                 "sm90-persistent", "sm90-persistent-ppfwd", "sm90-persistent-bwd", "sm90-short"])
def test_sm90_matches_float64(seq_len, head_dim, dtype, bwd, monkeypatch):
    """The Hopper forward (wgmma, TMA), then the mma.sync or the Hopper backward from its out and lse
    (sm90-dqcols: its column-split dQ, head_dim 128 after padding only; sm80-pingpong: the forward's pipelined
    consumers, then the mma.sync backward; sm90-dqtma, sm90-dqcols-tma: dQ by TMA reduce-add; sm90-overlap: the
    backward's overlapped consumer, with atomic or TMA dQ; sm90-dqsum, sm90-dqsum-tma: the consumers' dQ
    summed in shared memory, added by atomics or TMA; sm90-dqrows, sm90-dqrows-tma: 128 query rows a step, dQ split by
    rows across the consumers; sm90-dqrows-tma-pp, sm90-dqcols-tma-pp: those kernels' products issued by the two
    consumers in turn; sm90-det: the deterministic backward, its slices counted for one SM so that each CTA walks
    every key tile of its (batch, head); sm90-wide: the forward's three consumers, sm90-persistent: its persistent CTAs,
    sm90-persistent-ppfwd: its ping-pong consumers in persistent CTAs, sm90-short: its 208-key tiles (head_dim 64),
    each with the default backward; sm90-persistent-bwd: the backward's persistent CTAs, rows-tma / columns-tma)."""
    if not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    if bwd.startswith("sm90-dqcols") and head_dim == 64:
        pytest.skip("the column-split dQ kernel is for head_dim 128 (80, 96 padded)")
    if ("overlap" in bwd or "dqsum" in bwd or "dqrows" in bwd or "wide" in bwd or "short" in bwd) and head_dim != 64:
        pytest.skip("the overlapped consumer, the summed and the row-split dQ and the wide and short forwards are for "
                    "head_dim 64")
    monkeypatch.setattr(ops, "FWD_SM90", "pingpong" if bwd.endswith("pingpong") else
                        "persistent-pingpong" if bwd == "sm90-persistent-ppfwd" else
                        bwd[5:] if bwd in ("sm90-wide", "sm90-persistent", "sm90-short") else "sequential")
    monkeypatch.setattr(ops, "FWD_PATH", "sm90")
    monkeypatch.setattr(ops, "BWD_PATH", bwd[:4])
    monkeypatch.setattr(ops, "BWD_DQ", {"sm90-dqcols": "columns", "sm90-dqtma": "tma", "sm90-dqcols-tma": "columns-tma",
                                        "sm90-overlap": "atomic", "sm90-overlap-dqtma": "tma", "sm90-dqsum": "sum",
                                        "sm90-dqsum-tma": "sum-tma", "sm90-overlap-dqsum": "sum",
                                        "sm90-overlap-dqsum-tma": "sum-tma", "sm90-dqrows": "rows",
                                        "sm90-dqrows-tma": "rows-tma", "sm90-dqrows-tma-pp": "rows-tma",
                                        "sm90-dqcols-tma-pp": "columns-tma", "sm90-wide": "auto",
                                        "sm90-persistent": "auto", "sm90-persistent-ppfwd": "auto",
                                        "sm90-persistent-bwd": "auto", "sm90-short": "auto"}.get(bwd, "atomic"))
    monkeypatch.setattr(ops, "BWD_SM90", "overlap" if bwd.startswith("sm90-overlap") else
                        "pingpong" if bwd.endswith("-pp") else "persistent" if bwd == "sm90-persistent-bwd" else
                        "sequential")
    deterministic = bwd == "sm90-det"
    if bwd == "sm90-persistent-bwd":  # key CTAs counted for one SM: one CTA per (batch, head) walks its every key tile
        monkeypatch.setattr(ops, "_sm_count", lambda index: 1)
    if deterministic:
        monkeypatch.setattr(ops, "BWD_DQ", "auto")
        monkeypatch.setattr(ops, "_sm_count", lambda index: 1)
    B, H = (1, 2) if seq_len >= 1025 else (2, 3)
    q, k, v = make_qkv(B, H, seq_len, head_dim, dtype=dtype, device="cuda")
    check_against_reference(functools.partial(attention, deterministic=deterministic), q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("path", ["sm80", "sm90"])
def test_matches_float64_at_16384_keys(path, head_dim, monkeypatch):
    """N = 16384, the longest sequence issue 12 names: one head in bf16, out and dq, dk, dv against float64 (the
    reference holds a 2 GiB float64 score matrix), through the mma.sync kernels or the Hopper forward and backward."""
    if path == "sm90" and not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    monkeypatch.setattr(ops, "FWD_PATH", path)
    monkeypatch.setattr(ops, "BWD_PATH", path)
    q, k, v = make_qkv(1, 1, 16384, head_dim, dtype=torch.bfloat16, device="cuda")
    check_against_reference(attention, q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("N, head_dim", [(1, 64), (129, 64), (577, 64), (1025, 128), (4096, 128)])
def test_sm90_pingpong_forward_equals_sequential_bitwise(N, head_dim):
    """The pipelined consumers do the sequential ones' arithmetic in the same order: out and lse bitwise equal."""
    if not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    ext = build.extension()
    q, k, v = make_qkv(2, 3, N, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=False)
    scale = head_dim ** -0.5
    sequential, pingpong = ext.fwd_sm90(q, k, v, scale), ext.fwd_sm90_pingpong(q, k, v, scale)
    assert torch.equal(sequential[0], pingpong[0]) and torch.equal(sequential[1], pingpong[1])


def _assert_forwards_equal(first: str, second: str, B: int, H: int, N: int, head_dim: int, dtype=torch.bfloat16):
    """The extension's forwards ``first`` and ``second`` give bitwise equal out and lse on fresh packed (B, N, 3, H, d)
    inputs, split into the strided (B, H, N, d) views the ViT passes; skips off Hopper."""
    if not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    ext = build.extension()
    qkv = torch.randn(B, N, 3, H, head_dim, device="cuda", dtype=dtype)
    q, k, v = split_qkv(qkv)  # (B, H, N, d) views of the packed (B, N, 3, H, d)
    scale = head_dim ** -0.5
    one, other = getattr(ext, first)(q, k, v, scale), getattr(ext, second)(q, k, v, scale)
    assert torch.equal(one[0], other[0]) and torch.equal(one[1], other[1]), (first, second)


# (B, H, N) of the persistent kernels' GPU tests: fewer tiles than SMs, about as many, and many more (a dozen a CTA)
_PERSISTENT_SHAPES = [(1, 1, 1), (2, 5, 129), (3, 7, 197), (64, 12, 197), (96, 12, 100), (8, 12, 1025), (1, 3, 4097)]


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("B, H, N", _PERSISTENT_SHAPES)
def test_sm90_persistent_backward_matches_one_cta_a_tile(B, H, N, head_dim):
    """CTAs walking the key tiles of their (batch, head) (one CTA walking all of them, 2, 3 and 5 CTAs, uneven at N = 1025
    and 4097, and ops.sm90_key_ctas' count; K and V reloaded through kv_empty, the Q/dO ring counted on across tiles):
    dk and dv bitwise the one-CTA-a-tile kernel's (same arithmetic per key tile), dq equal up to the order of its
    float32 reduce-adds; into a packed gradient, as the ViT's."""
    if not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    ext = build.extension()
    qkv = torch.randn(B, N, 3, H, head_dim, device="cuda", dtype=torch.bfloat16)
    q, k, v = split_qkv(qkv)  # (B, H, N, d) views of the packed (B, N, 3, H, d)
    scale = head_dim ** -0.5
    out, lse = ext.fwd_sm90(q, k, v, scale)
    do = torch.randn_like(out)
    mode = {"dq_rows": True} if head_dim == 64 else {"dq_cols": True}
    dq0, dk0, dv0 = ext.bwd_sm90(do, q, k, v, out, lse, scale, torch.empty_like(qkv), *_sm90_flags(**mode, dq_tma=True))
    tiles = -(-N // 128)
    for key_ctas in sorted({1, 2, 3, 5, ops.sm90_key_ctas(q)} & set(range(1, tiles + 1))):  # uneven walks too
        dq1, dk1, dv1 = ext.bwd_sm90(do, q, k, v, out, lse, scale, torch.empty_like(qkv),
                                     *_sm90_flags(**mode, dq_tma=True, key_ctas=key_ctas))
        assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1), key_ctas
        torch.testing.assert_close(dq1.float(), dq0.float(), rtol=2e-2, atol=2e-2 * dq0.float().abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("B, H, N", _PERSISTENT_SHAPES)
def test_sm90_persistent_forward_equals_sequential_bitwise(B, H, N, head_dim):
    """Persistent CTAs (one an SM, each looping over Q tiles c, c + CTAs, ...) do each tile's arithmetic as the
    one-CTA-a-tile kernel does: out and lse bitwise equal, with fewer tiles than SMs, about as many, and many more
    (1536 at (64, 12, 197): a dozen per CTA, so the K/V ring and the Q hand-off wrap many times); packed views."""
    _assert_forwards_equal("fwd_sm90", "fwd_sm90_persistent", B, H, N, head_dim)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("B, H, N", _PERSISTENT_SHAPES)
def test_sm90_persistent_pingpong_forward_equals_pingpong_bitwise(B, H, N, head_dim):
    """The ping-pong consumers in persistent CTAs, their named-barrier turns running on from one Q tile to the next
    (only a CTA's first tile opens them, its last closes them): out and lse bitwise the one-CTA-a-tile ping-pong
    kernel's, at the persistent forward's shapes (1 to 33 key tiles; up to 9 Q tiles a CTA, of one key tile each at
    (96, 12, 100))."""
    _assert_forwards_equal("fwd_sm90_pingpong", "fwd_sm90_persistent_pingpong", B, H, N, head_dim)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N", [1, 17, 129, 193, 577, 1025, 4097])
def test_sm90_wide_forward_equals_sequential_bitwise(N, dtype):
    """Three consumers (192 query rows a CTA) do each row's arithmetic as the two-consumer kernel does: out and lse
    bitwise equal, at N within one CTA, across the 192-row boundary and with a ragged last CTA; packed (strided) q, k,
    v as the ViT passes them."""
    _assert_forwards_equal("fwd_sm90", "fwd_sm90_wide", 2, 5, N, 64, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N", [129, 197, 208, 209, 417, 1025])
def test_sm90_short_forward_against_float64(N, dtype, monkeypatch):
    """The 208-key-tile forward (VIT_CUDA_FWD_SM90=short): one key tile up to N = 208, a second of one key at 209,
    several past it; 64 x 3 heads, so that each persistent CTA loops over several Q tiles. Out and the gradients
    (auto's backward) against float64."""
    if not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    monkeypatch.setattr(ops, "FWD_PATH", "sm90")
    monkeypatch.setattr(ops, "FWD_SM90", "short")
    q, k, v = make_qkv(64, 3, N, 64, dtype=dtype, device="cuda")
    check_against_reference(attention, q, k, v)


_EXT_ERROR = """
import sys
import torch
from kernels.cuda import build
q = torch.randn(1, 1, 17, int(sys.argv[2]), device="cuda", dtype=torch.bfloat16)
ext = build.extension()
try:
    if sys.argv[1].startswith("bwd_sm90"):  # flags (dq_cols, dq_sum, dq_rows, dq_tma, overlap, key_ctas, dq_splits)
        out, lse = ext.fwd_sm90(q, q, q, 0.1)
        flags = {"bwd_sm90_cols": (True, False, False, False, False, 0, 0),
                 "bwd_sm90_walk": (False, False, False, True, False, 1, 0)}[sys.argv[1]]
        ext.bwd_sm90(out, q, q, q, out, lse, 0.1, None, *flags)
    else:
        getattr(ext, sys.argv[1])(q, q, q, float(sys.argv[3]) if len(sys.argv) > 3 else 0.1)
except ValueError as exc:
    print("ValueError:", exc)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("fn, head_dim, message", [("fwd_sm90_wide", 128, "head_dim 64 only"),
                                                   ("fwd_sm90", 32, "head_dim 64 and 128, got 32"),
                                                   ("bwd_sm90_cols", 64, "needs head_dim 128, got 64"),
                                                   ("bwd_sm90_walk", 64, "key-tile walk (key_ctas > 0)"),
                                                   ("fwd", 64, "softmax_scale must be > 0, got -1.5")])
def test_extension_refuses_what_it_has_no_kernel_for(fn, head_dim, message):
    """The extension's own checks raise ValueError through pybind11, formatted messages included (in a child process:
    on the H100 of 2026-12-07 every check that formatted numbers into its message through c10::str ended the process
    with a segmentation fault; api.cpp's msg() says why)."""
    if fn != "fwd" and not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    build.extension()  # build (or load) here, outside the child's time limit
    args = [fn, str(head_dim)] + (["-1.5"] if fn == "fwd" else [])
    proc = subprocess.run([sys.executable, "-c", _EXT_ERROR, *args], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and "ValueError:" in proc.stdout and message in proc.stdout, \
        f"rc {proc.returncode}: {proc.stdout[-500:]} {proc.stderr[-2000:]}"


def _sm90_flags(dq_cols=False, dq_sum=False, dq_rows=False, dq_tma=False, overlap=False, key_ctas=0,
                dq_splits=0) -> tuple:
    """The extension's bwd_sm90 kernel flags, in its argument order."""
    return dq_cols, dq_sum, dq_rows, dq_tma, overlap, key_ctas, dq_splits


def _sm90_backward_twice(N, first: dict, second: dict, head_dim: int = 64):
    """((dq, dk, dv), (dq, dk, dv)): the Hopper backward with flags ``first``, then ``second`` (:func:`_sm90_flags`),
    on the same fresh bf16 (2, 3, N, head_dim) inputs and one Hopper forward; skips off Hopper."""
    if not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    ext = build.extension()
    q, k, v = make_qkv(2, 3, N, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=False)
    scale = head_dim**-0.5
    out, lse = ext.fwd_sm90(q, k, v, scale)
    do = torch.randn_like(out)
    return tuple(ext.bwd_sm90(do, q, k, v, out, lse, scale, None, *_sm90_flags(**flags)) for flags in (first, second))


@pytest.mark.gpu
@pytest.mark.parametrize("dq_sum, dq_tma", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["atomic", "tma", "sum", "sum-tma"])
@pytest.mark.parametrize("N", [1, 129, 577, 4096])
def test_sm90_overlap_backward_equals_sequential_bitwise(N, dq_sum, dq_tma):
    """The overlapped consumer does the sequential one's arithmetic in the same order: dk and dv (each CTA writes its
    own) bitwise equal. dq is a float32 sum of atomic adds from every key tile, in an order that differs run to run,
    rounded to bf16: equal to within about one bf16 step of its largest entry."""
    sequential, overlap = _sm90_backward_twice(N, {"dq_sum": dq_sum, "dq_tma": dq_tma},
                                               {"dq_sum": dq_sum, "dq_tma": dq_tma, "overlap": True})
    assert torch.equal(sequential[1], overlap[1]) and torch.equal(sequential[2], overlap[2])
    assert max_err(sequential[0], overlap[0]) <= 1e-2 * sequential[0].abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("dq_tma", [False, True], ids=["atomic", "tma"])
@pytest.mark.parametrize("N", [129, 1025])
def test_sm90_summed_dq_leaves_dk_dv_bitwise(N, dq_tma):
    """The summed dQ changes only what follows the dQ product: dk and dv bitwise those of each consumer adding its own
    dQ; dq within about one bf16 step of its largest entry (both are float32 sums in a run-dependent order)."""
    own, summed = _sm90_backward_twice(N, {"dq_tma": dq_tma}, {"dq_sum": True, "dq_tma": dq_tma})
    assert torch.equal(own[1], summed[1]) and torch.equal(own[2], summed[2])
    assert max_err(own[0], summed[0]) <= 1e-2 * own[0].abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("dq_tma", [False, True], ids=["atomic", "tma"])
@pytest.mark.parametrize("N", [50, 129, 1025])
def test_sm90_row_split_dq_against_own(N, dq_tma):
    """128 query rows a step with the row-split dQ: dk and dv take the same 16-query k-steps in the same order as with
    64 rows a step, so they are expected bitwise equal to the per-consumer dQ kernel's (reported, not required: the
    two Sᵀ products are m64n128 and m64n64 wgmmas); both within about one bf16 step of each other's largest entry."""
    own, rows = _sm90_backward_twice(N, {"dq_tma": dq_tma}, {"dq_rows": True, "dq_tma": dq_tma})
    print(f"N={N} dq_tma={dq_tma}: dk bitwise {torch.equal(own[1], rows[1])}, dv bitwise {torch.equal(own[2], rows[2])}")
    for a, b in zip(own, rows):
        assert max_err(a, b) <= 1e-2 * a.abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("N", [1, 50, 128, 129, 300, 577, 4096])
def test_sm90_pingpong_backward_equals_sequential_bitwise(N, head_dim):
    """The ping-pong consumer does the row split's arithmetic in the same order, only scheduled otherwise: dk and dv
    (each CTA writes its own) bitwise equal; dq (float32 TMA reduce-adds from every key tile, in a run-dependent order)
    within about one bf16 step of its largest entry. Head_dim 64: the row split, 128 query rows a step (N = 1, 128: one
    step, no dQ in a second batch; 129: two; 300, 577, 4096: three or more, the doubled dSᵀ buffers wrap); 128: the
    column split, 64 rows a step."""
    split = {"dq_rows": True, "dq_tma": True} if head_dim == 64 else {"dq_cols": True, "dq_tma": True}
    sequential, pingpong = _sm90_backward_twice(N, split, {**split, "overlap": True}, head_dim)
    assert torch.equal(sequential[1], pingpong[1]) and torch.equal(sequential[2], pingpong[2])
    assert max_err(sequential[0], pingpong[0]) <= 1e-2 * sequential[0].abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("N, splits", [(1, 1), (129, 1), (300, 2), (577, 3), (1025, 2), (1025, 9), (4096, 1)])
def test_sm90_deterministic_slices(N, splits, head_dim):
    """The deterministic Hopper backward (dq_splits slices; CTA j walks key tiles j, j + splits, ...): dk and dv
    bitwise those of the one-tile-per-CTA kernel (the same consumer arithmetic per tile), dq within about one bf16
    step of its largest entry, and dq bitwise equal in two runs on each of two fresh inputs. Splits 1 at N = 129:
    one CTA walks both tiles; 9 at 1025: one tile each; 1 at 4096: 32 tiles a CTA (float adds commute, so the order
    of adds shows only from the third tile on: there, with atomics, dq differs run to run)."""
    split = {"dq_rows": True, "dq_tma": True} if head_dim == 64 else {"dq_cols": True, "dq_tma": True}
    one_tile, sliced = _sm90_backward_twice(N, split, {**split, "dq_splits": splits}, head_dim)
    assert torch.equal(one_tile[1], sliced[1]) and torch.equal(one_tile[2], sliced[2])
    assert max_err(one_tile[0], sliced[0]) <= 1e-2 * one_tile[0].abs().max().item()
    for _ in range(2):
        again = _sm90_backward_twice(N, {**split, "dq_splits": splits}, {**split, "dq_splits": splits}, head_dim)
        assert torch.equal(again[0][0], again[1][0])


@pytest.mark.gpu
@pytest.mark.parametrize("dq", ["atomic", "tma", "sum-tma", "rows-tma"])
@pytest.mark.parametrize("B, H, N", [(1, 1, 300), (3, 1, 129), (1, 5, 128), (2, 2, 50)])
def test_sm90_size_one_batch_or_heads(B, H, N, dq, monkeypatch):
    """Size-1 dimensions (whose strides the TMA descriptors never use) and N on a tile boundary; dQ by atomics and
    by TMA reduce-add (a descriptor over the float32 accumulator too)."""
    if not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    monkeypatch.setattr(ops, "FWD_PATH", "sm90")
    monkeypatch.setattr(ops, "BWD_PATH", "sm90")
    monkeypatch.setattr(ops, "BWD_DQ", dq)
    q, k, v = make_qkv(B, H, N, 64, dtype=torch.bfloat16, device="cuda")
    check_against_reference(attention, q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sm90_each_stage_against_float64(head_dim):
    """Every output of the Hopper kernels against float64 in one report, to tell a wrong stage apart
    when test_sm90_matches_float64 fails: lse checks Q·Kᵀ and the softmax statistics alone; out adds
    P·V; the backward's dv needs only P and dO, dk adds dS, dq adds dS·K. Bound: 2× the mma.sync
    kernels' error on the same inputs + 1e-3 (a stage with a layout bug is off by O(1))."""
    if not is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU (H100, H200)")
    q, k, v = make_qkv(2, 3, 300, head_dim, dtype=torch.bfloat16, device="cuda")
    scale = head_dim**-0.5
    ref_out, (rq, rk, rv) = reference_attention(q, k, v)
    do = torch.randn_like(ref_out)
    ref_out.backward(do)
    ref_lse = torch.logsumexp(rq.detach() @ rk.detach().transpose(-2, -1) * scale, dim=-1)
    refs = {"lse": ref_lse, "out": ref_out.detach(), "dq": rq.grad, "dk": rk.grad, "dv": rv.grad}
    q, k, v = q.detach(), k.detach(), v.detach()
    errs = {}
    ext = build.extension()
    def sm90_bwd(**flags):
        return lambda *a: ext.bwd_sm90(*a, None, *_sm90_flags(**flags))

    kernels = {"sm80": (ext.fwd, lambda *a: ext.bwd(*a, 8, 0, None)), "sm90": (ext.fwd_sm90, sm90_bwd())}
    kernels["sm90-pingpong"] = (ext.fwd_sm90_pingpong, lambda *a: ext.bwd(*a, 8, 0, None))
    kernels["sm90-dqtma"] = (ext.fwd_sm90, sm90_bwd(dq_tma=True))
    if head_dim == 64:
        kernels["sm90-overlap"] = (ext.fwd_sm90, sm90_bwd(overlap=True))
        kernels["sm90-dqsum"] = (ext.fwd_sm90, sm90_bwd(dq_sum=True))
        kernels["sm90-dqsum-tma"] = (ext.fwd_sm90, sm90_bwd(dq_sum=True, dq_tma=True))
        kernels["sm90-dqrows"] = (ext.fwd_sm90, sm90_bwd(dq_rows=True))
        kernels["sm90-dqrows-tma"] = (ext.fwd_sm90, sm90_bwd(dq_rows=True, dq_tma=True))
        kernels["sm90-dqrows-tma-pp"] = (ext.fwd_sm90, sm90_bwd(dq_rows=True, dq_tma=True, overlap=True))
        kernels["sm90-dqrows-tma-det"] = (ext.fwd_sm90, sm90_bwd(dq_rows=True, dq_tma=True, dq_splits=2))
    if head_dim == 128:
        kernels["sm90-dqcols"] = (ext.fwd_sm90, sm90_bwd(dq_cols=True))
        kernels["sm90-dqcols-tma"] = (ext.fwd_sm90, sm90_bwd(dq_cols=True, dq_tma=True))
        kernels["sm90-dqcols-tma-pp"] = (ext.fwd_sm90, sm90_bwd(dq_cols=True, dq_tma=True, overlap=True))
        kernels["sm90-dqcols-tma-det"] = (ext.fwd_sm90, sm90_bwd(dq_cols=True, dq_tma=True, dq_splits=2))
    for path, (fwd, bwd) in kernels.items():
        out, lse = fwd(q, k, v, scale)
        grads = bwd(do.to(q.dtype), q, k, v, out, lse, scale)
        got = {"lse": lse, "out": out, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
        errs[path] = {name: max_err(got[name], ref) for name, ref in refs.items()}
    bad = [(path, name) for path in kernels if path != "sm80" for name in refs
           if not errs[path][name] <= 2 * errs["sm80"][name] + 1e-3]
    assert not bad, f"sm90 stages off: {bad}; max errors {errs}"


@pytest.mark.gpu
def test_auto_runs_the_sm90_kernels_on_hopper():
    if not is_hopper():
        pytest.skip("needs a compute capability 9.0 GPU")
    assert ops.FWD_PATH == ops.BWD_PATH == "auto" and build.extension().has_sm90
    for n in (197, 4096):
        q = torch.empty(1, 1, n, 128, device="cuda", dtype=torch.bfloat16)
        assert (ops.fwd_path(q), ops.bwd_path(q)) == ("sm90", "sm90")
        assert (ops.fwd_path(q[..., :64]), ops.bwd_path(q[..., :64])) == ("sm90", "sm90")
        assert ops.sm90_bwd_options(q) == (True, False, False, True, True)  # columns-tma, ping-pong consumers
        assert ops.sm90_bwd_options(q[..., :64]) == (False, False, True, True, n >= 512)  # rows-tma, ping-pong from 512


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("seq_len", [127, 129, 197, 577, 1025])
def test_auto_defaults_against_float64(seq_len, head_dim):
    """The kernels the default rules pick, unforced, against float64 around the N = 128 threshold and where ViTs run:
    on Hopper the persistent forward (the persistent ping-pong one past N = 1024) with the pingpong backward
    (columns-tma) at head_dim 80/128, the short forward (the wide one at N = 1025) with the rows-tma backward at 64
    (its ping-pong consumers from N = 512), mma.sync below N = 128."""
    settings = ("VIT_CUDA_FWD", "VIT_CUDA_BWD", "VIT_CUDA_BWD_DQ", "VIT_CUDA_FWD_SM90", "VIT_CUDA_BWD_SM90")
    if any(name in os.environ for name in settings):
        pytest.skip("a VIT_CUDA_* setting in the environment overrides the defaults under test")
    assert ops.FWD_PATH == ops.BWD_PATH == ops.BWD_DQ == ops.FWD_SM90 == ops.BWD_SM90 == "auto"
    q, k, v = make_qkv(2, 3, seq_len, head_dim, dtype=torch.bfloat16, device="cuda")
    check_against_reference(attention, q, k, v)


@pytest.mark.gpu
def test_custom_softmax_scale():
    q, k, v = make_qkv(2, 2, 65, 64, dtype=torch.bfloat16, device="cuda")
    check_against_reference(attention, q, k, v, softmax_scale=0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_strided_qkv_from_fused_projection(dtype, fwd_path):
    """q, k, v as strided views of one (B, N, 3, H, d) tensor, as the ViT's fused qkv Linear makes them;
    gradients flow back into that tensor. Bound: the error rule's (conftest), 2× the naive backend's error on the same
    views plus the floor; with a fixed 1e-4 floor instead, dqkv failed in 2 of 8 runs of its 6 cases on an H100 (2.1×
    and 2.7× naive's, benchmarks/results/h100_20261208/call6_strided_repeat.log)."""
    B, N, H, d = 2, 197, 4, 64
    qkv = torch.randn(B, N, 3, H, d, device="cuda").to(dtype).requires_grad_()
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, d) views, row stride 3*H*d
    assert not q.is_contiguous() and q.stride(-1) == 1
    ref, (rq, rk, rv) = reference_attention(q, k, v)
    do = torch.randn_like(ref)
    ref.backward(do)
    ref_grad = pack_qkv(rq.grad, rk.grad, rv.grad)  # (B, N, 3, H, d)
    errs = {}
    for name, fn in (("cuda", attention), ("naive", get_attention("naive"))):
        qkv.grad = None
        out = fn(q, k, v)
        out.backward(do.to(dtype))
        errs[name] = (max_err(out, ref), max_err(qkv.grad, ref_grad))
    for i, (what, ref_i) in enumerate((("out", ref), ("dqkv", ref_grad))):
        assert errs["cuda"][i] <= 2 * errs["naive"][i] + error_floor(ref_i, dtype), (what, errs)


@pytest.mark.gpu
def test_non_unit_last_stride_and_misaligned_rows(fwd_path):
    q, k, v = make_qkv(2, 2, 100, 64, dtype=torch.bfloat16, device="cuda", requires_grad=False)
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # last-dim stride N
    wide = torch.randn(2, 2, 100, 65, device="cuda").bfloat16()
    kw = wide[..., 1:]  # rows start 2 bytes past 16-byte boundaries
    kw.copy_(k)
    out = attention(qt, kw, v)
    ref, _ = reference_attention(q, k, v)
    naive_err = max_err(get_attention("naive")(q, k, v), ref)
    assert max_err(out, ref) <= 2 * naive_err + error_floor(ref, torch.bfloat16)


@pytest.mark.gpu
def test_output_fully_written_and_deterministic_forward(fwd_path):
    q, k, v = make_qkv(3, 2, 577, 64, dtype=torch.bfloat16, device="cuda", requires_grad=False)
    out1, out2 = attention(q, k, v), attention(q, k, v)
    assert torch.isfinite(out1).all()
    assert torch.equal(out1, out2)


def _grads(q, k, v, do, **options):
    for t in (q, k, v):
        t.grad = None
    attention(q, k, v, **options).backward(do)
    return [t.grad.clone() for t in (q, k, v)]


@pytest.mark.gpu
@pytest.mark.parametrize("B, H, N, head_dim", [(1, 2, 4096, 64), (2, 3, 1025, 128), (64, 12, 197, 64),
                                                (16, 12, 1025, 128), (1, 1, 17, 32), (4, 2, 577, 80)])
def test_deterministic_backward_is_bitwise_repeatable_and_accurate(B, H, N, head_dim):
    """attention.deterministic=true: dq (and dk, dv) bitwise equal over five runs, at shapes with one dq slice per
    (batch, head) (B·H ≥ SMs: CTAs walk several key tiles) and with many (long N, B·H = 2), within the float64 rule;
    the backward auto picks runs it: on Hopper at head_dim 64 and 128 (80 padded), N ≥ 128, the Hopper one."""
    q, k, v = make_qkv(B, H, N, head_dim, dtype=torch.bfloat16, device="cuda")
    do = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16)
    as_seen = q.new_empty(B, H, N, cuda._padded_head_dim(head_dim))  # q as the op sees it
    splits = ops.backward_splits(as_seen, True)
    first = _grads(q, k, v, do, deterministic=True)
    for _ in range(4):
        assert all(torch.equal(a, b) for a, b in zip(first, _grads(q, k, v, do, deterministic=True))), splits
    check_against_reference(functools.partial(attention, deterministic=True), q, k, v)
    from kernels.cuda import eager
    assert eager.plan(as_seen, True)[1][:3] == [int(ops.bwd_path(as_seen) == "sm90"), ops.BWD_WARPS, splits]
    assert splits > 0


@pytest.mark.gpu
@pytest.mark.parametrize("B, N, H, head_dim", [(2, 197, 12, 64), (1, 1025, 2, 128), (3, 17, 2, 32), (2, 65, 3, 80)])
def test_qkvpacked_equals_split_bitwise_and_writes_one_gradient(B, N, H, head_dim):
    """attention_qkvpacked: out and the (B, N, 3, H, d) gradient equal attention()'s on the three views and its
    stacked gradients, bitwise (deterministic backward in both, so dq too); the packed op's gradient is one
    contiguous tensor. head_dim 80 (padded) runs the split path and still agrees."""
    from kernels.cuda import attention_qkvpacked

    qkv = torch.randn(B, N, 3, H, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, H, N, head_dim, device="cuda", dtype=torch.bfloat16)
    out = attention_qkvpacked(qkv, deterministic=True)
    out.backward(do)
    packed_grad, qkv.grad = qkv.grad, None
    views = [t.detach().clone().requires_grad_() for t in qkv.detach().permute(2, 0, 3, 1, 4).unbind(0)]
    ref = attention(*views, deterministic=True)
    ref.backward(do)
    assert torch.equal(out, ref)
    assert torch.equal(packed_grad, torch.stack([t.grad for t in views], dim=0).permute(1, 3, 0, 2, 4))
    assert packed_grad.is_contiguous()


@pytest.mark.gpu
@pytest.mark.parametrize("seq_len, head_dim", [(197, 64), (1025, 128)])
def test_qkvpacked_against_float64_eager_and_compiled(seq_len, head_dim):
    from kernels.cuda import attention_qkvpacked

    def packed(q, k, v, softmax_scale=None):
        return attention_qkvpacked(pack_qkv(q, k, v), softmax_scale)

    torch._dynamo.reset()
    for fn in (packed, torch.compile(packed, fullgraph=True)):
        check_against_reference(fn, *make_qkv(2, 3, seq_len, head_dim, dtype=torch.bfloat16, device="cuda"))


def test_qkvpacked_fake_kernels_give_shapes_without_a_gpu():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kernels.cuda import attention_qkvpacked

    with FakeTensorMode():
        qkv = torch.empty(2, 197, 3, 12, 64, dtype=torch.bfloat16, device="cuda")
        out = attention_qkvpacked(qkv)
        assert out.shape == (2, 12, 197, 64) and out.transpose(1, 2).is_contiguous()
        lse = torch.empty(2, 12, 197, dtype=torch.float32, device="cuda")
        dqkv = torch.ops.vit_cuda.attn_bwd_qkvpacked(out, qkv, out, lse, 0.125, 8, 0)
        assert dqkv.shape == qkv.shape and dqkv.is_contiguous()
    with pytest.raises(ValueError, match=r"\(B, N, 3, H, d\)"):
        attention_qkvpacked(torch.empty(2, 197, 2, 12, 64, dtype=torch.bfloat16))


def test_deterministic_option_is_a_bool_and_a_config_option():
    from vit.model import create_model

    q = torch.empty(1, 1, 4, 32, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        attention(q, q, q, deterministic="false")
    model = create_model("debug", attention="cuda", attention_options={"deterministic": True}, num_classes=3)
    from kernels.cuda import attention_qkvpacked

    fn = model.blocks[0].attn.attn_fn  # the ViT calls the packed form
    assert fn.func is attention_qkvpacked and fn.keywords == {"deterministic": True}
    with pytest.raises(ValueError, match="has no option"):
        create_model("debug", attention="cuda", attention_options={"determinstic": True}, num_classes=3)


_MINIMAL_CHECK = """
from torch.utils.cpp_extension import load_inline
src = 'int64_t check(int64_t x) { TORCH_CHECK_VALUE(x <= 0, "refused ", x); return x; }'
m = load_inline("vitk_minimal_check", src, functions=["check"])
try:
    m.check(1)
except ValueError as e:
    print("raised", e)
"""


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.gpu
def test_a_check_in_the_extension_raises_instead_of_crashing():
    """A TORCH_CHECK_VALUE in api.cpp reaches Python as a ValueError. Run in a child process: on the H200 image
    (torch 2.11.0+cu130, g++ 13.3, 2026-12-02) it ends the process with SIGSEGV instead, and so does the same check
    in a one-line ``load_inline`` extension, while a plain ``std::runtime_error`` is raised
    (benchmarks/results/h200_20261202/call3_exc_probe.log): there the install is at fault, not our extension,
    and the test says so and skips. ``kernels.cuda`` checks its inputs in Python before calling the extension."""
    proc = _child("from kernels.cuda.ops import extension\n"
                  "try:\n    extension().bwd_split_ctas_per_sm(True, 80, 8, 0)\n"
                  "except ValueError as e:\n    print('raised', e)\n")
    if proc.returncode != 0:
        minimal = _child(_MINIMAL_CHECK)
        if minimal.returncode != 0:
            pytest.skip(f"this torch install ends the process on any C++ extension's TORCH_CHECK (a one-line "
                        f"load_inline extension: exit {minimal.returncode}); ours: exit {proc.returncode}")
    assert proc.returncode == 0 and "raised head_dim must be 32, 64 or 128" in proc.stdout, (proc.returncode,
                                                                                          proc.stderr[-2000:])


def test_dq_splits_fill_whole_waves_and_stay_within_the_key_tiles(monkeypatch):
    """The slices per (batch, head): waves × tiles per CTA within 10 % of the best count's (and of the ideal, the
    whole work spread over every CTA slot), at least 1, at most one per key tile or MAX_DQ_SPLITS; where
    FlashAttention-2's ceil(SMs / (B·H)) leaves a second wave nearly empty it is not taken."""
    monkeypatch.setattr(ops, "_sm_count", lambda index: 132)
    monkeypatch.setattr(ops, "_split_ctas_per_sm", lambda index, dtype, d, warps: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cases = {(2, 12, 16384): 5, (8, 12, 4096): 4, (256, 12, 197): 1, (1, 1, 17): 1, (1, 1, 300): 3, (1, 2, 4096): 32}
    for (B, H, N), want in cases.items():
        assert ops.dq_splits(torch.empty(B, H, N, 64, device="meta"), 8) == want, (B, H, N)
    with pytest.raises(ValueError, match="head_dim 32, 64 or 128"):
        ops.dq_splits(torch.empty(1, 1, 17, 80, device="meta"), 8)
    def cost(heads, tiles, per_wave, s):
        return -(-heads * s // per_wave) * -(-tiles // s)  # waves × key tiles per CTA

    for heads, tiles, per_wave, most in [(24, 128, 132, 64), (96, 32, 264, 16), (3072, 2, 132, 64), (7, 300, 132, 8),
                                         (200, 5, 264, 64), (24, 128, 132, 2)]:
        s = ops.splits_for(heads, tiles, per_wave, most)
        allowed = range(1, min(tiles, most) + 1)
        assert s in allowed
        assert cost(heads, tiles, per_wave, s) <= 1.1 * min(cost(heads, tiles, per_wave, t) for t in allowed)
        assert cost(heads, tiles, per_wave, s) <= 1.15 * heads * tiles / per_wave + tiles / min(tiles, most) + 1
    big = torch.empty(1, 1, 1 << 20, 128, device="meta")  # one slice is 512 MiB: at most 2 fit the budget
    assert ops.dq_splits(big, 8) == 2
    fa2 = -(-132 // 24)  # 6 at (2, 12, 16384, 64): 144 CTAs, 12 of them in a second wave
    assert -(-24 * fa2 // 132) * -(-128 // fa2) > 1.5 * 24 * 128 / 132


def test_backward_splits_follow_the_backward_that_runs(monkeypatch):
    """deterministic=False: 0 (any order). Otherwise the slices of the backward bwd_path picks: the Hopper one's
    128-key tiles with one CTA per SM (132 SMs: (2, 12, 16384) 5 slices, one wave of 26 tiles a CTA, within 10 % of
    the best, 2 waves of 12; (8, 16, 4096) 1, one wave of 128 CTAs walking 32 tiles each, as many steps as 32 waves
    of one tile), the mma.sync one's dq_splits (two CTAs per SM here: 10 at (2, 12, 16384))."""
    monkeypatch.setattr(ops, "_sm_count", lambda index: 132)
    monkeypatch.setattr(ops, "_split_ctas_per_sm", lambda index, dtype, d, warps: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    q = torch.empty(2, 12, 16384, 64, device="meta")
    monkeypatch.setattr(ops, "bwd_path", lambda q: "sm90")
    assert ops.backward_splits(q, False) == 0
    assert ops.backward_splits(q, True) == ops.sm90_dq_splits(q) == 5
    assert ops.sm90_dq_splits(torch.empty(8, 16, 4096, 128, device="meta")) == 1
    assert ops.sm90_dq_splits(torch.empty(1, 1, 1 << 20, 128, device="meta")) == 2  # 512 MiB a slice: 2 fit
    monkeypatch.setattr(ops, "bwd_path", lambda q: "sm80")
    assert ops.backward_splits(q, True) == ops.dq_splits(q, ops.BWD_WARPS) == 10


def test_persistent_backward_key_ctas_and_modes(monkeypatch):
    """VIT_CUDA_BWD_SM90=persistent: CTAs per (batch, head) by the slices' wave rule without their memory cap, none
    walking more than WALK_MAX_TILES key tiles (132 SMs: (256, 12, 197) 1, each walking both key tiles; (2, 12, 1025)
    5, one wave walking 1-2 of the 9 tiles; (8, 12, 4096) 8 of 4 tiles each, where the wave rule alone gives 4 of 8),
    with the auto dQ modes only."""
    monkeypatch.setattr(ops, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert ops.WALK_MAX_TILES == 4
    cases = {(256, 12, 197): 1, (2, 12, 1025): 5, (8, 12, 4096): 8, (1, 1, 1 << 20): 2048, (1, 1, 1): 1}
    for (B, H, N), want in cases.items():
        assert ops.sm90_key_ctas(torch.empty(B, H, N, 64, device="meta")) == want, (B, H, N)
    q64 = torch.empty(1, 1, 4096, 64, device="meta")
    monkeypatch.setattr(ops, "BWD_SM90", "persistent")
    assert ops.sm90_bwd_options(q64) == (False, False, True, True, False)  # rows-tma, sequential
    monkeypatch.setattr(ops, "BWD_DQ", "sum-tma")
    with pytest.raises(ValueError, match="persistent has kernels for VIT_CUDA_BWD_DQ=rows-tma"):
        ops.sm90_bwd_options(q64)
    monkeypatch.setattr(ops, "BWD_DQ", "auto")
    with pytest.raises(ValueError, match="deterministic Hopper backward"):
        ops.sm90_bwd_options(q64, deterministic=True)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("deterministic", [False, True])
def test_torch_compile_fullgraph(head_dim, deterministic):
    torch._dynamo.reset()
    compiled = torch.compile(functools.partial(attention, deterministic=deterministic), fullgraph=True)
    q, k, v = make_qkv(2, 3, 197, head_dim, dtype=torch.bfloat16, device="cuda")
    check_against_reference(compiled, q, k, v)


@pytest.mark.gpu
def test_trains_inside_compiled_module():
    """A tiny attention block, compiled whole: loss falls, no graph break."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(64, 3 * 64, device="cuda", dtype=torch.bfloat16)

    def block(x):
        B, N, C = x.shape
        q, k, v = proj(x).reshape(B, N, 3, 2, C // 2).permute(2, 0, 3, 1, 4).unbind(0)
        return attention(q, k, v).transpose(1, 2).reshape(B, N, C)

    compiled = torch.compile(block, fullgraph=True)
    x = torch.randn(4, 50, 64, device="cuda", dtype=torch.bfloat16)
    target = torch.randn_like(x)
    opt = torch.optim.SGD(proj.parameters(), lr=0.5)
    losses = []
    for _ in range(20):
        loss = (compiled(x).float() - target.float()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


def test_fake_kernel_gives_shapes_without_a_gpu():
    """The registered fake (meta) kernel: what torch.compile traces with; padding 80 -> 128 and back."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = (torch.empty(2, 3, 197, 80, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        out = attention(q, k, v)
        assert out.shape == (2, 3, 197, 80) and out.dtype == torch.bfloat16
        out128, lse = torch.ops.vit_cuda.attn_fwd(*(torch.empty(1, 2, 5, 128, dtype=torch.float16, device="cuda")
                                                    for _ in range(3)), 0.1, False)
        assert out128.shape == (1, 2, 5, 128) and lse.shape == (1, 2, 5) and lse.dtype == torch.float32
