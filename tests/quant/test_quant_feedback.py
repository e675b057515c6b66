"""Error feedback (GPTQ) over mvc's quantizations: same centroids and masks, levels that fit the
layer's inputs better, the lazy-batch blocking equal to the plain column loop."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mvc.quant import QuantizedTensor, quantize
from mvc.quant.feedback import (FeedbackError, HessianCollector, collect_hessians, feedback_levels,
                                match_names, output_error)


def _layer(seed: int = 0, rows: int = 48, cols: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.05
    # correlated inputs, as a real layer sees (a low-rank mix plus noise)
    x = torch.randn(512, 8, generator=g) @ torch.randn(8, cols, generator=g) \
        + 0.1 * torch.randn(512, cols, generator=g)
    return w, x.T.to(torch.float64) @ x.to(torch.float64)


def _reference(q: QuantizedTensor, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """GPTQ without blocking, straight from the paper's pseudo-code: the levels."""
    from mvc.quant.feedback import _inverse_cholesky

    u = _inverse_cholesky(h, 0.01)
    work = w.to(torch.float64).clone()
    k, cen = q.bins, q.centroids.to(torch.float64)
    lv_in = q.levels
    out = torch.empty(w.shape, dtype=torch.int64)
    for j in range(w.shape[1]):
        col = work[:, j]
        mids = (cen[:-1] + cen[1:]) / 2
        lv = torch.bucketize(col.to(torch.float32), mids.to(torch.float32))
        val = cen[lv]
        lv = torch.where(lv_in[:, j] == k, k, torch.where(lv_in[:, j] == k + 1, k + 1, lv))
        val = torch.where(lv_in[:, j] == k, 0.0, torch.where(lv_in[:, j] == k + 1, w[:, j].to(torch.float64), val))
        out[:, j] = lv
        e = (col - val) / u[j, j]
        work[:, j + 1:] -= e[:, None] * u[j, j + 1:][None, :]
    return out


@pytest.mark.parametrize("kw", [dict(), dict(prune=0.3, protect=0.01)])
@pytest.mark.parametrize("family", ["kmeans", "uniform"])
def test_feedback_cuts_the_output_error_and_keeps_centroids_and_masks(kw, family):
    w, h = _layer()
    q = quantize(w, 8, **kw) if family == "kmeans" else _uniform(w, **kw)
    f = feedback_levels(q, w, h)
    assert torch.equal(f.centroids, q.centroids) and f.bins == q.bins
    k = q.bins
    assert torch.equal(f.levels == k, q.levels == k)          # pruned stay pruned (exact 0)
    assert torch.equal(f.levels == k + 1, q.levels == k + 1)  # protected stay protected
    QuantizedTensor.from_parts(f.levels, f.centroids, f.protected, f.dtype, f.bins)
    plain, fed = output_error(w, q.dequantize(), h), output_error(w, f.dequantize(), h)
    assert fed < 0.8 * plain


def _uniform(w: torch.Tensor, **kw: float) -> QuantizedTensor:
    from mvc.quant.uniform import FAMILIES

    assert "uniform" in FAMILIES
    return quantize(w, 8, family="uniform", **kw)


def test_blocking_gives_the_plain_column_loop():
    w, h = _layer(seed=2, cols=70)
    q = quantize(w, 6, prune=0.2, protect=0.02)
    for block in (1, 16, 128):
        assert torch.equal(feedback_levels(q, w, h, block=block).levels.to(torch.int64),
                           _reference(q, w, h))


def test_an_input_that_is_always_zero_frees_its_column():
    w, h = _layer(seed=3, cols=32)
    h[5, :] = 0
    h[:, 5] = 0
    f = feedback_levels(quantize(w, 8), w, h)
    assert f.levels.shape == w.shape


def test_bad_shapes_are_typed_errors():
    w, h = _layer()
    q = quantize(w, 8)
    with pytest.raises(FeedbackError):
        feedback_levels(q, w, h[:10, :10])
    v = torch.randn(50)
    with pytest.raises(FeedbackError):
        feedback_levels(quantize(v, 4), v, torch.eye(50))


def test_hessians_from_forward_hooks_by_checkpoint_name():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    xs = [torch.randn(5, 12) for _ in range(3)]
    hs = collect_hessians(model, xs)
    assert set(hs) == {"0.weight", "2.weight"}
    x = torch.cat(xs).to(torch.float64)
    assert torch.allclose(hs["0.weight"], x.T @ x)
    a = torch.relu(model[0](torch.cat(xs))).to(torch.float64)
    assert torch.allclose(hs["2.weight"], a.T @ a, atol=1e-9)
    with HessianCollector(model):
        pass
    assert not model[0]._forward_pre_hooks  # the hooks come off
    got = match_names(hs, ["model/0.weight", "model/2.weight", "model/0.bias", "optimizer/state/0/exp_avg"])
    assert set(got) == {"model/0.weight", "model/2.weight"}
