"""`mvc stats --plot FILE.png`: one picture of a repository's history.

Three panels over the commits (oldest first, x labelled by step or short id):
raw vs stored bytes per commit (log scale), the compression ratio, and each
commit's measured degradation against its bound ε (in the gate's own units: a
relative loss change, or the proxy's reconstruction error). Branch points are
vertical lines labelled with the branches that leave them. Every series is
labelled where it is drawn, so no legend needs reading. matplotlib is the
optional extra `plot` (`pip install mvc[plot]`), imported only here.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mvc.errors import UsageError
from mvc.search.record import QualityRecord

if TYPE_CHECKING:
    from mvc.repo.repository import Repo


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
    mib = 1024.0 * 1024.0
    ax_bytes.plot([i for i, _ in kept], [s.raw_bytes / mib for _, s in kept], "o-", color="tab:gray",
                  markersize=3)
    ax_bytes.bar([i for i, _ in kept], [max(s.stored_bytes, 1) / mib for _, s in kept], color="tab:blue")
    ax_bytes.set_yscale("log")
    ax_bytes.set_ylabel("MiB per commit (log)")
    if kept:
        last_i, last = kept[-1]
        first_i, first = kept[0]
        ax_bytes.annotate("raw checkpoint", (first_i, first.raw_bytes / mib), textcoords="offset points",
                          xytext=(4, -14), ha="left", color="tab:gray")
        ax_bytes.annotate("stored (new bytes)", (last_i, max(last.stored_bytes, 1) / mib),
                          textcoords="offset points", xytext=(-30, 6), ha="right", color="tab:blue")
    for i, s in enumerate(stats.commits):
        if s.pruned:
            ax_bytes.annotate("pruned", (i, 0.5), xycoords=("data", "axes fraction"), rotation=90,
                              ha="center", va="center", color="tab:red", fontsize=8)
    ratios = [(i, s.ratio) for i, s in kept if s.stored_bytes]
    ax_ratio.plot([i for i, _ in ratios], [r for _, r in ratios], "o-", color="tab:green", markersize=3)
    ax_ratio.set_ylabel("compression ratio (x)")
    if ratios:
        ax_ratio.annotate(f"{ratios[-1][1]:.1f}x", ratios[-1], textcoords="offset points", xytext=(4, 0),
                          color="tab:green", va="center")
    _degradation(ax_deg, commits)
    _branch_points(repo, commits, index, (ax_bytes, ax_ratio, ax_deg))
    ax_deg.set_xticks(xs)
    ax_deg.set_xticklabels(labels, rotation=60 if len(xs) > 12 else 0, fontsize=8)
    ax_deg.set_xlabel("commit (step, or id for commits without one), oldest first")
    total = (f"{len(commits)} commits: {stats.raw_bytes / mib:.1f} MiB raw, "
             f"{stats.stored_bytes / mib:.1f} MiB stored ({stats.ratio:.1f}x)")
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
