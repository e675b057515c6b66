"""The default space's refinement: when every point is refused, the search goes on in
`SearchSpace.refined()` (finer levels, both families, error feedback) before a commit falls
back to lossless (issue 29: a fidelity gate at defaults stored a pretrained encoder at 1.2x)."""
from __future__ import annotations

import math

import pytest
import torch

from mvc.cli.commands_history import describe_quality
from mvc.search import SearchSpace, find_config
from mvc.search.space import FINER_BINS, FINER_EMBEDDING_BINS, SearchSpaceError


@pytest.fixture(scope="module")
def flat() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"l1.weight": torch.randn(128, 96, generator=g),
            "l2.weight": torch.randn(64, 128, generator=g),
            "l1.bias": torch.randn(128, generator=g)}


def _rel_loss(flat: dict[str, torch.Tensor]):
    """1 + the state's relative L2 error: a loss whose relative degradation is that error
    (64 bins measure about 0.023 on `flat`, 96 bins 0.017, 128 bins 0.012)."""
    den = sum(float(t.pow(2).sum()) for t in flat.values())

    def loss(candidate: dict[str, torch.Tensor]) -> float:
        num = sum(float((candidate[k] - flat[k]).pow(2).sum()) for k in flat)
        return 1.0 + math.sqrt(num / den)
    return loss


def test_refined_space_extends_every_axis_it_names():
    base = SearchSpace.default()
    assert base.refine and not SearchSpace().refine
    fine = base.refined()
    assert fine.bins == base.bins + FINER_BINS
    assert fine.embedding_bins == base.embedding_bins + FINER_EMBEDDING_BINS
    assert fine.family == ("kmeans", "uniform") and fine.feedback == (False, True)
    assert not fine.refine and (fine.prune, fine.protect) == (base.prune, base.protect)
    # values already as fine are not repeated; a space's own axes are kept
    own = SearchSpace(bins=(8, 128), embedding_bins=(256,), refine=True).refined()
    assert own.bins == (8, 128) and own.embedding_bins == (256,)
    # every point of the base maps onto the refined cube with the same values
    point = ("magnitude", (6, 2, 1, 1))
    mapped = fine.remap(point, base, True)
    assert base.config(point, True) == fine.config(mapped, True)


def test_refine_round_trips_and_is_checked():
    sp = SearchSpace.default()
    assert SearchSpace.from_json(sp.to_json()) == sp
    assert SearchSpace.from_dict({}).refine is False
    with pytest.raises(SearchSpaceError, match="refine"):
        SearchSpace(refine="yes")  # type: ignore[arg-type]


def test_everything_refused_goes_on_in_the_refined_space(flat):
    loss = _rel_loss(flat)
    given = find_config(flat, evaluate=loss, epsilon=0.02, space=SearchSpace(), seed=0)
    assert given.config is None                     # the space as given: lossless
    assert "refined" not in given.quality.to_json()
    default = find_config(flat, evaluate=loss, epsilon=0.02, seed=0)
    rec = default.quality.to_json()
    assert default.config is not None and default.config.bins in FINER_BINS
    assert rec["refined"] is True and rec["degradation"] <= 0.02
    assert "(exhaustive, refined)" in describe_quality(rec)          # mvc show / log
    assert "refined" not in describe_quality(given.quality.to_json())
    # the refused trials of the base space are not run again
    configs = [str(t["config"]) for t in rec["trials"]]
    assert len(configs) == len(set(configs))
    assert configs[:len(given.quality.to_json()["trials"])] == \
        [str(t["config"]) for t in given.quality.to_json()["trials"]]
    # the chosen quantization is the one measured
    cand = {k: (default.qmap[k].dequantize() if default.qmap.get(k) is not None else v)
            for k, v in flat.items()}
    assert loss(cand) - 1.0 == pytest.approx(rec["degradation"], rel=1e-6)


def test_nothing_refined_when_the_space_serves(flat):
    loss = _rel_loss(flat)
    plain = find_config(flat, evaluate=loss, epsilon=0.2, space=SearchSpace(), seed=0)
    default = find_config(flat, evaluate=loss, epsilon=0.2, seed=0)
    assert plain.config == default.config and plain.config is not None
    assert plain.quality.to_json() == default.quality.to_json()


def test_a_refined_parent_keeps_its_neighbourhood_in_the_refined_cube(flat):
    loss = _rel_loss(flat)
    first = find_config(flat, evaluate=loss, epsilon=0.02, seed=0)
    assert first.config is not None and first.config.bins in FINER_BINS
    steady = find_config(flat, evaluate=loss, epsilon=0.02, previous=first.config, seed=0)
    rec = steady.quality.to_json()
    assert rec["mode"] == "neighbourhood" and rec["refined"] is True
    assert steady.config is not None and steady.config.bins in FINER_BINS
    # the same parent under a space built by hand: snapped into that space, which refuses
    # everything, so lossless (as before refinement existed)
    given = find_config(flat, evaluate=loss, epsilon=0.02, previous=first.config,
                        space=SearchSpace())
    assert given.config is None


def test_a_refined_commit_chain_stores_deltas_and_restores_in_a_fresh_repo_handle(flat, tmp_path):
    """Repo.commit with the default space: a refined first commit, then a refined
    neighbourhood commit of slightly moved weights stored as a delta against it; both
    restore to exactly their quantizations, read through a new handle."""
    import mvc
    from mvc.io import flatten

    repo = mvc.Repo.init(tmp_path / "r")
    moved = {k: v + 1e-4 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1))
             for k, v in flat.items()}

    def nested(s: dict[str, torch.Tensor]):
        loss = _rel_loss(s)
        return lambda state: loss(state["m"])      # Repo.commit passes the state as given
    ids = [repo.commit({"m": s}, msg, quality=nested(s), epsilon=0.02)
           for s, msg in ((flat, "first"), (moved, "next"))]
    recs = [repo.read_commit(c).quality for c in ids]
    assert [r["mode"] for r in recs] == ["exhaustive", "neighbourhood"]
    assert all(r["refined"] is True for r in recs)
    assert repo.read_commit(ids[1]).quant["bins"] >= 96
    codecs = {r.name: r.codec for r in repo.read_snapshot(repo.read_commit(ids[1]).snapshot).tensors}
    assert codecs["m/l1.weight"] == codecs["m/l2.weight"] == "qdelta/1"
    repo.close()
    with mvc.Repo(tmp_path / "r") as again:
        for cid, state, rec in zip(ids, (flat, moved), recs):
            got = flatten(again.read_state(cid)).tensors
            assert torch.equal(got["m/l1.bias"], state["l1.bias"])       # small: exact
            num = sum(float((got[f"m/{k}"] - state[k]).pow(2).sum()) for k in state)
            den = sum(float(t.pow(2).sum()) for t in state.values())
            assert math.sqrt(num / den) == pytest.approx(rec["degradation"], rel=1e-6)


def test_a_parent_of_the_refined_family_keeps_its_neighbourhood(flat):
    """A refined search may choose the uniform grid at a bin count the default cube has: the
    next commit stays in that family's neighbourhood (its levels keep deltas sparse) instead
    of searching the default cube afresh and refining all over again."""
    from mvc.quant import QuantConfig

    loss = _rel_loss(flat)
    parent = QuantConfig(bins=64, protect=0.01, family="uniform")
    steady = find_config(flat, evaluate=loss, epsilon=0.2, previous=parent, seed=0)
    rec = steady.quality.to_json()
    assert rec["mode"] == "neighbourhood" and rec["refined"] is True
    assert steady.config is not None and steady.config.family == "uniform"
    assert all(t["config"].get("family") == "uniform" for t in rec["trials"])
    # a space built by hand does not refine: the family it lacks means a fresh search there
    fresh = find_config(flat, evaluate=loss, epsilon=0.2, previous=parent, space=SearchSpace())
    assert fresh.quality.to_json()["mode"] == "exhaustive" and fresh.config.family == "kmeans"
