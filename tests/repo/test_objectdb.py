"""The one commit-graph walker (`mvc.repo.objectdb`): orders, merges, shared history,
replacements, delta parents, reflog-only roots, the `have` exclusion and damage.

Histories are built from hand-made commit and snapshot objects in a `MemoryStore` (no
tensors are encoded), so every shape of graph is cheap to make exactly.
"""
from __future__ import annotations

import pytest

from mvc.repo.objectdb import Damage, ObjectDB, Reached
from mvc.repo.objects import Commit, MalformedObjectError, Snapshot, TensorRecord
from mvc.repo.replace import REPLACE, ReplacementError
from mvc.store import ANY, MemoryStore, ObjectMissingError, RefUpdate, object_id


class History:
    """A MemoryStore and helpers that write chunks, snapshots and commits into it."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.db = ObjectDB(self.store.blobs, self.store.refs)
        self._t = 0

    def chunk(self, tag: str) -> str:
        return self.store.blobs.put(f"chunk {tag}".encode())

    def snapshot(self, *chunks: str, delta_of: str | None = None, tag: str = "") -> str:
        recs = [TensorRecord(name=f"t{i}", dtype="float32", shape=[1], codec="raw/1",
                             chunks=[c], stored_bytes=self.store.blobs.size(c), raw_bytes=4)
                for i, c in enumerate(chunks)]
        if delta_of is not None:
            d = self.chunk(f"delta {tag} {delta_of}")
            recs.append(TensorRecord(
                name="q", dtype="float32", shape=[4], codec="qdelta/1", chunks=[d],
                stored_bytes=self.store.blobs.size(d), raw_bytes=16, depth=1,
                meta={"parent": {"snapshot": delta_of, "name": "q"}, "refs": [delta_of]}))
        return self.store.blobs.put(Snapshot(recs, {"tag": tag}).encode())

    def commit(self, snapshot: str, *parents: str, msg: str = "") -> str:
        self._t += 1
        c = Commit(parents=list(parents), snapshot=snapshot, message=msg or f"c{self._t}",
                   time=f"2024-01-01T00:00:{self._t:02d}+00:00", author="t")
        return self.store.blobs.put(c.encode())

    def line(self, n: int, prefix: str = "", parent: str | None = None) -> list[str]:
        """`n` commits in a line, each with its own chunk: their ids, oldest first."""
        out = []
        for i in range(n):
            s = self.snapshot(self.chunk(f"{prefix}{i}"), tag=f"{prefix}{i}")
            parent = self.commit(s, *([parent] if parent else []))
            out.append(parent)
        return out

    def closure(self, *roots: str) -> set[str]:
        return {r.oid for r in self.db.reachable(roots)}


def kinds(reached: list[Reached]) -> dict[str, str]:
    return {r.oid: r.kind for r in reached}


def test_line_yields_every_object_once_and_orders():
    h = History()
    ids = h.line(4)
    got = list(h.db.reachable([ids[-1]]))
    assert len(got) == len({r.oid for r in got}) == 4 * 3  # commit, snapshot, chunk each
    assert sorted(k for k in kinds(got).values()) == ["chunk"] * 4 + ["commit"] * 4 + ["snapshot"] * 4
    # A referrer comes before what it names.
    pos = {r.oid: i for i, r in enumerate(got)}
    for r in got:
        if r.kind == "commit":
            assert pos[r.obj.snapshot] > pos[r.oid]
    assert [c.id for c in h.db.walk_commits([ids[-1]], order="topo")] == ids
    assert [c.id for c in h.db.walk_commits([ids[-1]], order="date")] == ids[::-1]
    assert {c.id for c in h.db.walk_commits([ids[-1]])} == set(ids)


def test_merge_and_shared_history_are_walked_once():
    h = History()
    base = h.line(2, "b")
    left = h.line(2, "l", parent=base[-1])
    right = h.line(3, "r", parent=base[-1])
    merge = h.commit(h.snapshot(h.chunk("m")), left[-1], right[-1])
    for order in ("any", "topo", "date"):
        seen = [c.id for c in h.db.walk_commits([merge, left[-1], right[0]], order=order)]
        assert sorted(seen) == sorted(base + left + right + [merge]), order
    topo = [c.id for c in h.db.walk_commits([merge], order="topo")]
    pos = {c: i for i, c in enumerate(topo)}
    for c in h.db.walk_commits([merge]):
        assert all(pos[p] < pos[c.id] for p in c.parents)
    # Newest first, across both branches of the merge.
    dated = list(h.db.walk_commits([merge], order="date"))
    assert [c.time for c in dated] == sorted((c.time for c in dated), reverse=True)
    # Two roots sharing history: each object once.
    got = [r.oid for r in h.db.reachable([left[-1], right[-1]])]
    assert len(got) == len(set(got)) == 3 * (2 + 2 + 3)


def test_date_order_reads_lazily():
    """`log -n 1` of a long history reads about one commit, not all of them."""
    h = History()
    ids = h.line(30)
    reads = []
    real = h.db.read_commit
    h.db.read_commit = lambda oid, **kw: (reads.append(oid), real(oid, **kw))[1]  # type: ignore[method-assign]
    walk = h.db.walk_commits([ids[-1]], order="date")
    assert next(walk).id == ids[-1]
    assert len(reads) <= 2


def test_identical_snapshots_and_chunks_are_shared():
    h = History()
    s = h.snapshot(h.chunk("same"))
    a = h.commit(s)
    b = h.commit(s, a)  # an unchanged checkpoint re-commits to the same snapshot
    got = list(h.db.reachable([b]))
    assert kinds(got) == {a: "commit", b: "commit", s: "snapshot", h.chunk("same"): "chunk"}
    assert len(got) == 4


def test_replacement_is_followed_and_the_original_kept_unread():
    h = History()
    old_chunk, new_chunk = h.chunk("old"), h.chunk("new")
    orig = h.snapshot(old_chunk, tag="orig")
    repl = h.snapshot(new_chunk, tag="repl")
    cid = h.commit(orig)
    h.store.refs.update_refs([RefUpdate(REPLACE + orig, None, repl)], "gc")
    assert h.db.resolve_snapshot_id(orig) == repl
    assert h.db.read_snapshot(orig).skeleton == {"tag": "repl"}
    got = {r.oid: r for r in h.db.reachable([cid])}
    assert set(got) == {cid, orig, repl, new_chunk}  # the replaced encoding's chunk is garbage
    assert got[orig].obj is None and got[orig].via == cid
    assert got[repl].replaces == orig and got[repl].obj.skeleton == {"tag": "repl"}
    # A side holding the original may still lack its replacement (and the replacement's chunks).
    assert {r.oid for r in h.db.reachable([cid], have={orig})} == {cid, repl, new_chunk}


def test_delta_parents_are_followed_even_off_the_commit_graph():
    """A delta needs the snapshot it is encoded against; the walk keeps it (and its chunks) even
    when no reachable commit names it."""
    h = History()
    pchunk = h.chunk("parent")
    parent_snap = h.snapshot(pchunk, tag="p")
    child = h.commit(h.snapshot(h.chunk("c"), delta_of=parent_snap, tag="c"))  # no parent commit
    got = {r.oid: r for r in h.db.reachable([child])}
    assert parent_snap in got and pchunk in got
    assert got[parent_snap].via == h.db.read_commit(child).snapshot
    # A delta parent that is gone is damage, named with the snapshot that needs it.
    h.store.blobs.delete([parent_snap])
    found: list[Damage] = []
    got = {r.oid for r in h.db.reachable([child], on_damage=found.append)}
    assert parent_snap not in got and pchunk not in got
    assert [(d.oid, d.kind) for d in found] == [(parent_snap, "snapshot")]
    assert str(found[0]).startswith(
        f"snapshot {h.db.read_commit(child).snapshot}: delta parent snapshot {parent_snap}: ")


def test_root_ids_are_refs_and_reflog_entries_not_replacements():
    h = History()
    main = h.line(2, "m")
    gone = h.line(1, "g")
    h.store.refs.update_refs([RefUpdate("HEAD", None, "ref: refs/heads/main")], "init")
    h.store.refs.update_refs([RefUpdate("refs/heads/main", None, main[0])], "c")
    h.store.refs.update_refs([RefUpdate("refs/heads/main", main[0], main[1])], "c")
    h.store.refs.update_refs([RefUpdate("refs/heads/tmp", None, gone[0])], "branch")
    h.store.refs.update_refs([RefUpdate("refs/heads/tmp", gone[0], None)], "delete")  # reflog stays
    snap = h.db.read_commit(main[1]).snapshot
    h.store.refs.update_refs([RefUpdate(REPLACE + snap, None, h.snapshot(h.chunk("x")))], "gc")
    roots = h.db.root_ids()
    assert roots == {main[0], main[1], gone[0]}  # reflog-only roots included; no symref, no replace
    assert gone[0] in {c.id for c in h.db.walk_commits(roots)}


def test_have_excludes_what_the_other_side_holds():
    """A push: objects reachable from the new tip minus everything reachable from what the
    remote has -- given as commits (their closure is implied), as a set or as a predicate."""
    h = History()
    old = h.line(3, "o")
    new = h.line(2, "n", parent=old[-1])
    want = h.closure(new[-1]) - h.closure(old[-1])
    assert {r.oid for r in h.db.reachable([new[-1]], have={old[-1]})} == want
    remote = h.closure(old[-1])
    assert {r.oid for r in h.db.reachable([new[-1]], have=remote.__contains__)} == want
    assert {c.id for c in h.db.walk_commits([new[-1]], have={old[-1]})} == set(new)
    assert list(h.db.reachable([new[-1]], have={new[-1]})) == []
    # A chunk the remote already has (deduplicated) is not sent again.
    shared = h.chunk("o0")
    again = h.commit(h.snapshot(shared, tag="again"), new[-1])
    sent = {r.oid for r in h.db.reachable([again], have=remote)}
    assert shared not in sent and again in sent


def test_damage_raises_without_a_handler_and_is_reported_with_one():
    h = History()
    ids = h.line(3)
    victim = ids[1]
    h.store.blobs.delete([victim])
    with pytest.raises(ObjectMissingError):
        list(h.db.reachable([ids[-1]]))
    found: list[Damage] = []
    got = {r.oid for r in h.db.reachable([ids[-1]], on_damage=found.append)}
    assert ids[-1] in got and victim not in got and ids[0] not in got  # behind the gap: unreachable
    assert [(d.oid, d.kind, d.via) for d in found] == [(victim, "commit", ids[-1])]
    assert str(found[0]) == f"commit {ids[-1]}: parent {victim} is missing"


def test_a_snapshot_as_commit_and_a_broken_replacement_are_damage():
    h = History()
    s = h.snapshot(h.chunk("a"))
    with pytest.raises(MalformedObjectError, match="referenced as a commit but is a snapshot"):
        h.db.read_commit(s)
    c = h.commit(s)
    x, y = h.snapshot(h.chunk("x")), h.snapshot(h.chunk("y"))
    h.store.refs.update_refs([RefUpdate(REPLACE + s, ANY, x), RefUpdate(REPLACE + x, ANY, y)], "bad")
    found: list[Damage] = []
    got = {r.oid for r in h.db.reachable([c], on_damage=found.append)}
    assert got == {c}
    assert len(found) == 1 and isinstance(found[0].error, ReplacementError)
    assert str(found[0]).startswith(f"commit {c}: snapshot {s}: ")
    with pytest.raises(ReplacementError):
        list(h.db.reachable([c]))


def test_is_commit():
    h = History()
    c = h.line(1)[0]
    assert h.db.is_commit(c)
    assert not h.db.is_commit(h.db.read_commit(c).snapshot)
    assert not h.db.is_commit(object_id(b"never stored"))
