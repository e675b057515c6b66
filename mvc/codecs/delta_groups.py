"""Quantization-aware parameter rearrangement (Inshrinkerator Alg. 5 and 6).

Deltas between two checkpoints' level streams are split into groups by each
parameter's level in the *parent*: parameters of a bucket that rarely migrates
then form long runs of one delta value, which run-length coding turns into a
handful of symbols.  The grouping is a stable partition by parent level, so
the decoder, which holds the parent's levels, rebuilds it by itself and
nothing about the arrangement is stored.

The codec uses the fused native passes (`native/groups.c`): `grouped_delta`
computes D = (parent - cur) mod B and scatters it into group order in one
O(n) counting-sort pass; `apply_grouped_delta` is Alg. 6 fused with the
inverse delta and the range checks.  Level and delta arrays are uint8 when B
<= 256, else uint16 (`delta_dtype`).  The same operations in plain numpy, the
readable reference the tests compare these to, are in tests/helpers/reference_coders.py.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from mvc.codecs.base import CodecError
from mvc.errors import InternalError
from mvc.native import ffi, lib, parallel, status
from mvc.native.buffers import borrow, nbytes
from mvc.native.parallel import in_worker, pmap, segments

__all__ = [
    "GroupedDeltaError", "LevelRangeError",
    "delta_dtype", "group_counts", "grouped_delta", "apply_grouped_delta", "decode_levels",
    "ChainWalker", "group_slices",
]

MAX_GROUPS = 1 << 16


class GroupedDeltaError(CodecError):
    """A delta stream is inconsistent with the parent levels it is applied to."""

    exit_code = 45


class LevelRangeError(CodecError):
    """A level array holds a value outside the range its level count allows."""

    exit_code = 46


def delta_dtype(modulus: int) -> np.dtype:
    """The narrowest unsigned dtype holding every value in [0, modulus)."""
    if modulus <= 1 << 8:
        return np.dtype(np.uint8)
    if modulus <= 1 << 16:
        return np.dtype(np.uint16)
    raise InternalError(f"delta modulus {modulus} exceeds 65536 levels")


def _ptr(arr: np.ndarray):
    """A pointer into `arr` for one call's argument list only (see mvc.native.buffers)."""
    return ffi.from_buffer("uint8_t[]", arr, require_writable=arr.flags.writeable)


def _counts_ptr(counts: Optional[np.ndarray]):
    """`counts` (contiguous int64) for one call's argument list, or NULL."""
    if counts is None:
        return ffi.NULL
    if counts.dtype != np.int64 or not counts.flags.c_contiguous:
        raise InternalError("counts must be a contiguous int64 array")
    return ffi.from_buffer("int64_t[]", counts, require_writable=counts.flags.writeable)


def _flat(arr: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype != dtype:
        raise InternalError(f"{what} must be {dtype}, got {flat.dtype}")
    return flat


def _check_same_length(a: np.ndarray, b: np.ndarray) -> None:
    if a.size != b.size:
        raise InternalError(f"level streams differ in length: {a.size} vs {b.size}")


def _raise_for(rc: int, what: str) -> None:
    if rc >= 0:
        return
    if rc == status.ERR_RANGE:
        raise LevelRangeError(f"{what}: a level is >= its level count or the group count")
    if rc in (status.ERR_CORRUPT, status.ERR_TRUNCATED):
        raise GroupedDeltaError(f"{what}: the delta is corrupt or does not fit its parent levels")
    if rc == status.ERR_NOMEM:
        raise MemoryError(f"{what}: out of memory")
    raise InternalError(f"{what}: {status.describe(rc)} (status {rc}; counts or arguments wrong, a bug)")


def _split(n: int) -> bool:
    """Whether one tensor's pass of `n` values runs in segments across the pool (not on a pool
    thread, where they would run inline and only cost the extra counting)."""
    return n > parallel.SPLIT and not in_worker()


def _count(flat: np.ndarray, n_groups: int) -> np.ndarray:
    counts = np.zeros(n_groups, dtype=np.int64)
    rc = lib.mvc_grp_count(_ptr(flat), flat.size, flat.dtype.itemsize, n_groups,
                           _counts_ptr(counts))
    _raise_for(rc, f"parent levels (n_groups={n_groups})")
    return counts


def group_counts(parent: np.ndarray, n_groups: int) -> np.ndarray:
    """How many parameters sit at each parent level (int64, length `n_groups`).

    `parent` is uint8 or uint16; raises LevelRangeError if a level is >= n_groups.
    """
    if not 1 <= n_groups <= MAX_GROUPS:
        raise InternalError(f"n_groups {n_groups} outside [1, {MAX_GROUPS}]")
    flat = np.ascontiguousarray(parent).reshape(-1)
    if flat.dtype not in (np.uint8, np.uint16):
        raise InternalError(f"parent levels must be uint8 or uint16, got {flat.dtype}")
    if not _split(flat.size):
        return _count(flat, n_groups)
    return np.sum(pmap(lambda s: _count(flat[s], n_groups), segments(flat.size)), axis=0)


def grouped_delta(parent: np.ndarray, cur: np.ndarray, modulus: int,
                  counts: Optional[np.ndarray]) -> np.ndarray:
    """D = (parent - cur) mod `modulus`, in group order (Alg. 5) when `counts` is given.

    Both inputs must already be `delta_dtype(modulus)`; `counts` comes from
    `group_counts(parent, n_groups)`, or is None for the original order.
    Raises LevelRangeError if a level is >= modulus (or its group count).
    """
    dt = delta_dtype(modulus)
    p, c = _flat(parent, dt, "parent levels"), _flat(cur, dt, "levels")
    _check_same_length(p, c)
    out = np.empty(p.size, dtype=dt)
    if counts is not None and _split(p.size):
        _grouped_delta_parts(p, c, modulus, counts, out)
        return out
    n_groups = 0 if counts is None else counts.size
    rc = lib.mvc_grp_delta(_ptr(p), _ptr(c), p.size, dt.itemsize, modulus, _counts_ptr(counts),
                           n_groups, _ptr(out))
    _raise_for(rc, "delta")
    return out


def _grouped_delta_parts(p: np.ndarray, c: np.ndarray, modulus: int, counts: np.ndarray,
                         out: np.ndarray) -> None:
    """`grouped_delta` by segments on the pool: each segment's values of a group go to the
    range after the earlier segments' (a stable partition), so `out` is the same."""
    segs = segments(p.size)
    n_groups = counts.size
    seg_counts = np.stack(pmap(lambda s: _count(p[s], n_groups), segs))
    if not np.array_equal(seg_counts.sum(axis=0), counts):
        _raise_for(status.ERR_ARG, "delta (counts do not match the parent levels)")
    starts = (np.cumsum(counts) - counts) + (np.cumsum(seg_counts, axis=0) - seg_counts)

    def one(i: int) -> None:
        s = segs[i]
        rc = lib.mvc_grp_delta_part(_ptr(p[s]), _ptr(c[s]), s.stop - s.start, p.itemsize, modulus,
                                    _counts_ptr(seg_counts[i]), _counts_ptr(starts[i]), n_groups,
                                    _ptr(out), out.size)
        _raise_for(rc, "delta")

    pmap(one, range(len(segs)))


def apply_grouped_delta(parent: np.ndarray, delta: np.ndarray, modulus: int, n_cur: int,
                        counts: Optional[np.ndarray]) -> tuple[np.ndarray, int]:
    """Alg. 6 fused with the inverse delta: (levels, how many equal n_cur - 1).

    levels = (parent - D) mod `modulus`, D read group by group (`counts` given)
    or in original order (None).  Raises GroupedDeltaError if D or a result is
    out of range (corrupt delta), LevelRangeError for an out-of-range parent.
    """
    dt = delta_dtype(modulus)
    p, d = _flat(parent, dt, "parent levels"), _flat(delta, dt, "delta")
    _check_same_length(p, d)
    if not 1 <= n_cur <= modulus:
        raise InternalError(f"n_cur {n_cur} outside [1, {modulus}]")
    out = np.empty(p.size, dtype=dt)
    top = ffi.new("uint64_t *")
    n_groups = 0 if counts is None else counts.size
    rc = lib.mvc_grp_apply(_ptr(p), _ptr(d), p.size, dt.itemsize, modulus, n_cur,
                           _counts_ptr(counts), n_groups, _ptr(out), top)
    _raise_for(rc, f"delta (levels must stay below {n_cur})")
    return out, int(top[0])


def decode_levels(parent: np.ndarray, n_prev: int, modulus: int, n_cur: int, *, grouped: bool,
                  rle: bool, sections: memoryview, lengths: list[int]) -> tuple[np.ndarray, int]:
    """A delta's level sections decoded and applied to `parent` in one native pass.

    `sections` holds the level sections back to back (`lengths` bytes each):
    one per parent level when `grouped` (Alg. 5 order), else one; each an
    RLE+Huffman stream (`rle`) or a Huffman stream of deltas, empty meaning all
    zero.  Returns (levels = (parent - D) mod `modulus`, count of levels equal
    to n_cur - 1).  Raises LevelRangeError if a parent level is >= n_prev
    (these are not the parent levels the delta was made against) and
    GroupedDeltaError if the delta is corrupt or does not fit the parent.
    """
    dt = delta_dtype(modulus)
    p = _flat(parent, dt, "parent levels")
    if not (1 <= n_prev <= modulus and 1 <= n_cur <= modulus):
        raise InternalError(f"level counts {n_prev}, {n_cur} outside [1, {modulus}]")
    if len(lengths) != (n_prev if grouped else 1) or sum(lengths) != len(sections):
        raise InternalError("section lengths do not match the sections or the group count")
    out = np.empty(p.size, dtype=dt)
    top = ffi.new("uint64_t *")
    # `sections` is usually a memoryview: its export must not outlive the call when the
    # sections are corrupt and the error keeps this frame (see mvc.native.buffers).
    with borrow(sections) as src:
        rc = lib.mvc_qdelta_levels(_ptr(p), p.size, dt.itemsize, n_prev, modulus, n_cur,
                                   int(grouped), int(rle), src, nbytes(sections),
                                   ffi.new("uint64_t[]", lengths), len(lengths), _ptr(out), top)
    _raise_for(rc, f"delta level sections (parent levels < {n_prev})")
    return out, int(top[0])


class ChainWalker:
    """8-bit levels walked along a chain of grouped RLE+Huffman deltas, in place (native/chain.h).

    Late in training a step changes few levels; the walker finds them through
    per-block level counts instead of a pass over every parameter, so a deep
    chain costs about one pass plus the changes.  Use as a context manager
    (frees the native state); `step` raises like `decode_levels`.
    """

    def __init__(self, levels: np.ndarray):
        flat = _flat(levels, np.dtype(np.uint8), "chain base levels")
        self.n = flat.size
        c = lib.mvc_chain_new(_ptr(flat), flat.size)  # the walker copies the levels
        if c == ffi.NULL:
            raise MemoryError(f"no memory for a chain walker over {flat.size} levels")
        # Freed by close(), or by the collector for a walker never closed.
        self._c = ffi.gc(c, lib.mvc_chain_free)

    @staticmethod
    def supports(numel: int, modulus: int) -> bool:
        """True when the walker can handle this tensor (8-bit levels, < 2**32 parameters)."""
        return modulus <= 1 << 8 and numel < 1 << 32

    def step(self, n_prev: int, modulus: int, n_cur: int, sections: memoryview,
             lengths: list[int]) -> int:
        """Apply one delta; returns how many levels equal n_cur - 1 afterwards."""
        if not (1 <= n_prev <= modulus <= 256 and 1 <= n_cur <= modulus):
            raise InternalError(f"level counts {n_prev}, {n_cur}, modulus {modulus} out of range")
        if len(lengths) != n_prev or sum(lengths) != len(sections):
            raise InternalError("section lengths do not match the sections or the group count")
        top = ffi.new("uint64_t *")
        with borrow(sections) as src:  # released before a corrupt step's error leaves
            rc = lib.mvc_chain_step(self._live(), n_prev, modulus, n_cur, src, nbytes(sections),
                                    ffi.new("uint64_t[]", lengths), len(lengths), top)
        _raise_for(rc, f"chain step (parent levels < {n_prev})")
        return int(top[0])

    def levels(self) -> np.ndarray:
        """The current levels (uint8, a copy)."""
        out = np.empty(self.n, dtype=np.uint8)
        _raise_for(lib.mvc_chain_levels(self._live(), _ptr(out), self.n), "chain levels")
        return out

    def _live(self):
        if self._c is None:
            raise InternalError("chain walker used after close()")
        return self._c

    def close(self) -> None:
        """Free the native state now (idempotent)."""
        c, self._c = self._c, None
        if c is not None:
            ffi.release(c)  # runs mvc_chain_free once; the collector will not run it again

    def __enter__(self) -> "ChainWalker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def group_slices(counts: np.ndarray) -> list[slice]:
    """The slice of each group inside the concatenated grouped array."""
    ends = np.cumsum(counts)
    starts = ends - counts
    return [slice(int(s), int(e)) for s, e in zip(starts, ends)]
