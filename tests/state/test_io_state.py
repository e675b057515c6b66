"""flatten/unflatten: exact structure, every dtype, strides and shared storage."""
from __future__ import annotations

import json
import random
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch
from checkpoints import (INT_VIEW, all_tensors, assert_identical, assert_same_sharing, realistic_checkpoint,
                         tensor_bytes)

from mvc.errors import DataError, MvcError
from mvc.io import FlatState, UnsupportedStateError, flatten, unflatten

# ----------------------------------------------------------------------------- helpers


def stored(flat: FlatState) -> dict[str, torch.Tensor]:
    """Simulate a store: contiguous private copies of each entry's logical values."""
    copies = {}
    for name, t in flat.tensors.items():
        # via a same-size integer view: sub-byte dtypes (uint4...) have no copy kernel
        bits = t.detach().cpu().view(INT_VIEW[t.element_size()]) if t.element_size() in INT_VIEW else t.detach().cpu()
        copies[name] = bits.clone(memory_format=torch.contiguous_format).view(t.dtype)
    return copies


def roundtrip(state: Any, **kwargs: Any) -> Any:
    flat = flatten(state)
    skeleton = json.loads(json.dumps(flat.skeleton, allow_nan=False))
    return unflatten(skeleton, stored(flat), **kwargs)


def all_dtypes() -> list[torch.dtype]:
    found = {getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    usable = []
    for dtype in found:
        if str(dtype).startswith("torch.q"):  # quantized dtypes are refused (tested below)
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # complex32 is "experimental"
                torch.empty(2, dtype=dtype)
        except Exception:
            continue
        usable.append(dtype)
    return sorted(usable, key=str)


def random_tensor(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """Random bit patterns of `dtype` (NaNs and all), generated via uint8."""
    size = torch.empty(0, dtype=dtype).element_size()
    high = 2 if dtype == torch.bool else 256  # other bytes are not valid bools
    raw = torch.randint(0, high, (*shape[:-1], shape[-1] * size), dtype=torch.uint8)
    return raw.view(dtype)


# ----------------------------------------------------------------------------- realistic


def test_realistic_checkpoint_roundtrip_is_bit_identical() -> None:
    state = realistic_checkpoint()
    out = roundtrip(state)
    assert_identical(state, out)
    assert_same_sharing(state, out)
    assert list(out) == list(state)
    assert isinstance(out["model"], OrderedDict) and out["model"]._metadata == state["model"]._metadata
    assert all(type(k) is int for k in out["optimizer"]["state"])
    assert out["py_rng"] == state["py_rng"]
    random.setstate(out["py_rng"])  # the restored value is usable as RNG state
    np.random.set_state(out["np_rng"])
    torch.set_rng_state(out["rng"])


def test_realistic_names_and_tied_weights_stored_once() -> None:
    state = realistic_checkpoint()
    flat = flatten(state)
    names = list(flat.tensors)
    assert names[0] == "model/0.weight"
    assert "model/2.weight" not in flat.tensors  # tied to 0.weight: stored once
    assert "optimizer/state/0/exp_avg" in flat.tensors and "optimizer/state/0/step" in flat.tensors
    assert "rng" in flat.tensors and "counts" in flat.tensors
    out = roundtrip(state)
    w0, w2 = out["model"]["0.weight"], out["model"]["2.weight"]
    assert w0 is not w2 and w0.untyped_storage().data_ptr() == w2.untyped_storage().data_ptr()
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 16))
    model.load_state_dict(out["model"])


def test_names_are_stable_across_commits_of_the_same_structure() -> None:
    a, b = realistic_checkpoint(), realistic_checkpoint()
    b["epoch"] = 4
    for t in all_tensors(b["model"]):
        t.add_(1) if t.is_floating_point() else None
    assert list(flatten(a).tensors) == list(flatten(b).tensors)


def test_skeleton_is_strict_json() -> None:
    state = {"x": [float("nan"), float("inf"), -0.0, 2**80, b"\x00\xff"], "t": torch.ones(2)}
    json.dumps(flatten(state).skeleton, allow_nan=False)


# ----------------------------------------------------------------------------- dtypes


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_every_dtype_roundtrips_bit_exact(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    base = random_tensor(dtype, 3, 4)
    state = {
        "plain": base,
        "transposed": random_tensor(dtype, 4, 3).t(),
        "scalar": random_tensor(dtype, 1).reshape(()),
        "empty": torch.empty(0, 5, dtype=dtype),
        "gapped": random_tensor(dtype, 4, 6)[:, ::2],
    }
    out = roundtrip(state)
    assert_identical(state, out)
    assert not out["transposed"].is_contiguous()


def test_float_specials_and_nan_payloads_survive() -> None:
    bits = torch.tensor([0x7FC00001, 0xFF800000, 0x7F800000, 0x80000000, 0x7FA00000], dtype=torch.int64)
    t = bits.to(torch.int32).view(torch.float32)
    out = roundtrip({"t": t})
    assert tensor_bytes(out["t"]) == tensor_bytes(t)


# ----------------------------------------------------------------------------- layouts and sharing


def test_layouts_keep_strides() -> None:
    state = {
        "transposed": torch.randn(4, 6).t(),
        "gapped": torch.randn(4, 6)[:, ::2],
        "offset_slice": torch.randn(4, 6)[1:3],
        "expanded": torch.randn(1, 3).expand(5, 3),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "size1_odd_stride": torch.randn(3).as_strided((1, 3), (7, 1)),
    }
    out = roundtrip(state)
    assert_identical(state, out)
    assert out["expanded"].stride() == (0, 1)
    assert out["channels_last"].is_contiguous(memory_format=torch.channels_last)


def test_same_object_twice_restores_the_same_object() -> None:
    t = torch.randn(3)
    state = {"a": t, "b": [t, (t,)]}
    flat = flatten(state)
    assert list(flat.tensors) == ["a"]
    out = roundtrip(state)
    assert out["a"] is out["b"][0] is out["b"][1][0]


def test_views_of_one_buffer_are_stored_once_and_restored_as_views() -> None:
    buf = torch.arange(24, dtype=torch.float32)
    state = {
        "first": buf[:10].view(2, 5),
        "second": buf[5:15],
        "matrix_t": buf[4:24].view(4, 5).t(),
        "strided": buf[3::4],
    }
    flat = flatten(state)
    assert len(flat.tensors) == 1
    (entry,) = flat.tensors.values()
    assert entry.dtype == torch.float32 and entry.numel() == 24  # covering span only
    out = roundtrip(state)
    assert_identical(state, out)
    assert_same_sharing(state, out)
    out["second"][0] = 100.0  # writes through like the original views
    assert out["first"][1, 0].item() == 100.0


def test_covering_member_keeps_its_shape() -> None:
    w = torch.randn(4, 3)
    flat = flatten({"w": w, "row": w[1]})
    assert list(flat.tensors) == ["w"] and flat.tensors["w"].shape == (4, 3)
    out = roundtrip({"w": w, "row": w[1]})
    assert_same_sharing({"w": w, "row": w[1]}, out)


def test_views_with_different_dtypes_share_one_byte_span() -> None:
    x = torch.randn(8)
    state = {"f": x, "i": x.view(torch.int32), "b": x.view(torch.uint8)[5:11], "h": x.view(torch.bfloat16)[3:7]}
    flat = flatten(state)
    assert len(flat.tensors) == 1
    out = roundtrip(state)
    assert_identical(state, out)
    assert_same_sharing(state, out)


def test_span_of_a_larger_storage_stores_only_the_span() -> None:
    big = torch.randn(1000)
    state = {"a": big[10:20], "b": big[15:30]}
    flat = flatten(state)
    (entry,) = flat.tensors.values()
    assert entry.numel() == 20
    assert_identical(state, roundtrip(state))


def test_parameters_and_requires_grad() -> None:
    p = torch.nn.Parameter(torch.randn(3))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    leaf = torch.randn(2, requires_grad=True)
    state = {"p": p, "frozen": frozen, "leaf": leaf, "p_again": p, "p_data": p.detach()}
    out = roundtrip(state)
    assert_identical(state, out)
    assert type(out["p"]) is torch.nn.Parameter and out["p"].requires_grad
    assert type(out["frozen"]) is torch.nn.Parameter and not out["frozen"].requires_grad
    assert out["p"] is out["p_again"]
    assert out["p_data"].untyped_storage().data_ptr() == out["p"].untyped_storage().data_ptr()


def test_unflatten_accepts_non_contiguous_or_offset_inputs() -> None:
    buf = torch.arange(10, dtype=torch.float32)
    state = {"a": buf[:6], "b": buf[4:]}
    flat = flatten(state)
    skeleton = json.loads(json.dumps(flat.skeleton))
    (name,) = flat.tensors
    backing = torch.zeros(40)
    backing[3:13] = flat.tensors[name]
    out = unflatten(skeleton, {name: backing[3:13]})  # an offset view, e.g. a slice of a decode buffer
    assert_identical(state, out)
    t = torch.randn(3, 4)
    flat = flatten({"t": t})
    out = unflatten(flat.skeleton, {"t": t.t().contiguous().t()})  # Fortran-ordered copy
    assert_identical({"t": t}, out)


def test_map_location_none_restores_recorded_device() -> None:
    state = {"t": torch.randn(2)}
    out = roundtrip(state, map_location=None)
    assert out["t"].device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_restore_on_cpu_by_default() -> None:  # pragma: no cover - no GPU in CI
    w = torch.randn(4, 4, device="cuda")
    state = {"w": w, "tied": w, "view": w[1]}
    out = roundtrip(state)
    assert out["w"].device.type == "cpu"
    assert torch.equal(out["w"], w.cpu())
    assert out["view"].untyped_storage().data_ptr() == out["w"].untyped_storage().data_ptr()


# ----------------------------------------------------------------------------- structure and names


def test_containers_keys_and_leaves_roundtrip() -> None:
    od = OrderedDict([("z", 1), ("a", 2)])
    od._metadata = OrderedDict([("", {"version": 1})])  # type: ignore[attr-defined]
    state = {
        "b": 1,
        "a": [1, (2, 3), [], ()],
        0: "int key",
        1.5: "float key",
        True: "bool key",
        None: "none key",
        (1, "x", None): "tuple key",
        "od": od,
        "leaves": [2**100, -(2**70), -0.0, float("nan"), float("-inf"), 1e-310, "é\udc80", b"\x00", bytearray(b"ab"),
                   3 + 4j, torch.float16, torch.Size([2, 3]), torch.device("cpu"), np.float32(1.5), np.int64(-3),
                   np.arange(6, dtype=">i4").reshape(2, 3), {1, 2, 3}, frozenset({"a", "b"})],
        "nested": [[[[{"deep": torch.ones(1)}]]]],
    }
    out = roundtrip(state)
    assert_identical(state, out)
    assert list(out) == list(state)


def test_deep_nesting() -> None:
    state: Any = torch.ones(1)
    for i in range(200):
        state = {"k": state} if i % 2 else [state]
    assert_identical(state, roundtrip(state))


def test_top_level_tensor_and_scalar_states() -> None:
    assert_identical(torch.ones(3), roundtrip(torch.ones(3)))
    assert list(flatten(torch.ones(3)).tensors) == ["tensor"]
    assert roundtrip(7) == 7 and roundtrip(None) is None


def test_colliding_names_are_disambiguated_deterministically() -> None:
    state = {"a/b": torch.ones(1), "a": {"b": torch.zeros(1)}, 0: torch.ones(2), "0": torch.zeros(2)}
    names = list(flatten(state).tensors)
    assert names == ["a/b", "a/b~1", "0", "0~1"]
    assert names == list(flatten(state).tensors)
    assert_identical(state, roundtrip(state))


def test_model_state_dict_loads_back() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    out = roundtrip(model.state_dict())
    fresh = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    fresh.load_state_dict(out)
    assert_identical(model.state_dict(), fresh.state_dict())


# ----------------------------------------------------------------------------- refusals


class _Opaque:
    pass


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested/quantized tensors are prototype/deprecated APIs
@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda: torch.ones(2).to_sparse(), "sparse"),
        (lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8), "quantized"),
        (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested"),
        (lambda: torch.empty(2, device="meta"), "meta"),
        (_Opaque, "weights_only"),
        (lambda: (lambda: 1), "state"),
    ],
    ids=["sparse", "quantized", "nested", "meta", "object", "lambda"],
)
def test_unsupported_values_name_their_key_path(make: Any, fragment: str) -> None:
    with pytest.raises(UnsupportedStateError) as info:
        flatten({"outer": {"inner": [1, make()]}})
    message = str(info.value)
    assert "state['outer']['inner'][1]" in message and fragment in message
    assert info.value.exit_code == 24 and isinstance(info.value, MvcError)


def test_tensor_subclass_and_cycle_are_refused() -> None:
    class Sub(torch.Tensor):
        pass

    with pytest.raises(UnsupportedStateError, match="subclass"):
        flatten({"x": torch.ones(2).as_subclass(Sub)})
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(UnsupportedStateError, match="cycle"):
        flatten({"loop": loop})
    with pytest.raises(UnsupportedStateError, match="keys"):
        flatten({torch.ones(1): 1})


def test_unflatten_rejects_missing_or_mismatched_tensors() -> None:
    flat = flatten({"w": torch.randn(2, 3)})
    with pytest.raises(DataError, match="missing"):
        unflatten(flat.skeleton, {})
    with pytest.raises(DataError, match="expected"):
        unflatten(flat.skeleton, {"w": torch.randn(3, 2)})
    with pytest.raises(DataError, match="expected"):
        unflatten(flat.skeleton, {"w": torch.randn(2, 3, dtype=torch.float64)})
    with pytest.raises(DataError):
        unflatten({**flat.skeleton, "format": 99}, flat.tensors)
    with pytest.raises(DataError):
        unflatten({"format": 1, "root": {"t": "bogus"}, "entries": {}, "objects": []}, {})
    with pytest.raises(DataError):
        unflatten({"format": 1, "root": {"t": "tensor", "o": 5}, "entries": {}, "objects": []}, {})



@pytest.mark.parametrize("stride", [[1, 1 << 40], [-1, 4], [1, 5], "x", [1]])
def test_hostile_dense_layout_is_a_data_error_without_allocating(stride):
    import copy

    from mvc.errors import DataError
    from mvc.state import flatten, unflatten

    x = torch.randn(3, 4).t()
    flat = flatten({"x": x})
    skeleton = copy.deepcopy(flat.skeleton)
    skeleton["objects"][0]["stride"] = stride
    with pytest.raises(DataError, match="malformed state skeleton"):
        unflatten(skeleton, flat.tensors)
    good = unflatten(flat.skeleton, flat.tensors)["x"]  # the untouched skeleton still rebuilds
    assert torch.equal(good, x) and good.stride() == x.stride()
