"""The flash backend's direct eager launches (kernels/flash/launch.py) and its 1-D grid.

CPU: the launcher's cache logic on a stand-in kernel (which signature reuses a compiled kernel,
what it is called with). GPU: eager calls take the direct path, bitwise equal to Triton's own
launches, and B·H beyond the old 65535 grid limit.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from conftest import check_against_reference, forward_backward, make_qkv, pack_qkv

from kernels.flash import launch


class _Compiled:
    def __init__(self, calls):
        self.calls, self.function, self.packed_metadata = calls, "fn", "meta"

    def run(self, *args):
        self.calls.append(("direct", args))


class _Kernel:
    """Stands in for a ``triton.jit`` function: records Triton-path launches and their grids."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.calls.append(("triton", args, meta, grid(dict(zip(self.arg_names, args)) | meta)))
            return _Compiled(self.calls)
        return launch


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(launch, "_device", lambda: 0)
    monkeypatch.setattr(launch, "_stream", lambda device: 7)


def _call(launcher, extent, x, n, scale, block):
    """One launch of the stand-in kernel ``(X, n, scale, BLOCK)`` as kernels/flash/op.py makes it."""
    key = launch.signature(x.shape, (x,), (n,) + extent)
    return launcher(key, extent, (x, scale, n), lambda: {"BLOCK": block})


def test_launcher_reuses_the_compiled_kernel_only_for_the_same_signature(fake_cuda):
    kernel = _Kernel()
    kernel.arg_names = ["X", "scale", "n", "BLOCK"]
    launcher = launch.Launcher(kernel, lambda extent, meta: (extent[0] * (extent[1] // meta["BLOCK"]),))
    x = torch.randn(64)
    assert _call(launcher, (3, 32), x, 5, 0.5, 16) is False  # first: Triton's own path
    assert kernel.calls[-1][0] == "triton" and kernel.calls[-1][3] == (6,)
    assert _call(launcher, (3, 32), x, 5, 0.25, 16) is True  # another float: same kernel
    kind, args = kernel.calls[-1]
    assert kind == "direct" and args == (6, 1, 1, 7, "fn", "meta", None, None, None, x, 0.25, 5, 16)
    assert launcher.direct_calls == 1
    misses = [((4, 32), x, 5),  # another extent (grid)
              ((3, 32), x, 6),  # another int (Triton specialises ints)
              ((3, 32), x.half(), 5),  # another dtype
              ((3, 32), x[1:], 5),  # an address not 16-byte aligned (and another shape)
              ((3, 32), x[:32], 5)]  # another shape
    for extent, t, n in misses:
        assert _call(launcher, extent, t, n, 0.5, 16) is False, (extent, t.shape, t.dtype, n)
    y = torch.randn(68)[4:]  # aligned view of the same shape: same signature
    assert _call(launcher, (3, 32), y, 5, 0.5, 16) is True
    assert kernel.calls[-1][1][9] is y


def test_launcher_leaves_launch_hooks_to_triton(fake_cuda, monkeypatch):
    kernel = _Kernel()
    kernel.arg_names = ["X", "scale", "n", "BLOCK"]
    launcher = launch.Launcher(kernel, lambda extent, meta: (1,))
    x = torch.randn(8)
    _call(launcher, (1, 1), x, 1, 1.0, 4)
    monkeypatch.setattr(launch, "_hooked", lambda: True)
    assert _call(launcher, (1, 1), x, 1, 1.0, 4) is False
    assert kernel.calls[-1][0] == "triton"


@pytest.mark.gpu
def test_gpu_eager_calls_launch_directly_and_equal_triton_launches_bitwise(monkeypatch):
    """The Python launcher (VIT_FLASH_LAUNCHER=python); tests/test_flash_native.py has the C++ one's twin."""
    from kernels.flash import attention, bwd, fwd, native, op

    monkeypatch.setattr(native, "_mode", "python")
    q, k, v = make_qkv(2, 3, 197, 64, dtype=torch.bfloat16, device="cuda")
    do = torch.randn_like(q)
    forward_backward(attention, q, k, v, do)  # first call of this signature: Triton's path
    before = {id(l): l.direct_calls for l in op._LAUNCHERS.values()}
    out, dq, dk, dv = forward_backward(attention, q, k, v, do)
    direct = [l for l in op._LAUNCHERS.values() if l.direct_calls > before.get(id(l), 0)]
    assert len(direct) == 3, "fwd, dq (with delta) and dk/dv should all have launched directly"
    want_out, lse = fwd(q, k, v, 64 ** -0.5)  # the triton_op: Triton's own launch path
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv),
                          (want_out, *bwd(do, q, k, v, want_out, lse, 64 ** -0.5))):
        assert torch.equal(a, b), name


@pytest.mark.gpu
def test_gpu_batch_heads_beyond_65535():
    """B·H = 65544 > 65535, the old grid's second-axis limit (an eval batch of 8192 ViT-B images is 98304)."""
    from kernels.flash import attention

    q, k, v = make_qkv(5462, 12, 17, 32, dtype=torch.bfloat16, device="cuda")
    check_against_reference(attention, q, k, v)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (cuda:1 while cuda:0 is current)")
@pytest.mark.parametrize("packed", [False, True], ids=["qkv", "packed"])
def test_gpu_inputs_on_a_non_current_device(packed):
    """train.py device=cuda:1 on one process never calls set_device: the kernels must still run on cuda:1."""
    from kernels.flash import attention, attention_qkvpacked

    assert torch.cuda.current_device() == 0
    q, k, v = make_qkv(2, 3, 197, 64, dtype=torch.bfloat16, device="cuda:1")
    fn = (lambda q, k, v, softmax_scale=None: attention_qkvpacked(pack_qkv(q, k, v), softmax_scale)) if packed \
        else attention
    check_against_reference(fn, q, k, v)
    torch.cuda.synchronize(1)


def test_inputs_on_a_non_current_gpu_are_detected(monkeypatch):
    """The check behind the device guard: a CUDA tensor on another GPU than the current one (CPU tensors never)."""
    from types import SimpleNamespace

    from kernels import flash

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert flash._elsewhere(SimpleNamespace(is_cuda=True, get_device=lambda: 1))
    assert not flash._elsewhere(SimpleNamespace(is_cuda=True, get_device=lambda: 0))
    assert not flash._elsewhere(torch.zeros(1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs CPU stand-ins under Triton's interpreter; on a GPU "
                    "machine test_gpu_inputs_on_a_non_current_device covers it (two GPUs)")
@pytest.mark.parametrize("packed", [False, True], ids=["qkv", "packed"])
def test_attention_runs_under_the_inputs_device_when_it_is_not_current(monkeypatch, packed):
    """attention() enters torch.cuda.device(q.device) exactly when _elsewhere(q) says so (CPU: both stand-ins)."""
    import contextlib

    from kernels import flash

    entered = []
    monkeypatch.setattr(torch.cuda, "device", lambda d: entered.append(d) or contextlib.nullcontext())
    q, k, v = make_qkv(1, 2, 17, 16)
    call = (lambda: flash.attention_qkvpacked(pack_qkv(q, k, v))) if packed else (lambda: flash.attention(q, k, v))
    for elsewhere in (False, True):
        monkeypatch.setattr(flash, "_elsewhere", lambda t, e=elsewhere: e)
        call().sum().backward()
    assert entered == [q.device]
