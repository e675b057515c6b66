"""The config cube: Table 9 defaults, JSON round trip, axis order and the cost model."""
from __future__ import annotations

import itertools
import json

import pytest

from mvc.errors import UsageError
from mvc.quant import QuantConfig
from mvc.search import SearchSpace, SearchSpaceError
from mvc.search.space import short


def test_defaults_are_table_9_plus_64_bins():
    sp = SearchSpace()
    # Table 9's 4..32 plus one finer level: a commit whose 32-bin trial misses epsilon
    # gets 64 bins (~5x) instead of a lossless fallback (1.2x).
    assert sp.bins == (4, 6, 8, 12, 16, 32, 64)
    assert sp.embedding_bins == (16, 32)
    assert sp.prune == (0.5, 0.4, 0.3, 0.2, 0.1, 0.0)  # most compressive first
    assert sp.prune_metric == ("magnitude", "sensitivity")
    assert sp.protect == (0.0005, 0.005, 0.01)
    assert sp.shape(False) == (7, 6, 3) and sp.shape(True) == (7, 6, 3, 2)


def test_json_round_trip_and_custom_axes():
    sp = SearchSpace(bins=(16, 4), prune=(0.0, 0.25), prune_metric=("magnitude",), protect=(0.01,))
    assert sp.bins == (4, 16) and sp.prune == (0.25, 0.0)
    assert SearchSpace.from_json(sp.to_json()) == sp
    assert SearchSpace.from_dict(json.loads(json.dumps(sp.to_dict()))) == sp
    assert SearchSpace.from_dict({}) == SearchSpace()


@pytest.mark.parametrize("bad", [
    {"bins": ()}, {"bins": (0, 4)}, {"bins": (4, 4)}, {"prune": (1.5,)},
    {"prune_metric": ("weird",)}, {"prune": (0.6,), "protect": (0.5,)}, {"bins": "48"},
])
def test_invalid_spaces_raise(bad):
    with pytest.raises(SearchSpaceError) as ei:
        SearchSpace(**bad)
    assert isinstance(ei.value, UsageError) and ei.value.exit_code == 82


def test_unknown_json_key_raises():
    with pytest.raises(SearchSpaceError):
        SearchSpace.from_dict({"bins": [4], "colour": "red"})


@pytest.mark.parametrize("emb", [False, True])
def test_cost_is_monotone_along_every_axis(emb):
    sp = SearchSpace()
    shape = sp.shape(emb)
    for idx in itertools.product(*(range(n) for n in shape)):
        for a in range(len(shape)):
            if idx[a] + 1 < shape[a]:
                up = idx[:a] + (idx[a] + 1,) + idx[a + 1:]
                assert sp.cost(up, emb, 0.3) > sp.cost(idx, emb, 0.3)


def test_config_of_a_point_and_canonical_metric():
    sp = SearchSpace()
    cfg = sp.config(("sensitivity", (0, 0, 0)), False)
    assert (cfg.bins, cfg.prune, cfg.prune_metric, cfg.protect) == (4, 0.5, "sensitivity", 0.0005)
    zero = sp.config(("sensitivity", (5, 5, 2)), False)  # prune 0: metric irrelevant
    assert zero.prune == 0.0 and zero.prune_metric == "magnitude"
    assert sp.canonical(("sensitivity", (5, 5, 2)), False) == ("magnitude", (5, 5, 2))
    assert sp.config(("magnitude", (1, 1, 1, 1)), True).embedding_bins == 32


def test_snap_rounds_to_the_conservative_side():
    sp = SearchSpace()
    # bins 10 -> 12, prune 0.25 -> 0.2, protect 0.001 -> 0.005: never more aggressive
    idx = sp.snap(QuantConfig(bins=10, prune=0.25, protect=0.001), False)
    cfg = sp.config(("magnitude", idx), False)
    assert (cfg.bins, cfg.prune, cfg.protect) == (12, 0.2, 0.005)
    assert sp.snap(QuantConfig(bins=64, prune=0.0, protect=0.5), False) == (6, 5, 2)
    assert sp.snap(QuantConfig(bins=128, prune=0.0, protect=0.5), False) == (6, 5, 2)
    assert sp.snap(QuantConfig(bins=8, embedding_bins=None), True)[3] == 0  # 8 -> 16


def test_short_form():
    assert short(None) is None
    assert short(QuantConfig(bins=8, prune=0.1, protect=0.01, embedding_bins=32)) == {
        "bins": 8, "prune": 0.1, "metric": "magnitude", "protect": 0.01, "embedding_bins": 32}
