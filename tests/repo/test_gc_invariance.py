"""gc never changes what a commit restores: every tensor kind, every compaction trigger.

Weights (quantized, with pruned and protected values), Adam's first moment (linear domain,
clamped by its second moment on restore), its second moment (log domain) and exact tensors
(biases, step counters) must read back bit-identically before gc, after gc and after
gc --shrink, in a process with warm level caches and in a fresh one.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from checkpoints import assert_same
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mvc.errors import InternalError
from mvc.quant import QuantConfig
from mvc.repo import compact
from mvc.repo.lossy import QDELTA, QUANT_CODECS
from mvc.repo.replace import REPLACE
from mvc.repo.repository import Repo


class MLP(torch.nn.Module):
    """Small, but its first weight (5120 values) is over the policy's 4096-value minimum and
    every Adam moment over the optimizer's 128: everything that can be quantized is."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 80)
        self.fc2 = torch.nn.Linear(80, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Trainer:
    """An MLP trained with Adam; `state()` is what a training loop commits."""

    def __init__(self, seed: int, amsgrad: bool = False) -> None:
        self.g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.model = MLP()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, amsgrad=amsgrad)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            x = torch.randn(16, 64, generator=self.g)
            loss = (self.model(x) - x[:, :8]).square().mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}


def new_repo(root: Path, *, chain_budget: float = 0.0) -> Repo:
    """A repository that keeps long chains at commit time (gc is what bounds them here)."""
    repo = Repo.init(root)
    assert repo.config.get("commit.optimizer") == "compressed"  # the default: moments quantized
    repo.config.set("commit.base_every", 0)
    repo.config.set("commit.chain_budget", chain_budget)
    return repo


def adam_history(root: Path, n: int = 5, every: int = 20) -> tuple[Repo, list[str]]:
    """The issue's reproduction: `n` lossy commits of {model, optimizer}, `every` Adam steps apart."""
    repo = new_repo(root)
    trainer = Trainer(0)
    ids = []
    for t in range(n):
        trainer.train(every)
        ids.append(repo.commit(trainer.state(), f"step {t}", quant=QuantConfig(bins=16, protect=0.005)))
    return repo, ids


def restore_all(repo: Repo, ids: list[str]) -> dict[str, dict]:
    return {cid: repo.read_state(cid) for cid in ids}


def assert_restores(root: Path, repo: Repo, ids: list[str], before: dict[str, dict], what: str) -> None:
    """Every commit restores `before`, bit for bit, through `repo` (warm caches) and through a
    fresh process's view of `root` (every chain walked from the stored encodings)."""
    for cid, state in restore_all(repo, ids).items():
        assert_same(state, before[cid], f"{what}, warm {cid[:8]}")
    with Repo(root) as fresh:
        for cid, state in restore_all(fresh, ids).items():
            assert_same(state, before[cid], f"{what}, fresh {cid[:8]}")


def quant_records(repo: Repo, cid: str) -> dict:
    snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
    return {r.name: r for r in snap.tensors if r.codec in QUANT_CODECS}


def test_gc_max_chain_1_keeps_adam_second_moments(tmp_path):
    """Regression (issue 12, defect 1): compaction dropped `meta.domain` / `meta.moment`, so
    rebased second moments restored as raw log values (all negative) and first moments lost
    their clamp; fsck said ok."""
    root = tmp_path / "r"
    repo, ids = adam_history(root)
    before = restore_all(repo, ids)
    sq = [quant_records(repo, cid)["optimizer/state/0/exp_avg_sq"] for cid in ids]
    assert any(r.codec == QDELTA for r in sq)  # the history has second-moment chains to cut
    report = repo.gc(max_chain=1)
    assert report.tensors_rebased > 0
    assert repo.fsck().ok
    assert_restores(root, repo, ids, before, "gc max_chain=1")
    for cid in ids:
        moments = repo.read_state(cid)["optimizer"]["state"]
        assert all(bool((s["exp_avg_sq"] >= 0).all()) for s in moments.values())
    repo.close()


def _meta_kept(repo: Repo, ids: list[str], originals: dict[str, dict]) -> tuple[int, int]:
    """Checks every rebased record kept its original's non-encoding meta and none of its
    delta's; returns (rebased records, how many of them are optimizer moments)."""
    n = moments = 0
    for cid in ids:
        for name, rec in quant_records(repo, cid).items():
            old = originals[cid][name]
            if old.codec == rec.codec:
                assert old == rec, f"{cid[:8]} {name}: changed but not rebased"
                continue
            n += 1
            moments += "domain" in rec.meta
            for key, value in old.meta.items():
                if key not in compact.ENCODING_META:
                    assert rec.meta.get(key) == value, f"{cid[:8]} {name}: meta {key!r} lost"
            stale = {"parent", "refs", "chain_cost", "mode", "parent_n_levels"} & set(rec.meta)
            assert not stale, f"{cid[:8]} {name}: delta meta {stale} left on a base"
    return n, moments


TRIGGERS = {
    # gc --max-chain
    "max_chain": lambda repo: repo.gc(max_chain=1),
    # the chain budget (commit.chain_budget), with no depth bound
    "budget": lambda repo: (repo.config.set("commit.chain_budget", 0.5), repo.gc(max_chain=0))[1],
    # `mvc config gc.max_chain 1; mvc gc --shrink`
    "shrink": lambda repo: (repo.config.set("gc.max_chain", 1), repo.gc(shrink=True))[1],
}


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
def test_every_compaction_trigger_restores_identically(tmp_path, trigger):
    root = tmp_path / "r"
    repo, ids = adam_history(root, n=6, every=5)
    repo.branch("side", ids[2])
    repo.switch("side")
    trainer = Trainer(1)
    trainer.model.load_state_dict(repo.read_state(ids[2])["model"])
    for t in range(3):
        trainer.train(5)
        ids.append(repo.commit(trainer.state(), f"side {t}", quant=QuantConfig(bins=8, prune=0.2)))
    originals = {cid: quant_records(repo, cid) for cid in ids}
    before = restore_all(repo, ids)
    report = TRIGGERS[trigger](repo)
    assert report.tensors_rebased > 0
    assert repo.fsck().ok
    assert_restores(root, repo, ids, before, trigger)
    rebased, moments = _meta_kept(repo, ids, originals)
    assert rebased == report.tensors_rebased and moments > 0
    # a second gc (with shrink) finds nothing left to compact and changes nothing either
    assert TRIGGERS[trigger](repo).tensors_rebased == 0
    repo.gc(shrink=True)
    assert_restores(root, repo, ids, before, f"{trigger}, again")
    repo.close()


def test_encoding_meta_names_every_field_the_quantized_codecs_write():
    """Compaction replaces exactly these fields; a new codec field missing here would be
    carried into the rebased record as stale meta (and a delta's `refs` would keep its
    old parent alive)."""
    from mvc.codecs.quantized import encode_base, encode_delta
    from mvc.quant import quantize

    w = torch.randn(64, 64)
    q = quantize(w, 8, prune=0.1, protect=0.01)
    p = quantize(w + 0.01, 8, protect=0.01)
    config = QuantConfig(bins=8).to_dict()
    written = set(encode_base(q, config=config).meta) | set(
        encode_delta(q, p.levels, p.n_levels, config=config).meta)
    assert q.protected.numel() and "protected" in written
    assert written <= compact.ENCODING_META
    # and what commit adds to a delta to link it into its chain
    assert {"parent", "refs", "chain_cost"} <= compact.ENCODING_META
    assert not {"domain", "moment"} & compact.ENCODING_META


def test_gc_refuses_a_reencoding_that_restores_different_values(tmp_path, monkeypatch):
    """The check before publishing compares restored tensors, not only levels: a re-encoding
    with the same levels but lost meta (here: all of it) is refused and nothing changes."""
    root = tmp_path / "r"
    repo, ids = adam_history(root)
    before = restore_all(repo, ids)
    monkeypatch.setattr(compact, "carried_meta", lambda rec: {})
    with pytest.raises(InternalError, match="bit-identically"):
        repo.gc(max_chain=1)
    assert list(repo.store.refs.iter_refs(REPLACE)) == []
    assert repo.fsck().ok
    assert_restores(root, repo, ids, before, "refused gc")
    monkeypatch.undo()  # the next gc does the job and collects what the refused one wrote
    assert repo.gc(max_chain=1).tensors_rebased > 0
    assert_restores(root, repo, ids, before, "gc after a refused one")
    repo.close()


# ----------------------------------------------------------------------------- randomized

QUANTS = st.builds(QuantConfig, bins=st.sampled_from([2, 4, 8, 16, 32]),
                   prune=st.sampled_from([0.0, 0.1, 0.4]),
                   protect=st.sampled_from([0.0, 0.002, 0.02]))

#: One history: per commit, the Adam steps before it, its config (None: the previous one
#: again, which keeps weights in delta chains; a new bin count mostly makes a base) and an
#: optional branch move (None, or the index of an earlier commit to start a new branch from).
HISTORIES = st.lists(
    st.tuples(st.integers(1, 4), st.one_of(st.none(), QUANTS),
              st.one_of(st.none(), st.none(), st.none(), st.integers(0, 100))),
    min_size=3, max_size=7)


def _run_history(history, seed: int, amsgrad: bool, commit_budget: float,
                 gc_bounds: tuple[int, float], shrink_first: bool) -> None:
    max_chain, gc_budget = gc_bounds
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "r"
        repo = new_repo(root, chain_budget=commit_budget)
        trainer = Trainer(seed, amsgrad)
        ids: list[str] = []
        cfg = QuantConfig(bins=8, protect=0.002)
        for i, (steps, new_cfg, fork) in enumerate(history):
            cfg = new_cfg or cfg
            if fork is not None and ids:
                start = ids[fork % len(ids)]
                repo.branch(f"b{i}", start)
                repo.switch(f"b{i}")
                resumed = repo.read_state(start)
                trainer.model.load_state_dict(resumed["model"])
                trainer.opt.load_state_dict(resumed["optimizer"])
            trainer.train(steps)
            ids.append(repo.commit(trainer.state(), f"c{i}", quant=cfg))
        before = restore_all(repo, ids)
        repo.config.set("commit.chain_budget", gc_budget)
        n = repo.gc(max_chain=max_chain, shrink=shrink_first).tensors_rebased
        event("tensors rebased: " + ("0" if n == 0 else "1-3" if n <= 3 else "> 3"))
        assert repo.fsck().ok
        assert_restores(root, repo, ids, before, "gc")
        repo.gc(shrink=True)
        assert repo.fsck().ok
        assert_restores(root, repo, ids, before, "gc --shrink")
        repo.close()


GC_ARGS = {"history": HISTORIES, "seed": st.integers(0, 3), "amsgrad": st.booleans(),
           # a commit-time budget cuts chains before gc sees them
           "commit_budget": st.sampled_from([0.0, 0.0, 0.0, 3.0]),
           # (gc max_chain, commit.chain_budget at gc time): depth, budget, or both
           "gc_bounds": st.sampled_from([(1, 0.0), (2, 0.0), (3, 0.0), (0, 0.3), (0, 1.0),
                                         (2, 0.3), (1, 1.0)]),
           "shrink_first": st.booleans()}


@pytest.mark.slow
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**GC_ARGS)
def test_random_histories_restore_identically_after_gc(history, seed, amsgrad, commit_budget,
                                                       gc_bounds, shrink_first):
    _run_history(history, seed, amsgrad, commit_budget, gc_bounds, shrink_first)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**GC_ARGS)
def test_random_histories_restore_identically_after_gc_fast(history, seed, amsgrad, commit_budget,
                                                            gc_bounds, shrink_first):
    """Ten of the random histories, for runs that leave out the slow tests."""
    _run_history(history, seed, amsgrad, commit_budget, gc_bounds, shrink_first)
