"""How much of a file this process has mapped in its resident set (Linux: /proc/self/smaps).

Page-cache residency (mincore) says nothing of it: what counts in RSS, and in the OOM score,
is the pages mapped into this process."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

#: For tests that read /proc/self/smaps.
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self/smaps")


def mapped(path: str | Path) -> int:
    """Resident bytes of this process's mappings of the file at `path`."""
    total, inside = 0, False
    target = str(Path(path).resolve())
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                inside = len(head) >= 6 and head[-1] == target   # a mapping's header line
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total
