"""How a commit's quantized tensors encode: the largest alone, each across the pool, the rest
one per thread (`parallel.pmap_sized`; the rule is tested in
tests/native/test_native_parallel_schedule.py), so a commit's encoding temporaries stay a
bounded share of the state whatever the thread count; the stored records do not depend on it."""
from __future__ import annotations

import threading

from checkpoints import trained

from mvc.native import parallel
from mvc.repo import lossy
from mvc.repo.repository import Repo

def _state(steps: int) -> dict:
    model, opt, _ = trained(0, steps)
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def _commits(path, states) -> list[dict]:
    repo = Repo.init(path)
    repo.config.set("commit.mode", "fixed")
    repo.config.set("commit.quant", {"bins": 8, "prune": 0.1, "protect": 0.001})
    records = []
    for i, s in enumerate(states):
        cid = repo.commit(s, message=f"step {i}")
        snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
        records.append({r.name: (r.codec, r.chunks, r.depth) for r in snap.tensors})
    return records


def test_large_tensors_encode_alone_and_store_what_the_pool_stores(tmp_path, monkeypatch):
    states = [_state(3), _state(6)]
    expected = _commits(tmp_path / "pool", states)

    cut = 2_000   # every tensor over 2,000 values is "large" here (the biggest weights, moments)
    monkeypatch.setattr(parallel, "LARGE_FLOOR", cut)
    monkeypatch.setattr(parallel, "LARGE_SHARE", 1e-9)
    real_encode = lossy.encode_for_commit
    lock = threading.Lock()
    active: list[int] = []      # sizes of the tensors encoding now
    large_seen, overlaps = [], []

    def encode(q, *a, **k):
        n = q.levels.numel()
        with lock:
            if n > cut:
                large_seen.append(n)
            if active and (n > cut or max(active) > cut):
                overlaps.append((n, list(active)))
            active.append(n)
        try:
            return real_encode(q, *a, **k)
        finally:
            with lock:
                active.remove(n)

    monkeypatch.setattr(lossy, "encode_for_commit", encode)
    assert _commits(tmp_path / "alone", states) == expected
    assert len(large_seen) >= 2 * 3 and not overlaps   # 3+ large tensors in each commit
