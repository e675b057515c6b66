"""Giving memory back to the operating system.

A commit's host temporaries (the search's on the host, the writer's encodings) are allocated
and freed in pieces of a few MB, which glibc's malloc keeps in its arenas once freed (past a
freed mapping of that size it serves them from the heap). The process's resident memory then
stays near the commit's peak after it, and the next phase's peak lands on top: a training
process that commits holds that much more between commits. Trimming after each phase costs
milliseconds. `malloc_trim` does not shrink a thread arena's free top, though, which glibc
keeps below a threshold it raises to 64 MiB: `bound_arena_tops`, set when mvc's thread pool
starts, lowers that.

Values read from a memory-mapped store (LMDB's map) stay mapped once touched, and each mapped
page counts in the process's resident set (and in the kernel's OOM score) until the map
closes: reading a whole store, as a lossless commit's presence checks or a checkout's reads
do, would add the store's size. `release_mapped` unmaps a value's pages once it is consumed;
they stay in the page cache, so a later read costs a page fault, not a disk read.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from mvc.native._lib import ffi, lib


#: Blocks from this size up are mapped on their own (glibc's own ceiling for its dynamic
#: threshold on 64-bit, which a torch process reaches after freeing its first large tensor).
MMAP_THRESHOLD = 32 << 20
#: An arena's free top above this goes back to the OS. glibc's dynamic value is twice the
#: mmap threshold, 64 MiB: each of a 16-thread pool's arenas then kept up to that resident
#: after a commit (measured: 0.13x a 124M checkpoint, and a commit's write phase 0.54x where
#: 0.45x with this; issue 27).
TRIM_THRESHOLD = 4 << 20
#: The variables (and tunables) by which a user set malloc's thresholds: theirs are kept.
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                 "MALLOC_MMAP_MAX_")


def bound_arena_tops(environ: Any = os.environ) -> bool:
    """Fix malloc's mmap and trim thresholds (`MMAP_THRESHOLD`, `TRIM_THRESHOLD`), so the
    arenas of the threads that commit give their free tops back instead of keeping up to
    64 MiB each; True when set. Process-wide (glibc has no per-thread setting), so it is
    left alone where the user chose: `MVC_MALLOC_TUNE=0`, or any of glibc's own malloc
    variables or `glibc.malloc.*` tunables set. A no-op on other C libraries."""
    if environ.get("MVC_MALLOC_TUNE", "1") == "0":
        return False
    if any(k in environ for k in USER_SETTINGS) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return False
    return lib.mvc_heap_bound(MMAP_THRESHOLD, TRIM_THRESHOLD) == 1


def release_free_heap() -> bool:
    """Return the C heap's free pages to the OS (glibc's `malloc_trim`); True when any were.
    A no-op elsewhere."""
    return bool(lib.mvc_heap_trim())


def release_mapped(buf: Any) -> bool:
    """Unmap the pages under `buf` (a buffer into a read-only shared file mapping: a value of
    a read-only LMDB transaction) from this process; its contents stay readable (faulted
    back in from the page cache). True when released; False where the system refused (the
    pages then simply stay mapped, as without this call). Never for other memory: on heap or
    private pages, or an LMDB write transaction's dirty pages, it would discard the data."""
    if isinstance(buf, (bytes, bytearray)):
        return False   # a copy on the heap (a py-lmdb that copied): never a mapping to release
    view = memoryview(buf)
    if not view.readonly:
        return False   # LMDB's map is read-only: a writable buffer is someone's memory
    if view.nbytes == 0:
        return True
    return lib.mvc_release_mapped(ffi.from_buffer(view), view.nbytes) == 0


def buffer_span(buf: Any) -> tuple[int, int]:
    """[start, end) addresses of the bytes of `buf` (a contiguous buffer)."""
    view = memoryview(buf)
    if view.nbytes == 0:
        return 0, 0
    start = int(ffi.cast("uintptr_t", ffi.from_buffer(view)))
    return start, start + view.nbytes


def shared_read_only_mapping(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """[start, end) of this process's read-only shared mapping of the file at `path` (how
    LMDB maps its data file), or None: none, or no /proc/self/maps to tell (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    target = os.path.realpath(path)
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.rstrip("\n").split(None, 5)
                if len(fields) == 6 and fields[5] == target and fields[1].startswith("r-") \
                        and fields[1][3] == "s":
                    lo, hi = fields[0].split("-")
                    return int(lo, 16), int(hi, 16)
    except OSError:
        return None
    return None
