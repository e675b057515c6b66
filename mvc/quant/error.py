"""What a quantization costs in reconstruction error, in one pass over the tensor.

`error_sums(q, x, w)` gives, with d = dequantize(q) - x (centroids rounded to the
tensor's dtype, pruned entries 0, protected entries exact) and x the tensor as float32:

    (sum d^2, sum x^2, sum |x| d^2, sum |x| x^2, sum |w| d^2, sum |w| x^2)

every term in float64 (the last two 0 without `w`).  The config search reads its
proxy metric (magnitude- and gradient-weighted relative errors) and its per-tensor
guard rail from these sums, so one pass over levels and values serves a trial; no
dequantized copy of the tensor is made.  On CPU a native kernel does the pass
(blocks sized from the length alone: the same bits whatever the thread count);
elsewhere torch does it chunk by chunk on the tensor's device.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import numpy as np
import torch

from mvc.errors import InternalError
from mvc.quant._kernels import level_census, qerr_sums
from mvc.quant.assign import native_ok
from mvc.quant.tensor import QuantizedTensor, level_values

#: Elements per chunk of the torch path (bounds its temporaries to a few MiB).
_CHUNK = 1 << 20
#: On an accelerator the sums take 4x longer chunks: each chunk is ~20 kernel launches, and a
#: GPU commit's time was measured to be launch overhead, not arithmetic (issue 27: 88k launches,
#: 0.46 s of kernels in a 124M first commit). The temporaries stay ~200 MiB.
_DEVICE_CHUNK = 1 << 22


def chunk_for(t: torch.Tensor) -> int:
    """Elements per chunk of a torch-path pass over `t`: longer on an accelerator."""
    return _CHUNK if t.device.type == "cpu" else _DEVICE_CHUNK

ErrorSums = tuple[float, float, float, float, float, float]


def level_table(q: QuantizedTensor, device: torch.device) -> torch.Tensor:
    """float32 value of each level: centroids rounded to q's dtype, 0 (pruned), 0 (protected:
    its exact values are never looked up here)."""
    return level_values(q.centroids.to(device=device, dtype=q.dtype), device)


def error_sums(q: QuantizedTensor, x: torch.Tensor, w: torch.Tensor | None = None) -> ErrorSums:
    """The six error sums of the module docstring for `q` against the values `x` (any
    float dtype and shape with q's element count; `w`, optional weights, likewise)."""
    if q.measured_only:   # its levels are placeholders: only its cached sums hold
        raise InternalError("error sums asked of a measured-only stand-in")
    lv = q.levels.reshape(-1)
    xf = x.detach().reshape(-1).to(device=lv.device, dtype=torch.float32).contiguous()
    wf = (w.detach().reshape(-1).to(device=lv.device, dtype=torch.float32).contiguous()
          if w is not None else None)
    if xf.numel() != lv.numel() or (wf is not None and wf.numel() != lv.numel()):
        raise ValueError("error_sums: x / w do not match the levels' element count")
    return table_error_sums(lv, xf, level_table(q, lv.device), wf)


def table_error_sums(levels: torch.Tensor, x: torch.Tensor, table: torch.Tensor,
                     w: torch.Tensor | None = None) -> ErrorSums:
    """The six error sums with d = table[levels] - x and the table's last entry standing for
    exact values (d = 0): `error_sums` for any table of level values, e.g. a transformed
    domain's.  `levels` flat uint8/int16/int32/int64, `x` (and `w`) flat contiguous float32
    on its device, `table` float32."""
    prot = table.numel() - 1
    if native_ok(x, levels.dtype):
        s = qerr_sums(x, levels.contiguous(), table, w)
        return (float(s[0]), float(s[1]), float(s[2]), float(s[3]), float(s[4]), float(s[5]))
    acc = torch.zeros(6, dtype=torch.float64, device=levels.device)
    step = chunk_for(levels)
    for s0 in range(0, levels.numel(), step):
        lc = levels[s0:s0 + step]
        xc = x[s0:s0 + step].to(torch.float64)
        idx = lc if lc.dtype in (torch.int32, torch.int64) else lc.to(torch.int32)
        d = torch.index_select(table, 0, idx).to(torch.float64).sub_(xc)
        d.masked_fill_(lc == prot, 0.0)
        dd, xx, ax = d.mul_(d), xc * xc, xc.abs()
        parts = [dd.sum(), xx.sum(), (ax * dd).sum(), (ax * xx).sum()]
        if w is not None:
            aw = w[s0:s0 + step].to(torch.float64).abs()
            parts += [(aw * dd).sum(), (aw * xx).sum()]
        else:
            parts += [acc.new_zeros(()), acc.new_zeros(())]
        acc += torch.stack(parts)
    a = acc.tolist()
    return (a[0], a[1], a[2], a[3], a[4], a[5])


class SumsCache:
    """Error sums by quantization, so every reader of one quantization's sums shares its
    pass: the search's guard rail and proxy, and the trials that reuse a `QuantizedTensor`
    whose (bins, thresholds) did not change.  Keyed weakly by the quantization (freed with
    it) and checked against the very value and gradient tensors, unchanged since (their
    in-place version counters), that the sums were computed from.  Sums taken with a
    gradient serve a request without one (its first four terms do not depend on it).
    One instance per measured quantity (`mvc.quant.optimizer` keeps a second moment's, in
    sqrt(v), in another)."""

    def __init__(self) -> None:
        self._map: weakref.WeakKeyDictionary[QuantizedTensor, tuple] = weakref.WeakKeyDictionary()

    @staticmethod
    def _tag(t: torch.Tensor | None) -> tuple:
        return (None, -1) if t is None else (weakref.ref(t), t._version)

    def peek(self, q: QuantizedTensor, w: torch.Tensor, g: torch.Tensor | None = None
             ) -> ErrorSums | None:
        """The sums kept for q against `w` (and `g`), or None."""
        hit = self._map.get(q)
        if hit is not None:
            (wr, wv), (gr, gv), sums = hit
            if wr() is w and wv == w._version:
                if g is None:
                    return (sums[0], sums[1], sums[2], sums[3], 0.0, 0.0)
                if gr is not None and gr() is g and gv == g._version:
                    return sums
        return None

    def get(self, q: QuantizedTensor, w: torch.Tensor, g: torch.Tensor | None) -> ErrorSums:
        """`error_sums(q, w, g)`, from the cache where it holds them."""
        sums = self.peek(q, w, g)
        if sums is None:
            sums = error_sums(q, w, g)
            self.put(q, w, g, sums)
        return sums

    def put(self, q: QuantizedTensor, w: torch.Tensor, g: torch.Tensor | None,
            sums: ErrorSums) -> None:
        """Keep `sums` for q, measured against `w` (and `g`) as they are now."""
        self._map[q] = (self._tag(w), self._tag(g), sums)

    def share(self, q: QuantizedTensor, other: QuantizedTensor) -> bool:
        """Serve `other` with what is kept for q (False when nothing is)."""
        hit = self._map.get(q)
        if hit is not None:
            self._map[other] = hit
        return hit is not None


_SUMS = SumsCache()


def seed_error_stats(q: QuantizedTensor, w: torch.Tensor, g: torch.Tensor | None,
                     sums: Sequence[float] | np.ndarray | None, counts: np.ndarray | None
                     ) -> None:
    """Remember what the assignment pass measured for q (`AssignStats`): its error sums
    against the tensor object `w` (weights: the object `g`, or None) and its level counts,
    so `cached_error_sums` and `level_histogram` find them."""
    if sums is not None:
        s = tuple(float(v) for v in sums)
        _SUMS.put(q, w, g, (s[0], s[1], s[2], s[3], s[4], s[5]))
    if counts is not None:
        _COUNTS[q] = (q.levels._version, torch.from_numpy(np.ascontiguousarray(counts, np.int64)))


def cached_error_sums(q: QuantizedTensor, w: torch.Tensor,
                      g: torch.Tensor | None = None) -> ErrorSums:
    """`error_sums(q, w, g)`, remembered for q while it lives: a later call with the same
    tensor objects (unchanged), or with `g=None` after one with a gradient, is a lookup.
    Pass the caller's own tensor objects (not fresh views): they are recognised by
    identity."""
    return _SUMS.get(q, w, g)


def measured_stand_in(q: QuantizedTensor) -> QuantizedTensor | None:
    """A levels-free stand-in for q that the measurement caches serve as they serve q: its
    error sums (against the same tensor objects) and its level counts. For a search that
    measures a trial from quantizations an earlier trial made and then dropped: keeping
    the measurement costs a few floats, keeping the levels a byte a value. Its levels and
    protected values are zero-stride placeholders of q's shapes and dtypes, so it must only
    ever be measured, never decoded. None when q's sums or counts are not cached."""
    counts = _COUNTS.get(q)
    if counts is None or counts[0] != q.levels._version:
        return None

    def placeholder(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros((1,) * t.dim(), dtype=t.dtype, device=t.device).expand(t.shape)

    stand = QuantizedTensor(placeholder(q.levels), q.centroids, placeholder(q.protected),
                            q.dtype, q.bins, measured_only=True)
    if not _SUMS.share(q, stand):
        return None
    _COUNTS[stand] = (stand.levels._version, counts[1])
    return stand


def relative_error(s: Sequence[float]) -> float:
    """||dequantize(q) - x|| / ||x|| from q's error sums (the first two suffice): 0 for an
    all-zero x restored as zeros, inf when an all-zero x is not."""
    n, r = s[0], s[1]
    if r <= 0.0:
        return 0.0 if n == 0.0 else math.inf
    return math.sqrt(n / r)


_COUNTS: weakref.WeakKeyDictionary[QuantizedTensor, tuple[int, torch.Tensor]] = \
    weakref.WeakKeyDictionary()


def level_histogram(q: QuantizedTensor) -> torch.Tensor:
    """int64 count of each of q's `n_levels` levels (on the CPU for CPU levels), remembered
    for q while it lives: the search asks once per trial for every quantization it keeps."""
    counts = checked_level_histogram(q)
    if counts is None:
        raise InternalError(f"a level outside [0, {q.n_levels})")
    return counts


def checked_level_histogram(q: QuantizedTensor) -> torch.Tensor | None:
    """`level_histogram`, or None when a level lies outside [0, n_levels) (levels handed in
    from outside, e.g. to an encoder, which names the problem itself)."""
    hit = _COUNTS.get(q)
    if hit is not None and hit[0] == q.levels._version:
        return hit[1]
    if q.measured_only:
        raise InternalError("a measured-only stand-in lost its level counts")
    lv = q.levels.reshape(-1)
    if native_ok(lv, lv.dtype):
        counts = level_census(lv.contiguous(), q.n_levels)
    else:
        li = lv.to(torch.int64)
        if lv.dtype != torch.uint8 and li.numel() and bool((li < 0).any()):
            return None
        # a level past the top lengthens the histogram: one check, no min/max reads
        counts = torch.bincount(li, minlength=q.n_levels)
        if counts.numel() > q.n_levels:
            return None
    if counts is None:
        return None
    _COUNTS[q] = (q.levels._version, counts)
    return counts
