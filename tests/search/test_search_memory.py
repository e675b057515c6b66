"""What a commit hook holds, and for how long (issue 27: on a GPU every set of a state's levels
is a quarter of its float32 bytes, and the bound on the hook's extra GPU memory is a quarter).

Found with the device-memory estimate of `tests/helpers/sync_counter.py` on a 124M-parameter
state: a search whose runner sat in a reference cycle kept its trials' levels until Python's
cyclic collector next ran, which on a GPU may be many commits later (the cycle tests run with
that collector off and look at what the hook left unreachable but not freed); and a trial held
the previous trial's levels while it made its own, reused or not.
"""
from __future__ import annotations

import gc
from contextlib import nullcontext

import pytest
import torch

from mvc.quant.backend import device_path
from mvc.quant import QuantConfig
from mvc.search import Quantization, default_policy, plan_quantization
from mvc.search.prepared import Prepared
from mvc.search.trials import quantize_config
from mvc.state import flatten, unflatten
from sync_counter import SyncCounter


def _state() -> dict:
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    x = torch.randn(128, 64)
    for _ in range(5):
        loss = (net(x) - x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"model": net.state_dict(), "optimizer": opt.state_dict()}


def _garbage_after(fn) -> list:
    """The objects `fn` left in reference cycles (unreachable, not yet freed)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        out = fn()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    del out
    return left


@pytest.mark.parametrize("path", ["native", "device"])
def test_a_search_leaves_nothing_in_cycles(path):
    whole = flatten(_state())
    tensors = dict(whole.tensors)
    how = Quantization("search", epsilon=0.05, policy=default_policy(), optimizer="compressed")

    def hook():
        with device_path() if path == "device" else nullcontext():
            return plan_quantization(tensors, how, to_state=lambda t: unflatten(whole.skeleton, t))

    left = _garbage_after(hook)
    kinds = sorted({type(o).__name__ for o in left
                    if isinstance(o, torch.Tensor) or type(o).__module__.startswith("mvc.")})
    assert kinds == [], kinds
    assert not any(isinstance(o, torch.Tensor) for o in left)


def test_a_trial_drops_what_it_does_not_reuse_before_it_quantizes():
    tensors = {n: t for n, t in flatten(_state()).tensors.items() if n.startswith("model/")}
    prep = Prepared(tensors, {}, default_policy(), 0.01)
    _, last = quantize_config(prep, QuantConfig(bins=16), seed=0, init={}, weigh=True)
    assert last
    same = dict(last)
    qmap, keys = quantize_config(prep, QuantConfig(bins=16), seed=0, init={}, weigh=True,
                                 reuse=same)
    assert same.keys() == last.keys()  # every piece reused: nothing dropped, nothing made again
    assert all(keys[k] is last[k] for k in last)
    other = dict(last)
    seen: list[int] = []
    real = prep.quantize_group

    def spy(*a, **k):
        seen.append(len(other))  # what the trial still holds when it starts quantizing
        return real(*a, **k)

    prep.quantize_group = spy  # type: ignore[method-assign]
    quantize_config(prep, QuantConfig(bins=8), seed=0, init={}, weigh=True, reuse=other)
    assert seen and seen[0] == 0 and other == {}


def test_a_reused_layer_type_keeps_no_dropped_levels_on_the_device():
    """A trial that reuses some layer types of the last one and quantizes the others again
    holds one set of levels on the device. A batched pass's levels are one buffer that each
    of its tensors' levels is a view of: one pass over every layer type sharing a bins count
    kept the dropped layer types' levels alive through the reused ones' (found at 124M: a
    trial held 0.32x the weights' bytes more than its own levels, the embeddings')."""
    g = torch.Generator().manual_seed(5)
    tensors = {"model/wte.weight": torch.randn(1024, 64, generator=g),
               "model/h.0.fc.weight": torch.randn(256, 128, generator=g),
               "model/h.0.proj.weight": torch.randn(128, 256, generator=g)}
    prep = Prepared(tensors, {}, default_policy(), 0.01)
    one_set = sum(t.numel() for t in tensors.values())  # uint8 levels: a byte a value
    with device_path(), SyncCounter(device=list(tensors.values())) as counter:
        _, last = quantize_config(prep, QuantConfig(bins=16, embedding_bins=16), seed=0,
                                  init={}, weigh=True)
        reuse = dict(last)
        del last
        _, keys = quantize_config(prep, QuantConfig(bins=16, embedding_bins=32), seed=0,
                                  init={}, weigh=True, reuse=reuse)
        del reuse
        assert {k[0] for k in keys} == set(tensors)
        held = counter.live_bytes
    assert one_set <= held < one_set * 1.05  # (protected values and centroids besides)


def test_each_layer_type_is_quantized_with_its_own_bins():
    """Regression: the pieces' keys are made for every layer type before any is quantized, and
    each must then be quantized with its own key's bins, not the last layer type's."""
    g = torch.Generator().manual_seed(4)
    tensors = {"model/wte.weight": torch.randn(512, 32, generator=g),
               "model/h.0.fc.weight": torch.randn(256, 128, generator=g),
               "model/h.0.proj.weight": torch.randn(128, 256, generator=g)}
    prep = Prepared(tensors, {}, default_policy(), 0.01)
    assert len(prep.groups) == 2
    for path in ("native", "device"):
        with device_path() if path == "device" else nullcontext():
            qmap, keys = quantize_config(prep, QuantConfig(bins=64, embedding_bins=8), seed=0,
                                         init={}, weigh=True)
        assert qmap["model/wte.weight"].bins == 8, path
        assert qmap["model/h.0.fc.weight"].bins == qmap["model/h.0.proj.weight"].bins == 64, path
        assert all(q.bins == key[1] for key, got in keys.items() for q in got.values()), path


def test_on_a_device_a_search_holds_one_trials_levels(monkeypatch):
    """On a device (here `device_path()`) a trial starts with no earlier trial's quantization
    held (each set is a quarter of the weights' bytes there); the winner, if it was not the
    latest trial, is made again: the same plan as the native search, which keeps its best."""
    import mvc.search.runner as runner_mod

    runners: list = []
    held: list[int] = []
    init, qc = runner_mod.Runner.__init__, runner_mod.quantize_config

    def spy_init(self, *a, **k):
        init(self, *a, **k)
        runners.append(self)

    def spy_qc(*a, **k):
        held.append(sum(tr.qmap is not None for r in runners for tr in r.memo.values()))
        return qc(*a, **k)

    monkeypatch.setattr(runner_mod.Runner, "__init__", spy_init)
    monkeypatch.setattr(runner_mod, "quantize_config", spy_qc)
    whole = flatten(_state())
    tensors = dict(whole.tensors)
    how = Quantization("search", epsilon=0.05, policy=default_policy())
    plans = {}
    for path in ("native", "device"):
        runners.clear()
        held.clear()
        with device_path() if path == "device" else nullcontext():
            plans[path] = plan_quantization(tensors, how,
                                            to_state=lambda t: unflatten(whole.skeleton, t))
        assert runners and runners[0].frugal == (path == "device")
        if path == "device":
            assert len(held) > 2 and max(held) == 0, held
    native, device = plans["native"], plans["device"]
    assert native.config == device.config and native.quantized.keys() == device.quantized.keys()
    for name, q in native.quantized.items():
        assert torch.equal(q.levels, device.quantized[name].levels), name
