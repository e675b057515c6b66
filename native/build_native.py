"""cffi builder for mvc's native core (out-of-line API mode).

Every `native/*.c` file is compiled into one extension, `mvc._mvc_native`.
Every `native/*.h` header is both included by the generated C and handed to
`ffi.cdef`, so adding a coder means adding a .c/.h pair and nothing else.
Headers must therefore stay cffi-parseable: plain prototypes, no macros used
in declarations; preprocessor lines are stripped before `cdef`.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import sysconfig

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def _require_compiler() -> None:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    exe = cc.split()[0]
    if shutil.which(exe) is None:
        sys.stderr.write(
            "\nerror: mvc needs a C compiler to build its native core "
            f"(looked for {exe!r}; set CC or install gcc/clang, e.g. "
            "`apt-get install build-essential`).\n\n"
        )
        raise SystemExit(1)


def _cdef_text(header: str) -> str:
    with open(header, encoding="utf-8") as fh:
        text = fh.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return "\n".join(lines)


def build_ffi() -> FFI:
    headers = sorted(glob.glob(os.path.join(HERE, "*.h")))
    sources = sorted(glob.glob(os.path.join(HERE, "*.c")))
    ffi = FFI()
    ffi.cdef("\n".join(_cdef_text(h) for h in headers))
    extra = os.environ.get("MVC_NATIVE_CFLAGS", "").split()
    ldflags = os.environ.get("MVC_NATIVE_LDFLAGS", "").split()
    ffi.set_source(
        "mvc._mvc_native",
        "\n".join(f'#include "{os.path.basename(h)}"' for h in headers),
        sources=[os.path.relpath(s) for s in sources],
        include_dirs=[os.path.relpath(HERE)],
        # -Wall -Wextra keep the core warning-free; the sanitizer run adds -Werror.
        extra_compile_args=["-O3", "-std=gnu11", "-fno-strict-aliasing", "-Wall", "-Wextra"] + extra,
        extra_link_args=ldflags,
    )
    return ffi


_require_compiler()
ffibuilder = build_ffi()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
