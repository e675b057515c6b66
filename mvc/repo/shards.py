"""Sharded tensors in a snapshot: one record per shard, assembled on read.

A sharded save (`mvc.dcp`, one writer per rank) stores each rank's piece of a tensor as its
own record.  The record's `shape` is the shard's; ``meta["shard"]`` says where it sits:

    {"of": <the tensor's name in the skeleton>, "offsets": [...], "shape": [<global shape>]}

and its name is `shard_name(of, offsets, sizes)` (``shard@0+8,0+16/model/0.weight``): the
layout is part of the name, so a delta (made against the parent's record *of the same
name*) continues exactly while a tensor's sharding is unchanged, and a tensor resharded
between two commits starts a new base.  The prefix keeps the tensor's own name last, so
the name rules that look at a name's end (layer types, optimizer-state patterns, the
``_sq`` partner of a first moment) read it as they read the unsharded name.

`assemble` turns the decoded shards back into the full tensors the skeleton names, so a
checkout in one process materializes the unsharded state whatever the world size that
wrote it.  The shards of a tensor must tile its global shape exactly (same dtype, inside
the bounds, no overlap, nothing missing): anything else is `ShardLayoutError`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from mvc.errors import DataError
from mvc.repo.objects import MAX_NUMEL, TensorRecord

SHARD_KEY = "shard"
_PREFIX = "shard@"


class ShardLayoutError(DataError):
    """The shard records of a tensor do not describe it: a malformed ``meta.shard``, shards of
    different dtypes or global shapes, a shard outside the tensor, overlapping shards, or
    parts of the tensor no shard covers."""

    exit_code = 160


def shard_name(name: str, offsets: Sequence[int], sizes: Sequence[int]) -> str:
    """The record name of the shard of `name` at `offsets` with shape `sizes`."""
    layout = ",".join(f"{int(o)}+{int(s)}" for o, s in zip(offsets, sizes))
    return f"{_PREFIX}{layout}/{name}"


def shard_meta(name: str, offsets: Sequence[int], global_shape: Sequence[int]) -> dict[str, Any]:
    """The ``meta["shard"]`` of a shard of `name` (global shape `global_shape`) at `offsets`."""
    return {"of": name, "offsets": [int(o) for o in offsets],
            "shape": [int(s) for s in global_shape]}


def covers_whole(offsets: Sequence[int], sizes: Sequence[int], global_shape: Sequence[int]) -> bool:
    """True when a chunk at `offsets` of shape `sizes` is the whole tensor (stored unsharded)."""
    return all(o == 0 for o in offsets) and list(sizes) == list(global_shape)


def shard_of(rec: TensorRecord) -> dict[str, Any] | None:
    """A record's validated ``meta["shard"]`` (None: an ordinary, unsharded record)."""
    info = rec.meta.get(SHARD_KEY)
    if info is None:
        return None
    if not isinstance(info, dict) or set(info) != {"of", "offsets", "shape"}:
        raise ShardLayoutError(f"record {rec.name!r}: meta.shard must be "
                               "{of, offsets, shape}")
    of, offsets, shape = info["of"], info["offsets"], info["shape"]
    if not isinstance(of, str) or not of:
        raise ShardLayoutError(f"record {rec.name!r}: meta.shard.of must be a tensor name")
    for what, seq in (("offsets", offsets), ("shape", shape)):
        if (not isinstance(seq, list) or len(seq) != len(rec.shape)
                or not all(type(v) is int and 0 <= v <= MAX_NUMEL for v in seq)):
            raise ShardLayoutError(f"record {rec.name!r}: meta.shard.{what} must be "
                                   f"{len(rec.shape)} integers in [0, 2^48]")
    if math.prod(shape) > MAX_NUMEL:
        raise ShardLayoutError(f"record {rec.name!r}: global shape {shape} is too large")
    for o, s, g in zip(offsets, rec.shape, shape):
        if o + s > g:
            raise ShardLayoutError(f"record {rec.name!r}: shard at {offsets} of shape "
                                   f"{rec.shape} lies outside the tensor's shape {shape}")
    return info


def expand_names(records: Iterable[TensorRecord], names: Iterable[str]) -> set[str]:
    """`names` (tensor names of a skeleton) plus the names of every shard record of them."""
    wanted = set(names)
    out = set(wanted)
    for rec in records:
        info = shard_of(rec)
        if info is not None and info["of"] in wanted:
            out.add(rec.name)
    return out


def assemble(records: Sequence[TensorRecord], tensors: Mapping[str, torch.Tensor]
             ) -> dict[str, torch.Tensor]:
    """`tensors` (decoded, by record name) with each sharded tensor's shards replaced by the
    full tensor under its own name, placed where the first of its shards was."""
    groups: dict[str, list[tuple[TensorRecord, dict[str, Any]]]] = {}
    for rec in records:
        info = shard_of(rec)
        if info is not None and rec.name in tensors:
            groups.setdefault(info["of"], []).append((rec, info))
    if not groups:
        return dict(tensors)
    shard_names = {rec.name: of for of, members in groups.items() for rec, _ in members}
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        of = shard_names.get(name)
        if of is None:
            if name in groups:
                raise ShardLayoutError(f"tensor {name!r} is stored both whole and in shards")
            out[name] = t
        elif of not in out:
            out[of] = _join(of, groups[of], tensors)
    return out


def check_tiling(name: str, members: Sequence[tuple[TensorRecord, dict[str, Any]]],
                 shape: Sequence[int] | None = None, dtype: str | None = None) -> None:
    """Raise `ShardLayoutError` unless the shard records `members` ((record, `shard_of`)) of
    tensor `name` tile its global shape exactly: one global shape (`shape`, the skeleton's,
    where given) and one dtype (`dtype` where given), element counts that add up, and no two
    shards overlapping (each lies inside the tensor: `shard_of`). From the records alone:
    nothing is decoded or allocated."""
    first_rec, first = members[0]
    want_shape = list(shape) if shape is not None else first["shape"]
    want_dtype = dtype if dtype is not None else first_rec.dtype
    for rec, info in members:
        if info["shape"] != want_shape or rec.dtype != want_dtype:
            raise ShardLayoutError(f"tensor {name!r}: its shards disagree on the global "
                                   f"shape or dtype ({want_shape} {want_dtype} expected, "
                                   f"{rec.name!r} says {info['shape']} {rec.dtype})")
    held = sum(math.prod(rec.shape) for rec, _ in members)
    if held != math.prod(want_shape):
        raise ShardLayoutError(f"tensor {name!r}: its shards hold {held} elements, "
                               f"the tensor {math.prod(want_shape)}")
    boxes = [(info["offsets"], rec.shape, rec.name) for rec, info in members
             if math.prod(rec.shape)]
    if len(boxes) > 1:
        lo = np.array([b[0] for b in boxes], dtype=np.int64)
        hi = lo + np.array([list(b[1]) for b in boxes], dtype=np.int64)
        # boxes i and j overlap when they do along every dimension
        meet = np.asarray(((lo[:, None, :] < hi[None, :, :])
                           & (lo[None, :, :] < hi[:, None, :])).all(axis=2))
        np.fill_diagonal(meet, False)
        if meet.any():
            i = int(np.argwhere(meet)[0][0])
            raise ShardLayoutError(f"tensor {name!r}: shard {boxes[i][2]!r} overlaps another")
    # Element counts add up, each shard lies inside and none overlaps: every element is covered.


def _join(name: str, members: list[tuple[TensorRecord, dict[str, Any]]],
          tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    check_tiling(name, members)
    first_rec, first = members[0]
    dtype = tensors[first_rec.name].dtype
    if any(tensors[rec.name].dtype != dtype for rec, _ in members):
        raise ShardLayoutError(f"tensor {name!r}: its shards disagree on the global "
                               "shape or dtype")
    full = torch.empty(first["shape"], dtype=dtype, device=tensors[first_rec.name].device)
    for rec, info in members:
        region = tuple(slice(o, o + s) for o, s in zip(info["offsets"], rec.shape))
        full[region] = tensors[rec.name].reshape(rec.shape)
    return full
