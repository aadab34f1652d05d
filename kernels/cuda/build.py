"""Build (once, cached) and load the CUDA C++ extension: ``python -m kernels.cuda.build``.

``torch.utils.cpp_extension.load`` compiles ``csrc/`` with ninja into a cache folder and reloads
it on later calls; it recompiles only when a source or flag changes. Targets: the present GPU's
architecture when one is visible, else sm_80 and sm_90a; ``TORCH_CUDA_ARCH_LIST`` (e.g. ``8.0``)
overrides both. Compute capability 9.0 is always built as ``9.0a`` (the same GPUs; the ``a`` adds
wgmma, TMA and setmaxnreg), and only a build that has ``9.0a`` compiles the Hopper kernels
(``fwd_sm90_*.cu``, ``bwd_sm90_*.cu``) and defines ``VITK_SM90A``. Hand-written PTX: no CUTLASS
headers are needed. ``MAX_JOBS`` sets ninja's parallelism (one job per ``.cu``: 12 mma.sync
instantiations, 8 Hopper ones, vector add, the host binding). Cache folder: ``$VIT_KERNELS_BUILD_DIR`` or
``~/.cache/vit-kernels/<torch>-cu<cuda>/``.
"""
from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path

import torch

from ..cache import SHARED_HEADERS, build_dir

CSRC = Path(__file__).resolve().parent / "csrc"
NAME = "vit_cuda_kernels"
# -lineinfo maps SASS back to source for ncu; --use_fast_math turns exp2f into one MUFU.EX2.
# (torch picks the C++ standard itself.)
NVCC_FLAGS = ["-O3", "--use_fast_math", "-lineinfo"]
CXX_FLAGS = ["-O3"]


def has_sm90(arch_list_value: str) -> bool:
    """Whether a ``TORCH_CUDA_ARCH_LIST`` value builds the Hopper (sm_90a) kernels."""
    return "9.0a" in arch_list_value.replace(" ", ";").split(";")


def sources(arch_list_value: str | None = None) -> list[Path]:
    """The extension's translation units: host binding, the eager autograd node, vector add, one file per instantiation, and
    the Hopper kernels' when ``arch_list_value`` (default :func:`arch_list`) has 9.0a."""
    arch_list_value = arch_list() if arch_list_value is None else arch_list_value
    hopper = sorted(CSRC.glob("*_sm90_hdim*.cu")) if has_sm90(arch_list_value) else []
    return [CSRC / "api.cpp", CSRC / "eager.cpp", CSRC / "vector_add.cu", *sorted(CSRC.glob("fwd_hdim*.cu")),
            *sorted(CSRC.glob("bwd_hdim*.cu")), *hopper]


def cuda_home() -> str | None:
    """The CUDA toolkit root: the first of $CUDA_HOME, $CUDA_PATH, torch's guess, nvcc's folder on
    PATH and /usr/local/cuda that holds both bin/nvcc and include/cuda_runtime.h; None if none does."""
    from torch.utils import cpp_extension

    which = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), cpp_extension.CUDA_HOME,
                  str(Path(which).resolve().parent.parent) if which else None, "/usr/local/cuda"]
    for home in candidates:
        if home and (Path(home) / "bin" / "nvcc").is_file() and (Path(home) / "include" / "cuda_runtime.h").is_file():
            return home
    return None


def find_nvcc() -> str | None:
    """Path of nvcc in :func:`cuda_home`; None if there is no usable toolkit."""
    home = cuda_home()
    return str(Path(home) / "bin" / "nvcc") if home else None


# torch's cpp_extension defines these for every .cu it compiles: a standalone nvcc call (SASS and resource checks)
# passes them to compile the same code.
TORCH_NVCC_DEFINES = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                      "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


def find_cuobjdump() -> str | None:
    """cuobjdump (reads SASS) from PATH, beside nvcc, or the copy that Triton's wheel carries; None if none exists."""
    candidates = [shutil.which("cuobjdump")]
    nvcc = find_nvcc()
    if nvcc:
        candidates.append(str(Path(nvcc).parent / "cuobjdump"))
    try:
        import triton

        candidates.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    except ImportError:
        pass
    return next((c for c in candidates if c and Path(c).is_file()), None)


def arch_list() -> str:
    """``TORCH_CUDA_ARCH_LIST`` value to build for: env override, else the present GPU, else
    ``8.0;9.0a``; a plain ``9.0`` becomes ``9.0a`` (``9.0+PTX`` stays as it is: no Hopper kernels)."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        archs = os.environ["TORCH_CUDA_ARCH_LIST"].replace(" ", ";").split(";")
        return ";".join("9.0a" if a == "9.0" else a for a in archs if a)
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return "9.0a" if (major, minor) == (9, 0) else f"{major}.{minor}"
    return "8.0;9.0a"


@functools.cache
def extension(verbose: bool = False):
    """Compile if needed and import the extension module (``fwd``, ``fwd_sm90``, ``bwd``, ``bwd_sm90``,
    ``vector_add``; ``has_sm90`` says whether the Hopper kernels were built).

    Raises:
        RuntimeError: torch has no CUDA build, nvcc is missing, or the compilation failed; the
            message says which and how to fix it.
    """
    if torch.version.cuda is None:
        raise RuntimeError(
            f"attention=cuda needs a CUDA build of PyTorch; this one ({torch.__version__}) is CPU-only. "
            "Install a CUDA wheel from https://pytorch.org/get-started/locally/."
        )
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError(
            "attention=cuda compiles its kernels on first use and needs nvcc, which was not found "
            "(CUDA_HOME is unset or has no bin/nvcc, and nvcc is not on PATH). Install the CUDA toolkit "
            f"matching torch's CUDA {torch.version.cuda} and set CUDA_HOME=/usr/local/cuda (or your install path)."
        )
    from torch.utils import cpp_extension

    # torch guesses CUDA_HOME once at import (from `which nvcc`, possibly a wrapper outside the toolkit)
    cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"] = str(Path(nvcc).parent.parent)
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    archs = os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list()
    defines = ["-DVITK_SM90A"] if has_sm90(archs) else []
    folder = build_dir(NAME)
    if not any(folder.glob(f"{NAME}*.so")):
        print(f"[cuda] building {NAME} for TORCH_CUDA_ARCH_LIST={archs}: {len(sources(archs))} translation units "
              f"with nvcc, several minutes the first time (MAX_JOBS sets the parallelism), in {folder}",
              file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(
            name=NAME,
            sources=[str(s) for s in sources(archs)],
            extra_cflags=CXX_FLAGS + defines,
            extra_cuda_cflags=NVCC_FLAGS + defines,
            extra_include_paths=[str(CSRC), str(SHARED_HEADERS)],
            build_directory=str(folder),
            verbose=verbose,
        )
    except Exception as exc:
        raise RuntimeError(
            f"building the CUDA extension {NAME} failed ({type(exc).__name__}: {exc}). The compiler output is "
            "above; rebuild with `python -m kernels.cuda.build` to see it in full."
        ) from exc
    finally:
        if previous is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous


def main() -> None:
    """Build ahead of time and print where the module landed."""
    module = extension(verbose=True)
    print(f"built {NAME} for TORCH_CUDA_ARCH_LIST={arch_list()} -> {module.__file__}")


if __name__ == "__main__":
    main()
