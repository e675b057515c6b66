"""Giving freed heap memory back to the operating system.

A commit's host temporaries (the search's on the host, the writer's encodings) are allocated
and freed in pieces of a few MB, which glibc's malloc keeps in its arenas once freed (past a
freed mapping of that size it serves them from the heap). The process's resident memory then
stays near the commit's peak after it, and the next phase's peak lands on top: a training
process that commits holds that much more between commits. Trimming after each phase costs
milliseconds.
"""
from __future__ import annotations

from mvc.native._lib import lib


def release_free_heap() -> bool:
    """Return the C heap's free pages to the OS (glibc's `malloc_trim`); True when any were.
    A no-op elsewhere."""
    return bool(lib.mvc_heap_trim())
