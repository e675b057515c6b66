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


def _big_value_past_the_end(root: Path) -> None:
    """Point one stored object's overflow page at the file's last page, so its bytes run past
    the end: LMDB itself follows that and dies of SIGBUS in its map (tests/native/
    test_native_lmdbcheck.py shows it), where mvc's check of the pages refuses the file."""
    import lmdb_reference as ref

    data = _data_file(root)
    raw = bytearray(data.read_bytes())
    psize = ref.page_size(bytes(raw), 0)
    assert psize
    big = next(n for n in ref.nodes(bytes(raw)) if n.db == "named" and n.flags == ref.F_BIGDATA)
    struct.pack_into("<Q", raw, big.offset + ref.NODESIZE + len(big.key), len(raw) // psize - 1)
    data.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", ["overflow past the end", "zero page size", "version 3"])
def test_pages_lmdb_would_die_on_are_refused_before_it_reads_them(tmp_path, damage):
    root = tmp_path / "repo"
    repo = Repo.init(root)
    repo.commit({"w": torch.randn(4096)}, "one", lossless=True)
    repo.close()
    data = _data_file(root)
    if damage == "overflow past the end":
        _big_value_past_the_end(root)
    else:
        raw = bytearray(data.read_bytes())
        # meta page 0: the page size (free record's pad) or the data format's version word
        struct.pack_into("<I", raw, 16 + (24 if damage == "zero page size" else 4),
                         0 if damage == "zero page size" else 3)
        data.write_bytes(bytes(raw))
    before = data.read_bytes()
    # in a child process: without the page check the first killed it (SIGBUS); LMDB refuses the
    # others itself, the header check first
    p = subprocess.run([*MVC, "log"], cwd=root, capture_output=True, text=True, timeout=120)
    assert p.returncode == 63, (p.returncode, p.stderr)
    assert "damaged" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([*MVC, "fsck"], cwd=root, capture_output=True, text=True, timeout=120)
    assert p.returncode == 63, (p.returncode, p.stderr)
    with pytest.raises(StoreFormatError, match="is damaged"):
        Repo(root)
    assert data.read_bytes() == before   # nothing was written to the damaged file


def test_a_damaged_overflow_page_count_stops_fsck_and_deletes_not_reads(tmp_path):
    """A big value's first overflow page says how many pages deleting it frees: a wrong count
    would hand other values' pages to the next write.  Reads never use it (the open's check
    leaves it unread); fsck and the first delete check it, and refuse."""
    import lmdb_reference as ref

    from mvc.store.lmdb_store import LmdbStore

    store = LmdbStore.create(tmp_path / ".mvc")
    oid = store.blobs.put(bytes(range(256)) * 64)
    keep = store.blobs.put(b"k" * 9000)
    store.close()
    data = _data_file(tmp_path)
    raw = bytearray(data.read_bytes())
    psize = ref.page_size(bytes(raw), 0)
    assert psize
    node = next(n for n in ref.nodes(bytes(raw)) if n.db == "named" and n.key == oid.encode()
                and n.flags == ref.F_BIGDATA)
    page = struct.unpack_from("<Q", raw, node.offset + ref.NODESIZE + len(node.key))[0]
    struct.pack_into("<I", raw, page * psize + 12, 1)  # mp_pages: fewer than the value fills
    data.write_bytes(bytes(raw))
    before = data.read_bytes()
    store = LmdbStore.open(tmp_path / ".mvc")
    try:
        assert store.blobs.get(oid) == bytes(range(256)) * 64 and store.blobs.get(keep) == b"k" * 9000
        with pytest.raises(StoreFormatError, match="overflow page"):
            store.blobs.delete([keep])
        with pytest.raises(StoreFormatError, match="overflow page"):
            store.maintenance.check_meta(repair=True)
    finally:
        store.close()
    assert data.read_bytes() == before
    p = subprocess.run([*MVC, "fsck"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 63 and "overflow page" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_a_value_lmdb_cannot_hold_is_a_bug_not_a_damaged_store(tmp_path):
    """LMDB refuses a value of 4 GiB or more (MDB_BAD_VALSIZE) whatever its file holds: that is
    a size mvc asked for, not damage, so the user is not sent to restore a sound store."""
    import lmdb

    from mvc.errors import InternalError
    from mvc.store.lmdb_env import io_error

    got = io_error(str(tmp_path), lmdb.BadValsizeError("mdb_put: MDB_BAD_VALSIZE"))
    assert isinstance(got, InternalError) and not isinstance(got, StoreFormatError)
    assert "damaged" not in str(got)
    assert isinstance(io_error(str(tmp_path), lmdb.CorruptedError("x")), StoreFormatError)
