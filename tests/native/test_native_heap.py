"""release_free_heap: memory freed in pieces the allocator kept goes back to the OS (glibc).

Run in a fresh interpreter: how a long test process's heap looks (its arenas, what it freed
before) is not this test's to control."""
from __future__ import annotations

import platform
import subprocess
import sys

import pytest
from mapped_pages import linux_only, mapped

# the probes' common part: this process's RSS, and the C allocator itself
LIBC = r"""
import ctypes, os

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
"""

PROBE = LIBC + r"""
from mvc.native.heap import release_free_heap
# 100 kB pieces (under the mmap threshold: from the heap), each followed by a small block that
# stays in use: freed, they are holes the heap cannot shrink past, and stay resident
big, small = [], []
for _ in range(2000):
    p = libc.malloc(100 << 10)
    libc.memset(p, 1, 100 << 10)
    big.append(p)
    small.append(libc.malloc(64))
for p in big:
    libc.free(p)
before = rss()
released = release_free_heap()
print(released, before - rss())
release_free_heap()   # again, with little or nothing to give back: harmless
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_memory_goes_back_to_the_os():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    released, dropped = out.stdout.split()
    assert released == "True" and int(dropped) > 100 << 20


POOL_PROBE = LIBC + r"""
import threading
from mvc.native.parallel import pmap
# a freed 30 MiB mapping (32 MiB is past the dynamic ceiling): what raises glibc's thresholds
# in any torch process
p = libc.malloc(30 << 20); libc.memset(p, 1, 30 << 20); libc.free(p)
meet = threading.Barrier(4)

def work(_):
    meet.wait()   # four tasks on four threads: four arenas
    blocks = [libc.malloc(4 << 20) for _ in range(12)]
    for b in blocks:
        libc.memset(b, 1, 4 << 20)
    for b in reversed(blocks):   # each free reaches the arena's top
        libc.free(b)

before = rss()
pmap(work, range(4))
print(rss() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
@pytest.mark.parametrize("env, kept", [({}, False), ({"MVC_MALLOC_TUNE": "0"}, True),
                                       ({"MALLOC_TRIM_THRESHOLD_": str(1 << 30),
                                         "MALLOC_MMAP_THRESHOLD_": str(30 << 20)}, True)])
def test_the_pools_arenas_give_their_free_tops_back(env, kept):
    """Four pool threads each use and free 48 MiB: with glibc's dynamic thresholds each arena
    keeps it resident; with the pool's bound they give it back, unless the user chose."""
    import os

    out = subprocess.run([sys.executable, "-c", POOL_PROBE], capture_output=True, text=True,
                         check=True, env={**os.environ, "MVC_THREADS": "4", **env})
    grown = int(out.stdout)
    if kept:
        assert grown > 120 << 20
    else:
        assert grown < 24 << 20


def test_bound_arena_tops_leaves_a_users_settings_alone(monkeypatch):
    from mvc.native import heap

    calls = []
    monkeypatch.setattr(heap, "lib", type("L", (), {"mvc_heap_bound": lambda *a: calls.append(a) or 1}))
    assert not heap.bound_arena_tops({"MVC_MALLOC_TUNE": "0"})
    assert not heap.bound_arena_tops({"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert not heap.bound_arena_tops({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"})
    assert not calls
    assert heap.bound_arena_tops({"GLIBC_TUNABLES": "glibc.rtld.nns=2"})
    assert calls == [(heap.MMAP_THRESHOLD, heap.TRIM_THRESHOLD)]


def test_native_heap_bound_checks_its_arguments():
    from mvc.native._lib import lib
    from mvc.native.status import ERR_ARG

    assert lib.mvc_heap_bound(0, 1 << 20) == ERR_ARG
    assert lib.mvc_heap_bound(1 << 20, 0) == ERR_ARG
    assert lib.mvc_heap_bound(1 << 40, 1 << 20) == ERR_ARG
    assert lib.mvc_heap_bound(1 << 20, 1 << 40) == ERR_ARG


# ------------------------------------------------------------------ release_mapped
@linux_only
def test_release_mapped_unmaps_a_file_mapping_and_keeps_its_contents(tmp_path):
    import mmap
    import os

    from mvc.native.heap import release_mapped

    data = os.urandom(8 << 20)
    path = tmp_path / "values"
    path.write_bytes(data)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    view = memoryview(m)
    try:
        assert bytes(view) == data                        # every page touched
        assert mapped(path) >= 8 << 20
        assert release_mapped(view[3:(6 << 20) + 5])       # unaligned ends: their whole pages
        assert mapped(path) <= (2 << 20) + 8192
        assert bytes(view) == data                        # faulted back in, the same bytes
        assert release_mapped(view) and release_mapped(view[:0])
        assert mapped(path) == 0
    finally:
        view.release()
        m.close()


def test_release_mapped_refuses_what_cannot_be_a_read_only_mapping():
    from mvc.native.heap import release_mapped

    data = bytearray(b"x" * 20000)
    assert not release_mapped(data) and not release_mapped(memoryview(data))
    assert not release_mapped(bytes(data))
    assert data == bytearray(b"x" * 20000)          # heap memory left as it was


def test_release_mapped_checks_its_range():
    from mvc.native import ffi, lib

    assert lib.mvc_release_mapped(ffi.NULL, 0) == 0
    assert lib.mvc_release_mapped(ffi.NULL, 4096) == -3                 # MVC_ERR_ARG
    top = ffi.cast("void *", (1 << (8 * ffi.sizeof("void *"))) - 4096)
    assert lib.mvc_release_mapped(top, 1 << 20) == -3                   # p + n wraps


def test_a_commit_trims_the_heap_before_its_level_cache_copies(tmp_path, monkeypatch):
    """The level cache takes host copies of a device state's levels on the committing thread,
    whose arena does not reuse the pool threads' free pieces: what the writer freed goes back
    to the OS between the write and those copies, so they do not land on top of it (the
    H200's commits peaked 0.1x the checkpoint over their write phase)."""
    import torch

    import mvc.native.heap as heap
    import mvc.repo.pipeline  # noqa: F401 - imported before the spy: only the commit's own trim is seen
    from mvc.repo.repository import Repo
    from mvc.repo.transaction import CommitTransaction

    calls: list[str] = []

    def spy(name: str, real):
        def run(*a, **k):
            calls.append(name)
            return real(*a, **k)
        return run

    monkeypatch.setattr(heap, "release_free_heap", spy("trim", heap.release_free_heap))
    monkeypatch.setattr(Repo, "_remember_levels", spy("remember", Repo._remember_levels))
    monkeypatch.setattr(CommitTransaction, "commit", spy("write", CommitTransaction.commit))
    with Repo.init(tmp_path / "r") as repo:
        repo.commit({"w": torch.randn(64, 64)}, "c0", epsilon=0.05)
    assert calls[calls.index("write") + 1:calls.index("remember")] == ["trim"], calls
