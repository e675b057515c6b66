"""`mvc.search.QualityRecord` (issue 26 item 1): one typed record, the same JSON.

A commit's id hashes its quality record's JSON, so `from_json(d).to_json() == d` for every
record ever written -- the fixture repository's, each writer's today, and any JSON object.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import shutil
import subprocess
import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from locations import FIXTURES

import mvc.search
from mvc.quant import QuantConfig
from mvc.repo.objects import checked_encoding
from mvc.repo.repository import Repo
from mvc.search import QualityRecord, SearchSpace, find_config
from mvc.search.record import _CHECKS
from mvc.store import object_id

KNOWN = sorted(_CHECKS)


def _same(d: dict) -> None:
    """`d` survives the record both ways, and its typed fields hold what it says."""
    rec = QualityRecord.from_json(d)
    assert rec.to_json() == d
    for k, v in d.items():
        if k not in _CHECKS:
            assert rec.extra[k] == v
        elif v is None:
            assert getattr(rec, k) is None and k in rec.nulls and k not in rec.extra
        elif _CHECKS[k](v):
            assert getattr(rec, k) == v and k not in rec.extra
        else:  # a known key holding a value of another type: kept as it is, not typed
            assert getattr(rec, k) is None and rec.extra[k] == v


# ------------------------------------------------------------------ records on disk
def test_fixture_records_round_trip_to_the_same_commit_ids(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(FIXTURES / "repo_v1" / "mvc", root / ".mvc")
    with Repo(root) as repo:
        commits = repo.log(all_refs=True)
        records = [c for c in commits if c.quality]
        assert len(records) >= 3   # the fixture's lossy commits (search, with moments)
        for c in commits:
            if c.quality is None:
                continue
            _same(c.quality)
            again = dataclasses.replace(c, quality=QualityRecord.from_json(c.quality).to_json())
            assert object_id(checked_encoding(again)) == c.id


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"fc1.weight": torch.randn(96, 64, generator=g) * 0.1,
                      "fc2.weight": torch.randn(32, 96, generator=g) * 0.1,
                      "fc2.bias": torch.zeros(32)}}


SPACE = SearchSpace(bins=(4, 8), prune=(0.0, 0.3), prune_metric=("magnitude",), protect=(0.0,))


def _loss(state) -> float:
    w = state["model"]["fc1.weight"] if "model" in state else state["model/fc1.weight"]
    return 1.0 + float(w.float().pow(2).mean())


def test_records_each_commit_path_writes_round_trip(tmp_path):
    with Repo.init(tmp_path) as repo:
        paths = {
            "proxy search": repo.commit(_state(0), "proxy", epsilon=0.05, space=SPACE),
            "metric search": repo.commit(_state(1), "metric", quality=_loss, epsilon=0.01,
                                         space=SPACE),
            "lossless fallback": repo.commit(_state(2), "fallback", quality=_loss, epsilon=0.0,
                                             space=SearchSpace(bins=(2,), prune=(0.9,),
                                                               prune_metric=("magnitude",),
                                                               protect=(0.0,))),
            "fixed": repo.commit(_state(3), "fixed", quant=QuantConfig(bins=8)),
            "fixed, quality fn": repo.commit(_state(4), "fixed q", quant=QuantConfig(bins=8),
                                             quality=_loss),
        }
        repo.config.set("commit.optimizer", "compressed")
        model = torch.nn.Linear(64, 32)
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(4, 64)).pow(2).mean().backward()
        opt.step()
        paths["moments"] = repo.commit({"model": model.state_dict(), "optimizer": opt.state_dict()},
                                       "moments", quant=QuantConfig(bins=8))
        got = {what: repo.read_commit(cid).quality for what, cid in paths.items()}
    for what, q in got.items():
        assert q, what
        _same(q)
    assert QualityRecord.from_json(got["lossless fallback"]).lossless_fallback
    assert got["lossless fallback"]["value"] is None and "closest" in got["lossless fallback"]
    fixed = QualityRecord.from_json(got["fixed"])
    assert fixed.gate_name == "none" and "bound" in got["fixed"] and fixed.bound is None
    assert QualityRecord.from_json(got["fixed, quality fn"]).rel_l2_weights is not None
    assert QualityRecord.from_json(got["moments"]).moment_cap is not None


def test_search_results_carry_the_record():
    flat = {"model/fc1.weight": _state()["model"]["fc1.weight"]}
    res = find_config(flat, evaluate=_loss, epsilon=0.01, space=SPACE)
    assert isinstance(res.quality, QualityRecord) and res.quality.gate == "metric"
    _same(res.quality.to_json())
    none = find_config({"model/fc2.bias": torch.zeros(32)})
    assert none.quality.mode == "nothing-to-quantize" and none.quality.to_json()["gate"] is None
    _same(none.quality.to_json())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_records_a_sharded_save_writes_round_trip(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from mvc.dcp import MvcStorageWriter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    msd, osd = get_state_dict(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    Repo.init(tmp_path / "repo").close()
    got = []
    for options in ({"epsilon": 0.05}, {"quant": QuantConfig(bins=8)}, {"epsilon": 1e-9}):
        w = MvcStorageWriter(tmp_path / "repo", message="sharded", **options)
        dcp.save({"model": msd, "optim": osd}, storage_writer=w)   # one process: no group
        with Repo(tmp_path / "repo") as repo:
            got.append(repo.read_commit(w.commit_id).quality)
    for q in got:
        _same(q)
        assert QualityRecord.from_json(q).sharded
    assert QualityRecord.from_json(got[2]).lossless_fallback


#: Records as the sharded (DCP) save and older versions wrote them.
WRITTEN = [
    {"metric": "proxy:magnitude_weighted_rel_l2", "value": 0.01, "baseline": 0.0, "bound": None,
     "gate": "none", "quantized_tensors": 3, "max_distortion": 0.2, "worst_tensor": "a",
     "sharded": True},
    {"metric": "proxy:magnitude_weighted_rel_l2", "baseline": 0.0, "epsilon": 0.05,
     "evaluations": 0, "mode": "exhaustive-sharded", "gate": "proxy", "bound": 0.05,
     "tensor_cap": 0.5, "sharded": True, "trials": [], "value": None, "degradation": None,
     "stored": "lossless: no feasible configuration"},
    {"metric": "quality:f", "baseline": 2.0, "value": 2.01, "degradation": 0.005,
     "epsilon": 0.01, "evaluations": 4, "mode": "exhaustive", "bits_per_param": 2.5,
     "trials": [{"config": {"bins": 8}, "value": 2.01}]},            # before `gate` (issue 15)
    {"metric": "rel_l2_weights", "value": 0.07, "baseline": 0.0, "bound": None,
     "quantized_tensors": 2},                                          # fixed, before gates
]


@pytest.mark.parametrize("d", WRITTEN)
def test_written_records_round_trip(d):
    _same(d)


def test_gate_of_old_records_is_inferred():
    assert QualityRecord.from_json(WRITTEN[2]).gate_name == "metric"
    assert QualityRecord.from_json(WRITTEN[3]).gate_name == "none"
    assert QualityRecord.from_json({"metric": "proxy:x"}).gate_name == "proxy"


def test_closest_trial_helpers():
    rec = QualityRecord.from_json({"stored": "lossless: no feasible configuration", "closest": {
        "config": {"bins": 4, "prune": 0.5}, "degradation": 0.2, "refused": "tensor_cap: x"}})
    assert rec.lossless_fallback and rec.closest_config == {"bins": 4, "prune": 0.5}
    assert rec.closest_degradation == 0.2 and rec.closest_refused == "tensor_cap: x"
    assert not QualityRecord.from_json({"stored": "lossless", "mode": "nothing-to-quantize"}
                                       ).lossless_fallback
    empty = QualityRecord()
    assert empty.closest_config == {} and empty.closest_degradation is None
    assert empty.to_json() == {}


def test_updates_keep_absent_and_null_apart():
    rec = QualityRecord(metric="m", value=None, nulls=frozenset({"value"}))
    assert rec.to_json() == {"metric": "m", "value": None}
    assert rec.updated(stored="s").to_json() == {"metric": "m", "value": None, "stored": "s"}
    assert rec.updated(ucb=None).to_json() == {"metric": "m", "value": None, "ucb": None}
    odd = QualityRecord.from_json({"value": "high"})        # a known key of another type
    assert odd.value is None and odd.updated(value=1.0).to_json() == {"value": 1.0}
    assert rec.merged({"x": 1, "ucb": 0.5}).to_json() == {"metric": "m", "value": None, "x": 1,
                                                          "ucb": 0.5}


# ------------------------------------------------------------------ any JSON object
_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8) \
    | st.floats(allow_nan=False, allow_infinity=False)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
_keys = st.sampled_from(KNOWN + ["extra", "nulls", "sharded_by", ""]) | st.text(max_size=10)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _json, max_size=12))
def test_any_json_object_round_trips(d):
    _same(d)


@settings(max_examples=100, deadline=None)
@given(st.fixed_dictionaries({}, optional={
    "metric": st.text(max_size=5), "value": st.floats(allow_nan=False) | st.none(),
    "evaluations": st.integers(), "trials": st.lists(st.dictionaries(st.text(max_size=3),
                                                                     _scalars, max_size=3)),
    "moment_distortion": st.dictionaries(st.sampled_from(["linear", "log"]),
                                         st.floats(allow_nan=False) | st.none()),
    "suspicious": st.booleans()}))
def test_typed_fields_hold_well_typed_values(d):
    rec = QualityRecord.from_json(d)
    assert not rec.extra and rec.to_json() == d
    if "evaluations" in d:
        assert rec.evaluations == d["evaluations"]


def test_integral_numbers_stay_ints_and_bools_are_not_numbers():
    d = {"baseline": 0, "value": True, "evaluations": 2.0}
    rec = QualityRecord.from_json(d)
    assert rec.baseline == 0 and type(rec.to_json()["baseline"]) is int
    assert rec.value is None and rec.evaluations is None and rec.to_json() == d
    assert math.isinf(QualityRecord(value=math.inf).to_json()["value"])   # not its job to clean


# ------------------------------------------------------------------ the package stays light
def test_reading_a_record_does_not_import_torch():
    probe = ("import sys\nfrom mvc.search import QualityRecord\n"
             "QualityRecord.from_json({'gate': 'proxy'}).gate_name\n"
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_lazy_package_names():
    # importing a submodule binds it on the package: it must not hide the function of its name
    importlib.import_module("mvc.search.fidelity")
    importlib.import_module("mvc.search.neighbourhood")
    assert sorted(mvc.search.__all__) == sorted(mvc.search._EXPORTS)
    assert callable(mvc.search.fidelity) and callable(mvc.search.neighbourhood)
    assert not isinstance(mvc.search.fidelity, types.ModuleType)
    for name in mvc.search.__all__:
        assert getattr(mvc.search, name) is not None
    with pytest.raises(AttributeError):
        mvc.search.no_such_name
