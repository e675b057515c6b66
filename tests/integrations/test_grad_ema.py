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
