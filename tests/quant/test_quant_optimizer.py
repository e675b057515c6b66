"""Optimizer-state compression: log-domain second moment, joint weight-momentum pruning."""
from __future__ import annotations

import pytest
import torch

from mvc.io import flatten
from mvc.quant import QuantConfig, quantize, quantize_state
from mvc.quant.optimizer import (OptimizerStateError, OptQuantized, check_policy, infer_param_map,
                                 moment_domain, parse_state_name, quantize_moment,
                                 quantize_optimizer_state, quantize_second_moment, restore)
from mvc.repo.pipeline import parent_centroids
from mvc.search import default_policy


def second_moment(n: int = 50_000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.exp(torch.randn(n, generator=g) * 2.5 - 16.0)  # ~1e-9 .. 1e-4: many decades
    v[::9] = 0.0
    return v


def test_log_domain_round_trip_properties():
    v = second_moment()
    q = quantize_second_moment(v, 16)
    r = restore(q, "log")
    assert r.dtype == v.dtype and r.shape == v.shape
    zero = v == 0
    assert torch.equal(r[zero], v[zero])                      # zeros stay exactly zero
    assert bool((q.levels.reshape(-1)[zero] == q.pruned_level).all())
    assert bool((r[~zero] > 0).all())                        # never restores a zero v
    rel = ((r[~zero] - v[~zero]).abs() / v[~zero])
    # levels follow the entries (LOG_SIGMA): the bulk is close, a rare tail entry may not be
    assert float(rel.quantile(0.99)) < 0.8 and float(rel.median()) < 0.35
    # each entry restores to the centroid nearest to it in the log domain
    lv, lr = v[~zero].double().log(), r[~zero].double().log()
    nearest = (lv[:, None] - q.centroids.double()[None, :]).abs().min(dim=1).values
    assert bool(((lr - lv).abs() <= nearest + 1e-5).all())
    # the linear domain cannot do this: small entries collapse onto one centroid
    lin = quantize(v, 16).dequantize()
    lin_rel = ((lin[~zero] - v[~zero]).abs() / v[~zero])
    assert float(lin_rel.median()) > 10 * float(rel.median())
    finer = restore(quantize_second_moment(v, 32), "log")
    assert float(((finer[~zero] - v[~zero]).abs() / v[~zero]).median()) < float(rel.median())


def test_restore_is_bit_exact_and_protected_values_are_exact():
    v = second_moment(seed=1).reshape(100, 500).to(torch.float64)
    q = quantize_second_moment(v, 16, protect=0.01)
    a, b = restore(q, "log"), restore(q, "log")
    assert torch.equal(a.view(torch.int64), b.view(torch.int64))
    prot = q.levels == q.protected_level
    assert int(prot.sum()) == q.protected.numel() > 0
    assert torch.equal(a[prot], v[prot])
    assert torch.equal(q.centroids, quantize_second_moment(v, 16, protect=0.01).centroids)


def test_second_moment_edge_cases():
    assert quantize_second_moment(torch.tensor([1e-8, -1e-9, 0.0]), 4) is None  # negative: exact
    z = torch.zeros(3, 5)
    assert torch.equal(restore(quantize_second_moment(z, 4), "log"), z)
    with pytest.raises(OptimizerStateError):
        restore(quantize(torch.ones(10), 2), "cubic")


def test_first_moment_joint_pruning_and_zeros():
    g = torch.Generator().manual_seed(2)
    m = torch.randn(64, 128, generator=g) * 1e-3
    m[0, :10] = 0.0
    pruned = torch.rand(64, 128, generator=g) < 0.3
    q = quantize_moment(m, 16, pruned=pruned)
    r = restore(q, "linear")
    assert bool((r[pruned] == 0).all()) and bool((r[0, :10] == 0).all())
    keep = ~pruned
    keep[0, :10] = False
    assert float((r[keep] - m[keep]).norm() / m[keep].norm()) < 0.2


def _adam_state(steps: int = 3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128),
                                torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    for _ in range(steps):
        model(torch.randn(16, 64)).square().mean().backward()
        opt.step()
    return model, opt, flatten({"model": model.state_dict(), "optimizer": opt.state_dict()}).tensors


def test_quantize_optimizer_state_on_adam():
    model, opt, flat = _adam_state()
    wq = quantize_state(flat, QuantConfig(bins=8, prune=0.3), default_policy())
    out = quantize_optimizer_state(flat, wq, min_numel=4096)
    # params in order: 0.weight, 0.bias, 1.weight, 1.bias, 2.weight, 2.bias; big ones only
    assert set(out) == {"optimizer/state/0/exp_avg", "optimizer/state/0/exp_avg_sq",
                        "optimizer/state/4/exp_avg", "optimizer/state/4/exp_avg_sq"}
    # by default moments of >= 128 values are compressed too (biases, norms); 2.bias has 64
    small = set(quantize_optimizer_state(flat, wq)) - set(out)
    assert small == {f"optimizer/state/{i}/{k}" for i in (1, 2, 3) for k in ("exp_avg", "exp_avg_sq")}
    assert all(isinstance(o, OptQuantized) for o in out.values())
    assert out["optimizer/state/0/exp_avg"].domain == "linear"
    assert out["optimizer/state/0/exp_avg_sq"].domain == "log"
    q, domain = out["optimizer/state/4/exp_avg"]
    w_pruned = wq["model/2.weight"].levels == wq["model/2.weight"].pruned_level
    assert bool((restore(q, domain)[w_pruned] == 0).all())   # joint pruning with the weight
    assert not any("step" in k for k in out)                   # counters stay exact
    v = flat["optimizer/state/0/exp_avg_sq"]
    rv = restore(*out["optimizer/state/0/exp_avg_sq"])
    assert torch.equal(rv[v == 0], v[v == 0])


def test_param_map_inference_and_explicit_map():
    _, _, flat = _adam_state()
    inferred = infer_param_map(flat)
    assert inferred[("optimizer/", 0)] == "model/0.weight"
    assert inferred[("optimizer/", 2)] == "model/1.weight"     # BatchNorm buffers skipped
    assert inferred[("optimizer/", 4)] == "model/2.weight"
    gap = {k: v for k, v in flat.items() if not k.startswith("optimizer/state/1/")}
    assert infer_param_map(gap) == {}                          # ambiguous: nothing inferred
    wq = {"model/x": quantize(torch.randn(64, 128), 4, prune=0.5)}
    out = quantize_optimizer_state(flat, wq, param_map={4: "model/x"})
    r = restore(*out["optimizer/state/4/exp_avg"])
    assert bool((r[wq["model/x"].levels == 4] == 0).all())
    with pytest.raises(OptimizerStateError):
        quantize_optimizer_state(flat, wq, param_map={"4": "model/x"})


def test_names_and_policy():
    assert parse_state_name("optimizer/state/12/exp_avg") == ("optimizer/", 12, "exp_avg")
    assert parse_state_name("model/state/x") is None
    assert moment_domain("opt/state/0/momentum_buffer") == "linear"
    assert moment_domain("state/3/max_exp_avg_sq") == "log"
    assert moment_domain("optimizer/state/0/step") is None
    assert check_policy("compressed") == "compressed"
    with pytest.raises(OptimizerStateError) as ei:
        check_policy("lossy")
    assert ei.value.exit_code == 83


def test_resumed_adam_still_trains_from_compressed_state():
    model, opt, flat = _adam_state(steps=20)
    out = quantize_optimizer_state(flat, None)
    sd = opt.state_dict()
    for name, oq in out.items():
        _, idx, key = parse_state_name(name)
        sd["state"][idx][key] = restore(*oq)
    opt.load_state_dict(sd)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(5))
    before = float(model(x).square().mean().detach())
    for _ in range(10):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    assert float(model(x).square().mean().detach()) < before


def test_default_policy_prunes_first_moment_and_coarsens_second():
    _, _, flat = _adam_state(steps=20)
    out = quantize_optimizer_state(flat, None)
    m = restore(*out["optimizer/state/0/exp_avg"])
    assert float((m == 0).float().mean()) >= 0.84          # 85% of the nonzero entries pruned
    assert m[m != 0].unique().numel() <= 2                 # 2 levels: sign and rough size
    exact = flat["optimizer/state/0/exp_avg"]
    kept = m != 0
    assert bool((torch.sign(m[kept]) == torch.sign(exact[kept])).all())
    assert float(exact[kept].abs().min()) >= float(exact[~kept].abs().max()) * 0.999
    v = restore(*out["optimizer/state/0/exp_avg_sq"])
    assert v[v > 0].unique().numel() <= 4


def test_second_moment_warm_start_keeps_levels_and_repo_stores_a_small_delta(tmp_path):
    """v is a slow EMA: warm-started from the parent's (log) centroids, its levels barely
    move, so the repository stores it as a delta much smaller than a base."""
    from mvc.repo.repository import Repo

    v1 = second_moment(seed=3)
    g = torch.Generator().manual_seed(4)
    v2 = v1 * 1.15 * torch.exp(torch.randn(v1.shape, generator=g) * 0.02)  # EMA drift
    q1 = quantize_second_moment(v1, 4)
    q2 = quantize_second_moment(v2, 4, init=q1.centroids)
    assert float((q1.levels != q2.levels).float().mean()) < 0.1
    r = Repo.init(tmp_path / "r")
    try:
        r.config.set("commit.optimizer", "compressed")
        model = torch.nn.Linear(256, 128)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(64, 256, generator=g)
        ids = []
        for step in range(3):
            for _ in range(5):
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
            ids.append(r.commit({"model": model.state_dict(), "optimizer": opt.state_dict()},
                                f"s{step}", quant=QuantConfig(bins=8)))
        recs = [{t.name: t for t in r.read_snapshot(r.read_commit(c).snapshot).tensors} for c in ids]
        name = "optimizer/state/0/exp_avg_sq"
        assert recs[0][name].codec == "qbase/1" and recs[0][name].meta["domain"] == "log"
        tx = r.commit_transaction()
        assert name in parent_centroids(tx.parent(r.head()), tx.read_centroids)  # log-domain centroids warm-start
        assert recs[2][name].codec == "qdelta/1"
        assert recs[2][name].stored_bytes < 0.5 * recs[0][name].stored_bytes
    finally:
        r.close()


def test_log_domain_levels_follow_the_entries_not_the_tails():
    """Adam divides every entry's step by its own sqrt(v): each entry counts once in the
    log-domain k-means.  Weighted by |log v| (the weights' default), the few levels go to the
    tails (the smallest v has the largest |log v|) and most entries' steps are off by 2x."""
    g = torch.Generator().manual_seed(5)
    # a wide bulk plus a sparse tail of tiny values, as a CNN's rarely active inputs give
    v = torch.cat([torch.exp(torch.randn(60_000, generator=g) * 1.5 - 19.0),
                   torch.exp(torch.rand(6_000, generator=g) * -20.0 - 25.0)])

    def step_error(q):   # |log| of the factor each entry's step is off by
        return (restore(q, "log").double() / v.double()).log().abs().div(2)

    ours = step_error(quantize_second_moment(v, 4))
    magnitude = step_error(quantize_second_moment(v, 4, sigma=0.2))
    assert float(ours.mean()) < 0.6 * float(magnitude.mean())
    assert float((ours > 0.5).double().mean()) < 0.5 * float((magnitude > 0.5).double().mean())
    # quantize_optimizer_state uses the same weighting for exp_avg_sq
    flat = {"optimizer/state/0/exp_avg_sq": v}
    q = quantize_optimizer_state(flat, None)["optimizer/state/0/exp_avg_sq"].q
    assert torch.equal(q.levels, quantize_second_moment(v, 4).levels)


def test_moments_compress_and_measure_the_same_alone_or_one_per_thread(monkeypatch):
    """The largest moments compress alone, their native passes split across the pool
    (`parallel.pmap_sized`), instead of one per thread: the same levels, centroids, protected
    values and error sums either way."""
    from mvc.native import parallel
    from mvc.search.measure import moment_distortion

    monkeypatch.setenv("MVC_THREADS", "4")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)   # kernels cut into 4 chunks
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(4096, 256), torch.nn.Linear(256, 256))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    for _ in range(2):
        model(torch.randint(0, 4096, (64,))).square().mean().backward()
        opt.step()
    flat = flatten({"model": model.state_dict(), "optimizer": opt.state_dict()}).tensors
    wq = quantize_state(flat, QuantConfig(bins=8, prune=0.3), default_policy())

    def run():
        out = quantize_optimizer_state(flat, wq)
        sums = parallel.pmap_sized(lambda n: moment_distortion(out[n].q, out[n].domain, flat[n]),
                                   {n: flat[n].numel() for n in out})
        return out, sums

    monkeypatch.setattr(parallel, "LARGE_FLOOR", 1 << 40)          # every moment on the pool
    shared, shared_sums = run()
    monkeypatch.setattr(parallel, "LARGE_FLOOR", 1 << 19)          # the embedding's alone
    monkeypatch.setattr(parallel, "LARGE_SHARE", 1e-9)
    assert parallel.large_alone({n: flat[n].numel() for n in shared})[0] == [
        "optimizer/state/0/exp_avg", "optimizer/state/0/exp_avg_sq"]
    alone, alone_sums = run()
    assert set(alone) == set(shared) and alone_sums == shared_sums
    for n, a in alone.items():
        b = shared[n]
        assert a.domain == b.domain
        assert torch.equal(a.q.levels, b.q.levels) and torch.equal(a.q.centroids, b.q.centroids)
        assert torch.equal(a.q.protected, b.q.protected)
