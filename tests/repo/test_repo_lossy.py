"""Quantized commits: base/delta chains restore exactly dequantize(quantize(W_t)), no drift."""
from __future__ import annotations

import pytest
import torch
from lossy_history import assert_bits, chained_repo, configs, trajectory

from mvc.quant import QuantConfig, QuantPolicy, quantize_state
from mvc.quant.optimizer import OPTIMIZER_STATE_PATTERNS
from mvc.repo.repository import Repo

POLICY = QuantPolicy(exclude=OPTIMIZER_STATE_PATTERNS)


def expected(state, cfg, prev=None):
    """What a commit must restore: dequantize(quantize(W_t)), warm-started like the repo does
    from the previous commit's centroids. Returns (tensors, qmap) so the next call can chain."""
    init = {k: q.centroids for k, q in (prev or {}).items() if q is not None}
    q = quantize_state(dict(state), cfg, POLICY, nonfinite="lossless", init=init)
    return {k: (q[k].dequantize() if q[k] is not None else v) for k, v in state.items()}, q


def test_chain_of_32_commits_restores_exactly(tmp_path):
    repo = Repo.init(tmp_path / "r")
    repo.config.set("commit.base_every", 100)
    repo.config.set("commit.chain_budget", 0)
    ids, exp, prev = [], [], None
    for t, state in trajectory(32):
        cfg = configs(t)
        ids.append(repo.commit(state, f"step {t}", quant=cfg))
        e, prev = expected(state, cfg, prev)
        exp.append(e)
    depths = [repo.read_commit(c).chain_depth for c in ids]
    assert max(depths) >= 20  # deltas were actually chained
    snap = repo.read_snapshot(repo.read_commit(ids[-1]).snapshot)
    codecs = {r.name: r.codec for r in snap.tensors}
    assert codecs["enc.weight"] == "qdelta/1" and codecs["bias"] != "qdelta/1"
    repo.close()
    # a fresh process-like Repo: no cached levels, chains walked from the bases
    with Repo(tmp_path / "r") as fresh:
        for cid, e in zip(ids, exp):
            got = fresh.read_state(cid)
            for k, v in e.items():
                assert_bits(got[k], v, f"{cid[:8]} {k}")


def test_lossy_same_checkpoint_twice_is_tiny(repo):
    state = dict(next(iter(trajectory(1)))[1])
    cfg = QuantConfig(bins=16)
    repo.commit(state, "a", quant=cfg)
    before = repo.store.blobs.object_bytes()
    repo.commit(state, "b", quant=cfg)
    assert repo.store.blobs.object_bytes() - before < 4096


def test_lossy_commit_records_config_and_quality(repo):
    state = dict(next(iter(trajectory(1)))[1])
    cid = repo.commit(state, "q", quant=QuantConfig(bins=8, prune=0.1, protect=0.005))
    c = repo.read_commit(cid)
    assert c.quant["bins"] == 8 and c.quality["metric"] == "rel_l2_weights"
    assert 0 < c.quality["value"] < 0.5


def test_configured_default_quant_and_lossless_override(repo):
    state = dict(next(iter(trajectory(1)))[1])
    repo.config.set("commit.mode", "fixed")
    repo.config.set("commit.quant", '{"bins": 8}')
    lossy_id = repo.commit(state, "lossy by config")
    exact_id = repo.commit(state, "exact", lossless=True)
    assert repo.read_commit(lossy_id).quant["bins"] == 8
    assert repo.read_commit(exact_id).quant is None
    assert torch.equal(repo.read_state(exact_id)["enc.weight"], state["enc.weight"])


def test_optimizer_state_exact_policy(repo):
    from checkpoints import realistic_state

    repo.config.set("commit.optimizer", "exact")
    s = realistic_state()
    cid = repo.commit(s, "q", quant=QuantConfig(bins=4))
    got = repo.read_state(cid)
    for k, v in s["optimizer"]["state"].items():
        for name, t in v.items():
            assert torch.equal(got["optimizer"]["state"][k][name], t)


def test_nan_tensor_is_kept_lossless(repo):
    w = torch.randn(100, 100)
    w[3, 4] = float("nan")
    cid = repo.commit({"w": w}, "nan", quant=QuantConfig(bins=8))
    got = repo.read_state(cid)["w"]
    assert torch.equal(got.view(torch.int32), w.view(torch.int32))


def _all_states(repo, ids):
    return {cid: repo.read_state(cid) for cid in ids}


def test_gc_compacts_chains_without_changing_any_restore(tmp_path):
    root = tmp_path / "r"
    repo, ids = chained_repo(root, 30)
    repo.branch("old", ids[10])
    before = _all_states(repo, ids)
    report = repo.gc(max_chain=4)
    assert report.snapshots_rewritten > 0 and report.max_chain_after <= 4
    assert report.max_chain_before > 4
    assert repo.fsck().ok
    repo.close()
    with Repo(root) as fresh:  # no warm caches: every chain walked from its (new) base
        after = _all_states(fresh, ids)
        for cid in ids:
            for k, v in before[cid].items():
                assert_bits(after[cid][k], v, f"{cid[:8]} {k}")
        # compacting again finds nothing to do; shrink returns space and changes nothing
        assert fresh.gc(max_chain=4).snapshots_rewritten == 0
        r = fresh.gc(shrink=True)
        assert r.disk_after <= r.disk_before
        assert fresh.fsck().ok
        for cid in ids:
            got = fresh.read_state(cid)
            for k, v in before[cid].items():
                assert_bits(got[k], v, f"after shrink {cid[:8]} {k}")


def test_deleted_branch_with_deltas_is_collected(tmp_path):
    repo = Repo.init(tmp_path / "r")
    states = list(trajectory(6))
    for t, s in states[:3]:
        repo.commit(s, f"main {t}", quant=configs(t))
    repo.switch("exp", create=True)
    for t, s in states[3:]:
        repo.commit(s, f"exp {t}", quant=configs(t))
    repo.switch("main")
    keep = {cid: repo.read_state(cid) for cid in (c.id for c in repo.log("main"))}
    repo.delete_branch("exp", force=True)
    # A deleted branch's commits are kept for the reflog grace period; expire it now.
    assert repo.gc().removed_objects == 0
    r = repo.gc(reflog_expire=0)
    assert r.removed_objects > 0 and repo.fsck().ok
    for cid, st in keep.items():
        got = repo.read_state(cid)
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                assert_bits(got[k], v, k)
    repo.close()


def test_cli_lossy_commits_use_disk_level_cache(tmp_path):
    from cli_helpers import run

    work = tmp_path
    assert run(work, "init")[0] == 0
    assert run(work, "config", "commit.mode", "fixed")[0] == 0
    assert run(work, "config", "commit.quant", '{"bins": 12, "protect": 0.005}')[0] == 0
    cfg = QuantConfig(bins=12, protect=0.005)
    exp, prev = [], None
    for t, state in trajectory(4):
        torch.save(state, work / "ckpt.pt")
        code, _, err = run(work, "commit", "-m", f"step {t}", "ckpt.pt")
        assert code == 0, err
        e, prev = expected(state, cfg, prev)
        exp.append(e)
    assert list((work / ".mvc" / "cache" / "levels").glob("*.levels"))
    with Repo(work) as repo:
        ids = [c.id for c in repo.log()][::-1]
        assert repo.read_commit(ids[-1]).chain_depth >= 1
        for cid, e in zip(ids, exp):
            got = repo.read_state(cid)
            for k, v in e.items():
                assert_bits(got[k], v, k)


def test_compressed_optimizer_state_round_trips_through_chains(repo):
    from mvc.io import flatten
    from mvc.quant.moment_bound import moment_ratio_bound
    from mvc.quant.optimizer import quantize_optimizer_state, restore

    repo.config.set("commit.optimizer", "compressed")
    big = torch.nn.Linear(128, 96)
    opt2 = torch.optim.Adam(big.parameters(), lr=1e-3)
    ids, exp = [], []
    cfg = QuantConfig(bins=16, protect=0.005)
    init = {}   # the repo warm-starts each commit's k-means from its parent's centroids
    for step in range(4):
        loss = big(torch.randn(32, 128)).square().mean()
        opt2.zero_grad()
        loss.backward()
        opt2.step()
        state = {"model": big.state_dict(), "optimizer": opt2.state_dict()}
        ids.append(repo.commit(state, f"s{step}", quant=cfg))
        flat = flatten(state).tensors
        wq = quantize_state(flat, cfg, POLICY, nonfinite="lossless")
        oq = quantize_optimizer_state(flat, wq, init=init)
        init = {n: o.q.centroids for n, o in oq.items()}
        e = {n: restore(o.q, o.domain) for n, o in oq.items()}
        for n in list(e):
            if n.endswith("exp_avg") and n + "_sq" in e:  # Adam's step stays within the exact bound
                m, v = flat[n], flat[n + "_sq"]
                bound = moment_ratio_bound(m, v)   # what the commit records (one rounding)
                limit = e[n + "_sq"].sqrt() * bound
                e[n] = torch.maximum(torch.minimum(e[n], limit), -limit)
                assert (e[n].abs() <= limit).all()
        exp.append(e)
    snap = repo.read_snapshot(repo.read_commit(ids[-1]).snapshot)
    domains = {r.name: r.meta.get("domain") for r in snap.tensors}
    assert domains["optimizer/state/0/exp_avg_sq"] == "log"
    assert any(r.codec == "qdelta/1" for r in snap.tensors if r.name.startswith("optimizer/"))
    for cid, e in zip(ids, exp):
        got = repo.read_state(cid)
        for name, v in e.items():
            idx = int(name.split("/")[2])
            assert_bits(got["optimizer"]["state"][idx][name.split("/")[3]], v, name)
        # one tensor at a time (as `mvc diff` reads them) restores the same bits as a checkout
        sid = repo.read_commit(cid).snapshot
        for name, v in e.items():
            rec = next(r for r in repo.read_snapshot(sid).tensors if r.name == name)
            assert_bits(repo.reader.read_any(sid, rec), v, f"read_any {name}")
        # steps and hyperparameters stay exact
        assert got["optimizer"]["param_groups"][0]["lr"] == 1e-3


def test_delta_max_ratio_keeps_barely_paying_deltas_out_of_chains(tmp_path):
    from mvc.repo.config import ConfigError

    def codecs(repo, cid):
        snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
        return {r.name: (r.codec, r.stored_bytes) for r in snap.tensors if r.codec.startswith("q")}

    runs = {}
    for ratio in (1.0, 0.3):
        repo = Repo.init(tmp_path / f"r{ratio}")
        repo.config.set("commit.base_every", 100)
        repo.config.set("commit.chain_budget", 0)
        repo.config.set("commit.delta_max_ratio", ratio)
        ids = [repo.commit(state, f"step {t}", quant=configs(t)) for t, state in trajectory(8)]
        runs[ratio] = [codecs(repo, cid) for cid in ids]
        states = _all_states(repo, ids)
        with Repo(tmp_path / f"r{ratio}") as fresh:  # every commit still restores the same
            for cid in ids:
                got = fresh.read_state(cid)
                for k, v in states[cid].items():
                    assert_bits(got[k], v, f"{ratio} {cid[:8]} {k}")
        repo.close()
    loose, strict = runs[1.0], runs[0.3]
    n_delta = lambda run: sum(c == "qdelta/1" for commit in run for c, _ in commit.values())
    assert n_delta(strict) < n_delta(loose)
    # where the strict repo kept a delta, it is below 0.3x of what that tensor costs as a base
    for commit in strict[1:]:
        for name, (codec, size) in commit.items():
            if codec == "qdelta/1":
                assert size < 0.3 * max(s for c, s in (x[name] for x in strict if name in x)
                                        if c == "qbase/1")
    repo = Repo(tmp_path / "r0.3")
    with pytest.raises(ConfigError):
        repo.config.set("commit.delta_max_ratio", 1.5)
    # a hand-edited config is refused when read, before anything is stored
    (tmp_path / "r0.3" / ".mvc" / "config.json").write_text('{"commit.delta_max_ratio": 0}')
    before = repo.store.blobs.object_bytes()
    with pytest.raises(ConfigError):
        repo.commit(next(iter(trajectory(1)))[1], "x", quant=configs(0))
    assert repo.store.blobs.object_bytes() == before


def _quant_records(repo, cid):
    snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
    return {r.name: r for r in snap.tensors if r.codec.startswith("q")}


def test_chain_budget_bounds_every_chain_and_gc_enforces_it(tmp_path):
    from mvc.repo.config import ConfigError
    from mvc.repo.lossy import chain_cost

    root = tmp_path / "r"
    repo, ids = chained_repo(root, 12, base_every=0, chain_budget=1.5)
    recs = [_quant_records(repo, cid) for cid in ids]
    costs = [chain_cost(r) for commit in recs for r in commit.values()]
    assert max(costs) <= 1.5 and any(c > 0 for c in costs)
    # the budget made bases that an unbudgeted chain of the same commits does not have
    free, free_ids = chained_repo(tmp_path / "free", 12, base_every=0)
    n_bases = lambda rs: sum(r.codec == "qbase/1" for commit in rs for r in commit.values())
    assert n_bases(recs) > n_bases([_quant_records(free, cid) for cid in free_ids])
    free.close()
    # each delta records the walk so far: its parent's cost plus a step of at most one pass
    for commit in recs[1:]:
        for r in commit.values():
            if r.codec == "qdelta/1":
                assert 0 < chain_cost(r) <= 1.5 and r.meta["chain_cost"] <= r.depth

    # gc applies a tighter budget to the existing history; nothing restores differently
    before = _all_states(repo, ids)
    repo.config.set("commit.chain_budget", 0.5)
    report = repo.gc(max_chain=0)
    assert report.tensors_rebased > 0 and repo.fsck().ok
    repo.close()
    with Repo(root) as fresh:
        for cid in ids:
            got = fresh.read_state(cid)
            for k, v in before[cid].items():
                assert_bits(got[k], v, f"{cid[:8]} {k}")
        for bad in (-1.0, float("nan"), float("inf")):
            with pytest.raises(ConfigError):
                fresh.config.set("commit.chain_budget", bad)


def test_gc_by_budget_is_idempotent(tmp_path):
    """A second gc finds nothing to do, although the commits after a rebased tensor recorded
    their costs against the chain the first gc cut."""
    repo, ids = chained_repo(tmp_path / "r", 12)
    before = _all_states(repo, ids)
    repo.config.set("commit.chain_budget", 2.5)
    first = repo.gc(max_chain=0)
    assert first.tensors_rebased > 0
    assert repo.gc(max_chain=0).tensors_rebased == 0
    assert repo.fsck().ok
    from mvc.errors import UsageError

    with pytest.raises(UsageError):
        repo.gc(max_chain=-1)
    for cid in ids:
        got = repo.read_state(cid)
        for k, v in before[cid].items():
            assert_bits(got[k], v, f"{cid[:8]} {k}")


def test_step_cost_counts_changed_levels_up_to_one_pass():
    from mvc.quant import QuantizedTensor
    from mvc.repo.lossy import DENSE_SHARE, step_cost

    def q(levels):
        return QuantizedTensor(torch.tensor(levels, dtype=torch.uint8), torch.zeros(4),
                               torch.zeros(0), torch.float32, 4)

    n = 1600
    base = [0] * n
    assert step_cost(q(base), q(base)) == 0.0
    few = [1] * int(n * DENSE_SHARE / 4) + [0] * (n - int(n * DENSE_SHARE / 4))
    assert step_cost(q(few), q(base)) == pytest.approx(0.25)
    assert step_cost(q([2] * n), q(base)) == 1.0


def test_large_host_tensors_count_changed_levels_by_segments(monkeypatch):
    """Past parallel.SPLIT values the count runs in pieces on the pool (a large tensor encodes
    alone): same counts, mixed level dtypes and a ragged last piece included."""
    from mvc.native import parallel
    from mvc.quant import QuantizedTensor
    from mvc.repo.lossy import DENSE_SHARE, same_quantization, step_cost

    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, 6, (1001,), generator=g, dtype=torch.uint8)
    b = a.clone()
    b[torch.randperm(1001, generator=g)[:13]] += 1

    def q(levels):
        return QuantizedTensor(levels, torch.zeros(5), torch.zeros(0), torch.float32, 5)

    whole = (step_cost(q(b), q(a)), same_quantization(q(b), q(a)), same_quantization(q(a), q(a)))
    monkeypatch.setattr(parallel, "SPLIT", 64)
    assert (step_cost(q(b), q(a)), same_quantization(q(b), q(a)),
            same_quantization(q(a), q(a))) == whole
    assert whole[0] == pytest.approx(13 / (1001 * DENSE_SHARE)) and whole[1:] == (False, True)
    assert step_cost(q(b.to(torch.int16)), q(a)) == whole[0]


def test_first_moment_bound_in_chunks_restores_the_one_shot_bits():
    """The reader bounds a restored Adam first moment chunk by chunk (no two copies of the
    moment for its limits); the bits must be those of the one-shot torch form every earlier
    version restored, binding entries, zeros and a ragged tail included (an earlier commit's
    record: no `sqrt` form)."""
    from types import SimpleNamespace

    from mvc.quant.moment_bound import LEGACY_CHUNK as _CLAMP_CHUNK
    from mvc.repo.reader import _bound_first_moment

    g = torch.Generator().manual_seed(5)
    n = 2 * _CLAMP_CHUNK + 4099   # a ragged tail; divisible by 3 for the 2-D case
    v = torch.rand(n, generator=g) * 1e-6
    v[torch.rand(n, generator=g) < 0.2] = 0.0
    v[::97] = 52.25
    m = torch.randn(n, generator=g) * 1e-3
    for shape in ((n,), (3, n // 3)):
        mm, vv = m.reshape(shape), v.reshape(shape)
        ref = mm.clone()
        limit = vv.float().clamp_min(0).sqrt_().mul_(3.7).to(ref.dtype)
        torch.clamp(ref, min=-limit, max=limit, out=ref)
        got = mm.clone()
        rec = SimpleNamespace(name="m", meta={"moment": {"partner": "v", "ratio_bound": 3.7}})
        _bound_first_moment(rec, got, {"v": vv})
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
        assert (ref != m.reshape(shape)).any()  # the bound binds somewhere
