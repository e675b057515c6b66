"""Gradients on another device than their tensors (issue 27). A GPU run's gradients are kept on
the host (their EMA: mvc.integrations.grad_ema) beside its CUDA state, and a host state may be
committed with a GPU model's live gradients. Either way a commit must store what the same state
and gradients store on the host, and the native kernels (which read host memory) must never be
handed a device tensor."""
from __future__ import annotations

import pytest
import torch
from checkpoints import realistic_state

from mvc.errors import InternalError
from mvc.quant._kernels import AssignStats, assign_into
from mvc.repo.repository import Repo
from mvc.state import flatten

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_native_kernels_refuse_a_tensor_that_is_not_on_the_host():
    x, mids = torch.randn(64), torch.tensor([-0.5, 0.0, 0.5])
    out = torch.empty(64, dtype=torch.uint8)
    assert assign_into(x, mids, out) == 0   # the host tensors themselves are fine
    with pytest.raises(InternalError, match="meta"):
        assign_into(x.to("meta"), mids, out)
    stats = AssignStats(w=torch.ones(64, device="meta"), table=torch.zeros(6))
    with pytest.raises(InternalError, match="host tensors only"):
        assign_into(x, mids, out, k=4, stats=stats)


def _state_and_grads(device: str, grad_device: str) -> tuple[dict, dict]:
    state = realistic_state(seed=3)
    flat = flatten(state).tensors
    grads = {n: torch.randn(t.shape, generator=torch.Generator().manual_seed(i)).to(grad_device)
             for i, (n, t) in enumerate(flat.items())
             if t.is_floating_point() and t.dim() >= 2 and "optimizer" not in n}
    return _to(state, device), grads


def _to(obj, device: str):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return type(obj)((k, _to(v, device)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_to(v, device) for v in obj]
    return obj


def _snapshot(tmp_path, name: str, device: str, grad_device: str) -> str:
    state, grads = _state_and_grads(device, grad_device)
    repo = Repo.init(tmp_path / name)
    try:
        cid = repo.commit(state, "c", grads=grads, epsilon=0.05)
        return repo.read_commit(cid).snapshot
    finally:
        repo.close()


def test_the_device_path_with_gradients_stores_the_native_snapshot(tmp_path):
    # the batched passes read gradients for sensitivity rules and a proxy's error weights
    # (once a chunk where they are the same tensor): the same choices and chunks as the host
    from mvc.quant.backend import device_path

    native = _snapshot(tmp_path, "native", "cpu", "cpu")
    with device_path():
        assert _snapshot(tmp_path, "device", "cpu", "cpu") == native


@cuda
@pytest.mark.parametrize("state_on, grads_on", [("cpu", "cuda"), ("cuda", "cpu")])
def test_cuda_gradients_elsewhere_store_what_the_host_stores(tmp_path, state_on, grads_on
                                                             ):  # pragma: no cover - no GPU in CI
    host = _snapshot(tmp_path, "host", "cpu", "cpu")
    assert _snapshot(tmp_path, "mixed", state_on, grads_on) == host
