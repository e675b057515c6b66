"""How a commit's quantized tensors encode: the largest alone, each across the pool, the rest
one per thread (`pipeline.encode_order`), so a commit's encoding temporaries stay a bounded
share of the state whatever the thread count; the stored records do not depend on it."""
from __future__ import annotations

import threading

from checkpoints import trained

from mvc.repo import lossy, pipeline
from mvc.repo.repository import Repo

LAYER = {"attn.c_attn": 768 * 2304, "attn.c_proj": 768 * 768, "mlp.c_fc": 768 * 3072,
         "mlp.c_proj": 3072 * 768, "ln_1": 768, "ln_2": 768}


def gpt2_small() -> dict[str, int]:
    """Values per quantized tensor of GPT-2-small (124M) with AdamW's two moments."""
    one = {"wte": 50257 * 768, "wpe": 1024 * 768, "ln_f": 768}
    one.update({f"h{i}.{n}": v for i in range(12) for n, v in LAYER.items()})
    return {f"{kind}.{n}": v for kind in ("param", "exp_avg", "exp_avg_sq") for n, v in one.items()}


def test_the_embedding_and_its_moments_encode_alone_at_124m():
    numels = gpt2_small()
    assert 123e6 < sum(numels.values()) / 3 < 125e6
    large, rest = pipeline.encode_order(numels, 16)
    assert sorted(large) == ["exp_avg.wte", "exp_avg_sq.wte", "param.wte"]
    assert set(large) | set(rest) == set(numels) and not set(large) & set(rest)
    sizes = [numels[n] for n in rest]
    assert sizes == sorted(sizes, reverse=True)    # biggest first, for the pool's balance
    # 16 of the rest at once hold under an eighth of the values' temporaries
    assert 16 * max(sizes) <= sum(numels.values()) / 8
    # two threads: no tensor is half a thread's part; one per thread packs them best
    assert pipeline.encode_order(numels, 2) == ([], sorted(numels, key=lambda n: -numels[n]))


def test_tensors_under_the_floor_stay_on_the_pool():
    assert pipeline.encode_order({"a": 1000, "b": 10}, 16) == ([], ["a", "b"])
    big = {"a": 3 * pipeline.LARGE_FLOOR, "b": pipeline.LARGE_FLOOR}
    assert pipeline.encode_order(big, 16) == (["a"], ["b"])


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
    monkeypatch.setattr(pipeline, "LARGE_FLOOR", cut)
    monkeypatch.setattr(pipeline, "LARGE_SHARE", 1e-9)
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
