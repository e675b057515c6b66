"""DDSketch-style log histogram (Inshrinkerator Alg. 1), mergeable and exact to count.

A non-zero value x falls in bucket i = ceil(log_gamma |x|), i.e. |x| in
(gamma^(i-1), gamma^i], with gamma = (1 + alpha) / (1 - alpha).  Positive and
negative values have separate stores, zeros a counter of their own.  Every value in
bucket i is within relative error alpha of the bucket's representative
2 gamma^i / (gamma + 1), which is what makes quantiles alpha-accurate.

The bucket index is not computed with a floating-point log (vectorized and scalar
log implementations disagree in the last ulp, which would make a value's bucket
depend on its position in the tensor).  Instead it is the exact position of |x| in
a table of float64 boundaries gamma^i: on CPU a native kernel finds it (a normal
value's cell -- its exponent and top mantissa bits, narrower than a bucket -- names the
bucket of the cell's smallest value, one comparison decides between it and the next;
subnormals are seeded by a bit-level log2), elsewhere `torch.searchsorted` does.  Both give identical
counts, so sketches of shards merge into exactly the sketch of the whole.

Values are sketched as float32 (the quantizer's compute type).  NaN and +-Inf are
never binned: `LogSketch.from_tensor` raises `NonFiniteTensorError`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from mvc.quant._kernels import Partition, loghist
from mvc.quant.backend import on_host_kernels
from mvc.quant.device_chunks import count_into
from mvc.quant.errors import NonFiniteTensorError, QuantConfigError

MIN_ALPHA = 1e-3
MAX_ALPHA = 0.5
# log of the smallest float32 subnormal (2^-149) and of float32 max: the table spans both.
_LOG_MIN_F32 = -149 * math.log(2.0)
_LOG_MAX_F32 = math.log(float(np.finfo(np.float32).max))


@dataclass(frozen=True)
class _Table:
    """Bucket boundaries for one alpha: bounds[j] = gamma ** (first + j)."""

    alpha: float
    gamma: float
    first: int
    bounds: np.ndarray  # float64, strictly increasing
    cells: np.ndarray   # int32: the bucket of the smallest float32 of each cell (native kernel)
    cell_bits: int      # a cell is the float32s sharing exponent and top cell_bits mantissa bits

    @property
    def inv_log2_gamma(self) -> float:
        return 1.0 / math.log2(self.gamma)


def check_alpha(alpha: float) -> float:
    """Validate a relative-error bound and return it as float."""
    try:
        a = float(alpha)
    except (TypeError, ValueError) as exc:
        raise QuantConfigError(f"alpha must be a number, got {alpha!r}") from exc
    if not (MIN_ALPHA <= a <= MAX_ALPHA):
        raise QuantConfigError(f"alpha must be in [{MIN_ALPHA}, {MAX_ALPHA}], got {alpha!r}")
    return a


@functools.lru_cache(maxsize=16)
def _table(alpha: float) -> _Table:
    gamma = (1.0 + alpha) / (1.0 - alpha)
    lg = math.log(gamma)
    first = math.floor(_LOG_MIN_F32 / lg) - 1
    last = math.ceil(_LOG_MAX_F32 / lg) + 1
    idx = np.arange(first, last + 1, dtype=np.float64)
    bounds = np.exp(idx * lg)
    bounds.setflags(write=False)
    # Cells narrower than a bucket (relative width <= 2^-k < gamma - 1) hold at most one
    # boundary: the native kernel looks a normal value's bucket up by its bits and settles
    # the rest with one comparison, no log.
    k = math.floor(-math.log2(gamma - 1.0)) + 1
    lo = (np.arange(1 << k, 255 << k, dtype=np.uint32) << np.uint32(23 - k)).view(np.float32)
    cells = np.zeros(255 << k, dtype=np.int32)
    cells[1 << k:] = np.searchsorted(bounds, lo.astype(np.float64), side="left")
    cells.setflags(write=False)
    return _Table(alpha, gamma, first, bounds, cells, k)


@functools.lru_cache(maxsize=16)
def _device_bounds(alpha: float, device: str) -> torch.Tensor:
    """The buckets' bounds, each rounded down to float32, on `device`: for a float32 x,
    b < x exactly when round_down(b) < x (x is a float32 and round_down(b) the largest one
    not above b), so a float32 search finds the float64 bounds' buckets without a float64
    copy of the values (8 bytes an element on a GPU)."""
    b = _table(alpha).bounds
    with np.errstate(over="ignore"):  # the last bound is past float32's range: inf, then down
        b32 = b.astype(np.float32)
    b32 = np.where(b32.astype(np.float64) > b, np.nextafter(b32, np.float32(-np.inf)), b32)
    return torch.from_numpy(np.ascontiguousarray(b32, dtype=np.float32)).to(device)


def _f32_down(v: float) -> float:
    """The largest float32 value not above v."""
    f = np.float32(v)
    if float(f) > v:
        f = np.nextafter(f, np.float32(-np.inf))
    return float(f)


def _flat_f32(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(-1).to(torch.float32).contiguous()


def _native_hist(x: torch.Tensor, tab: _Table, part: Partition | None = None) -> np.ndarray:
    """The `bucket_keys` counts of x, by the native kernel."""
    counts, zero, bad = loghist(x, tab.bounds, tab.inv_log2_gamma, tab.first, tab.cells,
                                tab.cell_bits, part)
    return np.concatenate([np.asarray(counts, dtype=np.int64), [zero, bad]])


#: Elements per chunk of the torch sketch: its float32 and int32 temporaries (~13 bytes an
#: element) stay ~100 MiB whatever the tensor's size (issue 27: device memory).
_HIST_CHUNK = 1 << 23


def bucket_keys(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """The int32 histogram key of each element of flat float32 `x` (any device): its positive bucket
    j in [0, nb), nb + j for a negative one, 2 nb for a zero, 2 nb + 1 for NaN / +-Inf; nb is
    `bucket_count(alpha)`.  The torch sketch and the batched quantizer
    (`mvc.quant.batched`) count these, so both bin every value as the native kernel does."""
    tab = _table(alpha)
    nb = len(tab.bounds)
    ax = x.abs()
    # int32 keys, float32 bounds (`_device_bounds`): a chunk's temporaries are 4 bytes an
    # element each, not 8 (issue 27: the sketch passes held a commit's peak GPU memory)
    key = torch.searchsorted(_device_bounds(tab.alpha, str(x.device)), ax, out_int32=True)
    key.add_(x < 0, alpha=nb)
    key.masked_fill_(ax == 0, 2 * nb)
    key.masked_fill_(~torch.isfinite(x), 2 * nb + 1)  # NaN / +-Inf: counted, never binned
    return key


def bucket_count(alpha: float) -> int:
    """Buckets per sign of a sketch with relative error `alpha` (`bucket_keys`)."""
    return len(_table(check_alpha(alpha)).bounds)


def _torch_hist(x: torch.Tensor, tab: _Table) -> np.ndarray:
    """The `bucket_keys` counts of x, by torch on x's device."""
    nb = len(tab.bounds)
    # Counts accumulate on the device and cross to the host once, with the non-finite count:
    # one synchronisation per tensor, not one per chunk.
    counts = torch.zeros(2 * nb + 2, dtype=torch.int64, device=x.device)
    for s in range(0, x.numel(), _HIST_CHUNK):
        count_into(counts, bucket_keys(x[s:s + _HIST_CHUNK], tab.alpha))
    return counts.cpu().numpy().astype(np.int64)


def _trim(counts: np.ndarray, lo: int) -> tuple[np.ndarray, int]:
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    return counts[nz[0]:nz[-1] + 1].copy(), lo + int(nz[0])


def _add(a: np.ndarray, alo: int, b: np.ndarray, blo: int, sign: int = 1) -> tuple[np.ndarray, int]:
    if b.size == 0:
        return a.copy(), alo
    if a.size == 0:
        return _trim(sign * b, blo)
    lo = min(alo, blo)
    hi = max(alo + a.size, blo + b.size)
    out = np.zeros(hi - lo, dtype=np.int64)
    out[alo - lo:alo - lo + a.size] += a
    out[blo - lo:blo - lo + b.size] += sign * b
    return _trim(out, lo)


class LogSketch:
    """Log-bucket histogram with alpha-relative quantiles; merging adds bucket counts.

    Store arrays are trimmed int64 numpy arrays: `pos[j]` counts positive values in
    bucket `pos_lo + j` (likewise `neg`), `zero` counts exact zeros.
    """

    __slots__ = ("alpha", "gamma", "pos", "pos_lo", "neg", "neg_lo", "zero")

    def __init__(self, alpha: float = 0.01, *, pos: np.ndarray | None = None, pos_lo: int = 0,
                 neg: np.ndarray | None = None, neg_lo: int = 0, zero: int = 0) -> None:
        self.alpha = check_alpha(alpha)
        self.gamma = _table(self.alpha).gamma
        empty = np.zeros(0, dtype=np.int64)
        pos = np.asarray(pos if pos is not None else empty, np.int64)
        neg = np.asarray(neg if neg is not None else empty, np.int64)
        self.pos, self.pos_lo = _trim(pos, pos_lo)
        self.neg, self.neg_lo = _trim(neg, neg_lo)
        self.zero = int(zero)
        if self.zero < 0 or (self.pos < 0).any() or (self.neg < 0).any():
            raise QuantConfigError("sketch counts must be non-negative")

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_tensor(cls, x: torch.Tensor, alpha: float = 0.01, *, name: str | None = None,
                    backend: str = "auto", part: Partition | None = None) -> LogSketch:
        """Sketch every element of `x` (any float dtype/device, taken as float32).

        `backend` is "auto" (native kernel on CPU, torch elsewhere), "native" or "torch";
        all give identical counts.  `part` (native only) restricts the sketch to the
        elements the partition keeps.  Raises `NonFiniteTensorError` naming `name` when
        `x` holds NaN or +-Inf.
        """
        a = check_alpha(alpha)
        tab = _table(a)
        flat = _flat_f32(x)
        if backend not in ("auto", "native", "torch"):
            raise QuantConfigError(f"unknown sketch backend {backend!r}")
        use_native = backend == "native" or (backend == "auto" and on_host_kernels(flat))
        if use_native and flat.device.type != "cpu":
            raise QuantConfigError("the native sketch backend needs a CPU tensor")
        if part is not None and not use_native:
            raise QuantConfigError("a partition can only be applied by the native backend")
        counts = _native_hist(flat, tab, part) if use_native else _torch_hist(flat, tab)
        return cls.from_key_counts(counts, a, name=name)

    @classmethod
    def from_key_counts(cls, counts: np.ndarray, alpha: float, *,
                        name: str | None = None) -> LogSketch:
        """The sketch whose values have these `bucket_keys` counts (length 2 nb + 2); raises
        `NonFiniteTensorError` naming `name` when some value was NaN or +-Inf."""
        a = check_alpha(alpha)
        tab = _table(a)
        nb = len(tab.bounds)
        c = np.asarray(counts, dtype=np.int64).reshape(-1)
        if c.size != 2 * nb + 2:
            raise QuantConfigError(f"{c.size} key counts for a sketch of {2 * nb + 2} keys")
        if c[2 * nb + 1]:
            raise NonFiniteTensorError(name, int(c[2 * nb + 1]))
        return cls(a, pos=c[:nb], pos_lo=tab.first, neg=c[nb:2 * nb], neg_lo=tab.first,
                   zero=int(c[2 * nb]))

    # -- algebra ------------------------------------------------------------------
    def _check_compatible(self, other: LogSketch) -> None:
        if not isinstance(other, LogSketch):
            raise QuantConfigError(f"cannot merge a LogSketch with {type(other).__name__}")
        if other.alpha != self.alpha:
            raise QuantConfigError(f"cannot merge sketches of alpha {self.alpha} and {other.alpha}")

    def merge(self, *others: LogSketch) -> LogSketch:
        """Return the sketch of the union: bucket counts added store by store."""
        pos, plo, neg, nlo, zero = self.pos, self.pos_lo, self.neg, self.neg_lo, self.zero
        for o in others:
            self._check_compatible(o)
            pos, plo = _add(pos, plo, o.pos, o.pos_lo)
            neg, nlo = _add(neg, nlo, o.neg, o.neg_lo)
            zero += o.zero
        return LogSketch(self.alpha, pos=pos, pos_lo=plo, neg=neg, neg_lo=nlo, zero=zero)

    def subtract(self, other: LogSketch) -> LogSketch:
        """Return the sketch of this multiset minus `other` (which must be contained in it)."""
        self._check_compatible(other)
        pos, plo = _add(self.pos, self.pos_lo, other.pos, other.pos_lo, -1)
        neg, nlo = _add(self.neg, self.neg_lo, other.neg, other.neg_lo, -1)
        return LogSketch(self.alpha, pos=pos, pos_lo=plo, neg=neg, neg_lo=nlo,
                         zero=self.zero - other.zero)

    def abs(self) -> LogSketch:
        """The sketch of |x|: the negative store folded into the positive one."""
        pos, plo = _add(self.pos, self.pos_lo, self.neg, self.neg_lo)
        return LogSketch(self.alpha, pos=pos, pos_lo=plo, zero=self.zero)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LogSketch):
            return NotImplemented
        return (self.alpha == other.alpha and self.zero == other.zero
                and self.pos_lo == other.pos_lo and np.array_equal(self.pos, other.pos)
                and self.neg_lo == other.neg_lo and np.array_equal(self.neg, other.neg))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"LogSketch(alpha={self.alpha}, count={self.count}, "
                f"buckets={self.pos.size}+{self.neg.size}, zero={self.zero})")

    # -- queries ------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Number of values sketched."""
        return int(self.pos.sum() + self.neg.sum()) + self.zero

    def _values(self, lo: int, size: int) -> np.ndarray:
        tab = _table(self.alpha)
        b = tab.bounds[lo - tab.first:lo - tab.first + size]
        return b * (2.0 / (tab.gamma + 1.0))

    def buckets(self) -> tuple[np.ndarray, np.ndarray]:
        """Non-empty buckets as (representative values ascending, counts), zero bucket included."""
        nv = self._values(self.neg_lo, self.neg.size)[::-1] * -1.0
        nc = self.neg[::-1]
        pv = self._values(self.pos_lo, self.pos.size)
        vals = np.concatenate([nv, np.zeros(1), pv])
        cnts = np.concatenate([nc, np.array([self.zero], np.int64), self.pos])
        keep = cnts > 0
        return vals[keep], cnts[keep]

    def _rank_bucket(self, q: float) -> tuple[int, int]:
        """(sign, bucket index) holding the value of rank floor(q (n - 1)); sign 0 = zero."""
        if not (0.0 <= float(q) <= 1.0):
            raise QuantConfigError(f"quantile must be in [0, 1], got {q!r}")
        n = self.count
        if n == 0:
            raise QuantConfigError("quantile of an empty sketch")
        rank = math.floor(float(q) * (n - 1))
        nneg = int(self.neg.sum())
        if rank < nneg:  # negative store, most negative (highest index) first
            cum = np.cumsum(self.neg[::-1])
            j = int(np.searchsorted(cum, rank, side="right"))
            return -1, self.neg_lo + self.neg.size - 1 - j
        rank -= nneg
        if rank < self.zero:
            return 0, 0
        rank -= self.zero
        j = int(np.searchsorted(np.cumsum(self.pos), rank, side="right"))
        return 1, self.pos_lo + j

    def bucket_bound(self, q: float) -> float:
        """Upper edge of the bucket holding the q-quantile of a non-negative sketch.

        Returned as the largest float32 not above gamma^i, so that for any float32 v,
        `v <= bucket_bound(q)` holds exactly for the values in that bucket and below
        (0.0 when the quantile is a zero).  Thresholds built on it split the data along
        bucket edges, so the sketch of the values kept is a slice of this sketch.
        """
        if self.neg.size:
            raise QuantConfigError("bucket_bound() needs a non-negative sketch (use abs())")
        sign, idx = self._rank_bucket(q)
        if sign == 0:
            return 0.0
        return _f32_down(float(_table(self.alpha).bounds[idx - _table(self.alpha).first]))

    def restrict_magnitude(self, above: float | None, at_most: float | None) -> LogSketch:
        """Sketch of the values with above < |x| <= at_most (None: no bound), exact when the
        bounds come from `bucket_bound` (or are 0, +-inf)."""
        tab = _table(self.alpha)

        def first_bucket_over(t: float) -> int:  # smallest bucket whose values all exceed t
            return int(np.searchsorted(tab.bounds, t, side="left")) + tab.first + 1

        lo = -(1 << 62) if above is None or above < 0 else first_bucket_over(above)
        hi = (1 << 62) if at_most is None else (
            -(1 << 62) if at_most < 0 else first_bucket_over(at_most) - 1)
        zero_kept = (above is None or above < 0) and (at_most is None or at_most >= 0)

        def cut(arr: np.ndarray, start: int) -> tuple[np.ndarray, int]:
            a, b = max(lo, start), min(hi, start + arr.size - 1)
            if a > b:
                return np.zeros(0, np.int64), 0
            return arr[a - start:b - start + 1], a

        pos, plo = cut(self.pos, self.pos_lo)
        neg, nlo = cut(self.neg, self.neg_lo)
        return LogSketch(self.alpha, pos=pos, pos_lo=plo, neg=neg, neg_lo=nlo,
                         zero=self.zero if zero_kept else 0)

    def quantile(self, q: float) -> float:
        """Estimate the q-quantile (the value of rank floor(q (n - 1)) in sorted order).

        The estimate is within relative error alpha of that value.  Raises
        `QuantConfigError` for q outside [0, 1] or an empty sketch.
        """
        sign, idx = self._rank_bucket(q)
        if sign == 0:
            return 0.0
        return sign * float(self._values(idx, 1)[0])
