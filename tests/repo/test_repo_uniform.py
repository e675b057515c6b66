"""The uniform quantizer family in a repository: a fixed uniform config commits, its step is
kept between commits (sparse deltas, chains restoring exactly dequantize(quantize(W_t))), the
config is recorded and shown with its family, the search can commit either family, and a
repository written before families existed reads its configs as k-means."""
from __future__ import annotations

import json
import shutil

from cli_helpers import run
from locations import FIXTURES
from lossy_history import assert_bits, trajectory

from mvc.quant import QuantConfig, QuantPolicy, quantize_state
from mvc.quant.optimizer import OPTIMIZER_STATE_PATTERNS
from mvc.repo.repository import Repo
from mvc.search import SearchSpace

POLICY = QuantPolicy(exclude=OPTIMIZER_STATE_PATTERNS)
UNIFORM = QuantConfig(bins=16, prune=0.1, protect=0.005, embedding_bins=32, family="uniform")


def test_uniform_history_restores_exactly_with_sparse_deltas(tmp_path):
    with Repo.init(tmp_path) as repo:
        repo.config.set("commit.chain_budget", 0)
        ids, want, prev = [], [], None
        for t, state in trajectory(6):
            ids.append(repo.commit(state, f"step {t}", quant=UNIFORM))
            init = {k: q.centroids for k, q in (prev or {}).items() if q is not None}
            prev = quantize_state(dict(state), UNIFORM, POLICY, nonfinite="lossless", init=init)
            want.append({k: (prev[k].dequantize() if prev[k] is not None else v)
                         for k, v in state.items()})
        c = repo.read_commit(ids[-1])
        assert c.quant["family"] == "uniform" and QuantConfig.from_dict(c.quant) == UNIFORM
        recs = {r.name: r for r in repo.read_snapshot(c.snapshot).tensors}
        assert recs["enc.weight"].codec == "qdelta/1"
        first = {r.name: r for r in repo.read_snapshot(repo.read_commit(ids[0]).snapshot).tensors}
        assert first["enc.weight"].codec == "qbase/1"
        # the step stayed: a delta of slowly drifting weights is a fraction of a base
        assert recs["enc.weight"].stored_bytes < first["enc.weight"].stored_bytes / 2
    with Repo(tmp_path) as fresh:
        for cid, exp in zip(ids, want):
            got = fresh.read_state(cid)
            for k, v in exp.items():
                assert_bits(got[k], v, f"{cid[:8]} {k}")
    code, out, _ = run(tmp_path, "log")
    assert code == 0
    code, out, _ = run(tmp_path, "show", ids[-1][:12])
    assert code == 0 and "uniform" in out


def test_search_commits_either_family(tmp_path):
    state = dict(next(iter(trajectory(1)))[1])
    with Repo.init(tmp_path) as repo:
        cid = repo.commit(state, "searched", space=SearchSpace(family=("uniform",)))
        c = repo.read_commit(cid)
        assert c.quant is not None and c.quant["family"] == "uniform"
        assert all(t["config"]["family"] == "uniform" for t in c.quality["trials"])
        cid2 = repo.commit(state, "both", space=SearchSpace(family=("kmeans", "uniform")))
        c2 = repo.read_commit(cid2)
        # the neighbourhood starts from the parent's uniform config
        assert c2.quant["family"] == "uniform" and c2.quality["mode"] == "neighbourhood"


def test_repository_from_before_families_reads_kmeans_configs(tmp_path):
    # tests/repo/test_fixture_repo.py checks every tensor of this fixture restores
    # bit-identically; here: its recorded configs are k-means ones
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(FIXTURES / "repo_v1" / "mvc", root / ".mvc")
    with Repo(root) as repo:
        quants = [repo.read_commit(cid).quant
                  for cid in json.loads((FIXTURES / "repo_v1" / "restores.json").read_text())]
        lossy = [q for q in quants if q]
        assert len(lossy) == 4
        assert all("family" not in q and QuantConfig.from_dict(q).family == "kmeans"
                   for q in lossy)
