"""Reading an LMDB store leaves none of its values mapped in this process.

py-lmdb pages a value in (touches each of its pages) whenever it is read, and a page of the
map, once touched, stays in the process's resident set until the map closes: a lossless
commit's presence checks mapped its whole store (+0.83x the checkpoint at 124M), a lossless
checkout every chunk it read.  Each read-only read now unmaps the value's pages once it is
consumed; the page cache keeps them, so reading again gives the same bytes.

Measured as the resident size of this process's mapping of the store's data file
(/proc/self/smaps): what the reads add, against the bytes they read."""
from __future__ import annotations

from pathlib import Path

import pytest
from mapped_pages import linux_only, mapped
from store_contract import blob

from mvc.store import LmdbStore
from mvc.store.lmdb_env import DATA_FILE

pytestmark = linux_only

MiB = 1 << 20
N, SIZE = 12, 4 * MiB   # 48 MiB of values: far above what a lookup's own pages map
#: What the reads may leave mapped: the B-tree's pages and what the kernel maps around them
#: (fault-around, large folios): bounded by the tree, not by the bytes read.
SLACK = 12 * MiB


@pytest.fixture
def filled(tmp_path: Path):
    root = tmp_path / ".mvc"
    LmdbStore.create(root).close()
    store = LmdbStore.open(root)
    values = [blob(SIZE, seed=i) for i in range(N)]
    ids = store.blobs.put_many(values)
    yield store, ids, values, root / "store" / DATA_FILE
    store.close()


def _reads(store, ids, values):
    blobs = store.blobs
    out = memoryview(bytearray(SIZE))
    return {
        "get": lambda: [blobs.get(o) for o in ids],
        "get_into": lambda: [blobs.get_into(o, out) for o in ids],
        "has": lambda: [blobs.has(o) for o in ids],
        "size": lambda: [blobs.size(o) for o in ids],
        "verify": lambda: [blobs.verify(o) for o in ids],
        "put_many of stored values": lambda: blobs.put_many(values),
        "check_meta's recount (fsck)": lambda: store.maintenance.check_meta(repair=False),
    }


@pytest.mark.parametrize("how", ["get", "get_into", "has", "size", "verify",
                                 "put_many of stored values", "check_meta's recount (fsck)"])
def test_reads_leave_no_values_mapped(filled, how: str) -> None:
    store, ids, values, data = filled
    read = _reads(store, ids, values)[how]
    before = mapped(data)
    read()
    assert mapped(data) - before < SLACK, f"{how} left values mapped"


def test_values_read_again_are_intact(filled) -> None:
    store, ids, values, data = filled
    for _ in range(2):   # the second pass reads pages unmapped by the first
        assert [store.blobs.get(o) for o in ids] == values
        out = memoryview(bytearray(SIZE))
        for o, v in zip(ids, values):
            assert store.blobs.get_into(o, out) == SIZE and out == v
        for o in ids:
            store.blobs.verify(o)
    assert mapped(data) < SLACK


def test_delete_counts_the_bytes_it_removes_without_mapping_them(filled) -> None:
    store, ids, values, data = filled
    before = mapped(data)
    total = store.blobs.object_bytes()
    assert store.blobs.delete(ids[:5] + ids[:2] + ["0" * 32]) == 5 * SIZE
    assert store.blobs.object_bytes() == total - 5 * SIZE
    assert not any(store.blobs.has(o) for o in ids[:5])
    assert all(store.blobs.has(o) for o in ids[5:])
    assert mapped(data) - before < SLACK


def test_only_values_inside_the_map_are_ever_released(filled) -> None:
    """`EnvHandle.in_map` is what guards every release: a read transaction's value is in the
    map; a write transaction's own dirty pages (a value put in it), and heap copies, are not
    (unmapping them would zero them)."""
    store, ids, values, data = filled
    h = store.blobs._conn.handle()
    objects = h.dbs["objects"]
    key = ids[0].encode("ascii")
    assert h.read(lambda txn: h.in_map(txn.get(key, db=objects)), buffers=True)
    assert not h.in_map(bytes(values[0])) and not h.in_map(bytearray(16))

    def fn(txn):
        txn.put(b"f" * 32, b"dirty page" * 1000, db=objects)
        dirty = txn.get(b"f" * 32, db=objects)
        inside = h.in_map(dirty)
        h.release(dirty)                       # left alone: the bytes are still there
        assert bytes(dirty) == b"dirty page" * 1000
        txn.delete(b"f" * 32, db=objects)
        return inside
    assert h.write(fn) is False
