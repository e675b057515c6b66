"""A lossy `dcp.save` quantizes each tensor where it lives: the writer hands DCP's tensors to the
commit as they are (a GPU's shards to the device path), never copying them all to host memory
first.  On CPU the device path runs on host tensors (`device_path()`) and must store what the
native path stores; the CUDA-marked test checks the same on a GPU."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from mvc.dcp import MvcStorageWriter
from mvc.quant.backend import device_path
from mvc.repo.repository import Repo

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _states(device: str) -> list[dict[str, Any]]:
    """Two DCP states (model + AdamW) of a small MLP, a few steps apart, on `device`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 128)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 64, generator=g).to(device), torch.randn(32, 128, generator=g).to(device)
    out = []
    for _ in range(2):
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        msd, osd = get_state_dict(model, opt)
        out.append(torch.utils._pytree.tree_map(
            lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v,
            {"model": dict(msd), "optim": osd}))
    return out


def _history(root: Path, states: list[dict[str, Any]], device: bool = False) -> dict[str, Any]:
    Repo.init(root).close()
    ids = []
    with device_path() if device else nullcontext():
        for i, state in enumerate(states):
            w = MvcStorageWriter(root, message=f"save {i}", epsilon=0.05)
            dcp.save(state, storage_writer=w, no_dist=True)
            ids.append(w.commit_id)
    with Repo(root) as repo:
        commits = [repo.read_commit(c) for c in ids]
        records = [{r.name: (r.codec, r.chunks, r.stored_bytes)
                    for r in repo.read_snapshot(c.snapshot).tensors} for c in commits]
        restored = [{k: v for k, v in repo.read_state(c, cache_levels=False)["model"].items()}
                    for c in ids]
    return {"quant": [c.quant for c in commits], "records": records, "restored": restored}


def _same_restores(a: list[dict], b: list[dict]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k].cpu(), y[k].cpu()), k


def test_a_dcp_history_is_the_same_on_the_device_path(tmp_path):
    states = _states("cpu")
    native = _history(tmp_path / "native", states)
    device = _history(tmp_path / "device", states, device=True)
    assert native["quant"][0] is not None                       # a lossy search ran
    assert any("qdelta" in r[0] for r in native["records"][1].values())   # and deltas
    assert device["quant"] == native["quant"]
    assert device["records"] == native["records"]
    _same_restores(device["restored"], native["restored"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_dcp_save_stores_what_the_host_one_stores(tmp_path):  # pragma: no cover - no GPU in CI
    states = _states("cpu")
    on_cuda = torch.utils._pytree.tree_map(
        lambda v: v.to("cuda") if isinstance(v, torch.Tensor) and v.dim() else v,  # step stays
        states)
    host = _history(tmp_path / "host", states)
    cuda = _history(tmp_path / "cuda", on_cuda)
    assert cuda["quant"] == host["quant"] and host["quant"][0] is not None
    assert cuda["records"] == host["records"]
    _same_restores(cuda["restored"], host["restored"])
