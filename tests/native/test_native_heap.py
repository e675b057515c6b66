"""release_free_heap: memory freed in pieces the allocator kept goes back to the OS (glibc).

Run in a fresh interpreter: how a long test process's heap looks (its arenas, what it freed
before) is not this test's to control."""
from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, os
from mvc.native.heap import release_free_heap

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
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
