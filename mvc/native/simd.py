"""Which SIMD forms the native kernels run (native/simd.h): 0 plain C, 2 AVX2, 3 AVX-512.

Every form writes the same bytes; `capped` makes a block run the lower ones on any machine,
which is how the tests cover each form.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mvc.native._lib import lib
from mvc.native.status import NativeArgumentError

LEVELS = (0, 2, 3)


def level() -> int:
    """The SIMD level the kernels use now (this CPU's, at most the cap)."""
    return int(lib.mvc_simd_level())


def available() -> list[int]:
    """The levels this CPU can run, lowest first (0 always), whatever the cap."""
    top = int(lib.mvc_simd_cpu())
    return [v for v in LEVELS if v <= top]


@contextmanager
def capped(at: int) -> Iterator[None]:
    """Within this block the kernels use SIMD level `at` at most.  Process-wide: for tests
    and benchmarks, not alongside other decoding threads."""
    prev = int(lib.mvc_simd_cap(at))
    if prev < 0:
        raise NativeArgumentError(f"SIMD level {at} is not one of {LEVELS}")
    try:
        yield
    finally:
        lib.mvc_simd_cap(prev)
