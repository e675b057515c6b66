"""fsck reports damage instead of crashing or hanging (issue 12, defects 4 and 5).

* gc's replacements (`refs/replace/<snapshot>`) are followed exactly one level:
  a chain or a loop of them is a `ReplacementError`, never a hang, and fsck
  reports it, as it reports replacements of or to missing objects and non-snapshots.
* every unreadable ref or reflog record (a flipped byte anywhere in them) is a
  reported problem with fsck's exit code, never a traceback; other commands
  meeting one fail with one line and the data-error exit code.
"""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from store_contract import corrupt_object

from mvc.cli.commands_maint import FsckFailed
from mvc.cli.main import main
from mvc.quant import QuantConfig
from mvc.repo.lossy import BrokenChainError
from mvc.repo.replace import REPLACE, ReplacementError
from mvc.repo.repository import Repo
from mvc.repo.revparse import UnknownRevisionError
from mvc.store import ANY, CorruptRefError, CorruptReflogError, IntegrityError, RefUpdate

MVC = [sys.executable, "-m", "mvc"]


def _bounded(fn, timeout: float = 30.0):
    """Run `fn` in a thread; fail (instead of hanging the suite) if it does not finish in time.
    Returns ("ok", value) or ("raised", exception)."""
    out: dict = {}

    def run():
        try:
            out["ok"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["raised"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} did not finish in {timeout}s (hang)"
    return next(iter(out.items()))


def _lossy_repo(root: Path, n: int = 3) -> tuple[list[str], list[str]]:
    """`n` quantized commits, each a delta on the previous: (commit ids, snapshot ids)."""
    repo = Repo.init(root)
    repo.config.set("cache.levels_keep", 0)  # every read walks its chain from the store
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g)
    ids = []
    for t in range(n):
        w = w + 0.01 * torch.randn(64, 64, generator=g)
        ids.append(repo.commit({"w": w}, f"c{t}", quant=QuantConfig(bins=8)))
    sids = [repo.read_commit(c).snapshot for c in ids]
    assert [r.codec for r in repo.read_snapshot(sids[-1]).tensors] == ["qdelta/1"]
    repo.close()
    return ids, sids


def _set_replacements(root: Path, pairs: list[tuple[str, str]]) -> None:
    with Repo(root) as repo:
        repo.store.refs.update_refs([RefUpdate(REPLACE + a, ANY, b) for a, b in pairs], "test")


def _cli(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`mvc -C root ARGS` in a fresh process: the real exit code and stderr."""
    return subprocess.run([*MVC, "-C", str(root), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def _cli_here(root: Path, args: list[str], capsys) -> tuple[int, str, str]:
    """The same, in this process (torch is imported once): (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(["-C", str(root), *args])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------ replacements
def test_replacement_loop_is_an_error_not_a_hang(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `-C` changes directory in this process
    root = tmp_path / "r"
    ids, sids = _lossy_repo(root)
    _set_replacements(root, [(sids[0], sids[1]), (sids[1], sids[0])])
    with Repo(root) as repo:  # fresh: no level cache
        for cid in ids:
            kind, value = _bounded(lambda cid=cid: repo.read_state(cid))
            assert kind == "raised" and isinstance(value, ReplacementError), value
            assert REPLACE + sids[0] in str(value) and "loop" in str(value)
        _, value = _bounded(lambda: repo.checkout(ids[0]))
        assert isinstance(value, ReplacementError)
        report = _bounded(repo.fsck)[1]
        assert not report.ok
        assert any("loop" in p and REPLACE + sids[0] in p for p in report.problems)
        assert any("loop" in p and REPLACE + sids[1] in p for p in report.problems)
    proc = _cli(root, "checkout", ids[2], "-o", "out.pt")
    assert proc.returncode == ReplacementError.exit_code, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    code, out, _ = _cli_here(root, ["fsck"], capsys)
    assert code == FsckFailed.exit_code and "loop" in out


def test_replacement_chain_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "r"
    ids, sids = _lossy_repo(root)
    # A -> B -> C. Following B alone is one level, but C is B's child: its delta names B, which
    # reads as C again -- a loop through the deltas that the chain walk must catch too.
    _set_replacements(root, [(sids[0], sids[1]), (sids[1], sids[2])])
    with Repo(root) as repo:
        _, value = _bounded(lambda: repo.read_state(ids[0]))
        assert isinstance(value, ReplacementError) and "chain" in str(value)
        assert REPLACE + sids[0] in str(value) and sids[2] in str(value)
        _, value = _bounded(lambda: repo.read_state(ids[1]))
        assert isinstance(value, BrokenChainError) and "loops" in str(value)
        problems = _bounded(repo.fsck)[1].problems
        assert any("chain" in p and REPLACE + sids[0] in p for p in problems)
        assert any(REPLACE + sids[1] in p and "loops back" in p for p in problems)
    assert _cli_here(root, ["fsck"], capsys)[0] == FsckFailed.exit_code
    code, _, err = _cli_here(root, ["checkout", ids[0], "-o", "out.pt"], capsys)
    assert code == ReplacementError.exit_code and err.count("\n") == 1


def test_replacements_to_missing_objects_and_non_snapshots_are_reported(tmp_path):
    root = tmp_path / "r"
    ids, sids = _lossy_repo(root)
    missing = "0" * 32
    _set_replacements(root, [(sids[0], missing), (sids[1], ids[1]), ("f" * 32, sids[2])])
    with Repo(root) as repo:
        problems = repo.fsck().problems
        assert any(f"replacement snapshot {missing} is missing" in p for p in problems)
        assert any(REPLACE + sids[1] in p and "is a commit, not a snapshot" in p
                   for p in problems)
        assert any(REPLACE + "f" * 32 in p and "missing" in p for p in problems)
        with pytest.raises(ReplacementError, match="not a snapshot"):
            repo.read_state(ids[1])
        with pytest.raises(Exception) as exc:
            repo.read_state(ids[0])
        assert missing in str(exc.value)


def test_gc_replacements_stay_one_level_and_fsck_clean(tmp_path):
    root = tmp_path / "r"
    ids, _ = _lossy_repo(root, n=6)
    with Repo(root) as repo:
        before = {c: repo.read_state(c)["w"] for c in ids}
        assert repo.gc(max_chain=2).snapshots_rewritten > 0
        assert repo.gc(max_chain=1).snapshots_rewritten > 0  # replaces some replacements again
        reps = dict(repo.store.refs.iter_refs(REPLACE))
        assert reps and not any(REPLACE + v in reps for v in reps.values())
        assert repo.fsck().ok, repo.fsck().problems
    with Repo(root) as repo:
        for c in ids:
            assert torch.equal(repo.read_state(c)["w"], before[c])


def test_publish_replacement_keeps_one_level(tmp_path):
    from mvc.repo.replace import follow_replacement, publish_replacement

    root = tmp_path / "r"
    _, sids = _lossy_repo(root)
    a, b, c = sids
    with Repo(root) as repo:
        store = repo.store.refs
        publish_replacement(store, a, b, "t")      # a -> b
        publish_replacement(store, b, c, "t")      # b -> c: a must move to c
        assert (store.read_ref(REPLACE + a), store.read_ref(REPLACE + b)) == (c, c)
        publish_replacement(store, a, b, "t")      # b is replaced: a names b's target
        assert store.read_ref(REPLACE + a) == c
        publish_replacement(store, c, a, "t")      # a reads as c: c needs no replacement
        assert store.read_ref(REPLACE + c) is None
        assert {follow_replacement(store, s) for s in sids} == {c}


# ------------------------------------------------------------ _is_commit
def test_corrupt_commit_is_a_corrupt_object_not_an_unknown_revision(tmp_path):
    repo = Repo.init(tmp_path / "r")
    repo.config.set("commit.mode", "lossless")
    first = repo.commit({"w": torch.zeros(4)}, "first")
    cid = repo.commit({"w": torch.ones(4)}, "second")
    corrupt_object(repo.store, cid, 20)
    for rev in (cid, cid[:12]):
        with pytest.raises(IntegrityError, match=cid):
            repo.resolve(rev)
    assert repo.resolve(first[:12]) == first
    repo.store.blobs.delete([first])  # missing (a concurrent gc): no such revision, as before
    with pytest.raises(UnknownRevisionError):
        repo.resolve(first[:12])
    repo.close()


# ------------------------------------------------------------ ref and reflog records
def _records(store) -> list[tuple[str, bytes, bytes]]:
    """Every (database, key, value) of the ref and reflog databases."""
    h = store._h()

    def fn(txn):
        return [(db, bytes(k), bytes(v)) for db in ("refs", "reflog")
                for k, v in txn.cursor(db=h.dbs[db]).iternext()]
    return h.read(fn)


def _put_records(store, records: list[tuple[str, bytes, bytes]]) -> None:
    """Make the ref and reflog databases hold exactly `records`."""
    h = store._h()

    def fn(txn):
        for db in ("refs", "reflog"):
            txn.drop(h.dbs[db], delete=False)
        for db, k, v in records:
            txn.put(k, v, db=h.dbs[db])
    h.write(fn)


def _view(store) -> tuple:
    """What refs and reflog mean (values, and each log's moves): equal views restore the
    same history. Times and reasons are text for people, so they are left out."""
    refs = dict(store.refs.iter_refs(""))
    logs = {n: [(e.old, e.new) for e in store.refs.reflog(n)] for n in store.refs.reflog_names()}
    return refs, logs


@pytest.fixture
def small_repo(tmp_path):
    root = tmp_path / "r"
    repo = Repo.init(root)
    repo.config.set("commit.mode", "lossless")
    for i in range(3):
        repo.commit({"w": torch.full((8,), float(i))}, f"commit {i}")
    repo.branch("b", "HEAD~1")
    repo.tag("t")
    yield root, repo
    repo.close()


def _flips(records, patterns, every_pattern: bool):
    """(index, 'key'|'value', position, pattern) for every byte of every record: with each
    pattern, or with one per byte, taken in turn."""
    n = 0
    for i, (_, k, v) in enumerate(records):
        for part, data in (("key", k), ("value", v)):
            for pos in range(len(data)):
                for pat in (patterns if every_pattern else [patterns[n % len(patterns)]]):
                    yield i, part, pos, pat
                n += 1


def _corrupted(records, i, part, pos, pat):
    db, k, v = records[i]
    data = bytearray(k if part == "key" else v)
    data[pos] ^= pat
    new = (db, bytes(data), v) if part == "key" else (db, k, bytes(data))
    return [r for j, r in enumerate(records) if j != i] + [new]


def _sweep(root: Path, repo: Repo, patterns, every_pattern: bool, cli_every: int,
           monkeypatch, capsys) -> int:
    store = repo.store
    records = _records(store)
    assert sum(len(k) + len(v) for _, k, v in records) > 800  # every record of the repo
    baseline = _view(store)
    assert repo.fsck().ok
    monkeypatch.chdir(root)
    reported = 0
    for n, (i, part, pos, pat) in enumerate(_flips(records, patterns, every_pattern)):
        what = f"{records[i][0]} record {records[i][1]!r}: {part} byte {pos} ^ {pat:#x}"
        _put_records(store, _corrupted(records, i, part, pos, pat))
        report = repo.fsck()  # must not raise, whatever the flip
        if report.ok:
            # Not reported: then it must be harmless -- every ref and every logged move as
            # before (a flip inside a reason or a time is just text).
            assert _view(store) == baseline, what
        else:
            reported += 1
            assert all("\n" not in p for p in report.problems), what
        if n % cli_every == 0:
            capsys.readouterr()
            code = main(["fsck"])
            out, err = capsys.readouterr()
            assert code == (0 if report.ok else FsckFailed.exit_code), (what, out, err)
            assert "internal error" not in err and "Traceback" not in err, what
    _put_records(store, records)
    assert repo.fsck().ok and _view(store) == baseline
    return reported


PATTERNS = (0x01, 0x80, 0xFF, 0x20, 0x04, 0x40, 0x02, 0x10, 0x08)


def test_every_flip_in_refs_and_reflog_is_reported_or_harmless(small_repo, monkeypatch, capsys):
    root, repo = small_repo
    reported = _sweep(root, repo, PATTERNS, every_pattern=False, cli_every=5,
                      monkeypatch=monkeypatch, capsys=capsys)
    assert reported > 150


@pytest.mark.slow
def test_every_flip_every_pattern(small_repo, monkeypatch, capsys):
    root, repo = small_repo
    _sweep(root, repo, PATTERNS, every_pattern=True, cli_every=1, monkeypatch=monkeypatch,
           capsys=capsys)


def _file_sweep(tmp_path: Path, root: Path, repo: Repo, sample: int | None) -> int:
    """Flip bytes of the LMDB file itself wherever a ref or reflog record's bytes lie (stale
    page copies and object keys equal to ref values included): fsck of each damaged copy
    reports a problem or reads every ref and logged move as before."""
    import random
    import shutil

    records = _records(repo.store)
    baseline = _view(repo.store)
    repo.close()
    data = (root / ".mvc" / "store" / "data.mdb").read_bytes()
    positions: set[int] = set()
    for _, k, v in records:
        for blob in (k, v):
            at = data.find(blob)
            while at >= 0:
                positions.update(range(at, at + len(blob)))
                at = data.find(blob, at + 1)
    cases = sorted(positions)
    assert len(cases) > 900
    if sample is not None:
        cases = random.Random(12).sample(cases, sample)
    reported = 0
    for n, pos in enumerate(cases):
        work = tmp_path / f"flip{n}"
        shutil.copytree(root, work)
        path = work / ".mvc" / "store" / "data.mdb"
        damaged = bytearray(path.read_bytes())
        damaged[pos] ^= PATTERNS[n % len(PATTERNS)]
        path.write_bytes(damaged)
        with Repo(work) as copy:
            report = copy.fsck()  # must not raise
            if report.ok:
                assert _view(copy.store) == baseline, f"byte {pos}"
            else:
                reported += 1
        shutil.rmtree(work)
    return reported


def test_flips_in_the_store_file_are_reported_or_harmless(small_repo, tmp_path):
    root, repo = small_repo
    assert _file_sweep(tmp_path, root, repo, sample=150) > 20


@pytest.mark.slow
def test_every_flip_in_the_store_file(small_repo, tmp_path):
    root, repo = small_repo
    _file_sweep(tmp_path, root, repo, sample=None)


def _set_raw(store, db: str, key: bytes, value: bytes) -> None:
    records = [r for r in _records(store) if not (r[0] == db and r[1] == key)]
    _put_records(store, records + [(db, key, value)])


def test_corrupt_ref_value_is_a_typed_error_naming_the_ref(small_repo, capsys, monkeypatch):
    root, repo = small_repo
    monkeypatch.chdir(root)
    _set_raw(repo.store, "refs", b"refs/heads/main", b"\xff\xfe not utf-8")
    with pytest.raises(CorruptRefError, match="refs/heads/main"):
        repo.head()
    with pytest.raises(CorruptRefError, match="refs/heads/main"):
        repo.branches()
    report = repo.fsck()
    assert any("refs/heads/main" in p and "corrupt" in p for p in report.problems)
    for args in (["log"], ["checkout", "main", "-o", "out.pt"], ["branch"], ["status"], ["gc"]):
        code, _, err = _cli_here(root, args, capsys)
        assert code == CorruptRefError.exit_code, (args, err)
        assert err.count("\n") == 1 and "refs/heads/main" in err, args
    proc = _cli(root, "fsck")
    assert proc.returncode == FsckFailed.exit_code and "refs/heads/main" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_corrupt_reflog_entry_is_a_typed_error(small_repo, capsys, monkeypatch):
    root, repo = small_repo
    monkeypatch.chdir(root)
    key = next(k for db, k, _ in _records(repo.store) if db == "reflog"
               and k.startswith(b"refs/heads/main\x00"))
    _set_raw(repo.store, "reflog", key, b'{"old":null,"new":')
    with pytest.raises(CorruptReflogError, match="refs/heads/main"):
        repo.store.refs.reflog("refs/heads/main")
    problems = repo.fsck().problems
    assert any("reflog of refs/heads/main" in p and "corrupt" in p for p in problems)
    code, _, err = _cli_here(root, ["gc"], capsys)  # gc must not guess what is reachable
    assert code == CorruptReflogError.exit_code and err.count("\n") == 1
    assert _cli_here(root, ["fsck"], capsys)[0] == FsckFailed.exit_code


def test_renamed_ref_is_reported(small_repo):
    """A flip that keeps a ref's name valid moves the branch; its reflog tells."""
    _, repo = small_repo
    records = _records(repo.store)
    db, k, v = next(r for r in records if r[1] == b"refs/heads/main")
    _put_records(repo.store, [r for r in records if r[1] != k] + [(db, b"refs/heads/mbin", v)])
    problems = repo.fsck().problems
    assert any("refs/heads/main: is missing" in p for p in problems), problems
    assert any("refs/heads/mbin: has no reflog" in p for p in problems), problems
