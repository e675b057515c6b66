"""Checks of an LMDB data file's pages before LMDB walks them (native/lmdbcheck.c).

LMDB trusts its file: one damaged node offset, value size or page number makes it read past the
end of the file, which the kernel answers with SIGBUS in the map, and a few impossible tree
shapes trip its assertions (abort).  Either kills the process instead of raising.  These checks
read the pages LMDB would reach, each read bounded by the buffer handed over, and report a
damaged file as `LmdbFileDamagedError` (the store turns it into its own `StoreFormatError`).
"""
from __future__ import annotations

from typing import Any

from mvc.errors import DataError, InternalError
from mvc.native._lib import ffi, lib
from mvc.native.status import ERR_CORRUPT, ERR_NOMEM, ERR_TRUNCATED, OK, describe

#: Enough of the file's start to hold both meta pages at LMDB's largest page size.
HEAD_BYTES = 2 * 32768
#: The layout read is a 64-bit build's (8-byte page numbers, sizes and pointers in the meta
#: page); elsewhere the checks pass everything, as LMDB alone did.
SUPPORTED = ffi.sizeof("size_t") == 8
#: `mvc_lmdb_check`'s answer when the meta page of the transaction changed while read.
_CHANGED = 1
_WHY_LEN = 256


class LmdbFileDamagedError(DataError):
    """An LMDB data file's pages make no sense: LMDB would read past its end or abort on them."""

    exit_code = 191


def _raise(rc: int, why: Any, what: str) -> None:
    if rc == ERR_NOMEM:
        raise MemoryError(f"checking {what}")
    if rc == ERR_TRUNCATED:
        raise LmdbFileDamagedError(f"{what} ends inside its meta pages")
    if rc == ERR_CORRUPT:
        raise LmdbFileDamagedError(f"{what}: {ffi.string(why).decode(errors='replace')}")
    raise InternalError(f"checking {what}: {describe(rc)}")


def check_header(head: bytes, what: str = "the LMDB file") -> None:
    """Check the two meta pages at the start of an LMDB file (`head`: its first `HEAD_BYTES`
    bytes, or all of a shorter file) before LMDB opens it: LMDB 0.9's format, one valid page
    size. Raises `LmdbFileDamagedError`."""
    if not SUPPORTED:  # pragma: no cover - 32-bit builds
        return
    why = ffi.new("char[]", _WHY_LEN)
    rc = lib.mvc_lmdb_check_header(ffi.from_buffer(head), len(head), why, _WHY_LEN)
    if rc != OK:
        _raise(rc, why, what)


def check_snapshot(file: Any, txnid: int | None, deep: bool = False,
                   what: str = "the LMDB file") -> bool:
    """Check every page of the snapshot that transaction `txnid` committed (None: the newest),
    in `file`, a buffer over the whole data file (a read-only mmap). Call it inside a read
    transaction of that snapshot, which keeps its pages from being reused meanwhile. `deep`
    also reads each big value's first overflow page. False when a writer committed over that
    snapshot's meta page while it was read (check again in a new read transaction); raises
    `LmdbFileDamagedError` for a damaged file."""
    if not SUPPORTED:  # pragma: no cover - 32-bit builds
        return True
    why = ffi.new("char[]", _WHY_LEN)
    tid = (1 << 64) - 1 if txnid is None else txnid
    # Both exports released before returning, so the caller can close its mapping even while
    # an error raised here is still held.
    with memoryview(file) as view:   # (an empty one ends inside its meta pages: truncated)
        buf = ffi.from_buffer(view)
        try:
            rc = lib.mvc_lmdb_check(buf, view.nbytes, tid, int(deep), why, _WHY_LEN)
        finally:
            ffi.release(buf)
    if rc == _CHANGED:
        return False
    if rc != OK:
        _raise(rc, why, what)
    return True
