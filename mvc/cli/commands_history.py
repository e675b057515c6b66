"""log, show, diff, stats."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from mvc.cli.format import echo, echo_json, human_bytes, message_lines, ratio, table
from mvc.cli.graph import GraphRow, draw
from mvc import layer_types
from mvc.errors import UsageError
from mvc.search.record import QualityRecord

if TYPE_CHECKING:
    from mvc.repo.objects import Commit
    from mvc.repo.repository import Repo
else:
    from mvc.cli.lazy import Repo


def _decorations(repo: Repo) -> dict[str, list[str]]:
    deco: dict[str, list[str]] = {}
    head, current = repo.head(), repo.current_branch()
    for name, oid in repo.branches():
        label = f"HEAD -> {name}" if name == current else name
        deco.setdefault(oid, []).insert(0 if name == current else len(deco.get(oid, [])), label)
    for name, oid in repo.refops.remote_branches():  # origin/main, as git decorates
        deco.setdefault(oid, []).append(name)
    for name, oid in repo.tags():
        deco.setdefault(oid, []).append(f"tag: {name}")
    if head and current is None:
        deco.setdefault(head, []).insert(0, "HEAD")
    for oid in sorted(repo.odb.shallow_ids()):  # a shallow boundary, as git decorates it
        deco.setdefault(oid, []).append("grafted")
    return deco


def describe_quant(q: dict) -> str:
    """'bins 8, prune 0.2 (magnitude), protect 0.005' (+ embedding settings when they differ;
    'uniform, bins 8, ...' for the uniform quantizer family; ', error feedback' when its levels
    were chosen with GPTQ error feedback)."""
    out = f"bins {q.get('bins')}, prune {q.get('prune', 0):g} ({q.get('prune_metric')}), " \
          f"protect {q.get('protect', 0):g}"
    if q.get("family", "kmeans") != "kmeans":
        out = f"{q['family']}, {out}"
    if q.get("feedback"):
        out += ", error feedback"
    if q.get("embedding_bins"):
        out += f"; embeddings: bins {q['embedding_bins']}"
    return out


def _record(q: QualityRecord | Mapping[str, Any]) -> QualityRecord:
    return q if isinstance(q, QualityRecord) else QualityRecord.from_json(q)


def _or(x: Any, default: Any) -> Any:
    return default if x is None else x


def describe_quality(q: QualityRecord | Mapping[str, Any]) -> str:
    """One line: which metric vouched for the commit, baseline, measured value, bound."""
    r = _record(q)
    parts = [_or(r.metric, "?")]
    # A proxy's or fidelity gate's value is not a relative loss change: no baseline, no %.
    relative = r.gate_name in ("metric", "per-example-ucb")
    if relative and r.baseline is not None and r.value is not None:
        parts.append(f"baseline {r.baseline:.6g} -> {r.value:.6g}")
    if relative and r.degradation is not None:
        parts.append(f"degradation {r.degradation:+.3%} (bound {_or(r.epsilon, 0):.2%})")
    elif r.value is not None:
        parts.append(f"value {r.value:.4g}")
    if r.evaluations is not None:
        mode = _or(r.mode, "?") + (", refined" if r.refined else "")
        parts.append(f"{r.evaluations} evaluations ({mode})")
    if r.stored:
        parts.append(r.stored)
    return "; ".join(parts)


def _pct(x: float | None) -> str:
    return f"{x:+.2%}"  # None raises, as it always did: such a record names no measurement


def describe_gate(q: QualityRecord | Mapping[str, Any]) -> str:
    """One line: which gate vouched for the commit, in its own units, and the tensor cap."""
    r = _record(q)
    gate = r.gate_name
    eps = r.epsilon
    if gate == "none":
        main = f"none (fixed config; relative L2 error of the weights {_or(r.value, 0):.4g}"
        if r.max_distortion is not None:
            main += f", worst tensor {r.max_distortion:.3g} ({r.worst_tensor})"
        main += ")"
    elif r.value is None:
        main = f"{gate}: no configuration passed"
    elif gate == "fidelity":
        mean = _or(r.fidelity, r.value)
        ucb, conf = r.fidelity_ucb, r.confidence
        if ucb is not None and conf is not None:  # gated on the upper confidence bound
            main = (f"fidelity ({r.fidelity_metric}): {conf:.0%} upper bound {ucb:.4g} "
                    f"{_or(r.units, '')} <= {_or(r.threshold, eps):g} (mean {mean:.4g}), "
                    "agreement with the exact checkpoint")
        else:
            main = (f"fidelity ({r.fidelity_metric}): {mean:.4g} "
                    f"{_or(r.units, '')} <= {_or(r.threshold, eps):g}, agreement with the "
                    "exact checkpoint")
    elif gate == "per-example-ucb":
        ucb = r.ucb
        main = (f"per-example-ucb: {_or(r.confidence, 0.95):.0%} upper bound "
                f"{_pct(ucb) if ucb is not None else '?'} <= {eps:.2%} (mean "
                f"{_pct(r.degradation)}, {_or(r.examples, '?')} examples)")
    elif gate == "proxy":
        main = (f"proxy: weighted relative L2 reconstruction error {r.value:.4g} <= "
                f"{eps:g} (not a loss bound)")
    elif r.mirror_check and r.mirror_degradation is not None:
        main = (f"metric: relative degradation {_pct(r.degradation)}, of its mirror "
                f"{_pct(r.mirror_degradation)} (bound {eps:.2%} on both; no noise bound)")
    else:
        main = (f"metric: relative degradation {_pct(r.degradation)} <= {eps:.2%} "
                "(one measurement, no noise bound)")
    cap = r.tensor_cap
    if cap is not None:
        worst = r.max_distortion
        main += f"; tensor cap {cap:g}"
        if worst is not None:
            main += f" (worst {worst:.3g}, {r.worst_tensor})"
    elif gate != "none":
        main += "; no tensor cap"
    if r.suspicious:
        main += "; SUSPICIOUS: measured better than the original beyond noise"
    if r.mode == "fixed" and gate != "none":
        main = "fixed config, measured (not chosen) by the " + main
    if r.outside:  # a fixed config stored although outside its bounds (fixed_gate warn)
        main += "; OUTSIDE: " + "; ".join(r.outside) + " (stored as configured)"
    return main


def short_gate(q: QualityRecord | Mapping[str, Any]) -> str:
    """The gate's measurement and bound, for `mvc log`."""
    r = _record(q)
    gate = r.gate_name
    eps = _or(r.epsilon, 0)
    if gate == "fidelity":
        if r.fidelity_ucb is not None and r.confidence is not None:
            return (f"fidelity {r.fidelity_metric} ucb {r.fidelity_ucb:.3g} "
                    f"(bound {eps:g})")
        return f"fidelity {r.fidelity_metric} {r.degradation:.3g} (bound {eps:g})"
    if gate == "per-example-ucb" and r.ucb is not None:
        return f"quality ucb {_pct(r.ucb)} (bound {eps:.2%})"
    if gate == "proxy":
        return f"proxy rel-L2 {r.degradation:.3g} (bound {eps:g})"
    return f"quality {_pct(r.degradation)} (bound {eps:.2%})"


def sizes_text(raw: int, encoded: int, new: int | None) -> str:
    """'12.1 MiB raw -> 0.4 MiB encoded (30.25x), 0.3 MiB new in store': the two sizes of a
    commit, labelled (`mvc.repo.inspect`: encoded counts shared chunks, new in store not)."""
    out = f"{human_bytes(raw)} raw -> {human_bytes(encoded)} encoded ({ratio(raw / encoded) if encoded else '-'})"
    return out if new is None else f"{out}, {human_bytes(new)} new in store"


def storage_line(c: Commit, raw: int, stored: int, new: int | None = None) -> str:
    """What `mvc commit` says after the summary: sizes, ratio, and how the commit was stored,
    e.g. '12.1 MiB raw -> 0.4 MiB encoded (30.25x), 0.3 MiB new in store; lossy: 16 bins,
    prune 0.2, gate quality +0.40% (bound 1.00%)' or '...; lossless: no feasible
    configuration'. `stored`: the encoded bytes; `new`: the bytes new in store (None: not
    said)."""
    sizes = sizes_text(raw, stored, new)
    r = QualityRecord.from_json(c.quality or {})
    if not c.quant:
        # No quantization: asked for (commit.mode lossless, --lossless), or the search found
        # no configuration within the bound; the pipeline records the latter in `stored`.
        return f"{sizes}; {r.stored or 'lossless'}"
    family = c.quant.get("family", "kmeans")
    grid = "" if family == "kmeans" else f" {family}"
    how = f"lossy: {c.quant.get('bins')}{grid} bins, prune {c.quant.get('prune', 0):g}"
    if c.quant.get("feedback"):
        how += ", error feedback"
    if r.gate_name == "none":
        return f"{sizes}; {how}, no gate (fixed config, relative L2 error {_or(r.value, 0):.3g})"
    if r.degradation is None:
        return f"{sizes}; {how}, gate {describe_gate(r)}"
    return f"{sizes}; {how}, gate {short_gate(r)}"


def commit_dict(c: Commit) -> dict:
    d = asdict(c)
    d["id"] = c.id
    return d


@click.command()
@click.argument("rev", required=False, default="HEAD")
@click.option("--oneline", is_flag=True, help="One line per commit.")
@click.option("--graph", is_flag=True, help="Draw the commit graph.")
@click.option("-n", "max_count", type=int, default=None, help="Show at most N commits.")
@click.option("--all", "all_refs", is_flag=True,
              help="History of every branch, remote-tracking branch, tag and HEAD, not just REV.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def log(rev: str, oneline: bool, graph: bool, max_count: int | None, all_refs: bool, as_json: bool) -> None:
    """Show the history reachable from REV (default HEAD), or from every ref with --all."""
    repo = Repo.discover()
    commits = repo.log(rev, max_count, all_refs=all_refs)
    pruned = repo.pruned()
    if as_json:
        echo_json([dict(commit_dict(c), pruned=c.id in pruned) for c in commits])
        return
    deco = _decorations(repo)
    rows = list(draw(commits)) if graph else [GraphRow(c, "", "", []) for c in commits]
    for i, g in enumerate(rows):
        c = cast("Commit", g.commit)
        refs = f" ({', '.join(deco[c.id])})" if c.id in deco else ""
        bullet = f"{g.row} " if graph else ""
        if oneline:
            mark = " [pruned]" if c.id in pruned else ""
            echo(f"{bullet}{c.id[:12]}{refs}{mark} {c.summary}")
            for line in g.after:
                echo(line)
            continue
        pad = f"{g.pad} " if graph else ""
        echo(f"{bullet}commit {c.id}{refs}")
        if c.id in pruned:
            echo(f"{pad}Pruned: checkpoint not stored (gc retention policy)")
        if "grafted" in deco.get(c.id, ()):
            echo(f"{pad}Shallow: its parents were not fetched (`mvc fetch --unshallow` brings them)")
        echo(f"{pad}Author: {c.author}")
        echo(f"{pad}Date:   {c.time}")
        extra = []
        if c.step is not None:
            extra.append(f"step {c.step}")
        extra += [f"{k}={v:g}" for k, v in c.metrics.items()]
        if c.quant:
            extra.append(describe_quant(c.quant))
        if c.quality and QualityRecord.from_json(c.quality).degradation is not None:
            extra.append(short_gate(c.quality))
        if extra:
            echo(f"{pad}Info:   {', '.join(extra)}")
        echo(pad.rstrip())
        for line in message_lines(c.message) or [""]:
            echo(f"{pad}    {line}", multiline=True)
        for line in g.after:
            echo(line)
        if i + 1 < len(rows) and not g.after:
            echo(pad.rstrip())


_OPTIMIZER_KEYS = {"exp_avg", "exp_avg_sq", "momentum_buffer", "max_exp_avg_sq", "step", "sum"}

#: How `mvc show` names the quantizer's layer types (`mvc.layer_types.LAYER_TYPES`).
_LABELS = {"linear": "linear weight", "conv": "conv weight", "attention": "attention weight"}


def layer_type(name: str, shape: list[int]) -> str:
    """The kind of tensor a flattened name and shape suggest, for `mvc show`'s summary:
    optimizer state by its key, anything else by the quantizer's layer type
    (`mvc.layer_types`, which reads "/" as a component separator too)."""
    dotted = name.replace("/", ".")
    parts = [p for p in dotted.split(".") if p]
    last = parts[-1] if parts else name
    if last in _OPTIMIZER_KEYS or "optimizer" in name.lower():
        return f"optimizer {last}"
    kind = layer_types.layer_type(dotted, shape)
    return f"other {len(shape)}-D" if kind == "other" else _LABELS.get(kind, kind)


def _type_summary(tensors: list) -> str:
    """One row per layer type: tensors, raw and encoded bytes, ratio, how they are stored."""
    groups: dict[str, list] = {}
    for t in tensors:
        groups.setdefault(layer_type(t.name, t.shape), []).append(t)
    rows = []
    for kind, ts in sorted(groups.items(), key=lambda kv: -sum(t.raw_bytes for t in kv[1])):
        raw, stored = sum(t.raw_bytes for t in ts), sum(t.stored_bytes for t in ts)
        lossy = sum(1 for t in ts if t.codec.startswith("q"))
        how = f"{lossy} quantized" if lossy == len(ts) else f"{len(ts) - lossy} exact" if not lossy \
            else f"{lossy} quantized, {len(ts) - lossy} exact"
        rows.append((kind, len(ts), human_bytes(raw), human_bytes(stored),
                     ratio(raw / stored) if stored else "-", how))
    return table(rows, ["layer type", "tensors", "raw", "encoded", "ratio", "stored as"], "lrrrrl")


@click.command()
@click.argument("rev", required=False, default="HEAD")
@click.option("--stat", "stat_only", is_flag=True, help="Summary by layer type only, without the per-tensor table.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(rev: str, stat_only: bool, as_json: bool) -> None:
    """Show a commit: message, metadata, provenance, a summary by layer type and how each
    tensor is stored (--stat: the summary only)."""
    repo = Repo.discover()
    c = repo.read_commit(repo.resolve(rev))
    pruned = c.id in repo.pruned()
    if pruned and as_json:
        echo_json({**commit_dict(c), "pruned": True, "tensors": None})
        return
    snap = repo.read_snapshot(c.snapshot) if not pruned else None
    # A tensor's stored_bytes is its encoded size (kept under that name for scripts).
    tensors = [] if snap is None else [{
        "name": t.name, "dtype": t.dtype, "shape": t.shape, "codec": t.codec,
        "raw_bytes": t.raw_bytes, "stored_bytes": t.stored_bytes, "encoded_bytes": t.stored_bytes,
        "depth": t.depth, "ratio": (t.raw_bytes / t.stored_bytes) if t.stored_bytes else None,
    } for t in snap.tensors]
    from mvc.repo.inspect import commit_sizes  # on use: the CLI starts without the repository code

    sizes = None if snap is None else commit_sizes(repo.odb, c.id)
    if as_json:
        echo_json({**commit_dict(c), "tensors": tensors, **({} if sizes is None else {
            "raw_bytes": sizes.raw_bytes, "encoded_bytes": sizes.encoded_bytes,
            "new_bytes": sizes.new_bytes})})
        return
    echo(f"commit {c.id}")
    if c.parents:
        echo(f"Parents: {' '.join(p[:12] for p in c.parents)}")
    echo(f"Author:  {c.author}")
    echo(f"Date:    {c.time}")
    if c.step is not None:
        echo(f"Step:    {c.step}")
    for k, v in c.metrics.items():
        echo(f"Metric:  {k} = {v:g}")
    if c.provenance:
        p = c.provenance
        dirty = " (dirty)" if p.get("dirty") else ""
        echo(f"Code:    {p.get('commit') or 'no commits'} on {p.get('branch') or 'detached'}"
             f"{dirty} in {p.get('repo')}")
    if c.quant:
        echo(f"Quant:   {describe_quant(c.quant)}")
    if c.quality:
        record = QualityRecord.from_json(c.quality)
        echo(f"Quality: {describe_quality(record)}")
        echo(f"Gate:    {describe_gate(record)}")
    echo()
    for line in message_lines(c.message):
        echo(f"    {line}", multiline=True)
    echo()
    if snap is None:
        echo("Pruned:  checkpoint not stored (gc retention policy)")
        return
    assert sizes is not None  # set with `snap`
    click.echo(_type_summary(snap.tensors))
    if not stat_only:
        echo()
        rows = [(t.name, t.dtype, "x".join(map(str, t.shape)) or "()", t.codec,
                 human_bytes(t.stored_bytes), ratio(t.raw_bytes / t.stored_bytes)
                 if t.stored_bytes else "-") for t in snap.tensors]
        click.echo(table(rows, ["tensor", "dtype", "shape", "codec", "encoded", "ratio"], "lllllr"))
    echo()
    echo(f"{len(snap.tensors)} tensors, {sizes_text(sizes.raw_bytes, sizes.encoded_bytes, sizes.new_bytes)}")


@click.command()
@click.argument("rev_a")
@click.argument("rev_b", required=False)
@click.option("--file", "file", type=click.Path(dir_okay=False), default=None,
              help="With REV_A alone: the checkpoint file to compare (default: checkpoint.path, else "
                   "the file last committed or checked out).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged tensors.")
def diff(rev_a: str, rev_b: str | None, file: str | None, as_json: bool, show_all: bool) -> None:
    """Per-tensor differences between REV_A and REV_B, or, with REV_A alone, between REV_A
    and the working checkpoint file (as git diff REV compares with the work tree)."""
    from mvc.repo.pruned import check_not_pruned

    repo = Repo.discover()
    if rev_b is not None and file is not None:
        raise UsageError("--file compares REV_A with a file: give no REV_B")
    # Revisions and the file are checked before torch is imported (issue 30 item 6).
    for rev in (rev_a,) if rev_b is None else (rev_a, rev_b):
        check_not_pruned(repo.store.refs, repo.resolve(rev))
    if rev_b is None:
        from mvc.io.checkpoint_errors import CheckpointNotFoundError

        working = _working_file(repo, file)
        if not working.exists():
            raise CheckpointNotFoundError(f"{working}: no such file")
        from mvc.io.files import load_checkpoint

        with repo.safe_globals():
            diffs = repo.diff_state(rev_a, load_checkpoint(working))
    else:
        diffs = repo.diff(rev_a, rev_b)
    if as_json:
        echo_json([d.to_dict() for d in diffs])
        return
    rows = []
    for d in diffs:
        if d.status == "unchanged" and not show_all:
            continue
        rel = f"{d.rel_l2:.3e}" if d.rel_l2 is not None else "-"
        mx = f"{d.max_abs:.3e}" if d.max_abs is not None else "-"
        rows.append((d.name, d.status, rel, mx))
    counts: dict[str, int] = {}
    for d in diffs:
        counts[d.status] = counts.get(d.status, 0) + 1
    if rows:
        click.echo(table(rows, ["tensor", "status", "rel L2", "max |diff|"], "llrr"))
    echo(", ".join(f"{n} {s}" for s, n in counts.items()) or "no tensors")


def _working_file(repo: Repo, given: str | None) -> Path:
    """The checkpoint file `diff REV` compares: --file, else checkpoint.path, else the file
    `status` tracks (last committed or checked out)."""
    import json

    if given:
        return Path(given)
    configured = repo.config.get("checkpoint.path")
    if configured:
        p = Path(configured)
        return p if p.is_absolute() else repo.path / p
    raw = repo.store.maintenance.get_meta("worktree")
    if raw:
        return Path(json.loads(raw)["path"])
    raise UsageError("no checkpoint file to compare with: give REV_B, --file PATH, or "
                     "`mvc config checkpoint.path PATH`")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), default=None, metavar="FILE.png",
              help="Also draw the history to FILE: bytes, ratio, degradation vs epsilon, branch points "
                   "(needs the plot extra: matplotlib).")
def stats(as_json: bool, plot_file: str | None) -> None:
    """Raw checkpoint bytes vs encoded bytes and bytes new in store, per commit and in total.

    Encoded: what the commit's tensors take, shared chunks included (ratio: raw /
    encoded). New in store: what it added to the store, each object counted for the
    first commit that used it (an unchanged re-commit adds a few hundred bytes)."""
    repo = Repo.discover()
    if plot_file is not None:
        from mvc.cli.plot import plot_history

        n = plot_history(repo, Path(plot_file))
        echo(f"Wrote {plot_file} ({n} commits)", err=as_json)
    s = repo.stats()
    if as_json:
        echo_json(s.to_dict())
        return
    rows = [(c.id[:12], c.message[:40], "pruned", "-", "-", "-") if c.pruned else
            (c.id[:12], c.message[:40], human_bytes(c.raw_bytes), human_bytes(c.encoded_bytes),
             ratio(c.encoded_ratio), human_bytes(c.new_bytes)) for c in s.commits]
    click.echo(table(rows, ["commit", "message", "raw", "encoded", "ratio", "new in store"], "llrrrr"))
    echo()
    echo(f"total: {len(s.commits)} commits, {human_bytes(s.raw_bytes)} raw, "
         f"{human_bytes(s.encoded_bytes)} encoded, {human_bytes(s.stored_bytes)} new in store "
         f"({ratio(s.ratio)} overall); "
         f"{human_bytes(s.total_disk_bytes)} on disk ({human_bytes(s.disk_bytes)} store, "
         f"{human_bytes(s.cache_bytes)} level cache)")
    if s.unreachable_objects:
        echo(f"{human_bytes(s.unreachable_bytes)} in {s.unreachable_objects} objects no ref or "
             "reflog reaches (an interrupted commit, deleted history): `mvc gc` frees them")


COMMANDS = [log, show, diff, stats]
