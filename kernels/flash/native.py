"""The eager flash path in C++ (``csrc/eager.cpp``): autograd node, allocations and kernel launches with no
Python per call once a launch's key has been seen.

The extension is compiled on first use (a C++ compiler and torch's headers; no CUDA toolkit: the few driver
types it needs are declared in the file) into ``$VIT_KERNELS_BUILD_DIR`` or ``~/.cache/vit-kernels/<torch build>-<python>/``,
and reloaded from there afterwards; ``python -m kernels.flash.native`` builds it ahead of time.
``VIT_FLASH_LAUNCHER`` picks the eager path: ``auto`` (default: the C++ path where it builds, else the
Python one with one warning), ``native`` (the C++ path or an error), ``python`` (the Python
``autograd.Function`` and :class:`kernels.flash.launch.Launcher`). Both paths launch the same compiled
kernels with the same arguments; ``torch.compile`` never takes either (it traces the ``torch.library`` ops).

Each key's first launch comes back here (:func:`_first_launch`): Triton's own launch (autotune, compile,
run), then the plan the C++ side reuses for the key: the kernel's ``CUfunction``, grid, block, shared
memory and each argument's type, from the compiled kernel's signature.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch

from ..cache import SHARED_HEADERS, build_dir
from . import configs
from .kernels import LOG2E
from .launch import _hooked
from .op import _announce, _dkdv_meta, _dq_meta, _fwd_meta, _tiles_grid

CSRC = Path(__file__).resolve().parent / "csrc" / "eager.cpp"
NAME = "vit_flash_eager"
MODES = ("auto", "native", "python")
_TYPE_CODES = {"i32": "i", "i64": "l", "fp32": "f", "constexpr": "c"}

_module = None
_failed: str | None = None
_warned = False
# The compiled kernels behind the C++ side's plans, kept alive: a plan holds only the raw CUfunction, and Triton
# unloads a CompiledKernel's module when the object is collected (CompiledKernel.__del__).
_PLANNED: set = set()


def _checked(value: str, where: str) -> str:
    value = value.strip().lower()
    if value not in MODES:
        raise ValueError(f"{where}={value!r}: use one of {', '.join(MODES)}")
    return value


_mode = _checked(os.environ.get("VIT_FLASH_LAUNCHER", "auto"), "VIT_FLASH_LAUNCHER")


def mode() -> str:
    """The eager launcher mode: ``$VIT_FLASH_LAUNCHER`` at import (default ``auto``), or :func:`set_mode`'s."""
    return _mode


def set_mode(value: str) -> str:
    """Switch the eager launcher (benchmarks and tests compare the two paths); returns the previous mode.

    Raises:
        ValueError: a value other than auto, native, python.
    """
    global _mode
    previous, _mode = _mode, _checked(value, "flash launcher mode")
    return previous


def load(verbose: bool = False):
    """Build (first time) and import the extension, and install :func:`_first_launch` in it.

    Raises:
        RuntimeError (or the compiler's error): the build failed, e.g. no C++ compiler.
    """
    global _module
    if _module is None:
        from torch.utils import cpp_extension

        folder = build_dir(NAME)
        if not any(folder.glob(f"{NAME}*.so")):
            print(f"[flash] building the eager launcher (C++, once per torch version, about a minute) in {folder}",
                  file=sys.stderr, flush=True)
        module = cpp_extension.load(NAME, [str(CSRC)], extra_cflags=["-O2"], extra_include_paths=[str(SHARED_HEADERS)],
                                    build_directory=str(folder), with_cuda=False, verbose=verbose)
        module.set_first_launch(_first_launch, LOG2E)
        _module = module
    return _module


def module():
    """The loaded extension for an eager call, or None where the Python path is to run: ``python`` mode, a
    Triton launch hook installed (a profiler must see every launch), Triton's interpreter in ``auto`` mode,
    or a failed build in ``auto`` mode (warned once).

    Raises:
        RuntimeError: ``native`` mode and the extension does not build.
    """
    global _failed, _warned
    which = _mode
    if which == "python" or _hooked() or (configs.INTERPRETED and which == "auto"):
        return None  # under the interpreter only ``native`` mode takes it (tests): every launch is then a first one
    if _module is not None:
        return _module
    if _failed is None:  # one try per process: a failed build is not retried on every call
        try:
            return load()
        except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as err:  # no ninja or compiler, a build or load error
            _failed = f"{type(err).__name__}: {err}"
    if which == "native":
        raise RuntimeError(f"VIT_FLASH_LAUNCHER=native but the C++ launcher did not build: {_failed}")
    if not _warned:
        _warned = True
        warnings.warn(f"flash: the C++ eager launcher did not build ({_failed.splitlines()[0]}); eager calls take "
                      f"the Python launcher (same kernels, ~0.2 ms more CPU per call). Set VIT_FLASH_LAUNCHER=python "
                      f"to silence this.", RuntimeWarning, stacklevel=3)
    return None


# slot -> (autotuned kernel per head-dim class, the block size that tiles N, its name in tuning messages, its
# constexprs from q and the flags): as kernels.flash.op's launch_fwd / launch_dq / launch_dkdv
_SLOTS = {
    0: (configs.FWD, "BLOCK_M", "fwd", _fwd_meta),
    1: (configs.DQ, "BLOCK_M2", "bwd dq", _dq_meta),
    2: (configs.DKDV, "BLOCK_N1", "bwd dk/dv", _dkdv_meta),
}


def _first_launch(slot: int, q: torch.Tensor, args: tuple, flags: list) -> tuple | None:
    """Launch slot's kernel through Triton (autotuning and compiling on a new key) with ``args`` (tensors,
    floats, ints in the kernel's order), then return its plan ``(function, grid, block, shared, types)``,
    or None if the compiled kernel needs what the C++ launch does not do (scratch memory, clusters, PDL,
    a launch hook); the key then takes this path on every call."""
    tuners, block, what, meta = _SLOTS[slot]
    kernel = tuners[configs.head_dim_class(q.shape[-1])]
    B, H, N = q.shape[:3]
    grid = _tiles_grid(block)
    tuned_before = len(kernel.cache)
    compiled = kernel[lambda m: grid((B * H, N), m)](*args, **meta(q, flags))
    _announce(kernel, what, q, tuned_before)
    found = plan(compiled, len(args), grid((B * H, N), kernel.best_config.kwargs)[0])
    if found is not None:
        _PLANNED.add(compiled)
    return found


def plan(compiled, n_args: int, grid: int) -> tuple | None:
    """``(function, grid, block, shared, types)`` of a compiled Triton kernel whose first ``n_args`` parameters
    are the launch's arguments (the rest constexpr), or None where the C++ launch would not be Triton's."""
    md = getattr(compiled, "metadata", None)
    if md is None:  # Triton's interpreter: nothing compiled to launch
        return None
    plain = (getattr(md, "num_ctas", 1) == 1 and not getattr(md, "launch_pdl", False)
             and not getattr(md, "launch_cooperative_grid", False) and not getattr(md, "global_scratch_size", 0)
             and not getattr(md, "profile_scratch_size", 0) and not _hooked())
    signature = list(compiled.src.signature.values())
    if not plain or any(ty != "constexpr" for ty in signature[n_args:]):
        return None
    types = "".join("p" if ty.startswith("*") else _TYPE_CODES.get(ty, "?") for ty in signature[:n_args])
    if "?" in types:
        return None
    return compiled.function, grid, 32 * md.num_warps, md.shared, types


def main() -> None:
    """``python -m kernels.flash.native``: build the extension now and say where it is."""
    module = load(verbose=True)
    print(f"flash eager launcher: {module.__file__}")


if __name__ == "__main__":
    main()
