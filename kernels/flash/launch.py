"""Eager launches of the flash kernels at a few microseconds of CPU each.

Triton's per-call path for an autotuned kernel (``Autotuner.run`` -> ``JITFunction.run``: bind the
arguments, compute each one's specialisation, hash a cache key, look the compiled kernel up, build
the grid) costs tens of microseconds of Python per launch; a flash forward+backward makes three.
At ViT sizes (N ≈ 200) that is as long as the kernels themselves, so the GPU waits on the CPU.

:class:`Launcher` keeps, per *launch signature*, the ``CompiledKernel`` that Triton's own path
returned on the first call and the grid it used; later calls with the same signature hand the
arguments straight to that kernel's C launcher. Same binary, same arguments, same grid: bitwise
the same results (tests/test_flash.py checks it on the GPU).

The signature holds everything Triton specialises a compiled kernel on, and more: each tensor's
dtype and whether its address is 16-byte aligned, every integer's exact value (Triton looks at
``== 1``, ``% 16`` and the int32/int64 range), the constexprs, the current CUDA device. Floats are
passed as fp32 values and are not specialised. While a Triton launch hook is installed (a profiler
such as proton), every call takes Triton's own path so that the hook sees it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from triton.runtime.autotuner import Autotuner

try:  # triton >= 3.4
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older triton: no launch hooks to honour here
    _knobs = None


def _installed(hook) -> bool:
    """Triton >= 3.5 keeps an empty ``HookChain`` where no hook is installed."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooked() -> bool:
    return _knobs is not None and (_installed(_knobs.runtime.launch_enter_hook)
                                   or _installed(_knobs.runtime.launch_exit_hook))


def _device() -> int:
    return torch.cuda.current_device()


def _stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)  # what Triton's own launch path calls


def signature(shape: torch.Size, tensors: tuple, ints: tuple) -> tuple:
    """What a compiled kernel is specialised on, as a cache key (a superset of Triton's own; see the
    module doc): the device, q's shape (it fixes the constexprs and the grid), each tensor's dtype and
    16-byte alignment, and the exact integer arguments."""
    return (_device(), shape, ints, *[(t.dtype, t.data_ptr() % 16 == 0) for t in tensors])


class Launcher:
    """Launch one Triton kernel (plain or autotuned) with a cached direct path after the first call.

    Args:
        kernel: a ``triton.jit`` function or a ``triton.autotune`` wrapper of one.
        grid: ``grid(extent, meta) -> tuple`` of up to three ints; ``extent`` is the caller's tuple of
            ints that fix the launch's size beyond the arguments (e.g. ``(B·H, N)``), ``meta`` maps
            every argument name to its value (the autotuned config's block sizes included).

    ``launcher(key, extent, args, meta_fn)`` launches with positional ``args`` (tensors, floats, ints
    in the kernel's order); ``key`` is the launch's :func:`signature`; ``meta_fn()`` gives the keyword
    constexprs (called only when Triton's own path runs). Returns ``True`` when the direct path was taken.
    ``launcher.direct_calls`` counts those (tests read it).
    """

    def __init__(self, kernel, grid: Callable[[dict], tuple]):
        self.kernel = kernel
        self.grid = grid
        fn = kernel.fn if isinstance(kernel, Autotuner) else kernel
        self.arg_names = fn.arg_names
        self.plans: dict = {}
        self.direct_calls = 0

    def __call__(self, key: tuple, extent: tuple, args: tuple, meta_fn: Callable[[], dict]) -> bool:
        plan = self.plans.get(key)
        if plan is not None and not _hooked():
            run, function, packed, grid, tail, _ = plan
            run(*grid, _stream(key[0]), function, packed, None, None, None, *args, *tail)
            self.direct_calls += 1
            return True
        self._first_call(key, extent, args, meta_fn())
        return False

    def _first_call(self, key, extent: tuple, args: tuple, meta: dict) -> None:
        """Triton's own launch; remember the compiled kernel, grid and constexpr tail it used."""
        compiled = self.kernel[lambda m: self.grid(extent, m)](*args, **meta)
        config = self.kernel.best_config.kwargs if isinstance(self.kernel, Autotuner) else {}
        full = {**dict(zip(self.arg_names, args)), **meta, **config}
        missing = [n for n in self.arg_names if n not in full]
        if missing or not hasattr(compiled, "packed_metadata"):  # an unexpected Triton: keep its own path
            return
        grid = tuple(self.grid(extent, full)) + (1, 1)
        tail = tuple(full[n] for n in self.arg_names[len(args):])
        # the compiled kernel itself last: it unloads its module when collected (CompiledKernel.__del__)
        self.plans[key] = (compiled.run, compiled.function, compiled.packed_metadata, grid[:3], tail, compiled)

