"""Issue 27: a commit whose hook runs out of device memory is made on the host instead.

A training process often leaves its GPU nearly full, and the hook needs room beside the state
(a fifth of it, about). Running out there must not cost the commit, or the training run that
made it: the hook runs again on host copies of the state (`mvc.repo.pipeline._quantization`),
with a warning, and stores what a host commit stores (the two paths give the same levels).

CPU tests run the device path on host tensors (`device_path()`) and make one of its passes,
on a pool thread, raise torch's out-of-memory error once; a CUDA-marked test caps the process's
share of a real GPU so the hook cannot fit beside the state.
"""
from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoints import adam_state, on_device

import mvc.quant.batched_sketch as batched_sketch
from mvc.errors import MvcWarning
from mvc.quant import QuantConfig
from mvc.quant.backend import device_path
from mvc.repo import pipeline
from mvc.repo.repository import Repo
from mvc.search.quality import PROXY_EPSILON
from mvc.state import flatten
from mvc.state.device_memory import (DEVICE_OUT_OF_MEMORY, host_copies, on_devices,
                                     other_accelerators)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OOM = "ran out of device memory"


def _records(repo: Repo, cid: str) -> dict[str, Any]:
    return {r.name: (r.codec, r.chunks, r.meta)
            for r in repo.read_snapshot(repo.read_commit(cid).snapshot).tensors}


def _bits(state: Any) -> dict[str, bytes]:
    return {k: t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            for k, t in flatten(state).tensors.items()}


def _commit(root: Path, state: Any, **kw: Any) -> tuple[dict[str, Any], dict[str, bytes]]:
    with Repo.init(root) as repo:
        cid = repo.commit(state, "c", epsilon=PROXY_EPSILON, **kw)
        return _records(repo, cid), _bits(repo.read_state(cid, cache_levels=False))


def _fails_once(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The device path's sketch pass raises torch's out-of-memory error the first time it runs
    (on whichever pool thread runs it first); returns the threads it failed on."""
    real = batched_sketch.bucket_keys
    lock = threading.Lock()
    failed: list[str] = []

    def bucket_keys(x: torch.Tensor, alpha: float) -> torch.Tensor:
        with lock:
            if not failed:
                failed.append(threading.current_thread().name)
                raise DEVICE_OUT_OF_MEMORY("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(x, alpha)

    monkeypatch.setattr(batched_sketch, "bucket_keys", bucket_keys)
    return failed


def test_a_hook_out_of_device_memory_commits_on_the_host(tmp_path, monkeypatch):
    state = adam_state(64, 96, 32)
    want = _commit(tmp_path / "host", state)
    failed = _fails_once(monkeypatch)
    with device_path(), pytest.warns(MvcWarning, match=OOM):
        got = _commit(tmp_path / "device", state)
    assert failed                       # the device attempt did run out
    assert got == want                  # the same records, chunk for chunk, and the same bits


def test_out_of_memory_of_the_retry_reaches_the_caller(tmp_path, monkeypatch):
    """The host attempt is made once: what it raises is the caller's."""
    calls: list[int] = []

    def never_fits(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        raise DEVICE_OUT_OF_MEMORY("CUDA out of memory")

    monkeypatch.setattr(pipeline, "plan_quantization", never_fits)
    with device_path(), pytest.warns(MvcWarning, match=OOM), \
            pytest.raises(DEVICE_OUT_OF_MEMORY), Repo.init(tmp_path / "r") as repo:
        repo.commit(adam_state(), "c", epsilon=PROXY_EPSILON)
    assert len(calls) == 2
    with Repo(tmp_path / "r") as repo:
        assert repo.head() is None      # nothing committed


def test_out_of_memory_on_the_host_path_is_not_retried(tmp_path, monkeypatch):
    """Host tensors took the host kernels already: there is nowhere else to go."""
    calls: list[int] = []

    def never_fits(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        raise DEVICE_OUT_OF_MEMORY("out of memory")

    monkeypatch.setattr(pipeline, "plan_quantization", never_fits)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MvcWarning)
        with pytest.raises(DEVICE_OUT_OF_MEMORY), Repo.init(tmp_path / "r") as repo:
            repo.commit(adam_state(), "c", epsilon=PROXY_EPSILON)
    assert len(calls) == 1


def test_a_quality_function_sees_the_retried_candidates(tmp_path, monkeypatch):
    """A search with a quality function retried on the host: the function is called on the
    retry's candidates and the search's answer is the host's."""
    state = adam_state(64, 96, 32)

    def quality(s: Any) -> float:
        return float(sum(float(t.float().pow(2).sum()) for t in s["model"].values()))

    want = _commit(tmp_path / "host", state, quality=quality)
    _fails_once(monkeypatch)
    with device_path(), pytest.warns(MvcWarning, match=OOM):
        got = _commit(tmp_path / "device", state, quality=quality)
    assert got == want


def test_host_copies_and_the_way_back():
    here = torch.arange(4.0)
    assert host_copies({"a": here})["a"] is here        # host tensors are not copied
    there = torch.ones(3, device="meta")                # a device this host lacks
    copies = {"a": here, "b": torch.ones(3)}            # b's host copy
    back = on_devices(copies, {"a": here, "b": there}, copies)
    assert back["a"] is here and back["b"] is there     # unchanged: the originals, no copy
    new = torch.zeros(3)
    moved = on_devices({"b": new, "c": new}, {"b": there}, copies)
    assert moved["b"].device.type == "meta" and moved["c"] is new


def test_only_accelerators_other_than_cuda_are_quantized_from_host_copies():
    """The hook's device path is CUDA's (float64 sums: Apple's MPS has none): a tensor on MPS
    or XLA is quantized from a host copy, a CUDA or host tensor where it is."""
    assert not other_accelerators(torch.zeros(2))
    assert not other_accelerators(torch.zeros(2, device="meta"))
    fake = type("T", (), {"device": torch.device("mps")})()
    assert other_accelerators(fake)                     # type: ignore[arg-type]
    assert not other_accelerators(type("T", (), {"device": torch.device("cuda", 1)})())  # type: ignore[arg-type]
    here = torch.arange(3.0)
    assert host_copies({"a": here}, lambda t: True)["a"] is here


@cuda
def test_cuda_commit_beside_a_full_gpu_stores_what_the_host_stores(tmp_path):  # pragma: no cover - no GPU in CI
    """The process may use only what the state already takes plus 1 MiB: the hook cannot fit,
    so the commit is made on the host, and stores the host commit's chunks."""
    state = adam_state(512, 1024, 512)
    repo_cfg = QuantConfig(bins=16, prune=0.1, protect=0.01, prune_metric="magnitude")
    roots = []
    for name in ("host", "device"):
        root = tmp_path / name
        with Repo.init(root) as repo:
            repo.config.set("commit.mode", "fixed")
            repo.config.set("commit.quant", repo_cfg.to_dict())
        roots.append(root)
    with Repo(roots[0]) as repo:
        want = _records(repo, repo.commit(state, "c"))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    on_gpu = on_device(state, "cuda")
    torch.cuda.synchronize()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 2**20) / total)
    try:
        with pytest.warns(MvcWarning, match=OOM), Repo(roots[1]) as repo:
            got = _records(repo, repo.commit(on_gpu, "c"))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert got == want


def test_a_lookup_out_of_device_memory_restores_on_the_host(monkeypatch):
    """A restore onto a device whose lookup runs out there looks the levels up on the host and
    moves the values: the same bits (checked here with the host standing in for the device)."""
    from mvc.quant import QuantizedTensor, quantize
    from mvc.repo import reader

    w = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    q = quantize(w, 16, prune=0.1, protect=0.01)
    want = q.dequantize()
    real = QuantizedTensor.lookup
    failed: list[int] = []

    def lookup(self: QuantizedTensor, values: torch.Tensor) -> torch.Tensor:
        if not failed:
            failed.append(1)
            raise DEVICE_OUT_OF_MEMORY("CUDA out of memory")
        return real(self, values)

    monkeypatch.setattr(QuantizedTensor, "lookup", lookup)
    rec = type("Rec", (), {"meta": {}})()
    with pytest.warns(MvcWarning, match="looking levels up on the host"):
        got = reader._values(rec, q, torch.device("cpu"))
    assert failed and torch.equal(got.view(torch.int32), want.view(torch.int32))


@cuda
def test_cuda_checkout_whose_lookups_run_out_restores_the_same_bits(tmp_path, monkeypatch):  # pragma: no cover - no GPU in CI
    from mvc.quant import QuantizedTensor

    state = adam_state(64, 96, 32)
    with Repo.init(tmp_path / "r") as repo:
        cid = repo.commit(state, "c", epsilon=PROXY_EPSILON)
        want = _bits(repo.read_state(cid, cache_levels=False))
        real = QuantizedTensor.lookup

        def lookup(self: QuantizedTensor, values: torch.Tensor) -> torch.Tensor:
            if self.levels.is_cuda:
                raise DEVICE_OUT_OF_MEMORY("CUDA out of memory")
            return real(self, values)

        monkeypatch.setattr(QuantizedTensor, "lookup", lookup)
        with pytest.warns(MvcWarning, match="looking levels up on the host"):
            got = repo.read_state(cid, cache_levels=False, map_location="cuda")
    assert all(t.is_cuda for t in flatten(got).tensors.values() if t.is_floating_point()
               and t.numel() > 1000)
    assert _bits(on_device(got, "cpu")) == want
