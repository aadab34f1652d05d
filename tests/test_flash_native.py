"""The C++ eager path of the flash backend (kernels/flash/native.py, kernels/flash/csrc/eager.cpp).

CPU: the extension builds with this torch, and under Triton's interpreter its autograd node, allocations
and argument lists give bitwise the Python path's out, dq, dk, dv (every launch then goes through
``_first_launch``, which runs the interpreted kernels on the arguments the C++ side built); plans,
modes and the build-failure warning. GPU: after a key's first call the launches skip Python, bitwise
equal to Triton's own launches through the torch.library ops.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from conftest import check_against_reference, forward_backward, make_qkv, pack_qkv

from kernels import flash
from kernels.flash import native

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def launcher_mode():
    """Restore the launcher mode after a test that switches it."""
    previous = native.mode()
    yield native.set_mode
    native.set_mode(previous)


def _packed(q, k, v, softmax_scale=None, fp32_delta=False):
    return flash.attention_qkvpacked(pack_qkv(q, k, v), softmax_scale, fp32_delta=fp32_delta)


def _both_paths(fn, q, k, v, do, set_mode):
    set_mode("python")
    want = forward_backward(fn, q, k, v, do)
    set_mode("native")
    assert native.module() is not None
    got = forward_backward(fn, q, k, v, do)
    return want, got


CASES = [(1, 2, 17, 32, torch.float32), (2, 1, 65, 80, torch.float16), (1, 2, 1, 64, torch.float32)]


@pytest.mark.parametrize("packed", [False, True], ids=["qkv", "packed"])
@pytest.mark.parametrize("fp32_delta", [False, True], ids=["plain", "fp32_delta"])
@pytest.mark.parametrize("B,H,N,d,dtype", CASES, ids=[f"N{c[2]}-d{c[3]}-{str(c[4])[6:]}" for c in CASES])
def test_native_path_equals_the_python_path_bitwise(launcher_mode, packed, fp32_delta, B, H, N, d, dtype):
    def fn(q, k, v, softmax_scale=None):
        if packed:
            return _packed(q, k, v, softmax_scale, fp32_delta)
        return flash.attention(q, k, v, softmax_scale, fp32_delta=fp32_delta)

    q, k, v = make_qkv(B, H, N, d, dtype=dtype, device=DEVICE)
    do = torch.randn(B, N, H, d, dtype=dtype, device=DEVICE).transpose(1, 2)  # out's layout, as the ViT's
    want, got = _both_paths(fn, q, k, v, do, launcher_mode)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and a.stride() == b.stride(), name
        assert torch.equal(a, b), f"{name}: max diff {(a.double() - b.double()).abs().max().item():.3e}"


def test_native_path_against_float64_with_a_contiguous_upstream_gradient(launcher_mode):
    launcher_mode("native")
    q, k, v = make_qkv(2, 2, 33, 64, dtype=torch.float16, device=DEVICE)
    check_against_reference(flash.attention, q, k, v)  # its do is contiguous (B, H, N, d), not out's layout
    check_against_reference(_packed, q, k, v)


@pytest.mark.parametrize("packed", [False, True], ids=["qkv", "packed"])
def test_native_path_gives_a_first_derivative_under_create_graph_and_refuses_the_second(launcher_mode, packed):
    """As the Python path's once_differentiable (tests/test_flash.py::test_second_derivative_raises): create_graph=True
    returns the gradient; the second derivative through it raises when it is taken."""
    launcher_mode("native")
    q, k, v = make_qkv(1, 1, 17, 16, device=DEVICE)
    inputs = (pack_qkv(q, k, v).detach().requires_grad_(True),) if packed else (q, k, v)
    out = flash.attention_qkvpacked(*inputs) if packed else flash.attention(*inputs)
    launcher_mode("python")
    want = torch.autograd.grad(out.square().sum(), inputs, retain_graph=True)  # not the C++ node: same kernels
    launcher_mode("native")
    grads = torch.autograd.grad(out.square().sum(), inputs, create_graph=True)
    assert all(torch.equal(g, w) for g, w in zip(grads, want))
    with pytest.raises(RuntimeError, match="differentiate twice.*second derivative"):
        sum(g.square().sum() for g in grads).backward()


def test_packed_op_refuses_a_second_derivative_on_the_native_path(launcher_mode):
    """vit_flash::fwd_qkvpacked called eagerly (kernels.flash.fwd_qkvpacked): with create_graph=True its backward is the
    Python op, whose second derivative raises; the C++ op has no autograd kernel (a warning, then an undefined gradient)."""
    from kernels.flash import op

    launcher_mode("native")
    q, k, v = make_qkv(1, 1, 17, 16, device=DEVICE)
    qkv = pack_qkv(q, k, v).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(op.fwd_qkvpacked(qkv, 0.25)[0].square().sum(), (qkv,), create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        g.square().sum().backward()


def test_native_path_without_grad_returns_the_same_out(launcher_mode):
    q, k, v = make_qkv(1, 2, 17, 32, device=DEVICE, requires_grad=False)
    launcher_mode("python")
    want = flash.attention(q, k, v, fp32_delta=True)
    launcher_mode("native")
    with torch.no_grad():
        got = flash.attention(q, k, v, fp32_delta=True)
    assert not got.requires_grad and torch.equal(got, want)


def _compiled(signature, **metadata):
    md = {"num_ctas": 1, "launch_pdl": False, "launch_cooperative_grid": False, "global_scratch_size": 0,
          "profile_scratch_size": 0, "num_warps": 4, "shared": 12288} | metadata
    return SimpleNamespace(metadata=SimpleNamespace(**md), src=SimpleNamespace(signature=signature), function=1234)


def test_plan_reads_types_from_the_compiled_signature(monkeypatch):
    monkeypatch.setattr(native, "_hooked", lambda: False)
    sig = {"Q": "*bf16", "scale": "fp32", "stride": "i32", "one": "constexpr", "big": "i64", "BLOCK": "constexpr"}
    assert native.plan(_compiled(sig), 5, 96) == (1234, 96, 128, 12288, "pficl")
    assert native.plan(_compiled(sig | {"BLOCK": "i32"}), 5, 96) is None  # a parameter past the launch's arguments
    for unusual in ({"num_ctas": 2}, {"launch_pdl": True}, {"global_scratch_size": 64}, {"profile_scratch_size": 8}):
        assert native.plan(_compiled(sig, **unusual), 5, 96) is None, unusual
    assert native.plan(_compiled({"x": "u8"}), 1, 1) is None
    assert native.plan(None, 1, 1) is None  # the interpreter returns no compiled kernel
    monkeypatch.setattr(native, "_hooked", lambda: True)
    assert native.plan(_compiled(sig), 5, 96) is None


def test_launcher_modes(launcher_mode, monkeypatch):
    with pytest.raises(ValueError, match="use one of auto, native, python"):
        launcher_mode("fast")
    launcher_mode("python")
    assert native.module() is None
    launcher_mode("auto")
    assert (native.module() is not None) == torch.cuda.is_available()  # under the interpreter: the Python path
    monkeypatch.setattr(native, "_hooked", lambda: True)
    launcher_mode("native")
    assert native.module() is None  # a Triton launch hook sees every launch only on Triton's path


def test_a_failed_build_warns_once_in_auto_mode_and_raises_in_native_mode(launcher_mode, monkeypatch):
    def broken(verbose=False):
        raise OSError("no C++ compiler")

    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failed", None)
    monkeypatch.setattr(native, "_warned", False)
    monkeypatch.setattr(native, "load", broken)
    monkeypatch.setattr(native.configs, "INTERPRETED", False)
    launcher_mode("auto")
    with pytest.warns(RuntimeWarning, match="no C.. compiler"):
        assert native.module() is None
    assert native.module() is None  # no second warning (pytest's filter would turn one into an error here)
    launcher_mode("native")
    with pytest.raises(RuntimeError, match="VIT_FLASH_LAUNCHER=native"):
        native.module()


@pytest.fixture
def planned(launcher_mode, monkeypatch):
    """Native mode with every first launch returning a (fake) direct plan, as on a GPU; the plans are forgotten after.
    A direct launch then fails on this machine (no CUDA), which shows that it was attempted."""
    launcher_mode("native")
    monkeypatch.setattr(native, "plan", lambda compiled, n_args, grid: (1, grid, 128, 0, "p" * n_args))
    native.module().clear_plans()
    yield
    native.module().clear_plans()


@pytest.mark.skipif(torch.cuda.is_available(), reason="launches a fake CUfunction: only where no GPU can run it")
@pytest.mark.parametrize("B,H", [(0, 2), (2, 0)])
def test_an_empty_grid_is_not_launched(planned, B, H):
    """B·H = 0: Triton's launcher skips a grid of no programs (cuLaunchKernel would fail on it); the direct path too."""
    q, k, v = make_qkv(B, H, 17, 16, device=DEVICE)
    for _ in range(2):  # the first call through Python, the second with the plan
        forward_backward(flash.attention, q, k, v, torch.randn_like(q))
    q, k, v = make_qkv(1, 1, 17, 16, device=DEVICE)
    flash.attention(q, k, v)  # a key's first launch: Triton's
    with pytest.raises(RuntimeError):  # a non-empty grid is launched directly (and fails here)
        flash.attention(q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["qkv", "packed"])
def test_gpu_native_launches_skip_python_and_equal_triton_launches_bitwise(launcher_mode, packed):
    from kernels.flash import bwd, fwd

    launcher_mode("native")
    q, k, v = make_qkv(2, 3, 197, 64, dtype=torch.bfloat16, device="cuda")
    do = torch.randn(2, 197, 3, 64, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    fn = _packed if packed else flash.attention
    forward_backward(fn, q, k, v, do)  # the first call of each key: Triton's path
    before = native.module().direct_launch_count()
    out, dq, dk, dv = forward_backward(fn, q, k, v, do)
    assert native.module().direct_launch_count() - before == 3, "fwd, dq and dk/dv should skip Python"
    want_out, lse = fwd(q, k, v, 64 ** -0.5)  # the triton_op: Triton's own launch path
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv),
                          (want_out, *bwd(do, q, k, v, want_out, lse, 64 ** -0.5))):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@pytest.mark.parametrize("N,d", [(1, 32), (197, 80), (577, 128), (1025, 64)])
def test_gpu_native_path_against_float64(launcher_mode, N, d):
    launcher_mode("native")
    q, k, v = make_qkv(2, 2, N, d, dtype=torch.bfloat16, device="cuda")
    for _ in range(2):  # the first call through Python, the second direct
        check_against_reference(flash.attention, q, k, v)


class _OpNames(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the dispatcher ops that run inside it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fp32_delta", [False, True], ids=["plain", "fp32_delta"])
def test_the_packed_ops_backward_is_the_cpp_op_and_equals_the_python_one(launcher_mode, fp32_delta):
    """vit_flash::fwd_qkvpacked's autograd formula (torch.compile's path) calls vit_flash_native::bwd_qkvpacked."""
    from kernels.flash import op

    fwd = op.fwd_qkvpacked_fp32_delta if fp32_delta else op.fwd_qkvpacked
    q, k, v = make_qkv(2, 2, 17, 32, device=DEVICE)
    qkv = pack_qkv(q, k, v).detach()
    do = torch.randn(2, 17, 2, 32, device=DEVICE).transpose(1, 2)
    grads = {}
    for mode in ("python", "native"):
        launcher_mode(mode)
        x = qkv.clone().requires_grad_()
        out = fwd(x, 32 ** -0.5)[0]
        with _OpNames() as seen:
            (grads[mode],) = torch.autograd.grad(out, (x,), do)
        assert ("vit_flash_native.bwd_qkvpacked.default" in seen.names) == (mode == "native"), seen.names
    assert torch._C._dispatch_has_kernel_for_dispatch_key("vit_flash_native::bwd_qkvpacked", DEVICE.upper())
    assert torch.equal(grads["native"], grads["python"])


def test_compiled_packed_attention_with_the_cpp_backward_equals_eager(launcher_mode):
    launcher_mode("native")
    q, k, v = make_qkv(1, 2, 17, 16, device=DEVICE)
    do = torch.randn_like(q)
    compiled = torch.compile(_packed, fullgraph=True, backend="aot_eager")
    got = forward_backward(compiled, q, k, v, do)
    want = forward_backward(_packed, q, k, v, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), name


def test_the_cpp_ops_schema_exists_before_the_extension_loads():
    """A graph compiled in another process (torch.compile's caches) may call vit_flash_native::bwd_qkvpacked before
    anything loads the extension: kernels.flash defines the op, with a Python kernel (the Python launcher)."""
    import subprocess
    import sys

    code = """
import torch
from kernels.flash import native, op
from kernels import split_qkv
qkv = torch.randn(1, 17, 3, 2, 16, device="cuda" if torch.cuda.is_available() else "cpu")
out, lse = op._fwd_qkvpacked(qkv, 0.25, True)
dout = torch.randn_like(out)
got = torch.ops.vit_flash_native.bwd_qkvpacked(dout, qkv, out, lse, None, 0.25)
assert native._module is None, "the extension loaded"
assert torch.equal(got, op._bwd_qkvpacked(dout, qkv, out, lse, 0.25, True)), "differs from the Python launcher"
print("ok")
"""
    # The interpreter where there is no GPU (auto then never loads the extension). On a GPU the child runs there,
    # since Triton 3.6's interpreter fails under NumPy 2 (README, "CPU only?"), with the Python launcher, since auto
    # would load the extension at the op's first call.
    env = {**os.environ, "VIT_FLASH_LAUNCHER": "python" if torch.cuda.is_available() else "auto"}
    env.pop("TRITON_INTERPRET", None)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=False, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]


def test_the_build_command_of_the_readme():
    """`python -m kernels.flash.native` builds (here: finds) the extension and prints where it is."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "kernels.flash.native"], capture_output=True, text=True, timeout=600,
                         check=False, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-2000:]
    last = run.stdout.strip().splitlines()[-1]  # after the compiler's (ninja's) own lines
    assert last.startswith("flash eager launcher: ") and last.endswith(".so"), run.stdout
    assert "RuntimeWarning" not in run.stderr, run.stderr[-2000:]
