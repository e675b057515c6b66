"""`mvc stats --plot` chooses its axes from the data (issue 30 item 11): on a lossless history
the bytes axis is linear from 0 and the ratio axis starts at 1x, so 1.216x-1.219x reads flat;
a log bytes axis only when the values span orders of magnitude (an unchanged re-commit)."""
from __future__ import annotations

import pytest
import torch

from helpers.cli_helpers import run
from mvc.cli.plot import LOG_SPAN, MIN_RATIO_SPAN, bytes_scale, ratio_limits

matplotlib = pytest.importorskip("matplotlib")


@pytest.fixture
def figures(monkeypatch):
    """The figures `mvc stats --plot` saves (the PNG is still written)."""
    from matplotlib.figure import Figure

    saved: list = []
    original = Figure.savefig

    def keep(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def _save(path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    torch.save({"w": torch.randn(256, 256, generator=g), "b": torch.randn(256, generator=g)}, path)


def _axes(work, figures):
    code, out, err = run(work, "stats", "--plot", str(work / "history.png"))
    assert code == 0, err
    assert (work / "history.png").read_bytes()[:4] == b"\x89PNG"
    ax_bytes, ax_ratio, _ = figures[-1].axes
    return ax_bytes, ax_ratio


def test_lossless_history_has_linear_bytes_and_a_ratio_axis_from_1x(work, figures):
    for seed in range(3):
        _save(work / "model.pt", seed)
        assert run(work, "commit", "-m", f"c{seed}", "model.pt")[0] == 0
    ax_bytes, ax_ratio = _axes(work, figures)
    assert ax_bytes.get_yscale() == "linear" and ax_bytes.get_ylim()[0] == 0.0
    assert "KiB" in ax_bytes.get_ylabel()  # the unit of the data (256 KiB), not MiB
    lo, hi = ax_ratio.get_ylim()
    ratios = [float(y) for y in ax_ratio.lines[0].get_ydata()]
    assert 1.1 < min(ratios) and max(ratios) - min(ratios) < 0.05  # lossless float32: ~1.2x, flat
    assert lo == 1.0 and hi - lo >= MIN_RATIO_SPAN


def test_an_unchanged_recommit_puts_bytes_on_a_log_axis(work, figures):
    _save(work / "model.pt", 0)
    assert run(work, "commit", "-m", "c0", "model.pt")[0] == 0
    assert run(work, "commit", "-m", "again", "model.pt", "--allow-empty")[0] == 0
    ax_bytes, _ = _axes(work, figures)
    assert ax_bytes.get_yscale() == "log"  # 256 KiB beside a few hundred bytes new in store


def test_axis_rules():
    assert bytes_scale([100.0, 90.0, 80.0]) == "linear"
    assert bytes_scale([LOG_SPAN * 10.0 + 1, 10.0]) == "log"
    assert bytes_scale([0.0, 0.0]) == "linear"
    assert ratio_limits([1.216, 1.219]) == (1.0, 1.0 + MIN_RATIO_SPAN)
    lo, hi = ratio_limits([3.0, 30.0])
    assert lo == 1.0 and hi == pytest.approx(33.0)
    assert ratio_limits([0.5, 0.6])[0] == pytest.approx(0.45)  # a ratio under 1x stays in view
