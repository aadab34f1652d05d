"""Build (once, cached) and load the CUDA C++ extension: ``python -m kernels.cuda.build``.

``torch.utils.cpp_extension.load`` compiles ``csrc/`` with ninja into a cache folder and reloads
it on later calls; it recompiles only when a source or flag changes. Targets: the present GPU's
architecture when one is visible, else sm_80 and sm_90; ``TORCH_CUDA_ARCH_LIST`` (e.g. ``9.0``)
overrides both. ``MAX_JOBS`` sets ninja's parallelism (one job per ``.cu``: 12 attention
instantiations + vector add + the host binding). Cache folder: ``$VIT_KERNELS_BUILD_DIR`` or
``~/.cache/vit-kernels/<torch>-cu<cuda>/``.
"""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
NAME = "vit_cuda_kernels"
# -lineinfo maps SASS back to source for ncu; --use_fast_math turns exp2f into one MUFU.EX2.
# (torch picks the C++ standard itself.)
NVCC_FLAGS = ["-O3", "--use_fast_math", "-lineinfo"]
CXX_FLAGS = ["-O3"]


def sources() -> list[Path]:
    """The extension's translation units: host binding, vector add, one file per instantiation."""
    return [CSRC / "api.cpp", CSRC / "vector_add.cu", *sorted(CSRC.glob("fwd_hdim*.cu")), *sorted(CSRC.glob("bwd_hdim*.cu"))]


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


def arch_list() -> str:
    """``TORCH_CUDA_ARCH_LIST`` value to build for: env override, else the present GPU, else 8.0;9.0."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return "8.0;9.0"


def build_dir() -> Path:
    tag = f"torch{torch.__version__.split('+')[0]}-cu{torch.version.cuda}"
    path = Path(os.environ.get("VIT_KERNELS_BUILD_DIR", Path.home() / ".cache" / "vit-kernels" / tag))
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def extension(verbose: bool = False):
    """Compile if needed and import the extension module (``fwd``, ``bwd``, ``vector_add``).

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
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list()
    try:
        return cpp_extension.load(
            name=NAME,
            sources=[str(s) for s in sources()],
            extra_cflags=CXX_FLAGS,
            extra_cuda_cflags=NVCC_FLAGS,
            extra_include_paths=[str(CSRC)],
            build_directory=str(build_dir()),
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
