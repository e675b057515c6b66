"""cffi calls into native/assign.c, split across threads.

cffi releases the GIL around every call, so the process-wide native thread pool
(`mvc.native.parallel`) gives real parallelism.  Work is cut into pieces whose
layout depends only on the input size (never on the thread count) wherever the
result is a floating-point sum.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mvc.errors import InternalError

# Below this many elements per thread, splitting costs more than it saves.
MIN_CHUNK = 1 << 18


def parallel_chunks(n: int, fn: Callable[[int, int], None], *,
                    min_chunk: int = MIN_CHUNK) -> None:
    """Run fn(start, stop) over [0, n) in up to torch's intra-op thread count of chunks.

    The chunks run on the shared native pool (inline inside one of its tasks) and
    this returns or raises only once every chunk has finished: they write through
    raw pointers into the caller's tensors, which must not be written after an
    error reached the caller.  The first error (in chunk order) propagates.
    """
    threads = max(1, min(torch.get_num_threads(), n // max(1, min_chunk)))
    if threads == 1:
        fn(0, n)
        return
    from mvc.native.parallel import (
        pmap,  # the extension loads on first use, as in _lib()
    )

    step = -(-n // threads)
    pmap(lambda ab: fn(*ab), [(s, min(n, s + step)) for s in range(0, n, step)], threads)


def _lib() -> tuple[Any, Any]:
    from mvc.native import ffi, lib

    return ffi, lib


def _ptr(ctype: str, t: torch.Tensor) -> Any:
    """`t`'s data as a C pointer of `ctype`, for a host tensor only: the kernels read and write
    host memory, and a device tensor's address there would be read as if it were (a crash, or
    garbage). Callers route device tensors to the torch path; reaching here with one is a bug."""
    if t.device.type != "cpu":
        raise InternalError(f"a native kernel was given a tensor on {t.device}: native kernels "
                            f"take host tensors only")
    return _lib()[0].cast(ctype, t.data_ptr())


@dataclass(frozen=True)
class Partition:
    """Prune / protect cut-offs in the native kernels' terms (see native/assign.h).

    Disabled rules: prune_t < 0, protect thresholds +inf.  `sens` is the flat float32
    CPU sensitivity tensor or None.
    """

    prune_t: float = -1.0
    protect_mag_t: float = float("inf")
    protect_sens_t: float = float("inf")
    prune_on_sens: bool = False
    sens: torch.Tensor | None = None

    @property
    def active(self) -> bool:
        return (self.prune_t >= 0 or self.protect_mag_t != float("inf")
                or (self.sens is not None and self.protect_sens_t != float("inf")))

    def cdata(self, offset: int) -> Any:
        ffi, _ = _lib()
        p = ffi.new("mvc_partition_t *")
        p.sens = (_ptr("const float *", self.sens) + offset
                  if self.sens is not None else ffi.NULL)
        p.prune_t = self.prune_t
        p.protect_mag_t = self.protect_mag_t
        p.protect_sens_t = self.protect_sens_t
        p.prune_on_sens = int(self.prune_on_sens)
        return p


def loghist(x: torch.Tensor, bounds: np.ndarray, inv_log2_gamma: float, first: int,
            cells: np.ndarray, cell_bits: int, part: Partition | None = None
            ) -> tuple[np.ndarray, int, int]:
    """(counts[2 * nb], zeros, non-finite) of contiguous float32 CPU `x` (native/assign.h;
    `cells`: contiguous int32, the bucket of each float32 cell)."""
    ffi, lib = _lib()
    nb = len(bounds)
    xp = _ptr("const float *", x)
    bp = ffi.cast("const double *", bounds.ctypes.data)
    cp = ffi.cast("const int32_t *", cells.ctypes.data)
    parts: list[tuple[np.ndarray, int, int]] = []

    def run(a: int, b: int) -> None:
        counts = np.zeros(2 * nb, dtype=np.int64)
        zero = ffi.new("int64_t *", 0)
        pc = part.cdata(a) if part is not None else ffi.NULL
        bad = lib.mvc_loghist_f32(xp + a, b - a, pc, bp, nb, inv_log2_gamma, first, cp,
                                  cells.size, cell_bits, ffi.cast("int64_t *", counts.ctypes.data),
                                  zero)
        parts.append((counts, int(zero[0]), int(bad)))

    parallel_chunks(x.numel(), run)
    if not parts or any(p[2] < 0 for p in parts):  # pragma: no cover - arguments built here
        raise InternalError("mvc_loghist_f32 rejected its arguments")
    counts = parts[0][0] if len(parts) == 1 else np.sum([p[0] for p in parts], axis=0)
    return counts, sum(p[1] for p in parts), sum(p[2] for p in parts)


@dataclass
class AssignStats:
    """What an assignment can measure in its own pass (native/assign.h mvc_assign_stats_t):
    `table` (float32, one value per level, the last the protected level's) and optional
    float32 weights `w` in; the six float64 error sums of `mvc.quant.error` and the int64
    count of each level out, bit-equal to `qerr_sums` / `level_counts` over the levels."""

    table: torch.Tensor | None = None
    w: torch.Tensor | None = None
    sums: np.ndarray | None = None
    counts: np.ndarray | None = None


def assign_into(x: torch.Tensor, mids: torch.Tensor, out: torch.Tensor,
                part: Partition | None = None, k: int = 0,
                stats: AssignStats | None = None) -> int:
    """Levels of contiguous float32 CPU `x` into uint8/int16 `out` (see native/assign.h).

    Returns the number of protected elements (0 without a partition).  With `stats`, its
    sums and counts are filled in: the work is then cut into blocks sized from the length
    alone and the blocks' sums added in order (as `qerr_sums` does), so they are the same
    bits whatever the thread count.
    """
    ffi, lib = _lib()
    mids_c = mids.contiguous()
    mp = _ptr("const float *", mids_c)
    xp = _ptr("const float *", x)
    if out.dtype == torch.uint8:
        fn, ctype = lib.mvc_assign_f32_u8, "uint8_t *"
    else:
        fn, ctype = lib.mvc_assign_f32_i16, "int16_t *"
    op = _ptr(ctype, out)
    rcs: list[tuple[int, int]] = []
    if stats is None:
        def chunk(a: int, b: int) -> None:
            pc = part.cdata(a) if part is not None else ffi.NULL
            n_prot = ffi.new("int64_t *", 0)
            rc = fn(xp + a, b - a, mp, mids_c.numel(), pc, k, ffi.NULL, op + a, n_prot)
            rcs.append((rc, int(n_prot[0])))

        parallel_chunks(x.numel(), chunk)
    else:
        if stats.table is None:
            raise InternalError("assign_into: statistics need a table of level values")
        n = x.numel()
        bs = _block_size(n)
        nblocks = max(1, -(-n // bs))
        tab = stats.table.contiguous()
        w = stats.w.contiguous() if stats.w is not None else None
        n_table = tab.numel()
        sums = np.zeros((nblocks, 6), dtype=np.float64)
        counts = np.zeros((nblocks, n_table), dtype=np.int64)
        tp = _ptr("const float *", tab)
        wp = _ptr("const float *", w) if w is not None else ffi.NULL

        def blocks(b0: int, b1: int) -> None:
            for b in range(b0, b1):
                a, e = b * bs, min(n, (b + 1) * bs)
                st = ffi.new("mvc_assign_stats_t *")
                st.table, st.n_table = tp, n_table
                st.w = wp + a if w is not None else ffi.NULL
                st.sums = ffi.cast("double *", sums.ctypes.data) + 6 * b
                st.counts = ffi.cast("int64_t *", counts.ctypes.data) + n_table * b
                pc = part.cdata(a) if part is not None else ffi.NULL
                n_prot = ffi.new("int64_t *", 0)
                rc = fn(xp + a, e - a, mp, mids_c.numel(), pc, k, st, op + a, n_prot)
                rcs.append((rc, int(n_prot[0])))

        parallel_chunks(nblocks, blocks, min_chunk=1)
        stats.sums, stats.counts = sums.sum(0), counts.sum(0)
    if any(rc != 0 for rc, _ in rcs):  # pragma: no cover - arguments are validated by callers
        raise InternalError(f"native assignment failed with codes {rcs}")
    return sum(c for _, c in rcs)


def gather_level(levels: torch.Tensor, level: int, src: torch.Tensor, count: int) -> torch.Tensor:
    """src's elements (flattened, C order) where `levels == level`; `count` is their number.

    CPU, contiguous, uint8/int16 levels; `src` of any dtype with levels' element count.
    """
    ffi, lib = _lib()
    out = torch.empty(count, dtype=src.dtype)
    fn, ctype = ((lib.mvc_gather_level_u8, "const uint8_t *") if levels.dtype == torch.uint8
                 else (lib.mvc_gather_level_i16, "const int16_t *"))
    got = fn(_ptr(ctype, levels), levels.numel(), level,
             _ptr("const void *", src), src.element_size(),
             _ptr("void *", out) if count else ffi.NULL, count)
    if got != count:  # pragma: no cover - count comes from the assignment kernel
        raise InternalError(f"gathered {got} elements of level {level}, expected {count}")
    return out


def _block_size(n: int) -> int:
    # depends on n only, never on the thread count, so float sums are reproducible
    return max(1 << 16, -(-n // 64))


def level_sums(x: torch.Tensor, levels: torch.Tensor,
               k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 sums, int64 counts) per level < k of contiguous CPU float32 `x`."""
    ffi, lib = _lib()
    n = x.numel()
    bs = _block_size(n)
    nblocks = max(1, -(-n // bs))
    sums = torch.zeros(nblocks, k, dtype=torch.float64)
    cnts = torch.zeros(nblocks, k, dtype=torch.int64)
    fn, ctype = ((lib.mvc_level_sums_u8, "const uint8_t *") if levels.dtype == torch.uint8
                 else (lib.mvc_level_sums_i16, "const int16_t *"))
    xp = _ptr("const float *", x)
    lp = _ptr(ctype, levels)
    sp = _ptr("double *", sums)
    cp = _ptr("int64_t *", cnts)

    def run(b0: int, b1: int) -> None:
        for b in range(b0, b1):
            a, e = b * bs, min(n, (b + 1) * bs)
            if fn(xp + a, lp + a, e - a, k, sp + b * k, cp + b * k) != 0:  # pragma: no cover
                raise InternalError("mvc_level_sums rejected its arguments")

    parallel_chunks(nblocks, run, min_chunk=1)
    # numpy reduces row by row in a fixed order: reproducible to the last bit
    return torch.from_numpy(sums.numpy().sum(0)), cnts.sum(0)


def dequant(levels: torch.Tensor, table: torch.Tensor,
            protected: torch.Tensor) -> torch.Tensor | None:
    """table[levels] with the last table level filled from `protected` in order (CPU).

    `levels` contiguous uint8/int16, `table` and `protected` of the output dtype (2, 4 or
    8 bytes).  Returns None when the parts are inconsistent (level out of range,
    protected count mismatch).
    """
    ffi, lib = _lib()
    out = torch.empty(levels.numel(), dtype=table.dtype)
    fn, ctype = ((lib.mvc_dequant_u8, "const uint8_t *") if levels.dtype == torch.uint8
                 else (lib.mvc_dequant_i16, "const int16_t *"))
    prot = protected.contiguous()
    rc = fn(_ptr(ctype, levels), levels.numel(),
            _ptr("const void *", table), table.numel(), table.element_size(),
            _ptr("const void *", prot) if prot.numel() else ffi.NULL,
            prot.numel(), _ptr("void *", out) if out.numel() else ffi.NULL)
    return out if rc == 0 else None


def qerr_sums(x: torch.Tensor, levels: torch.Tensor, table: torch.Tensor,
              w: torch.Tensor | None = None, *, sqrt_x: bool = False) -> np.ndarray:
    """The six float64 error sums of native/qerr.h over contiguous CPU float32 `x`,
    uint8/int16 `levels`, float32 `table` and optional float32 weights `w`; with `sqrt_x`
    (no `w`), over the correctly rounded sqrt(x) (x < 0 as 0) taken as `x` is read: a second
    moment's sums in sqrt(v), with no float32 copy of sqrt(v).

    Summed block by block (blocks sized from n alone) and the blocks in order:
    reproducible to the bit whatever the thread count.
    """
    ffi, lib = _lib()
    if levels.dtype not in (torch.uint8, torch.int16) or x.dtype != torch.float32 \
            or levels.numel() != x.numel() or (w is not None and (sqrt_x or w.numel() != x.numel())):
        raise InternalError("qerr_sums: float32 x, uint8/int16 levels of its length, "
                            "w of its length and not with sqrt_x")
    n = x.numel()
    bs = _block_size(n)
    nblocks = max(1, -(-n // bs))
    sums = np.zeros((nblocks, 6), dtype=np.float64)
    u8 = levels.dtype == torch.uint8
    ctype = "const uint8_t *" if u8 else "const int16_t *"
    fn: Callable[..., Any]
    if sqrt_x:
        root = lib.mvc_qerr_sqrt_sums_u8 if u8 else lib.mvc_qerr_sqrt_sums_i16

        def fn(xp: Any, lp: Any, n: int, tp: Any, nt: int, wp: Any, sp: Any) -> int:
            return int(root(xp, lp, n, tp, nt, sp))
    else:
        fn = lib.mvc_qerr_sums_u8 if u8 else lib.mvc_qerr_sums_i16
    xp = _ptr("const float *", x)
    lp = _ptr(ctype, levels)
    tab = table.contiguous()
    tp = _ptr("const float *", tab)
    wp = _ptr("const float *", w) if w is not None else ffi.NULL
    sp = ffi.cast("double *", sums.ctypes.data)
    bad: list[int] = []

    def run(b0: int, b1: int) -> None:
        for b in range(b0, b1):
            a, e = b * bs, min(n, (b + 1) * bs)
            if fn(xp + a, lp + a, e - a, tp, tab.numel(), wp + a if w is not None else wp,
                  sp + 6 * b) != 0:
                bad.append(b)

    parallel_chunks(nblocks, run, min_chunk=1)
    if bad:
        raise InternalError("mvc_qerr_sums: a level is outside the table")
    return sums.sum(0)


def moment_clamp(m: torch.Tensor, v: torch.Tensor, bound: float) -> None:
    """The first-moment bound's clamp (`mvc.quant.moment_bound`, IEEE form) of contiguous CPU
    float32 `m` by `v` (as many elements), in place; `bound` a float32 value >= 0."""
    ffi, lib = _lib()
    if m.numel() != v.numel():
        raise InternalError("moment_clamp: m and v differ in size")
    mp = _ptr("float *", m)
    vp = _ptr("const float *", v)

    def run(a: int, b: int) -> None:
        if lib.mvc_moment_clamp_f32(mp + a, vp + a, b - a, bound) < 0:
            raise InternalError("mvc_moment_clamp_f32 rejected its arguments")

    parallel_chunks(m.numel(), run)


def ratio_max(m: torch.Tensor, v: torch.Tensor) -> float:
    """max |m| / sqrt(v) over v > 0 (float32, as torch computes it) of contiguous CPU
    float32 `m` and `v`; 0.0 when no v > 0."""
    ffi, lib = _lib()
    mp = _ptr("const float *", m)
    vp = _ptr("const float *", v)
    best: list[float] = []

    def run(a: int, b: int) -> None:
        out = ffi.new("float *", 0.0)
        if lib.mvc_ratio_max_f32(mp + a, vp + a, b - a, out) < 0:  # pragma: no cover
            raise InternalError("mvc_ratio_max_f32 rejected its arguments")
        best.append(float(out[0]))

    parallel_chunks(m.numel(), run)
    return max(best, default=0.0)


def level_counts(levels: torch.Tensor, n_levels: int) -> torch.Tensor:
    """int64 count of each level 0..n_levels-1 of contiguous CPU uint8/int16 `levels` (made by
    this process: one outside the range is an `InternalError`)."""
    counts = level_census(levels, n_levels)
    if counts is None:
        raise InternalError(f"a level outside [0, {n_levels})")
    return counts


def level_census(levels: torch.Tensor, n_levels: int) -> torch.Tensor | None:
    """`level_counts`, or None when a level is outside [0, n_levels) (levels read from
    storage: the caller names the damage)."""
    ffi, lib = _lib()
    # The groups' count (native/groups.h, the delta coder's Alg. 5 pass) is this census:
    # int16 levels read as uint16, so a negative one is out of range too.
    width = levels.element_size()
    lp = _ptr("const uint8_t *", levels)
    parts: list[np.ndarray] = []
    bad: list[int] = []

    def run(a: int, b: int) -> None:
        counts = np.empty(n_levels, dtype=np.int64)
        if lib.mvc_grp_count(lp + a * width, b - a, width, n_levels,
                             ffi.cast("int64_t *", counts.ctypes.data)) != 0:
            bad.append(a)
        parts.append(counts)

    parallel_chunks(levels.numel(), run)
    if bad:
        return None
    total = np.sum(parts, axis=0) if parts else np.zeros(n_levels, dtype=np.int64)
    return torch.from_numpy(np.ascontiguousarray(total, dtype=np.int64))


def scan_f32(x: torch.Tensor) -> tuple[int, int, int, int]:
    """(non-finite, < 0, == 0, > 0) counts of contiguous CPU float32 `x` (native/qerr.h)."""
    ffi, lib = _lib()
    xp = _ptr("const float *", x)
    parts: list[np.ndarray] = []

    def run(a: int, b: int) -> None:
        counts = np.zeros(4, dtype=np.int64)
        if lib.mvc_scan_f32(xp + a, b - a, ffi.cast("int64_t *", counts.ctypes.data)) != 0:
            raise InternalError("mvc_scan_f32 rejected its arguments")  # pragma: no cover
        parts.append(counts)

    parallel_chunks(x.numel(), run)
    t = np.sum(parts, axis=0) if parts else np.zeros(4, dtype=np.int64)
    return int(t[0]), int(t[1]), int(t[2]), int(t[3])



def _positive_spans(v: torch.Tensor) -> tuple[list[tuple[int, int, int, int]], int]:
    """([(start, stop, first positive's rank, positives in the span)], positives in all)
    of v's chunks, from one counting pass: the chunks then compact or expand in parallel."""
    ffi, lib = _lib()
    n = v.numel()
    threads = max(1, min(torch.get_num_threads(), n // MIN_CHUNK))
    step = max(1, -(-n // threads))
    spans = [(s, min(n, s + step)) for s in range(0, n, step)]
    vp = _ptr("const float *", v)
    counts = np.zeros((len(spans), 4), dtype=np.int64)

    def count(i: int) -> None:
        a, b = spans[i]
        lib.mvc_scan_f32(vp + a, b - a, ffi.cast("int64_t *", counts[i].ctypes.data))

    _run_indexed(len(spans), count)
    out, off = [], 0
    for (a, b), c in zip(spans, counts):
        out.append((a, b, off, int(c[3])))
        off += int(c[3])
    return out, off


def _run_indexed(n: int, fn: Callable[[int], None]) -> None:
    if n <= 1:
        for i in range(n):
            fn(i)
        return
    from mvc.native.parallel import pmap

    pmap(fn, list(range(n)), n)


def log_positive(v: torch.Tensor) -> torch.Tensor:
    """float32(log(float64(x))) of the entries x > 0 of contiguous CPU float32 `v`, in order
    (native/moments.h)."""
    ffi, lib = _lib()
    spans, total = _positive_spans(v)
    out = torch.empty(total, dtype=torch.float32)
    vp = _ptr("const float *", v)
    op = _ptr("float *", out)

    def run(i: int) -> None:
        a, b, off, cnt = spans[i]
        if lib.mvc_log_positive_f32(vp + a, b - a, op + off, cnt) != cnt:
            raise InternalError("mvc_log_positive_f32: the positive count changed")

    _run_indexed(len(spans), run)
    return out


def expand_positive(v: torch.Tensor, sub: torch.Tensor, fill: int) -> torch.Tensor:
    """Levels of v's shape (flat): `sub`'s entries, in order, where v > 0, else `fill`.
    Contiguous CPU float32 `v`; uint8/int16 `sub` holding one entry per positive."""
    ffi, lib = _lib()
    spans, total = _positive_spans(v)
    if total != sub.numel():
        raise InternalError(f"expand_positive: {sub.numel()} levels for {total} positives")
    out = torch.empty(v.numel(), dtype=sub.dtype)
    fn, ctype = ((lib.mvc_expand_positive_u8, "uint8_t *") if sub.dtype == torch.uint8
                 else (lib.mvc_expand_positive_i16, "int16_t *"))
    vp = _ptr("const float *", v)
    sp = _ptr(ctype, sub)
    op = _ptr(ctype, out)

    def run(i: int) -> None:
        a, b, off, cnt = spans[i]
        if fn(vp + a, b - a, sp + off, cnt, fill, op + a) != cnt:
            raise InternalError("mvc_expand_positive: the positive count changed")

    _run_indexed(len(spans), run)
    return out


def _moment_args(wlev: torch.Tensor | None) -> tuple[Any, int]:
    ffi, _ = _lib()
    if wlev is None:
        return ffi.NULL, 1
    return _ptr("const void *", wlev), wlev.element_size()


def compact_moment(m: torch.Tensor, wlev: torch.Tensor | None, wpruned: int
                   ) -> tuple[torch.Tensor, list[tuple[int, int, int, int]]]:
    """(kept entries of contiguous CPU float32 `m` in order, the chunk spans) where kept
    means m != 0 and, with contiguous uint8/int16 weight levels `wlev`, wlev != wpruned
    (native/moments.h).  The spans serve `expand_moment` on the same inputs."""
    ffi, lib = _lib()
    n = m.numel()
    threads = max(1, min(torch.get_num_threads(), n // MIN_CHUNK))
    step = max(1, -(-n // threads))
    bounds = [(s, min(n, s + step)) for s in range(0, n, step)]
    mp = _ptr("const float *", m)
    wp, ws = _moment_args(wlev)
    wsz = wlev.element_size() if wlev is not None else 0
    counts = [0] * len(bounds)

    def count(i: int) -> None:
        a, b = bounds[i]
        w = wp + a * wsz if wlev is not None else wp
        counts[i] = lib.mvc_compact_moment_f32(mp + a, b - a, w, ws, wpruned, ffi.NULL, 0)

    _run_indexed(len(bounds), count)
    if any(c < 0 for c in counts):  # pragma: no cover - arguments built here
        raise InternalError("mvc_compact_moment_f32 rejected its arguments")
    spans, off = [], 0
    for (a, b), c in zip(bounds, counts):
        spans.append((a, b, off, c))
        off += c
    out = torch.empty(off, dtype=torch.float32)
    op = _ptr("float *", out)

    def run(i: int) -> None:
        a, b, o, c = spans[i]
        w = wp + a * wsz if wlev is not None else wp
        if lib.mvc_compact_moment_f32(mp + a, b - a, w, ws, wpruned, op + o, c) != c:
            raise InternalError("mvc_compact_moment_f32: the kept count changed")

    _run_indexed(len(spans), run)
    return out, spans


def expand_moment(m: torch.Tensor, wlev: torch.Tensor | None, wpruned: int,
                  spans: list[tuple[int, int, int, int]], sub: torch.Tensor,
                  fill: int) -> torch.Tensor:
    """Levels of m's length: `sub`'s entries in order where kept (as `compact_moment`, whose
    spans these are), else `fill`."""
    ffi, lib = _lib()
    if sum(s[3] for s in spans) != sub.numel():
        raise InternalError("expand_moment: level count does not match the kept entries")
    out = torch.empty(m.numel(), dtype=sub.dtype)
    fn, ctype = ((lib.mvc_expand_moment_u8, "uint8_t *") if sub.dtype == torch.uint8
                 else (lib.mvc_expand_moment_i16, "int16_t *"))
    mp = _ptr("const float *", m)
    wp, ws = _moment_args(wlev)
    wsz = wlev.element_size() if wlev is not None else 0
    sp = _ptr(ctype, sub)
    op = _ptr(ctype, out)

    def run(i: int) -> None:
        a, b, o, c = spans[i]
        w = wp + a * wsz if wlev is not None else wp
        if fn(mp + a, b - a, w, ws, wpruned, sp + o, c, fill, op + a) != c:
            raise InternalError("mvc_expand_moment: the kept count changed")

    _run_indexed(len(spans), run)
    return out
