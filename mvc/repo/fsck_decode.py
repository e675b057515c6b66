"""`mvc fsck --decode`: every tensor of every reachable snapshot decoded, as a checkout would.

An object's id proves its bytes are the ones written, not that they decode: a payload an
encoder got wrong (the rANS encoder before its exact division, for one) passes every id check
and fails only at checkout. This reads each snapshot's tensors through a reader of its own
(levels kept for that snapshot only) and names each tensor that does not restore.

The rANS blocks that encoder wrote wrong are recovered by the decoder where exactly one input
gives them (`mvc.native.rans.recovery_counts`): such a tensor restores, and is named as a
warning, since its checkout runs the slower recovery each time (a commit of the restored state
stores it anew). A block two inputs give stays a problem.
"""
from __future__ import annotations

from mvc.errors import MvcError
from mvc.native.rans import recovery_counts
from mvc.progress import Progress, phase
from mvc.repo.objectdb import ObjectDB
from mvc.repo.reader import TensorReader


def undecodable(odb: ObjectDB, snapshots: list[str], progress: Progress | None = None,
                warnings: list[str] | None = None) -> list[str]:
    """A problem line for each tensor of `snapshots` that does not decode (its delta chain
    walked from the stored bases, no level cache read); `progress` hears of each tensor.
    `warnings`, when given, gets a line for each tensor that decoded through the recovery of
    old rANS blocks."""
    problems: list[str] = []
    snaps = {sid: odb.read_snapshot(sid) for sid in snapshots}
    total = sum(len(s.tensors) for s in snaps.values())
    with phase(progress, "decoding tensors", total_items=total) as p:
        for sid, snap in snaps.items():
            reader = TensorReader(odb)   # a fresh in-memory cache per snapshot, no disk cache
            for rec in snap.tensors:
                before = recovery_counts()[0]
                try:
                    reader.read_any(sid, rec, snap.tensors)
                except MvcError as exc:
                    problems.append(f"snapshot {sid}: tensor {rec.name!r} does not decode: {exc}")
                recovered = recovery_counts()[0] - before
                if recovered and warnings is not None:
                    warnings.append(
                        f"snapshot {sid}: tensor {rec.name!r} holds {recovered} rANS block(s) "
                        "written by mvc's encoder before its exact division, recovered (they "
                        "never decoded before); every checkout of it runs that recovery")
                p.advance(items=1)
    return problems
