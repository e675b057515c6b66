"""Checkout timing for bench_delta: chain depth against torch.load, and the chain policies.

Both commit the trajectory's full checkpoints (model, Adam state, scheduler)
into a fresh repository and time `Repo.read_state` on a freshly opened `Repo`
against `torch.load` of the same checkpoint file, the two alternated and each
the best of `repeats` (alternating keeps both in the same cache and allocator
state; both read warm page cache).
"""
from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from benchmarks.trajectory import Checkpoint
from mvc.quant import QuantConfig
from mvc.repo.repository import Repo

#: Chain policies the sweep compares: the paper's rule (no bound), fixed base intervals, the
#: walking-cost budget (the default: commit.chain_budget 8) and a smaller delta_max_ratio.
POLICIES: tuple[dict[str, float], ...] = (
    {"base_every": 0, "chain_budget": 0},
    {"base_every": 16, "chain_budget": 0},
    {"base_every": 8, "chain_budget": 0},
    {"base_every": 0, "chain_budget": 0, "delta_max_ratio": 0.5},
    {"base_every": 0, "chain_budget": 16},
    {"base_every": 0, "chain_budget": 8},
    {"base_every": 0, "chain_budget": 4},
    {"base_every": 0, "chain_budget": 2},
)


def _timed(root: str, cid: str, path, use_cache: bool, repeats: int) -> tuple[float, float]:
    """(best read_state seconds, best torch.load seconds), alternated."""
    best, load = float("inf"), float("inf")
    for _ in range(repeats):
        r = Repo(root)
        if not use_cache:
            r.disk_levels = None
        try:
            t0 = time.perf_counter()
            r.read_state(cid)
            best = min(best, time.perf_counter() - t0)
        finally:
            r.close()
        t0 = time.perf_counter()
        torch.load(path, map_location="cpu", weights_only=True)
        load = min(load, time.perf_counter() - t0)
    return best, load


def _commit_all(root: str, cks: Sequence[Checkpoint], config: QuantConfig,
                settings: Mapping[str, float]) -> tuple[Repo, list[str]]:
    repo = Repo.init(root)
    for key, value in settings.items():
        repo.config.set(f"commit.{key}", value)
    return repo, [repo.commit(ck.state, f"epoch {ck.index}", step=ck.step, quant=config) for ck in cks]


def checkout_times(cks: Sequence[Checkpoint], config: QuantConfig,
                   depths: Iterable[int] = (1, 8, 32), repeats: int = 3) -> Optional[dict[str, Any]]:
    """Checkout time at delta-chain depth 1, 8, 32 relative to torch.load of the same file.

    Commits go in with no chain bound (`commit.base_every` and
    `commit.chain_budget` 0), so commit d sits at chain depth d (the depth
    actually recorded is reported).  Each checkout is timed twice: for any
    commit (no level cache: the chain is walked from its base) and, right
    after it was committed, as the newest commit (levels from
    `.mvc/cache/levels`, the resume-after-failure case).
    Target (issue 5): depth-32 checkout <= 2x torch.load.  Returns None when
    the trajectory is too short for any requested depth.
    """
    depths = [d for d in depths if d < len(cks)]
    if not depths:
        return None
    out: dict[str, Any] = {"depth": {}}
    with tempfile.TemporaryDirectory(prefix="mvc-bench-checkout-") as tmp:
        repo = Repo.init(tmp)
        repo.config.set("commit.base_every", 0)
        repo.config.set("commit.chain_budget", 0)
        ids, latest = [], {}
        for ck in cks[:max(depths) + 1]:
            ids.append(repo.commit(ck.state, f"epoch {ck.index}", step=ck.step, quant=config))
            d = len(ids) - 1
            if d in depths:
                # Resuming from the newest commit (the failure-recovery case) in a new process:
                # its levels come from .mvc/cache/levels, whatever its chain depth.
                latest[d] = _timed(tmp, ids[d], cks[d].path, True, repeats)
        recorded = {d: repo.read_commit(ids[d]).chain_depth for d in depths}
        out["stored_bytes"] = repo.stats().stored_bytes
        repo.close()
        for d in depths:
            cold, load = _timed(tmp, ids[d], cks[d].path, False, repeats)
            walk, fold = chain_decode_seconds(tmp, ids[d], repeats)
            out["depth"][str(d)] = {"chain_depth": recorded[d], "checkout_s": cold,
                                    "chain_walk_s": walk, "per_step_fold_s": fold,
                                    "torch_load_s": load, "ratio": cold / load,
                                    "latest_checkout_s": latest[d][0],
                                    "latest_ratio": latest[d][0] / latest[d][1]}
    return out


def chain_decode_seconds(root: str, cid: str, repeats: int) -> tuple[float, float]:
    """Levels of every quantized tensor of `cid` from its chain: (walker, per-step fold) seconds.

    The walker (`decode_chain`, native/chain.c) against folding the one-step
    decoder `decode_delta` over the same chain, best of `repeats`, both
    single-threaded and from payloads already read.
    """
    from mvc.codecs.quantized import decode_base, decode_chain, decode_delta
    from mvc.repo.lossy import QBASE, QDELTA, parent_ref
    from mvc.repo.repository import Repo
    from mvc.repo.tensors import parse_dtype, read_payload

    repo = Repo(root)
    try:
        chains = []
        snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
        for rec in snap.tensors:
            if rec.codec != QDELTA:
                continue
            steps, cur = [], rec
            while cur.codec == QDELTA:
                data = read_payload(repo.store.blobs, cur)
                steps.append((cur.meta, lambda data=data: data))
                psid, pname = parent_ref(cur)
                cur = next(r for r in repo.read_snapshot(psid).tensors if r.name == pname)
            assert cur.codec == QBASE
            base = decode_base(cur.meta, read_payload(repo.store.blobs, cur), parse_dtype(cur.dtype),
                               tuple(cur.shape))
            chains.append((base, steps[::-1], parse_dtype(rec.dtype), tuple(rec.shape)))
    finally:
        repo.close()

    def best(fn) -> float:
        t = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            t = min(t, time.perf_counter() - t0)
        return t

    def walk() -> None:
        for base, steps, dtype, shape in chains:
            decode_chain(base, steps, dtype, shape)

    def fold() -> None:
        for base, steps, dtype, shape in chains:
            q = base
            for meta, load in steps:
                q = decode_delta(meta, load(), dtype, shape, q.levels)

    return best(walk), best(fold)


def policy_sweep(cks: Sequence[Checkpoint], config: QuantConfig,
                 policies: Sequence[Mapping[str, float]] = POLICIES,
                 repeats: int = 2) -> list[dict[str, Any]]:
    """Storage against checkout time of every commit, per chain policy (commit.* settings)."""
    rows = []
    for pol in policies:
        with tempfile.TemporaryDirectory(prefix="mvc-bench-policy-") as tmp:
            repo, ids = _commit_all(tmp, cks, config, pol)
            stored = repo.stats().stored_bytes
            depth = max(repo.read_commit(c).chain_depth for c in ids)
            repo.close()
            ratios = []
            for ck, cid in zip(cks, ids):
                t, load = _timed(tmp, cid, ck.path, False, repeats)
                ratios.append(t / load)
            rows.append({"policy": dict(pol), "stored_bytes": stored, "max_depth": depth,
                         "worst_ratio": max(ratios), "mean_ratio": statistics.mean(ratios),
                         "ratios": ratios})
    return rows


def print_checkout(checkout: Optional[dict[str, Any]]) -> None:
    if checkout is None:
        print("\ncheckout timing: skipped")
        return
    print("\ncheckout (fresh Repo, full checkpoint incl. Adam state, no chain bound) vs torch.load "
          "of the same file:")
    print("  'any commit': no level cache, the chain is walked from its base;"
          " 'newest commit': the resume case, levels from .mvc/cache/levels")
    for d, r in checkout["depth"].items():
        print(f"  depth {int(d):3d} (recorded {r['chain_depth']:3d}): any commit {r['ratio']:.2f}x, "
              f"newest commit {r['latest_ratio']:.2f}x torch.load; chain levels alone: walker "
              f"{1e3 * r['chain_walk_s']:.1f} ms vs per-step decode {1e3 * r['per_step_fold_s']:.1f} ms "
              f"({r['per_step_fold_s'] / max(r['chain_walk_s'], 1e-9):.2f}x)")
    deep = checkout["depth"].get("32")
    if deep is not None:
        print(f"  target depth-32 <= 2x torch.load: any commit {'PASS' if deep['ratio'] <= 2 else 'MISS'}, "
              f"newest commit {'PASS' if deep['latest_ratio'] <= 2 else 'MISS'}")


def print_policies(rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        return
    ref = rows[0]["stored_bytes"]
    print(f"\nchain policies ({len(rows[0]['ratios'])} full checkpoints committed; checkout of every "
          "commit, no level cache, vs torch.load):")
    print(f"  {'policy':48s} {'stored MB':>9} {'x unbounded':>11} {'max depth':>9} "
          f"{'worst':>7} {'mean':>7}")
    for r in rows:
        name = ", ".join(f"{k}={v:g}" for k, v in r["policy"].items())
        print(f"  {name:48s} {r['stored_bytes'] / 1e6:9.2f} {r['stored_bytes'] / ref:11.2f} "
              f"{r['max_depth']:9d} {r['worst_ratio']:6.1f}x {r['mean_ratio']:6.1f}x")
