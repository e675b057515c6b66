"""A damaged LMDB page is a typed "store is damaged" error (exit 63) with a one-line message,
never a traceback: LMDB's own consistency errors (MDB_CORRUPTED, MDB_INVALID, ...) met while
opening the store or its databases, as the corruption sweep found them."""
from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mvc.repo.repository import Repo
from mvc.store import StoreFormatError

MVC = [sys.executable, "-m", "mvc"]


def _data_file(root: Path) -> Path:
    return next((root / ".mvc").rglob("data.mdb"))


def _main_root_page(raw: bytes) -> tuple[int, int]:
    """(page size, page number of the main database's root) from the newer meta page.

    LMDB 0.9's meta page: a 16-byte page header, then magic, version, address, map size,
    two 48-byte database records (free list, main: its root at byte 40), last page, txn id.
    """
    psize = struct.unpack_from("<I", raw, 16 + 24)[0]  # the free-list record's pad = page size
    metas = []
    for page in (0, psize):
        txnid = struct.unpack_from("<Q", raw, page + 16 + 24 + 96 + 8)[0]
        root = struct.unpack_from("<Q", raw, page + 16 + 24 + 48 + 40)[0]
        metas.append((txnid, root))
    return psize, max(metas)[1]


@pytest.fixture
def damaged(tmp_path):
    root = tmp_path / "repo"
    repo = Repo.init(root)
    repo.commit({"w": torch.arange(64, dtype=torch.float32)}, "one", lossless=True)
    repo.close()
    data = _data_file(root)
    raw = bytearray(data.read_bytes())
    psize, page = _main_root_page(bytes(raw))
    struct.pack_into("<H", raw, page * psize + 10, 0)  # the root page's flags: no page type
    data.write_bytes(bytes(raw))
    return root


def test_the_api_raises_a_typed_error(damaged):
    with pytest.raises(StoreFormatError, match="is damaged"):
        Repo(damaged)


def test_the_cli_exits_63_with_one_line(damaged):
    p = subprocess.run([*MVC, "log"], cwd=damaged, capture_output=True, text=True, timeout=120)
    assert p.returncode == 63, p.stderr
    assert "damaged" in p.stderr and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0
