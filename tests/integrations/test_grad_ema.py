"""GradientEMA: the Tracker's gradient average as a component of its own (issue 13)."""
from __future__ import annotations

import pytest
import torch

from mvc.integrations import GradientEMA, GradientEMAError

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_average_names_and_restart(device):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1, bias=False)).to(device)
    ema = GradientEMA(model, beta=0.9)
    assert ema.names == ["model/0.weight", "model/0.bias", "model/1.weight"]
    seen = []
    for step in range(1, 5):
        for p in model.parameters():
            p.grad = torch.full_like(p, float(step))
        model[1].weight.grad = None if step == 2 else model[1].weight.grad  # skipped that step
        ema.accumulate()
        seen.append(step)
    got = ema.take()
    want = torch.tensor(1.0)
    for step in seen[1:]:
        want = 0.9 * step + 0.1 * want
    assert set(got) == set(ema.names)
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in got.values())
    assert torch.allclose(got["model/0.weight"], torch.full((2, 3), float(want)))
    three = 0.9 * 3 + 0.1 * 1.0  # the second layer missed step 2
    assert torch.allclose(got["model/1.weight"], torch.full((1, 2), 0.9 * 4 + 0.1 * three))
    assert ema.take() == {}  # restarted
    ema.accumulate()
    ema.reset()
    assert ema.take() == {}


def test_prefix_and_argument_errors():
    lin = torch.nn.Linear(2, 2)
    assert GradientEMA(lin, prefix="student/").names == ["student/weight", "student/bias"]
    for bad in (0.0, 1.5, True, "0.9"):
        with pytest.raises(GradientEMAError) as ei:
            GradientEMA(lin, beta=bad)
        assert ei.value.exit_code == 119
    with pytest.raises(GradientEMAError):
        GradientEMA({"w": torch.zeros(2)})


def _steps(model, ema, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    for step in range(n):
        for i, p in enumerate(model.parameters()):
            p.grad = None if (step == 1 and i == 1) else torch.randn(p.shape, generator=g)
        ema.accumulate()
    return ema.take()


@pytest.mark.parametrize("slab", [1, 5, 8, 1 << 20])
def test_staged_gradients_fold_as_host_ones(monkeypatch, slab):
    """The pinned-slab path (an accelerator's), taken here by host gradients: cut across
    slabs of any size, skipped steps included, it averages what the host path does."""
    import mvc.integrations.grad_ema as grad_ema

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    want = _steps(model, GradientEMA(model), 4)
    monkeypatch.setattr(grad_ema, "_staged", lambda t: True)
    ema = GradientEMA(model, slab_values=slab)
    got = _steps(model, ema, 4)
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape and torch.allclose(got[k], want[k], rtol=1e-6, atol=0)
    total = sum(p.numel() for p in model.parameters())
    held = sum(s.numel() for s in ema._slabs)
    assert total <= held < total + slab   # the gradients' size, up to one slab more


def test_staged_layout_grows_when_a_parameter_first_gets_a_gradient(monkeypatch):
    """A layer with no gradient at first (frozen, then trained): the slabs are laid out
    again, with what is averaged so far kept."""
    import mvc.integrations.grad_ema as grad_ema

    monkeypatch.setattr(grad_ema, "_staged", lambda t: True)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    ema = GradientEMA(model, slab_values=4)
    first, second = list(model[0].parameters()), list(model[1].parameters())
    for p in first:
        p.grad = torch.ones_like(p)
    ema.accumulate()
    held = sum(s.numel() for s in ema._slabs)
    for p in first + second:
        p.grad = torch.full_like(p, 2.0)
    ema.accumulate()
    assert sum(s.numel() for s in ema._slabs) > held
    got = ema.take()
    assert torch.allclose(got["model/0.weight"], torch.full((3, 2), 0.9 * 2.0 + 0.1 * 1.0))
    assert torch.allclose(got["model/1.weight"], torch.full((1, 3), 2.0))


def test_slab_size_is_checked():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(GradientEMAError):
            GradientEMA(torch.nn.Linear(2, 2), slab_values=bad)


@pytest.mark.parametrize("path", ["host", "staged", "mixed"])
def test_a_step_with_a_nonfinite_gradient_is_left_out_whole(monkeypatch, path):
    """A mixed-precision loss scaler's overflow step (inf / NaN gradients, a step the optimizer
    skips) stays out of the average, on the host path and on the pinned-slab path alike: in
    it, it would make every later commit's tensors unquantizable. "mixed": a model partly on
    the CPU (its biases here) whose NaN is in a staged gradient, known only when the copy is
    done: the step's host gradients are left out with it, not folded before."""
    import mvc.integrations.grad_ema as grad_ema

    if path == "staged":
        monkeypatch.setattr(grad_ema, "_staged", lambda t: True)
    if path == "mixed":
        monkeypatch.setattr(grad_ema, "_staged", lambda t: t.dim() > 1)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    clean, spoilt = GradientEMA(model), GradientEMA(model)
    g = torch.Generator().manual_seed(0)
    def give(grads: list[torch.Tensor]) -> None:
        for p, gr in zip(model.parameters(), grads):
            p.grad = gr

    for step in range(5):
        grads = [torch.randn(p.shape, generator=g) for p in model.parameters()]
        if step == 2:   # an extra, overflowing step for one of them: one value of one layer
            bad = [t.clone() for t in grads]
            bad[2][0, 0] = float("inf") if path == "host" else float("nan")
            give(bad)
            spoilt.accumulate()
        give(grads)
        clean.accumulate()
        spoilt.accumulate()
    want, got = clean.take(), spoilt.take()
    assert spoilt.skipped == 1 and clean.skipped == 0
    assert set(got) == set(want)
    assert all(torch.isfinite(t).all() for t in got.values())
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=1e-6, atol=0)
