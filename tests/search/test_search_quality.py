"""Relative degradation edge cases and the proxy metric."""
from __future__ import annotations

import math

import pytest
import torch

from mvc.errors import UsageError
from mvc.quant import quantize
from mvc.search import PROXY_EPSILON, QualityFunctionError, degradation, proxy_error
from mvc.search.quality import PROXY_MAGNITUDE, PROXY_MAX, as_loss, check_baseline


def test_degradation_edge_cases():
    assert degradation(1.01, 1.0) == pytest.approx(0.01)
    assert degradation(0.9, 1.0) == pytest.approx(-0.1)          # better than the original
    assert degradation(-0.89, -0.9) == pytest.approx(0.01 / 0.9)  # negative baseline: still "worse"
    assert degradation(0.003, 0.0) == pytest.approx(0.003)         # zero baseline: absolute
    assert degradation(float("nan"), 1.0) == math.inf
    assert degradation(float("inf"), 1.0) == math.inf


def test_as_loss_and_baseline_checks():
    assert as_loss(torch.tensor(2.5), "f") == 2.5
    assert as_loss(3, "f") == 3.0
    with pytest.raises(QualityFunctionError):
        as_loss(torch.ones(3), "f")
    with pytest.raises(QualityFunctionError):
        as_loss("a string", "f")
    with pytest.raises(QualityFunctionError) as ei:
        check_baseline(float("nan"))
    assert isinstance(ei.value, UsageError) and ei.value.exit_code == 81


def test_proxy_is_zero_for_exact_and_grows_with_coarser_bins():
    g = torch.Generator().manual_seed(0)
    w = {"a.weight": torch.randn(64, 128, generator=g), "b.weight": torch.randn(32, 128, generator=g)}
    errs = []
    for bins in (4, 8, 32):
        qmap = {k: quantize(v, bins) for k, v in w.items()}
        value, name = proxy_error(w, qmap, None)
        assert name == PROXY_MAGNITUDE
        errs.append(value)
    assert errs[0] > errs[1] > errs[2] > 0
    # 32 bins on Gaussian weights: within the default bound; 4 bins far outside
    assert errs[2] < PROXY_EPSILON < errs[0]
    assert proxy_error(w, {k: None for k in w}, None)[0] == 0.0


def test_proxy_with_gradients_is_the_max_of_both_weightings():
    g = torch.Generator().manual_seed(1)
    w = {"a.weight": torch.randn(64, 64, generator=g)}
    grads = {"a.weight": torch.randn(64, 64, generator=g)}
    qmap = {"a.weight": quantize(w["a.weight"], 8)}
    mag, _ = proxy_error(w, qmap, None)
    both, name = proxy_error(w, qmap, grads)
    assert name == PROXY_MAX and both >= mag
    # a gradient missing for one quantized tensor: magnitude weighting only
    w2 = dict(w, **{"b.weight": torch.randn(64, 64, generator=g)})
    q2 = dict(qmap, **{"b.weight": quantize(w2["b.weight"], 8)})
    assert proxy_error(w2, q2, grads)[1] == PROXY_MAGNITUDE
