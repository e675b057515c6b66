"""`mvc stats --plot FILE.png`: one picture of a repository's history.

Three panels over the commits (oldest first, x labelled by step or short id):
raw, encoded and new-in-store bytes per commit (`mvc.repo.inspect`), the
compression ratio (raw / encoded), and each commit's measured degradation
against its bound ε (in the gate's own units: a relative loss change, or the
proxy's reconstruction error). Branch points are vertical lines labelled with
the branches that leave them. Every series is labelled where it is drawn, so no
legend needs reading. matplotlib is the optional extra `plot` (`pip install
mvc[plot]`), imported only here.

The axes follow the data: bytes in the unit of the largest, on a log scale
only when the values span more than `LOG_SPAN` (an unchanged re-commit adds a
few hundred bytes beside megabytes), else linear from 0; the ratio from 1x (or
below the smallest) with headroom, never narrower than `MIN_RATIO_SPAN`, so a
flat lossless history (1.216x-1.219x) reads flat rather than as a trend.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mvc.errors import UsageError
from mvc.search.record import QualityRecord

if TYPE_CHECKING:
    from mvc.repo.repository import Repo


#: The bytes axis is logarithmic when its largest positive value exceeds its smallest this many times.
LOG_SPAN = 30.0
#: The ratio axis spans at least this much (x): narrower, noise would look like a trend.
MIN_RATIO_SPAN = 0.5


def bytes_scale(values: list[float]) -> str:
    """'log' when the positive `values` span more than `LOG_SPAN`, else 'linear'."""
    positive = [v for v in values if v > 0]
    if not positive:
        return "linear"
    return "log" if max(positive) > LOG_SPAN * min(positive) else "linear"


def ratio_limits(ratios: list[float]) -> tuple[float, float]:
    """The ratio axis: from 1x (or 10% below the smallest ratio, if that is under 1x) to 10%
    above the largest, and at least `MIN_RATIO_SPAN` wide."""
    finite = [r for r in ratios if r == r and r != float("inf")]
    if not finite:
        return 0.0, 2.0
    lo = min(1.0, 0.9 * min(finite))
    hi = max(1.1 * max(finite), lo + MIN_RATIO_SPAN)
    return lo, hi


def byte_unit(largest: float) -> tuple[float, str]:
    """(divisor, name) of the binary unit `largest` bytes read best in."""
    for divisor, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if largest >= divisor:
            return float(divisor), name
    return 1.0, "B"


class PlotExtraMissingError(UsageError):
    """`mvc stats --plot` needs matplotlib: install the `plot` extra (pip install 'mvc[plot]')."""

    exit_code = 171


def plot_history(repo: Repo, path: Path) -> int:
    """Draw `repo`'s history to `path` (any format matplotlib writes, by extension); returns
    the number of commits drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotExtraMissingError("mvc stats --plot needs matplotlib: pip install 'mvc[plot]'") from None
    stats = repo.stats()
    commits = [repo.read_commit(c.id) for c in stats.commits]
    if not commits:
        raise UsageError("nothing to plot: the repository has no commits")
    index = {c.id: i for i, c in enumerate(commits)}
    xs = list(range(len(commits)))
    labels = [str(c.step) if c.step is not None else c.id[:7] for c in commits]
    fig, (ax_bytes, ax_ratio, ax_deg) = plt.subplots(3, 1, sharex=True, figsize=(11, 8.5),
                                                      gridspec_kw={"height_ratios": [3, 2, 2]})
    kept = [(i, s) for i, s in enumerate(stats.commits) if not s.pruned]
    ks = [i for i, _ in kept]
    values = [float(v) for _, s in kept for v in (s.raw_bytes, s.encoded_bytes, s.new_bytes)]
    unit, unit_name = byte_unit(max(values, default=0.0))
    scale = bytes_scale(values)
    ax_bytes.plot(ks, [s.raw_bytes / unit for _, s in kept], "o-", color="tab:gray", markersize=3)
    ax_bytes.plot(ks, [s.encoded_bytes / unit for _, s in kept], "s--", color="tab:cyan", markersize=3)
    # A bar of 0 bytes cannot be drawn on a log axis: one byte stands in for it.
    floor = 1.0 / unit if scale == "log" else 0.0
    ax_bytes.bar(ks, [max(s.new_bytes / unit, floor) for _, s in kept], color="tab:blue")
    ax_bytes.set_yscale(scale)
    if scale == "linear":
        ax_bytes.set_ylim(bottom=0.0)
    ax_bytes.set_ylabel(f"{unit_name} per commit" + (" (log)" if scale == "log" else ""))
    if kept:
        last_i, last = kept[-1]
        first_i, first = kept[0]
        ax_bytes.annotate("raw checkpoint", (first_i, first.raw_bytes / unit), textcoords="offset points",
                          xytext=(4, 6), ha="left", color="tab:gray")
        ax_bytes.annotate("encoded", (first_i, first.encoded_bytes / unit), textcoords="offset points",
                          xytext=(4, -14), ha="left", color="tab:cyan")
        ax_bytes.annotate("new in store", (last_i, max(last.new_bytes / unit, floor)),
                          textcoords="offset points", xytext=(-30, 6), ha="right", color="tab:blue")
    for i, s in enumerate(stats.commits):
        if s.pruned:
            ax_bytes.annotate("pruned", (i, 0.5), xycoords=("data", "axes fraction"), rotation=90,
                              ha="center", va="center", color="tab:red", fontsize=8)
    ratios = [(i, s.encoded_ratio) for i, s in kept if s.encoded_bytes]
    ax_ratio.plot([i for i, _ in ratios], [r for _, r in ratios], "o-", color="tab:green", markersize=3)
    ax_ratio.set_ylim(*ratio_limits([r for _, r in ratios]))
    ax_ratio.set_ylabel("compression ratio (x)\nraw / encoded")
    if ratios:
        ax_ratio.annotate(f"{ratios[-1][1]:.2f}x", ratios[-1], textcoords="offset points", xytext=(4, 0),
                          color="tab:green", va="center")
    _degradation(ax_deg, commits)
    _branch_points(repo, commits, index, (ax_bytes, ax_ratio, ax_deg))
    ax_deg.set_xticks(xs)
    ax_deg.set_xticklabels(labels, rotation=60 if len(xs) > 12 else 0, fontsize=8)
    ax_deg.set_xlabel("commit (step, or id for commits without one), oldest first")
    from mvc.cli.format import human_bytes

    total = (f"{len(commits)} commits: {human_bytes(stats.raw_bytes)} raw, "
             f"{human_bytes(stats.stored_bytes)} new in store ({stats.ratio:.1f}x)")
    fig.suptitle(f"mvc history of {repo.path.name}: {total}")
    for ax in (ax_bytes, ax_ratio, ax_deg):
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(commits)


def _degradation(ax: Any, commits: list) -> None:
    """Each commit's measured degradation (points) and its bound ε (a step line), labelled."""
    pts, bounds = [], []
    for i, c in enumerate(commits):
        q = QualityRecord.from_json(c.quality or {})
        if q.degradation is not None:
            pts.append((i, float(q.degradation)))
        if q.epsilon is not None:
            bounds.append((i, float(q.epsilon)))
    if bounds:
        ax.step([i for i, _ in bounds], [e for _, e in bounds], where="mid", color="tab:red",
                linestyle="--")
        ax.annotate("bound ε", bounds[-1], textcoords="offset points", xytext=(4, 2), color="tab:red")
    if pts:
        ax.plot([i for i, _ in pts], [d for _, d in pts], "o", color="tab:purple", markersize=4)
        ax.annotate("measured", pts[-1], textcoords="offset points", xytext=(4, -10), color="tab:purple")
    if not pts and not bounds:
        ax.annotate("no lossy commits: nothing measured", (0.5, 0.5), xycoords="axes fraction",
                    ha="center", color="tab:gray")
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.set_ylabel("degradation vs ε\n(gate's units)")


def _branch_points(repo: Repo, commits: list, index: dict[str, int], axes: tuple) -> None:
    """A vertical line at each commit two or more commits build on, naming the branches that
    leave it (those whose history reaches the second and later children)."""
    children: dict[str, list[str]] = defaultdict(list)
    for c in commits:
        for p in c.parents[:1]:
            children[p].append(c.id)
    tips = dict(repo.branches())
    for parent, kids in children.items():
        if len(kids) < 2 or parent not in index:
            continue
        names = []
        for name, tip in tips.items():
            line = {c.id for c in repo.odb.walk_commits([tip])}
            if any(k in line for k in kids[1:]) and not all(k in line for k in kids):
                names.append(name)
        for ax in axes:
            ax.axvline(index[parent], color="tab:orange", linestyle=":", linewidth=1.2)
        axes[0].annotate("branch: " + (", ".join(sorted(names)) or "?"), (index[parent], 1.0),
                         xycoords=("data", "axes fraction"), textcoords="offset points", xytext=(3, -30),
                         color="tab:orange", fontsize=8)
