"""Where this project's compiled extensions live: one folder per extension, torch build and Python version; and the
C++ headers both extensions include."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

SHARED_HEADERS = Path(__file__).resolve().parent / "csrc"  # kernels/csrc: once_differentiable.h, packed_views.h


def build_dir(name: str) -> Path:
    """The build folder of extension ``name``, created if missing: ``$VIT_KERNELS_BUILD_DIR/<name>``, or
    ``~/.cache/vit-kernels/torch<version>-py<major><minor>/<name>``. The version keeps torch's CUDA variant
    (``2.11.0-cu130``) and the Python version is in the tag, because a module links against both: a CPU and a CUDA
    torch of one version, or two Pythons, must not share a ``.so``."""
    tag = f"torch{torch.__version__.replace('+', '-')}-py{sys.version_info.major}{sys.version_info.minor}"
    path = Path(os.environ.get("VIT_KERNELS_BUILD_DIR", Path.home() / ".cache" / "vit-kernels" / tag)) / name
    path.mkdir(parents=True, exist_ok=True)
    return path
