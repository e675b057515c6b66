"""Scoped pointers into Python buffers for native calls: the ownership rules of the bindings.

A pointer C reads or writes through comes from `ffi.from_buffer`, which holds
a buffer export on its object until it is released.  Kept in a local variable
past the call, that export outlives the call on an error path: the error's
traceback keeps the frame, errors easily end up in reference cycles, and when
the collector clears such a cycle it may clear an exported memoryview first.
CPython then drops the memoryview's managed buffer although it is still
exported, and releasing the export afterwards writes through NULL: a segfault
at some later collection, after a perfectly clean decode error (issue 12).

So every binding in `mvc.native` and `mvc.codecs` follows three rules:

* a `from_buffer` pointer is either a temporary inside one call's argument
  list or bound by `with borrow(...)`, which releases it on every path;
* pointers derived from it (offsets, plane tables, casts) are used only inside
  that block, by threads that have all finished when it ends (`pmap` returns
  or raises only then);
* what a binding returns owns its memory (a fresh array, or a view that keeps
  its owner alive); nothing returned points into a buffer it releases.
"""
from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

from mvc.native._lib import ffi


def nbytes(obj: Any) -> int:
    """Size in bytes of a buffer object (numpy array, memoryview, bytes, bytearray)."""
    n = getattr(obj, "nbytes", None)
    return int(n) if n is not None else len(obj)


def borrow(obj: Any, ctype: str = "uint8_t[]", *, writable: bool = False) -> AbstractContextManager[Any]:
    """`ffi.from_buffer(ctype, obj)` for a `with` block: the export is released when the block
    ends, however it ends; an empty buffer gives NULL (what the C core expects for length 0)."""
    if nbytes(obj) == 0:
        return contextlib.nullcontext(ffi.NULL)
    return ffi.from_buffer(ctype, obj, require_writable=writable)
