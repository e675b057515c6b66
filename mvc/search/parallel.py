"""The config search spread over data-parallel ranks (Inshrinkerator §5, "Parallelized
Implementation"): every replica holds the same state, so each round of the search
evaluates as many trials as there are ranks, one per rank, and the first feasible one in
order of compression wins.

The search runs on one rank, the *leader* (rank 0 of the group); the others are
*workers* that evaluate the trials the leader hands them on their own replica:

    leader  (`with ranks(group): find_config(...)`)      workers (`serve_trials(...)`)
      "start": the search's settings ───────────────▶    prepare the same sketches and gate
      "batch": N trials ────────────────────────────▶    trial #rank, on this replica
      ◀──────────────── every rank's verdict (all-gather) ─────────────────▶
      ...                                                 ...
      "done" ───────────────────────────────────────▶    return

So the ranks agree on every verdict by construction (the leader decides from the gathered
ones) and nothing but the leader's inputs decides the trial order: workers need only
their own tensors, gradients and quality function -- the same batch, the same function
on every rank, as for any data-parallel evaluation.  The winner's quantization is recomputed
on the leader (deterministic) when another rank found it.  With one rank, or without a
`ranks` context, `find_config` is the sequential search.

This module holds the protocol's collectives and the context; the search side is in
`mvc.search.driver` (`find_config`, `serve_trials`).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from mvc.errors import UsageError


class ParallelSearchError(UsageError):
    """The parallel search was asked for without an initialized `torch.distributed` group, or
    a worker received a message out of protocol (the ranks are not running one search)."""

    exit_code = 164


@dataclass(frozen=True)
class Ranks:
    """A process group the search spreads over (None: the default group)."""

    group: Any = None

    @property
    def rank(self) -> int:
        return int(dist.get_rank(self.group))

    @property
    def size(self) -> int:
        return int(dist.get_world_size(self.group))

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def _src(self) -> int:
        # broadcast_object_list takes a global rank
        return dist.get_global_rank(self.group, 0) if self.group is not None else 0

    def send(self, message: Any = None) -> Any:
        """The leader's `message`, on every rank (broadcast)."""
        box = [message if self.leader else None]
        dist.broadcast_object_list(box, src=self._src(), group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """`obj` of every rank, in rank order (all-gather)."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out


_ACTIVE: contextvars.ContextVar[Ranks | None] = contextvars.ContextVar("mvc_search_ranks",
                                                                      default=None)


def default_ranks(group: Any = None) -> Ranks:
    """`Ranks` over `group` (the default group when None); it must be initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ParallelSearchError("the parallel search needs torch.distributed initialized")
    return Ranks(group)


@contextlib.contextmanager
def ranks(group: Any = None) -> Iterator[Ranks]:
    """Within this block, `find_config` on the group's rank 0 leads a parallel search; the
    other ranks must be in `serve_trials` meanwhile."""
    r = default_ranks(group)
    token = _ACTIVE.set(r)
    try:
        yield r
    finally:
        _ACTIVE.reset(token)


def active() -> Ranks | None:
    """The `ranks` context the current search runs in (None: sequential)."""
    r = _ACTIVE.get()
    return r if r is not None and r.size > 1 else None
