"""The on-disk level cache: an entry serves only the record it was made for, in the repository
that made it; everything else (another commit's entry, another repository's, one gc made stale,
a flipped byte) is a miss, reads stay bit-identical, and fsck / stats see the cache."""
from __future__ import annotations

import json
import shutil
import struct
import time

import pytest
import torch

from mvc.quant import QuantConfig, QuantPolicy
from mvc.repo import levelcache as LC
from mvc.repo.repository import Repo
from mvc.store.lmdb_store import REPO_ID_KEY

CFG = QuantConfig(bins=8, protect=0.005)
POLICY = QuantPolicy(min_numel=64)  # small tensors too: small cache files to sweep


def states(n: int, seed: int = 0, size: tuple[int, int] = (96, 48)):
    g = torch.Generator().manual_seed(seed)
    w = {"enc.weight": torch.randn(*size, generator=g) * 0.05,
         "dec.weight": torch.randn(size[1], size[0], generator=g) * 0.05}
    for t in range(n):
        w = {k: v + 0.003 * torch.randn(v.shape, generator=g) for k, v in w.items()}
        yield t, {**w, "bias": torch.full((5,), float(t))}


def lossy_repo(root, n: int = 3, seed: int = 0, **kw) -> tuple[Repo, list[str]]:
    repo = Repo.init(root)
    repo.config.set("commit.base_every", 100)
    repo.config.set("commit.chain_budget", 0)
    ids = [repo.commit(s, f"step {t}", quant=CFG, policy=POLICY) for t, s in states(n, seed, **kw)]
    return repo, ids


def snap_id(repo: Repo, cid: str) -> str:
    return repo.read_commit(cid).snapshot


def deltas(repo: Repo, cid: str) -> list[str]:
    return [r.name for r in repo.read_snapshot(snap_id(repo, cid)).tensors if r.codec == "qdelta/1"]


def bits(state: dict) -> dict[str, bytes]:
    return {k: v.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            for k, v in state.items() if isinstance(v, torch.Tensor)}


def uncached(root, cid: str) -> dict[str, bytes]:
    """What `cid` restores with no level cache at all (chains walked from their bases)."""
    with Repo(root) as r:
        r.disk_levels = None
        return bits(r.read_state(cid))


def fresh_read(root, cid: str) -> dict[str, bytes]:
    """What a new process restores (it consults the disk cache)."""
    with Repo(root) as r:
        return bits(r.read_state(cid))


def cache_dir(root):
    return root / ".mvc" / "cache" / "levels"


def header(path) -> dict:
    with open(path, "rb") as fh:
        return LC.read_header(fh)[0]


def write_file(path, repo_id: str, sid: str, tensors: dict[str, tuple[dict, bytes]]) -> None:
    """A cache file in the documented format: tensors maps name -> (entry fields, blob)."""
    index, blobs, off = {}, [], 0
    for name, (fields, blob) in tensors.items():
        index[name] = dict(fields, offset=off, length=len(blob), xxh3=LC.checksum(blob).hex())
        blobs.append(blob)
        off += len(blob)
    head = json.dumps({"repo": repo_id, "snapshot": sid, "tensors": index},
                      sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<8sQ16s", LC.MAGIC, len(head), LC.checksum(head)) + head + b"".join(blobs))


def entries(path) -> dict[str, tuple[dict, bytes]]:
    """(entry fields, blob) of every tensor of a cache file."""
    with open(path, "rb") as fh:
        h, start, size = LC.read_header(fh)
        return {n: ({k: v for k, v in e.items() if k not in ("offset", "length", "xxh3")},
                    bytes(LC.read_blob(fh, start, size, e))) for n, e in h["tensors"].items()}


def test_every_entry_is_bound_to_repository_snapshot_and_record(tmp_path):
    repo, ids = lossy_repo(tmp_path)
    rid = repo.store.maintenance.get_meta(REPO_ID_KEY).decode()
    assert len(rid) == 32 and int(rid, 16) >= 0  # made at init
    sid = snap_id(repo, ids[-1])
    h = header(cache_dir(tmp_path) / f"{sid}.levels")
    assert h["repo"] == rid and h["snapshot"] == sid
    records = {r.name: r for r in repo.read_snapshot(sid).tensors}
    assert set(h["tensors"]) == {"enc.weight", "dec.weight"}
    for name, e in h["tensors"].items():
        rec = records[name]
        assert (e["dtype"], e["shape"], e["chunks"]) == (rec.dtype, rec.shape, rec.chunks)
        assert LC.binds(e, rec)
    repo.close()


def test_a_fresh_process_uses_a_valid_entry(tmp_path):
    repo, ids = lossy_repo(tmp_path)
    repo.close()
    sid_file = cache_dir(tmp_path) / f"{snap_id(Repo(tmp_path), ids[-1])}.levels"
    with Repo(tmp_path) as r:
        rec = next(x for x in r.read_snapshot(snap_id(r, ids[-1])).tensors if x.codec == "qdelta/1")
        assert r.disk_levels.load(snap_id(r, ids[-1]), rec) is not None  # a hit
    assert fresh_read(tmp_path, ids[-1]) == uncached(tmp_path, ids[-1])
    assert sid_file.exists()
    assert Repo(tmp_path).fsck().warnings == []


def test_an_entry_copied_from_another_commit_is_a_miss(tmp_path):
    repo, ids = lossy_repo(tmp_path)
    assert deltas(repo, ids[-1]), "the newest commit must hold deltas for the cache to matter"
    src = cache_dir(tmp_path) / f"{snap_id(repo, ids[-2])}.levels"
    dst = cache_dir(tmp_path) / f"{snap_id(repo, ids[-1])}.levels"
    repo.close()
    truth = uncached(tmp_path, ids[-1])
    shutil.copyfile(src, dst)  # same tensor names, another commit's levels
    assert "foreign" in " ".join(Repo(tmp_path).fsck().warnings)
    assert fresh_read(tmp_path, ids[-1]) == truth
    assert not dst.exists()  # removed on read: it can never serve this snapshot
    assert Repo(tmp_path).fsck().warnings == []


def test_an_entry_from_another_repository_is_a_miss(tmp_path):
    # Two repositories with the same history share snapshot ids, so their cache files share names.
    a, ids_a = lossy_repo(tmp_path / "a")
    b, ids_b = lossy_repo(tmp_path / "b")
    sid = snap_id(a, ids_a[-1])
    assert sid == snap_id(b, ids_b[-1])
    rid_b = b.store.maintenance.get_meta(REPO_ID_KEY).decode()
    a.close()
    b.close()
    truth = uncached(tmp_path / "a", ids_a[-1])
    target = cache_dir(tmp_path / "a") / f"{sid}.levels"

    # 1. b's file, copied as it is: a miss, removed on read, reported by fsck.
    shutil.copyfile(cache_dir(tmp_path / "b") / f"{sid}.levels", target)
    warnings = Repo(tmp_path / "a").fsck().warnings
    assert any("foreign" in w and "repository" in w for w in warnings), warnings
    assert fresh_read(tmp_path / "a", ids_a[-1]) == truth
    assert not target.exists()

    # 2. Everything else right (snapshot, records, checksums) but another repository's id,
    #    and levels that are not these: still a miss, never data.
    older = entries(cache_dir(tmp_path / "a") / f"{snap_id(Repo(tmp_path / 'a'), ids_a[-2])}.levels")
    with Repo(tmp_path / "a") as r:
        recs = {x.name: x for x in r.read_snapshot(sid).tensors}
    forged = {n: (dict(f, chunks=recs[n].chunks), blob) for n, (f, blob) in older.items()}
    write_file(target, rid_b, sid, forged)
    assert any("foreign" in w for w in Repo(tmp_path / "a").fsck().warnings)
    assert fresh_read(tmp_path / "a", ids_a[-1]) == truth
    # The same forged entry under this repository's own id *would* be read: the id is what refused it.
    rid_a = Repo(tmp_path / "a").store.maintenance.get_meta(REPO_ID_KEY).decode()
    write_file(target, rid_a, sid, forged)
    assert fresh_read(tmp_path / "a", ids_a[-1]) != truth


def test_entries_made_stale_by_gc_are_misses_and_reported(tmp_path):
    repo, ids = lossy_repo(tmp_path, n=4)
    repo.config.set("cache.levels_keep", 8)
    repo.close()
    with Repo(tmp_path) as r:  # refill the cache for every commit
        for t, s in states(4, seed=1):
            r.commit(s, f"more {t}", quant=CFG, policy=POLICY)
        ids = [c.id for c in r.log()][::-1]
    truths = {c: uncached(tmp_path, c) for c in ids}
    before = {p.name: p.read_bytes() for p in cache_dir(tmp_path).glob("*.levels")}
    with Repo(tmp_path) as r:
        report = r.gc(max_chain=1)
        assert report.tensors_rebased > 0
        # gc deletes what it made stale itself ...
        assert report.cache_files_removed > 0 and not r.fsck().warnings
    # ... and one killed before that cleanup leaves entries that are misses, and reported.
    for name, data in before.items():
        (cache_dir(tmp_path) / name).write_bytes(data)
    warnings = Repo(tmp_path).fsck().warnings
    assert any("stale" in w and "no longer stored as cached" in w for w in warnings), warnings
    for c in ids:
        assert fresh_read(tmp_path, c) == truths[c], c
    # A snapshot gc deleted leaves a stale file behind: reported, never read.
    with Repo(tmp_path) as r:
        r.branch("side", ids[1])
        r.switch("side")
        side = r.commit(next(states(1, seed=7))[1], "side", quant=CFG, policy=POLICY)
        side_sid = snap_id(r, side)
        r.switch("main")
        r.delete_branch("side", force=True)
        r.store.refs.delete_reflog("refs/heads/side")
        for name in r.store.refs.reflog_names():
            if name == "HEAD":
                r.store.refs.delete_reflog(name)
        stale = cache_dir(tmp_path) / f"{side_sid}.levels"
        kept_bytes = stale.read_bytes()
        report = r.gc()
        assert not r.store.blobs.has(side_sid)
        # gc deletes the level-cache files of what it freed: fsck has nothing to say after it.
        assert report.cache_files_removed >= 1 and not stale.exists()
        assert not r.fsck().warnings
    stale.write_bytes(kept_bytes)  # a stale file (e.g. a gc that was killed before its cleanup)
    warnings = Repo(tmp_path).fsck().warnings
    assert any(side_sid in w and "no longer in the repository" in w for w in warnings), warnings


def test_a_stale_entry_whose_record_changed_is_never_used(tmp_path):
    """The binding itself: an entry whose chunks are not the record's is skipped, even with
    every checksum right (what a gc re-encoding would leave)."""
    repo, ids = lossy_repo(tmp_path)
    sid = snap_id(repo, ids[-1])
    path = cache_dir(tmp_path) / f"{sid}.levels"
    rid = repo.store.maintenance.get_meta(REPO_ID_KEY).decode()
    repo.close()
    truth = uncached(tmp_path, ids[-1])
    older = entries(cache_dir(tmp_path) / f"{snap_id(Repo(tmp_path), ids[-2])}.levels")
    write_file(path, rid, sid, older)  # right repository and snapshot, the older records' chunks
    assert fresh_read(tmp_path, ids[-1]) == truth
    assert any("stale" in w for w in Repo(tmp_path).fsck().warnings)


def small_cache(root) -> tuple[str, list, bytes]:
    """A repository whose newest commit's cache file is small: (commit id, its quantized records
    (a delta among them), the cache file's bytes)."""
    repo, ids = lossy_repo(root, n=2, size=(32, 16))
    sid = snap_id(repo, ids[-1])
    recs = [r for r in repo.read_snapshot(sid).tensors if r.codec in ("qdelta/1", "qbase/1")]
    assert any(r.codec == "qdelta/1" for r in recs)
    repo.close()
    return ids[-1], recs, (cache_dir(root) / f"{sid}.levels").read_bytes()


def qbits(q) -> tuple:
    return (q.bins, bits({"l": q.levels, "c": q.centroids, "p": q.protected}))


def test_every_flipped_byte_is_a_miss_and_the_file_is_removed(tmp_path):
    cid, recs, good = small_cache(tmp_path)
    truth = uncached(tmp_path, cid)
    repo = Repo(tmp_path)
    sid = snap_id(repo, cid)
    path = cache_dir(tmp_path) / f"{sid}.levels"
    expect = {r.name: qbits(repo.disk_levels.load(sid, r)) for r in recs}
    assert len(good) < 4096
    for i in range(len(good)):
        for flip in (0x01, 0x80):
            bad = bytearray(good)
            bad[i] ^= flip
            path.write_bytes(bad)
            # Each entry verifies itself when read: a flip in one entry's levels leaves the
            # others usable until that entry is read; then the file goes.
            for r in recs:
                q = repo.disk_levels.load(sid, r)
                assert q is None or qbits(q) == expect[r.name], (i, flip, r.name)
            assert not path.exists(), (i, flip)
    # Through the public read path and fsck, on a sample of positions (each is slower).
    for i in range(0, len(good), max(1, len(good) // 25)):
        bad = bytearray(good)
        bad[i] ^= 0x5A
        path.write_bytes(bad)
        assert any("corrupt" in w for w in repo.fsck().warnings), i
        repo.reader.levels.clear()
        assert bits(repo.read_state(cid)) == truth, i
    repo.close()


@pytest.mark.parametrize("size", [1 << 62, (1 << 64) - 1, 10**12])
def test_a_flipped_header_size_allocates_nothing(tmp_path, size):
    cid, recs, good = small_cache(tmp_path)
    repo = Repo(tmp_path)
    sid = snap_id(repo, cid)
    path = cache_dir(tmp_path) / f"{sid}.levels"
    path.write_bytes(good[:8] + struct.pack("<Q", size) + good[16:])
    t0 = time.monotonic()
    assert repo.disk_levels.load(sid, recs[0]) is None
    assert time.monotonic() - t0 < 1.0 and not path.exists()
    assert bits(repo.read_state(cid)) == uncached(tmp_path, cid)
    repo.close()


def test_old_format_files_and_leftovers_are_reported(tmp_path):
    repo, ids = lossy_repo(tmp_path, n=2)
    sid = snap_id(repo, ids[-1])
    path = cache_dir(tmp_path) / f"{sid}.levels"
    path.write_bytes((5).to_bytes(8, "little") + b"{}" + b"x" * 3)  # the unbound format of old
    (cache_dir(tmp_path) / f".{sid}.999999999.tmp").write_bytes(b"partial")
    warnings = repo.fsck().warnings
    assert any("corrupt" in w and sid in w for w in warnings), warnings
    assert any("temporary" in w for w in warnings), warnings
    assert repo.fsck().ok  # disposable: not repository damage
    repo.prune_level_cache()
    assert repo.fsck().warnings == []
    repo.close()


def test_a_repository_without_an_id_gets_one_lazily(tmp_path):
    repo, ids = lossy_repo(tmp_path, n=2)
    repo.store.maintenance.set_meta(REPO_ID_KEY, b"not-an-id")  # as a garbled (or absent) id reads
    repo.close()
    truth = uncached(tmp_path, ids[-1])
    with Repo(tmp_path) as r:
        rid = LC.repository_id(r.store.maintenance)
        assert len(rid) == 32 and r.store.maintenance.get_meta(REPO_ID_KEY).decode() == rid
        assert LC.repository_id(r.store.maintenance) == rid  # stable once made
    # the entries made under the old id no longer bind: misses, reported as foreign
    assert any("foreign" in w for w in Repo(tmp_path).fsck().warnings)
    assert fresh_read(tmp_path, ids[-1]) == truth


def test_stats_counts_the_cache_apart_from_the_store(tmp_path):
    from cli_helpers import run

    repo, _ids = lossy_repo(tmp_path, n=2)
    s = repo.stats()
    files = sum(p.stat().st_size for p in cache_dir(tmp_path).iterdir())
    assert s.cache_bytes == files > 0
    assert s.total_disk_bytes == s.disk_bytes + s.cache_bytes
    assert s.to_dict()["cache_bytes"] == files
    repo.close()
    code, out, err = run(tmp_path, "stats")
    assert code == 0, err
    assert "level cache" in out
    code, out, _ = run(tmp_path, "stats", "--json")
    assert json.loads(out)["cache_bytes"] == files


def test_fsck_cli_warns_about_the_cache_without_failing(tmp_path):
    from cli_helpers import run

    repo, ids = lossy_repo(tmp_path, n=2)
    sid = snap_id(repo, ids[-1])
    repo.close()
    path = cache_dir(tmp_path) / f"{sid}.levels"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(data)
    code, out, err = run(tmp_path, "fsck")
    assert code == 0, err
    assert "warning: level cache" in out and "corrupt" in out and "ok" in out
    assert path.exists()
    code, out, err = run(tmp_path, "fsck", "--prune-cache")
    assert code == 0 and not path.exists()
    code, out, _ = run(tmp_path, "fsck")
    assert code == 0 and "warning" not in out


def test_entries_are_checked_by_the_digest_of_their_parts_as_one_blob():
    """The cache writes an encoding's parts as they are (no joined copy): each entry's digest
    must be the digest of the bytes a reader gets back in one piece."""
    from mvc.repo.levelfile import checksum, checksum_parts

    data = bytes(range(256)) * 40
    for cuts in ([], [0], [1, 7], [100, 100, 5000], [len(data)]):
        bounds = [0, *cuts, len(data)]
        parts = [memoryview(data)[a:b] for a, b in zip(bounds, bounds[1:])]
        assert checksum_parts(parts) == checksum(data)
    assert checksum_parts([]) == checksum(b"")
