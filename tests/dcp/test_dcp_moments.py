"""Lossy sharded saves compress optimizer moments as a one-process commit does (issue 28, item 3).

Two gloo ranks save FSDP2 + AdamW state (tests/helpers/dcp_moments_worker.py); the same full
state is then committed from this process (`Repo.commit`, the optimizer's own index-keyed
state dict, as a Tracker commits it).  The sharded commit's moments are quantized shard by
shard with the whole tensor's centroids, so it must choose what the one-process commit
chooses -- the weights' config, each moment's levels and centroids, the guard rails' record,
the first moments' bounds -- and restore the same values.  One-process tests cover the
agreement rules (NaN on one shard, index-keyed names, the exact policy).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from rank_procs import run_ranks, with_helpers_path

from mvc.dcp import MvcStorageWriter, moments
from mvc.repo import lossy
from mvc.repo.repository import Repo
from mvc.repo.shards import shard_of

WORLD = 2
MOMENT_FIELDS = ("moment_cap", "moment_distortion", "moments_exact", "moments_zeroed")
PARAMS = ["0.weight", "0.bias", "2.weight", "2.bias"]   # the optimizer's parameter order


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("dcp_moments")
    for name in ("repo", "exact", "one"):
        Repo.init(root / name).close()
    reports = run_ranks("dcp_moments_worker.py", [str(WORLD), str(root)],
                        lambda r: root / f"rank{r}.pt", world=WORLD, env=with_helpers_path())
    r0 = reports[0]
    assert all(r["config"] == r0["config"] and r["quality"] == r0["quality"] for r in reports)
    # the same full state, committed from one process with the optimizer's own keys
    s = r0["saved"]
    one = {"model": s["model"],
           "optim": {"state": {i: s["optim"]["state"][p] for i, p in enumerate(PARAMS)},
                     "param_groups": s["optim"]["param_groups"]}}
    with Repo(root / "one") as repo:
        r0["one"] = repo.commit(one, message="one process", step=3, epsilon=0.05)
    return root, r0


def one_name(name: str) -> str:
    """optim/state/<fqn>/<key> -> optim/state/<index>/<key>."""
    parts = name.split("/")
    if parts[:2] == ["optim", "state"]:
        parts[2] = str(PARAMS.index(parts[2]))
    return "/".join(parts)


def records(path: Path, cid: str) -> dict:
    with Repo(path) as repo:
        c = repo.read_commit(cid)
        snap = repo.read_snapshot(c.snapshot)
        return {r.name: (r, repo.reader.read_quantized(c.snapshot, r)
                         if lossy.is_quantized(r) else None) for r in snap.tensors}


def is_moment(name: str) -> bool:
    return name.endswith(("/exp_avg", "/exp_avg_sq"))


def test_sharded_moments_are_stored_compressed(saved):
    root, r0 = saved
    lossy_recs, exact = records(root / "repo", r0["lossy"]), records(root / "exact", r0["exact"])
    mom = {n: r for n, (r, _) in lossy_recs.items() if is_moment(n)}
    assert len(mom) == 2 * 8 and all(shard_of(r) is not None for r in mom.values())
    big = [r for r in mom.values() if shard_of(r)["of"].split("/")[2].endswith("weight")]
    assert big and all(lossy.is_quantized(r) for r in big)
    assert all(r.meta.get("domain") == "log" for r in big if r.name.endswith("_sq"))
    assert all(r.meta["moment"]["partner"] == r.name + "_sq"
               for r in big if r.name.endswith("exp_avg"))
    stored = sum(r.stored_bytes for r in mom.values())
    exact_bytes = sum(r.stored_bytes for n, (r, _) in exact.items() if is_moment(n))
    assert stored < 0.15 * exact_bytes, (stored, exact_bytes)


def test_same_choices_as_a_one_process_commit(saved):
    root, r0 = saved
    with Repo(root / "one") as repo:
        one = repo.read_commit(r0["one"])
    assert r0["config"] == one.quant
    q = r0["quality"]
    assert q["sharded"] is True and q["moment_distortion"]["linear"] > 0
    assert {k: q.get(k) for k in MOMENT_FIELDS} == {k: one.quality.get(k) for k in MOMENT_FIELDS}
    mine, theirs = records(root / "repo", r0["lossy"]), records(root / "one", r0["one"])
    by_tensor: dict[str, list] = {}
    for n, (r, qt) in mine.items():
        info = shard_of(r)
        by_tensor.setdefault(info["of"] if info else n, []).append((r, qt))
    compared = 0
    for g, parts in by_tensor.items():
        rec, want = theirs[one_name(g)]
        assert all(lossy.is_quantized(r) == lossy.is_quantized(rec) for r, _ in parts), g
        if want is None:
            continue
        assert all(r.meta.get("domain") == rec.meta.get("domain") for r, _ in parts), g
        if "moment" in rec.meta:
            assert all(r.meta["moment"]["ratio_bound"] == rec.meta["moment"]["ratio_bound"]
                       for r, _ in parts), g
        # the shards' levels, in place, are the whole tensor's; the centroids are its own
        assert all(torch.equal(qt.centroids, want.centroids) for _, qt in parts), g
        got = torch.cat([qt.levels for _, qt in
                         sorted(parts, key=lambda p: shard_of(p[0])["offsets"])])
        assert torch.equal(got, want.levels), g
        compared += 1
    assert compared == 8   # 2 weights, 6 moments (2.bias's are under min_numel: exact)


def flat(state: dict) -> dict:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    return flatten_state_dict(state)[0]


def test_restores_what_the_one_process_commit_restores(saved):
    root, r0 = saved
    with Repo(root / "repo") as repo:
        mine = repo.read_state(r0["lossy"])
    with Repo(root / "one") as repo:
        theirs = repo.read_state(r0["one"])
    for p in PARAMS:
        i = PARAMS.index(p)
        for key in ("exp_avg", "exp_avg_sq"):
            a = mine["optim"]["state"][p][key]
            assert torch.equal(a, theirs["optim"]["state"][i][key]), (p, key)
            assert torch.equal(flat(r0["loaded"])[f"optim.state.{p}.{key}"], a), (p, key)
        assert torch.equal(mine["model"][p], theirs["model"][p])
    m = mine["optim"]["state"]["0.weight"]["exp_avg"]
    assert not torch.equal(m, r0["saved"]["optim"]["state"]["0.weight"]["exp_avg"])


# ------------------------------------------------------------------ one process
def test_a_nan_in_one_shard_keeps_the_whole_moment_exact():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(256, 8, generator=g)
    m[200, 0] = float("nan")
    tensors = {"a": m[:128].clone(), "b": m[128:].clone(),
               "c": torch.randn(256, 8, generator=g).abs()}
    shards = {"a": {"of": "optim/state/w/exp_avg", "offsets": [0, 0], "shape": [256, 8]},
              "b": {"of": "optim/state/w/exp_avg", "offsets": [128, 0], "shape": [256, 8]}}
    tensors["optim/state/w/exp_avg_sq"] = tensors.pop("c")
    glob = {"optim/state/w/exp_avg": ([256, 8], torch.float32),
            "optim/state/w/exp_avg_sq": ([256, 8], torch.float32)}
    out = moments.compress(tensors, shards, {}, glob, {})
    assert sorted(out.quantized) == ["optim/state/w/exp_avg_sq"]
    assert out.domains == {"optim/state/w/exp_avg_sq": "log"} and out.bounds == {}


def test_moment_names_by_fqn_and_by_index():
    assert moments.moment_of("optim/state/layers.0.attn.weight/exp_avg") == (
        "optim/", "layers.0.attn.weight", "exp_avg")
    assert moments.moment_of("optimizer/state/3/exp_avg_sq") == ("optimizer/", 3, "exp_avg_sq")
    assert moments.moment_of("optim/state/0.weight/step") is None
    assert moments.moment_of("model/0.weight") is None


def test_commit_optimizer_exact_keeps_moments_exact(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(16, 64)
    (model(x) - x).pow(2).mean().backward()
    opt.step()
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    with Repo.init(tmp_path / "repo") as repo:
        repo.config.set("commit.optimizer", "exact")
    w = MvcStorageWriter(tmp_path / "repo", message="m", epsilon=0.05)
    dcp.save({"model": msd, "optim": osd}, storage_writer=w)
    recs = records(tmp_path / "repo", w.commit_id)
    assert w.last_config is not None and "moment_cap" not in w.last_quality
    assert not any(lossy.is_quantized(r) for n, (r, _) in recs.items() if "/state/" in n)
    assert lossy.is_quantized(recs["model/0.weight"][0])


def test_a_load_decodes_each_second_moment_once(saved, monkeypatch):
    """A first moment's bound restores its second moment; a DCP load that asks for both
    keeps that one for its own items instead of decoding it again."""
    from mvc.dcp import MvcStorageReader
    from mvc.repo.reader import TensorReader

    root, r0 = saved
    with Repo(root / "repo") as repo:
        want = repo.read_state(r0["lossy"])
    calls: list[str] = []
    orig = TensorReader.read_quantized

    def counted(self, snapshot_id, rec, *args, **kw):
        calls.append(rec.name)
        return orig(self, snapshot_id, rec, *args, **kw)

    monkeypatch.setattr(TensorReader, "read_quantized", counted)
    state = torch.utils._pytree.tree_map(
        lambda v: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v, want)
    dcp.load(state, storage_reader=MvcStorageReader(root / "repo", rev=r0["lossy"]), no_dist=True)
    assert calls and len(calls) == len(set(calls)), sorted(calls)
    assert any(n.endswith("exp_avg_sq") for n in calls)
    got, ref = flat(state), flat(want)
    assert got.keys() == ref.keys()
    assert all(torch.equal(got[k], ref[k]) for k in ref if isinstance(ref[k], torch.Tensor))
