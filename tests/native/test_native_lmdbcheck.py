"""native/lmdbcheck.c against the Python reading of LMDB's pages in tests/helpers/lmdb_reference.

Real LMDB files (named databases, trees three levels deep, big values on overflow pages, free
lists) are damaged one field or byte at a time, or truncated: the native check must give the
reference's verdict every time, and whatever it accepts, LMDB must read without dying.
"""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import lmdb
import lmdb_reference as ref
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvc.native.lmdb_pages import LmdbFileDamagedError, check_header, check_snapshot

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _make(directory: Path, seed: int) -> bytes:
    """An LMDB file as mvc's stores look: four named databases, small and big values, keys
    deleted and rewritten over several transactions (so the free list has records)."""
    rng = random.Random(seed)
    env = lmdb.open(str(directory), map_size=64 << 20, max_dbs=8, subdir=True, lib_version=0)
    dbs = [env.open_db(name.encode()) for name in ("objects", "refs", "reflog", "meta")]
    for round_ in range(4):
        with env.begin(write=True) as txn:
            for i in range(300):
                key = f"{rng.randrange(10**6):08d}-{round_}-{i}".encode()
                size = rng.choice((8, 200, 1500, 5000, 20000))
                txn.put(key, rng.randbytes(size), db=dbs[0])
            for i in range(20):
                txn.put(f"refs/heads/b{rng.randrange(50)}".encode(), rng.randbytes(40), db=dbs[1])
            txn.put(b"format", b"1", db=dbs[3])
        with env.begin(write=True) as txn:
            keys = [k for k, _ in txn.cursor(db=dbs[0])]
            for key in rng.sample(keys, len(keys) // 3):
                txn.delete(key, db=dbs[0])
    env.close()
    return (directory / "data.mdb").read_bytes()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[bytes]:
    return [_make(tmp_path_factory.mktemp(f"env{seed}"), seed) for seed in range(2)]


def _native(b: bytes, txnid: int | None = None, deep: bool = False) -> str:
    try:
        check_header(b[:65536])
        return "ok" if check_snapshot(b, txnid, deep) else "changed"
    except LmdbFileDamagedError as e:
        return "truncated" if "ends inside" in str(e) else "corrupt"


def _txnid(b: bytes) -> int:
    ps = ref.page_size(b, 0)
    assert ps
    return max(ref.u64(b, ref.PAGEHDRSZ + 128), ref.u64(b, ps + ref.PAGEHDRSZ + 128))


def test_sound_files_pass_both(files):
    for b in files:
        nodes = ref.nodes(b)
        assert {n.db for n in nodes} == {"free", "main", "named"}
        assert any(n.flags == ref.F_BIGDATA for n in nodes)
        assert any(n.branch for n in nodes if n.db == "named")
        for deep in (False, True):
            assert _native(b, None, deep) == ref.check(b, None, deep) == "ok"
            assert _native(b, _txnid(b), deep) == "ok"


def test_another_transaction_is_changed_not_damaged(files):
    b = files[0]
    assert _native(b, _txnid(b) + 5) == ref.check(b, _txnid(b) + 5) == "changed"
    # the older meta page is still a snapshot of its own, checked as such
    assert _native(b, _txnid(b) - 1) == ref.check(b, _txnid(b) - 1)


def _set(b: bytes, at: int, value: int, width: int) -> bytes:
    out = bytearray(b)
    out[at:at + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    return bytes(out)


# The fields a damaged file gets wrong: a node's size/page words, flags, key size; a page
# header's number, flags, bounds; a node offset.
NODE_FIELDS = [(0, 2), (2, 2), (4, 2), (6, 2), (8, 8)]
PAGE_FIELDS = [(0, 8), (10, 2), (12, 2), (14, 2), (16, 2), (18, 2)]
VALUES = st.one_of(st.sampled_from([0, 1, 2, 3, 0xFFFF, 0x7FFF, 4096, 1 << 16, (1 << 48) - 1,
                                    (1 << 64) - 1]), st.integers(0, (1 << 64) - 1))


@SETTINGS
@given(which=st.integers(0, 1), pick=st.integers(0, 10**6), field=st.sampled_from(NODE_FIELDS),
       value=VALUES, deep=st.booleans())
def test_a_damaged_node_field_gets_the_reference_verdict(files, which, pick, field, value, deep):
    b = files[which]
    nodes = ref.nodes(b)
    node = nodes[pick % len(nodes)]
    damaged = _set(b, node.offset + field[0], value, field[1])
    assert _native(damaged, None, deep) == ref.check(damaged, None, deep)


@SETTINGS
@given(which=st.integers(0, 1), pick=st.integers(0, 10**6), field=st.sampled_from(PAGE_FIELDS),
       value=VALUES, deep=st.booleans())
def test_a_damaged_page_header_gets_the_reference_verdict(files, which, pick, field, value, deep):
    b = files[which]
    ps = ref.page_size(b, 0)
    pages = sorted({n.page for n in ref.nodes(b)} | {0, 1})
    page = pages[pick % len(pages)]
    damaged = _set(b, page * ps + field[0], value, field[1])
    assert _native(damaged, None, deep) == ref.check(damaged, None, deep)


@SETTINGS
@given(which=st.integers(0, 1), at=st.integers(0, 10**9), xor=st.integers(1, 255),
       deep=st.booleans())
def test_any_flipped_byte_gets_the_reference_verdict(files, which, at, xor, deep):
    b = bytearray(files[which])
    b[at % len(b)] ^= xor
    assert _native(bytes(b), None, deep) == ref.check(bytes(b), None, deep)


@SETTINGS
@given(which=st.integers(0, 1), keep=st.integers(0, 10**9))
def test_a_truncated_file_gets_the_reference_verdict(files, which, keep):
    b = files[which][:keep % (len(files[which]) + 1)]
    if not b:
        with pytest.raises(LmdbFileDamagedError):
            check_snapshot(b, None)
        return
    assert _native(b) == ref.check(b)


READER = r"""
import sys, lmdb
for path in sys.argv[1:]:
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=8, subdir=True, lib_version=0)
    try:
        with env.begin() as txn:
            for name in (b"objects", b"refs", b"reflog", b"meta"):
                try:
                    db = env.open_db(name, txn=txn, create=False)
                    for key, value in txn.cursor(db=db):
                        bytes(value)
                except lmdb.Error:
                    pass
    except lmdb.Error:
        pass
    finally:
        env.close()
print("read all")
"""


def _read_all(paths: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", READER, *map(str, paths)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_lmdb_reads_every_file_the_check_accepts(files, tmp_path):
    """Random damage the check lets through (a flipped byte in a value, a stale free page...)
    LMDB reads without dying: the check covers what LMDB trusts."""
    rng = random.Random(7)
    accepted = []
    all_nodes = [ref.nodes(f) for f in files]
    for i in range(400):
        b = bytearray(files[i % 2])
        nodes = all_nodes[i % 2]
        if i % 2:
            b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
        else:
            node = rng.choice(nodes)
            at, width = rng.choice(NODE_FIELDS)
            b = bytearray(_set(bytes(b), node.offset + at, rng.randrange(1 << (8 * width)), width))
        if _native(bytes(b)) == "ok":
            d = tmp_path / f"a{i}"
            d.mkdir()
            (d / "data.mdb").write_bytes(bytes(b))
            accepted.append(d)
    assert len(accepted) > 100
    done = _read_all(accepted)
    assert done.returncode == 0 and "read all" in done.stdout, done.stderr[-2000:]


def test_what_the_check_refuses_can_kill_lmdb(files, tmp_path):
    """Why the check exists: a big value whose overflow pages run past the end of the file
    passes LMDB's own checks, and reading it dies of SIGBUS in the map."""
    b = files[0]
    ps = ref.page_size(b, 0)
    big = next(n for n in ref.nodes(b) if n.db == "named" and n.flags == ref.F_BIGDATA)
    last = len(b) // ps - 1
    damaged = _set(b, big.offset + ref.NODESIZE + len(big.key), last, 8)
    assert _native(damaged) == ref.check(damaged) == "corrupt"
    d = tmp_path / "env"
    d.mkdir()
    (d / "data.mdb").write_bytes(damaged)
    died = _read_all([d])
    assert died.returncode < 0 and "read all" not in died.stdout


def test_a_zero_page_size_is_refused_before_lmdb_opens(files):
    b = _set(files[0], ref.PAGEHDRSZ + 24, 0, 4)
    with pytest.raises(LmdbFileDamagedError, match="page size"):
        check_header(b[:65536])
    with pytest.raises(LmdbFileDamagedError, match="ends inside"):
        check_header(files[0][:4200])
    with pytest.raises(LmdbFileDamagedError, match="format 3"):
        check_header(_set(files[0], ref.PAGEHDRSZ + 4, 3, 4)[:65536])


def test_the_check_reads_inside_the_buffer_only(files):
    """Every length of a sound file's prefix, with the bytes after it unreadable to the check
    (a bytes object of exactly that length): the sanitizer run sees any read past it."""
    b = files[1]
    ps = ref.page_size(b, 0)
    for n in list(range(0, 2 * ps + 200, 97)) + [len(b) - 1, len(b) - ps]:
        if n:
            _native(bytes(b[:n]))
