"""Issue 27: the quantizer's device (torch) code path, run on host tensors, against the native one.

CUDA tensors take torch's ops (sketches, masks, assignment, error sums, level counts, optimizer
moments); host tensors take the native kernels. `mvc.quant.backend.device_path()` sends host
tensors down the device path, so CPU-only CI runs the code a GPU runs: the same search (configs,
trials, their proxy values to float64 summation order), the same stored chunks and bit-identical restores, for a first commit
and a delta commit on top of it, weights and compressed Adam moments alike.
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoints import on_device
from torch import nn

from mvc.quant import quantize
from mvc.quant.backend import device_path, on_host_kernels
from mvc.repo.repository import Repo
from mvc.search.quality import PROXY_EPSILON
from mvc.state import flatten

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _states() -> list[dict[str, Any]]:
    """Two checkpoints of a small model trained with AdamW, a few steps apart."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(512, 64), nn.Flatten(), nn.Linear(64 * 4, 256), nn.GELU(),
                          nn.Linear(256, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for steps in (3, 3):
        for _ in range(steps):
            idx = torch.randint(0, 512, (16, 4))
            loss = nn.functional.cross_entropy(model(idx), torch.randint(0, 512, (16,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
        out.append({"model": {k: v.clone() for k, v in model.state_dict().items()},
                    "optimizer": _clone(opt.state_dict())})
    return out


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def _bits(state: Any) -> dict[str, bytes]:
    return {k: t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            for k, t in flatten(state).tensors.items()}


def _history(root: Path, device: bool, triton: bool = False) -> dict[str, Any]:
    states = _states()
    kernel = nullcontext()
    if triton:
        from mvc.quant.triton_assign import triton_path
        kernel = triton_path()
    with (device_path() if device else nullcontext()), kernel, Repo.init(root) as repo:
        ids = [repo.commit(s, f"c{i}", epsilon=PROXY_EPSILON) for i, s in enumerate(states)]
        commits = [repo.read_commit(c) for c in ids]
        recs = [{r.name: (r.codec, r.chunks, r.stored_bytes, r.meta)
                 for r in repo.read_snapshot(c.snapshot).tensors} for c in commits]
        restored = [_bits(repo.read_state(c, cache_levels=False)) for c in ids]
    return {"quant": [c.quant for c in commits],
            "trials": [(c.quality or {}).get("trials") for c in commits],
            "records": recs, "restored": restored}


def test_the_device_path_runs_on_host_tensors():
    t = torch.zeros(3)
    assert on_host_kernels(t)
    with device_path():
        assert not on_host_kernels(t)
    assert on_host_kernels(t)


def test_a_lossy_history_is_the_same_on_the_device_path(tmp_path):
    native = _history(tmp_path / "native", device=False)
    device = _history(tmp_path / "device", device=True)
    assert native["quant"][0] is not None and native["records"][1]  # a real search, deltas
    assert any("qdelta" in r[0] for r in native["records"][1].values())
    assert any(r[3].get("moment") for r in native["records"][0].values())  # moments compressed
    assert device["quant"] == native["quant"]
    # The same trials in the same order with the same outcome; their measured values agree to
    # float64 summation order (torch sums chunk by chunk, the native kernels block by block).
    for a, b in zip(device["trials"], native["trials"], strict=True):
        assert [(t["config"], t["feasible"], t["bits"]) for t in a] == \
            [(t["config"], t["feasible"], t["bits"]) for t in b]
        assert [t["value"] for t in a] == pytest.approx([t["value"] for t in b], rel=1e-9)
    assert device["records"] == native["records"]      # the same chunks, byte for byte
    assert device["restored"] == native["restored"]


@pytest.mark.slow
def test_a_lossy_history_is_the_same_with_the_triton_kernel(tmp_path):
    """The device path with each chunk's assignment in the Triton kernel (here in Triton's
    interpreter): the same search, the same chunks, the same restores as the native path."""
    pytest.importorskip("triton")
    import mvc.quant.triton_assign as ta
    if not ta.runs_on_host():
        pytest.skip("Triton's interpreter is off (conftest leaves it off where CUDA is)")

    native = _history(tmp_path / "native", device=False)
    before = ta.launches
    kernel = _history(tmp_path / "triton", device=True, triton=True)
    assert ta.launches > before and not ta._failed  # the kernel ran, not its fallback
    assert kernel["quant"] == native["quant"]
    for a, b in zip(kernel["trials"], native["trials"], strict=True):
        assert [(t["config"], t["feasible"], t["bits"]) for t in a] == \
            [(t["config"], t["feasible"], t["bits"]) for t in b]
        assert [t["value"] for t in a] == pytest.approx([t["value"] for t in b], rel=1e-9)
    assert kernel["records"] == native["records"]
    assert kernel["restored"] == native["restored"]


def test_reading_on_the_device_path_restores_the_same_bits(tmp_path):
    states = _states()
    with Repo.init(tmp_path / "r") as repo:
        ids = [repo.commit(s, f"c{i}", epsilon=PROXY_EPSILON) for i, s in enumerate(states)]
        native = [_bits(repo.read_state(c, cache_levels=False)) for c in ids]
        with device_path():
            device = [_bits(repo.read_state(c, cache_levels=False)) for c in ids]
    assert device == native


@pytest.mark.parametrize("kw", [dict(), dict(prune=0.3, protect=0.01)])
def test_quantize_is_the_same_on_both_paths(kw):
    w = torch.randn(300, 70, generator=torch.Generator().manual_seed(1))
    a = quantize(w, 16, **kw)
    with device_path():
        b = quantize(w, 16, **kw)
    assert torch.equal(a.levels, b.levels) and torch.equal(a.centroids, b.centroids)
    assert torch.equal(a.protected, b.protected)


# ----------------------------------------------------------------------------- on a real GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_cuda_history_matches_the_host_one(tmp_path):  # pragma: no cover - no GPU in CI
    """The same levels, centroids and protected values from a CUDA state as from the host one,
    the same stored bytes, and the same restores. Snapshot ids differ: a snapshot's skeleton
    records the device each tensor was saved from, so a delta's parent reference differs too
    (seen on an H200: every other field of every record was equal)."""
    states = _states()
    out = {}
    for dev in ("cpu", "cuda"):
        with Repo.init(tmp_path / dev) as repo:
            ids = [repo.commit(on_device(s, dev), f"c{i}", epsilon=PROXY_EPSILON)
                   for i, s in enumerate(states)]
            commits = [repo.read_commit(c) for c in ids]
            quantized, sizes = [], []
            for c in commits:
                recs = repo.read_snapshot(c.snapshot).tensors
                sizes.append({r.name: (r.codec, r.stored_bytes) for r in recs})
                quantized.append({r.name: _parts(repo.reader.read_quantized(c.snapshot, r))
                                  for r in recs if r.codec.startswith("q")})
            out[dev] = {
                "quant": [c.quant for c in commits], "sizes": sizes, "quantized": quantized,
                "host": [_bits(repo.read_state(c, cache_levels=False)) for c in ids],
                "device": [_bits(on_device(repo.read_state(c, map_location="cuda", cache_levels=False),
                                     "cpu")) for c in ids]}
    assert out["cuda"]["quant"] == out["cpu"]["quant"]
    assert out["cuda"]["quantized"] == out["cpu"]["quantized"]
    assert out["cuda"]["sizes"] == out["cpu"]["sizes"]
    assert out["cuda"]["host"] == out["cpu"]["host"]
    assert out["cpu"]["device"] == out["cpu"]["host"]   # decoded onto the GPU: the same bits


def _parts(q: Any) -> tuple[bytes, bytes, bytes]:
    return tuple(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                 for t in (q.levels, q.centroids, q.protected))


@cuda
def test_cuda_quantizations_cross_both_ways():  # pragma: no cover - no GPU in CI
    from mvc.repo import lossy

    g = torch.Generator().manual_seed(0)
    ws = {f"w{i}": torch.randn(n, generator=g) for i, n in enumerate((1, 7, 300, 4097))}
    host = {k: quantize(w, 16 if i % 2 else 300, protect=0.01) for i, (k, w) in enumerate(ws.items())}
    dev = {k: q.to("cuda") for k, q in host.items()}
    back = {k: lossy.on_host(q) for k, q in dev.items()}
    for k, q in host.items():
        b = back[k]
        assert b.levels.device.type == "cpu" and torch.equal(b.levels, q.levels)
        assert torch.equal(b.protected, q.protected) and torch.equal(b.centroids, q.centroids)
        d = q.to(torch.device("cuda"))
        assert torch.equal(d.dequantize().cpu(), q.dequantize())
