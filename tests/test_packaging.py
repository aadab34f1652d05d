"""pyproject.toml ships what the extensions compile: every file under a ``csrc`` folder of ``kernels/`` is matched by
the package data, so a non-editable install (``pip install .``) builds the cuda backend and the flash eager launcher
as the checkout does."""
import ast
import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_package_data_holds_every_extension_source():
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python 3.11+, the project supports 3.10)
    section = text.split("[tool.setuptools.package-data]", 1)[1]
    line = re.search(r"^kernels = (\[.*?\])$", section, re.MULTILINE)
    assert line, "pyproject's [tool.setuptools.package-data] needs its kernels list on one line: kernels = [...]"
    globs = ast.literal_eval(line.group(1))
    sources = [p.relative_to(ROOT / "kernels").as_posix() for p in (ROOT / "kernels").rglob("*")
               if p.is_file() and "csrc" in p.relative_to(ROOT / "kernels").parts and "__pycache__" not in p.parts]
    assert len(sources) > 20, sources  # api.cpp, eager.cpp, the kernels' headers and instantiations, the shared header
    missing = [s for s in sources if not any(fnmatch.fnmatch(s, g) and s.count("/") == g.count("/") for g in globs)]
    assert not missing, f"not in pyproject's [tool.setuptools.package-data] kernels: {missing}"
