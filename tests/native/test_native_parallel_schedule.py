"""How a batch of items of different sizes runs on the pool (`parallel.large_alone`,
`parallel.pmap_sized`): the largest alone, each across the pool, the rest one per thread, so
the temporaries in flight stay a bounded share of the work whatever the thread count."""
from __future__ import annotations

import threading

from mvc.native import parallel

LAYER = {"attn.c_attn": 768 * 2304, "attn.c_proj": 768 * 768, "mlp.c_fc": 768 * 3072,
         "mlp.c_proj": 3072 * 768, "ln_1": 768, "ln_2": 768}


def gpt2_small() -> dict[str, int]:
    """Values per quantized tensor of GPT-2-small (124M) with AdamW's two moments."""
    one = {"wte": 50257 * 768, "wpe": 1024 * 768, "ln_f": 768}
    one.update({f"h{i}.{n}": v for i in range(12) for n, v in LAYER.items()})
    return {f"{kind}.{n}": v for kind in ("param", "exp_avg", "exp_avg_sq") for n, v in one.items()}


def test_the_embedding_and_its_moments_go_alone_at_124m():
    numels = gpt2_small()
    assert 123e6 < sum(numels.values()) / 3 < 125e6
    large, rest = parallel.large_alone(numels, 16)
    assert sorted(large) == ["exp_avg.wte", "exp_avg_sq.wte", "param.wte"]
    assert set(large) | set(rest) == set(numels) and not set(large) & set(rest)
    sizes = [numels[n] for n in rest]
    assert sizes == sorted(sizes, reverse=True)    # biggest first, for the pool's balance
    # 16 of the rest at once hold under an eighth of the values' temporaries
    assert 16 * max(sizes) <= sum(numels.values()) / 8
    # two threads: no tensor is half a thread's part; one per thread packs them best
    assert parallel.large_alone(numels, 2) == ([], sorted(numels, key=lambda n: -numels[n]))
    # the moments alone (what the optimizer's compression schedules): their embedding's two
    moments = {n: v for n, v in numels.items() if not n.startswith("param.")}
    assert sorted(parallel.large_alone(moments, 16)[0]) == ["exp_avg.wte", "exp_avg_sq.wte"]


def test_items_under_the_floor_stay_on_the_pool():
    assert parallel.large_alone({"a": 1000, "b": 10}, 16) == ([], ["a", "b"])
    big = {"a": 3 * parallel.LARGE_FLOOR, "b": parallel.LARGE_FLOOR}
    assert parallel.large_alone(big, 16) == (["a"], ["b"])


def test_pmap_sized_runs_the_large_ones_alone_and_returns_every_result(monkeypatch):
    monkeypatch.setenv("MVC_THREADS", "4")
    monkeypatch.setattr(parallel, "LARGE_FLOOR", 10)
    sizes = {"big": 1000, "also big": 900, **{f"s{i}": 5 for i in range(8)}}
    lock = threading.Lock()
    running: list[str] = []
    overlaps = []

    def work(k: str) -> int:
        with lock:
            if running and (sizes[k] > 10 or any(sizes[r] > 10 for r in running)):
                overlaps.append((k, list(running)))
            running.append(k)
        try:
            return sizes[k] * 2
        finally:
            with lock:
                running.remove(k)

    assert parallel.pmap_sized(work, sizes) == {k: 2 * v for k, v in sizes.items()}
    assert not overlaps
    assert parallel.pmap_sized(work, {}) == {}


def test_a_lowered_thread_hands_its_work_to_a_pool_as_low():
    import os
    import sys

    import pytest

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    with pytest.raises(ValueError):
        parallel.lower_this_thread(0)
    with pytest.raises(ValueError):
        parallel.lower_this_thread(20)
    base = nice()
    out: dict[str, object] = {}

    def background() -> None:
        out["lowered"] = parallel.lower_this_thread(5)
        out["self"] = nice()
        out["pool"] = set(parallel.pmap(lambda _: nice(), range(8)))

    t = threading.Thread(target=background)
    t.start()
    t.join()
    if not sys.platform.startswith("linux"):
        assert out["lowered"] is False and out["pool"] == {base}
        return
    low = min(19, base + 5)
    assert out["lowered"] is True and out["self"] == low and out["pool"] == {low}
    # this thread, and the pool its own work goes to, kept their priority
    assert nice() == base and parallel.this_thread_lowered() == 0
    assert set(parallel.pmap(lambda _: nice(), range(8))) == {base}
