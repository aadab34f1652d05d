"""Does a formatted TORCH_CHECK crash in any C++ extension built here, or only in ours? A tiny CPU-only one."""
import subprocess
import sys

from torch.utils.cpp_extension import load_inline

SRC = r'''
#include <torch/extension.h>
#include <sstream>
void lit() { TORCH_CHECK_VALUE(false, "literal message"); }
void fmt(int64_t x) { TORCH_CHECK_VALUE(false, "formatted ", x); }
std::string oss(int64_t x) { std::ostringstream s; s << "oss " << x; return s.str(); }
void tostr(int64_t x) { TORCH_CHECK_VALUE(false, std::string("to_string ") + std::to_string(x)); }
void fmt_dbl(double x) { TORCH_CHECK_VALUE(false, "formatted double ", x); }
'''
if len(sys.argv) == 1:
    m = load_inline("segv_probe", SRC, functions=["lit", "fmt", "oss", "tostr", "fmt_dbl"], build_directory=None,
                    extra_cflags=["-O3"], verbose=False)
    for case in ("lit", "fmt", "oss", "tostr", "fmt_dbl"):
        p = subprocess.run([sys.executable, __file__, case], capture_output=True, text=True, check=False)
        print(case, "rc", p.returncode, p.stdout.strip()[-200:], p.stderr.strip()[-300:])
else:
    m = load_inline("segv_probe", SRC, functions=["lit", "fmt", "oss", "tostr", "fmt_dbl"], extra_cflags=["-O3"])
    try:
        f = getattr(m, sys.argv[1])
        print(f() if sys.argv[1] == "lit" else f(5.5) if sys.argv[1] == "fmt_dbl" else f(5))
    except ValueError as exc:
        print("ValueError", exc)
