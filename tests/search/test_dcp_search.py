"""The config search spread over 2 gloo ranks (issue 17, Inshrinkerator §5 on replicas).

tests/helpers/search_worker.py runs the ranks once per module: rank 0 leads a first search and a
neighbourhood search while rank 1 serves their trials, then runs both alone."""
from __future__ import annotations

import pytest
import torch
from rank_procs import run_ranks

from mvc.search import SearchSpace
from mvc.search.guided import MonotoneOracle, guided_search
from mvc.search.parallel import ParallelSearchError, active, ranks


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("search")
    from mvc.repo.repository import Repo
    Repo.init(root / "repo").close()
    Repo.init(root / "ddp_repo").close()
    out = run_ranks("search_worker.py", ["2", str(root)], lambda r: root / f"rank{r}.pt")
    return out + [{"root": root}]


@pytest.mark.parametrize("search", ["first", "next", "refined"])
def test_two_ranks_choose_what_one_process_chooses_in_fewer_rounds(reports, search):
    r0, r1, _ = reports
    par, alone = r0[search], r0[f"{search}_alone"]
    assert par["config"] is not None and par["config"] == alone["config"]
    # the refined search: the worker evaluated points of the finer cube the leader moved to
    assert par["refined"] == alone["refined"] == (True if search == "refined" else None)
    assert par["ranks"] == 2 and alone["rounds"] is None
    # one trial per rank per round; rounds replace the sequential trials
    assert par["trials"] <= 2 * par["rounds"]
    assert par["rounds"] < alone["trials"]
    # the winner was evaluated, and found feasible, in the parallel search
    assert any(t["feasible"] for t in par["log"])
    assert r1["after"] == "finished"   # the worker served both searches, then returned


def test_batched_guided_search_finds_the_sequential_winner():
    """On a monotone cube the (width+1)-ary diagonal search finds the same point."""
    shape = (6, 6, 3)

    def cost(i):
        return (i[0] + 1) * 2.0 + (3 - i[1]) * 0.7 + i[2] * 0.1

    def feasible(i):
        return i[0] + i[1] // 2 >= 4

    seq = MonotoneOracle(feasible)
    want = guided_search(shape, cost, seq)
    par = MonotoneOracle(feasible)
    rounds = []

    def prefetch(points):
        assert len(points) <= 3
        rounds.append(points)
        for p in points:
            par.seed(p, feasible(p))

    got = guided_search(shape, cost, par, prefetch=prefetch, width=3)
    assert got == want
    assert len(rounds) + par.probes < seq.probes


def test_parallel_search_needs_a_process_group():
    assert active() is None
    with pytest.raises(ParallelSearchError):
        with ranks():
            pass
    assert SearchSpace()  # the sequential search is untouched (tests/search/test_search_*.py)


def test_tracker_on_two_ranks_commits_once_with_the_parallel_search(reports):
    from mvc.repo.repository import Repo

    r0, r1, info = reports
    t0, t1 = r0["tracker"], r1["tracker"]
    assert t0["commit"] == t1["commit"] and t0["config"] == t1["config"]
    with Repo(info["root"] / "repo") as repo:
        assert [c.id for c in repo.log()] == [t0["commit"]]     # one commit, by rank 0
        quality = repo.read_commit(t0["commit"]).quality
    assert quality["ranks"] == 2 and quality["rounds"] >= 1
    assert quality["gate"] == "metric"


def test_a_ddp_model_with_buffers_is_evaluated_through_its_module(reports):
    """DDP's forward broadcasts buffers on the training group: evaluated through the wrapper,
    the ranks' different trials (and a background commit beside training) hung there."""
    from mvc.repo.repository import Repo

    info = reports[2]
    paths = [info["root"] / f"ddp{r}.pt" for r in range(2)]
    assert all(p.exists() for p in paths), "a rank did not finish its DDP commits"
    d0, d1 = (torch.load(p, weights_only=False) for p in paths)
    assert d0["evaluated"] == ["Sequential"]   # the wrapped module, never the DDP wrapper
    with Repo(info["root"] / "ddp_repo") as repo:
        ids = [c.id for c in repo.log()]
        for mode in ("foreground", "background"):
            assert d0[mode]["commit"] == d1[mode]["commit"] and d0[mode]["config"] is not None
            c = repo.read_commit(d0[mode]["commit"])
            assert c.quality["ranks"] == 2 and c.quality["gate"] == "metric"
            restored = repo.checkout(c.id)
            assert sorted(restored["model"]) == d0[mode]["keys"]   # the wrapper's own names
    assert ids == [d0["background"]["commit"], d0["foreground"]["commit"]]
