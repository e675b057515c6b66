"""A restore's `map_location` is checked before anything is read (mvc.state.devices): what
torch would reject deep inside the first copy, with an AssertionError or a RuntimeError, is a
`UsageError` naming the argument."""
from __future__ import annotations

import pytest
import torch

from mvc.errors import DataError, UsageError
from mvc.state import flatten, unflatten
from mvc.state.devices import check_usable, target_device


def test_devices_that_exist_pass():
    assert target_device(None) is None
    assert target_device("cpu") == torch.device("cpu")
    assert target_device(torch.device("cpu")) == torch.device("cpu")
    assert target_device("meta") == torch.device("meta")


@pytest.mark.parametrize("bad", ["bogus", "", "cuda:x", "cpu:-1:2"])
def test_a_name_that_is_no_device_is_named(bad):
    with pytest.raises(UsageError, match="is not a device"):
        target_device(bad)


@pytest.mark.parametrize("bad", [{"cuda:0": "cpu"}, lambda s, loc: s, 0])
def test_torch_load_s_other_forms_are_refused_by_name(bad):
    with pytest.raises(UsageError, match="device name or a torch.device"):
        target_device(bad)


def test_a_cuda_device_this_host_cannot_use_is_named():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(UsageError, match="CUDA is not available|no index"):
        target_device(f"cuda:{n}")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="map_location 'cuda': CUDA is not available"):
            target_device("cuda")
        with pytest.raises(UsageError, match="saved on cuda:0"):
            check_usable(torch.device("cuda:0"), "the state was saved on cuda:0")


def test_unflatten_checks_its_map_location():
    flat = flatten({"t": torch.randn(3)})
    with pytest.raises(UsageError, match="'bogus'"):
        unflatten(flat.skeleton, flat.tensors, map_location="bogus")


@pytest.mark.parametrize("recorded", ["bogus", 5, None, ""])
def test_a_recorded_device_that_is_none_is_a_malformed_skeleton(recorded):
    """`map_location=None` restores each tensor where it was saved: a skeleton whose recorded
    device names none is corrupt data, not torch's RuntimeError."""
    flat = flatten({"t": torch.randn(3)})
    skeleton = {**flat.skeleton, "entries": {"t": {**flat.skeleton["entries"]["t"],
                                                   "device": recorded}}}
    with pytest.raises(DataError, match="malformed state skeleton"):
        unflatten(skeleton, flat.tensors, map_location=None)


@pytest.mark.skipif(hasattr(torch, "xpu") and torch.xpu.is_available(), reason="has an XPU")
def test_a_recorded_accelerator_this_torch_lacks_is_named():
    flat = flatten({"t": torch.randn(3)})
    skeleton = {**flat.skeleton, "entries": {"t": {**flat.skeleton["entries"]["t"],
                                                   "device": "xpu:0"}}}
    with pytest.raises(UsageError, match="saved on xpu:0: xpu is not available here"):
        unflatten(skeleton, flat.tensors, map_location=None)
    with pytest.raises(UsageError, match="map_location 'xpu'"):
        target_device("xpu")


def test_an_index_free_cuda_is_the_calling_threads_current_device(monkeypatch):
    """'cuda' names the caller's current device: resolved where it is asked, not on the pool
    threads that decode (a new thread's current device is 0, so a rank that set its own
    would have had its tensors made on GPU 0). CUDA itself is stood in for: this machine may
    have none."""
    import mvc.state.devices as devices

    monkeypatch.setattr(devices, "check_usable", lambda device, what: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert target_device("cuda") == torch.device("cuda", 1)
    assert target_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert target_device("cuda:0") == torch.device("cuda", 0)   # an index given is kept
