"""A layer type's tensors quantized by one config in one batched pass on their device (issue 27):
what the torch path runs in place of a loop over tensors when they live on an accelerator.

A search trial quantizes every tensor of a layer type with one bins count and one set of
thresholds. Tensor by tensor, that was a dozen kernel launches and several host
synchronisations each (`.item()`, boolean indexing, the error sums' `.tolist()`). Here the
group's tensors are laid end to end and walked in chunks of a fixed number of elements; a
chunk holds pieces of many tensors and is one set of element-wise kernels, with each element's
tensor index selecting its thresholds, midpoints and level values from small tables:

* masks: each tensor's prune / protect thresholds (a rule that is off is +-inf: it never fires);
* levels: one `searchsorted` over every tensor's midpoints at once. A value's key is (tensor
  index, its float32 bits in an order-preserving integer form), so it meets only its own
  tensor's midpoints, and a value on a midpoint goes to the lower centroid (`mvc.quant.assign`);
* error sums (`mvc.quant.error`'s six, in float64) by `torch.segment_reduce` over each piece
  (`device_chunks.piece_reduce`: short runs first, then each piece's runs), which CUDA runs as
  CUB's segmented reduction (no atomics: the same sums every run), and the level counts by one
  histogram of the chunk's (tensor, level) keys (`count_into`; `bincount` would read its
  input's range back);
* protected values, once the counts are on the host, by position: a tensor's levels equal to
  its k + 1, gathered with the count known (`device_chunks.select_where`), so no chunk waits.

What crosses to the host: the counts and sums once per group (the search's bits, proxy and
guard rail read them), read back when the caller asks for them: `start_group` enqueues a
group's pass and returns, so a search trial starts every layer type's pass (the host's k-means
of one running while the device assigns another) and then waits for the device once; and,
where a threshold uses sensitivity, the dropped values' histograms once per group (the kept
values' sketch feeds the k-means). The k-means itself runs in the native code on the host, as
on every path, so every device chooses the same centroids. The levels stay on the device.

Levels, centroids and protected values are those of `quantize_prepared` on either path, the
counts equal and the sums agree to float64 summation order (tests/quant/test_quant_batched.py).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from mvc.native.parallel import pmap
from mvc.quant import triton_assign
from mvc.quant.assign import level_dtype, midpoints
from mvc.quant.backend import on_host_kernels
from mvc.quant.config import check_bins
from mvc.quant.batched_sketch import count_sketches, finite
from mvc.quant.device_chunks import (Chunk, chunks, count_into, flat_values, float_keys,
                                     piece_reduce, select_where, upload)
from mvc.quant.error import ErrorSums
from mvc.quant.errors import QuantConfigError
from mvc.quant.importance import sensitivity_values
from mvc.quant.kmeans import approx_kmeans
from mvc.quant.logdomain import exp_levels, log32
from mvc.quant.moment_bound import float64_sqrt
from mvc.quant.partition import Thresholds
from mvc.quant.sketch import LogSketch
from mvc.quant.tensor import (QuantizedTensor, host_plan, level_values, magnitude_keep,
                               seeded_generator)
from mvc.quant.uniform import DEFAULT_FAMILY, check_family

#: Dtypes whose values float32 holds exactly, so a protected value can be taken from the
#: float32 chunk (a float64 tensor's cannot: it takes the per-tensor path).
BATCH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GroupJob:
    """One tensor of a group: its values, sketch and thresholds, what its sensitivity rules read
    (`grad`), the weights of its error sums (`weight`: a gradient of its shape, or None) and
    its warm-start centroids (`init`)."""

    tensor: torch.Tensor
    sketch: LogSketch
    thr: Thresholds
    grad: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    init: torch.Tensor | None = None
    # Optimizer moments (`mvc.quant.batched_moments`): entries where `pruned_by` (the levels
    # of the moment's weight) is `pruned_level` are set aside at the pruned level, outside the
    # quantization (its sketch, k-means and thresholds see the rest only), as are exact zeros
    # with `quantize_group(drop_zeros=True)`.
    pruned_by: torch.Tensor | None = None
    pruned_level: int = -1


@dataclass(frozen=True)
class GroupResult:
    """A tensor's quantization with what its assignment measured: the six error sums
    against the tensor (weighted by the job's `weight`) and the count of each level."""

    q: QuantizedTensor
    sums: ErrorSums
    counts: np.ndarray


def batchable(t: torch.Tensor) -> bool:
    """Whether `quantize_group` serves `t`: a non-empty float32 / bfloat16 / float16 tensor
    whose quantizer work takes the torch path (`mvc.quant.backend`)."""
    return t.dtype in BATCH_DTYPES and t.numel() > 0 and not on_host_kernels(t)


@dataclass
class _Plan:
    thr: Thresholds
    k: int
    init: np.ndarray | None
    keep: LogSketch | None = None        # the kept values' sketch (k-means family)
    centres: np.ndarray | None = None


def quantize_group(jobs: list[GroupJob], bins: int, *, seed: int = 0, sigma: float = 0.2,
                   family: str = DEFAULT_FAMILY, chunk: int | None = None,
                   domain: str = "linear", drop_zeros: bool = False, to_host: bool = False
                   ) -> list[GroupResult | None]:
    """`start_group(...).results()`: the group's pass, waited for."""
    return start_group(jobs, bins, seed=seed, sigma=sigma, family=family, chunk=chunk,
                       domain=domain, drop_zeros=drop_zeros, to_host=to_host).results()


class PendingGroup:
    """A group's pass enqueued on its device (`start_group`). `wait()` reads its counts and sums
    back, the pass's one wait for the device; `results()` waits if that is not done and builds
    the results (the first call; later ones return the same list). A caller with several
    groups (a search trial's layer types) starts them all, waits for each, then takes their
    results: one wait in all, and the device runs one group's pass while the host runs the
    next one's k-means and launches."""

    def __init__(self, n_jobs: int, live: list[int], launched: _Launched | None) -> None:
        self._n, self._live, self._launched = n_jobs, live, launched
        self._host: tuple[np.ndarray, np.ndarray] | None = None
        self._out: list[GroupResult | None] | None = None

    def wait(self) -> None:
        """Read the pass's counts and sums back, once (nothing to do for a pass done)."""
        if self._launched is not None and self._host is None:
            self._host = _read_back(self._launched)

    def results(self) -> list[GroupResult | None]:
        """Each job's result (None where `quantize_group` leaves it), in the jobs' order."""
        if self._out is None:
            self.wait()
            out: list[GroupResult | None] = [None] * self._n
            if self._launched is not None and self._host is not None:
                for i, r in zip(self._live, _collect(self._launched, *self._host), strict=True):
                    out[i] = r
            # the device buffers go with the launch
            self._out, self._launched, self._host = out, None, None
        return self._out


def start_group(jobs: list[GroupJob], bins: int, *, seed: int = 0, sigma: float = 0.2,
                family: str = DEFAULT_FAMILY, chunk: int | None = None,
                domain: str = "linear", drop_zeros: bool = False, to_host: bool = False
                ) -> PendingGroup:
    """The batched pass over the group enqueued (module docstring): its `results()` are each
    job's tensor quantized as `quantize_prepared(tensor, x, sketch, sens, thr, bins,
    seed=seed, sigma=sigma, init=init, family=family)` would. The host's part (the k-means;
    with sensitivity rules, the dropped values' histograms, which it waits for) is done
    here. None for a job whose values have no more distinct buckets than
    centroids: `quantize_prepared` replaces its centroids by exact means, a second pass that
    is left to it. `chunk`: elements per chunk (default: by device).

    `domain` "log" (second moments, `mvc.quant.optimizer`): the values quantized are
    float32(log(v)) of the kept entries, protected entries keep v, and the sums measure
    sqrt(v') against sqrt(v) (`moment_error_sums`). `drop_zeros`: exact zeros (in the log
    domain every v <= 0) are set aside at the pruned level (a moment's). The jobs' sketches are
    then of the kept entries' (transformed) values.

    `to_host`: the results' quantizations in host memory, the group's levels crossing in one
    copy when the pass is done, so the device holds none of them after (the commit encodes
    on the host: a final quantization, such as a moment's, need not wait there)."""
    k0 = check_bins(bins)
    check_family(family)
    if domain not in DOMAINS:
        raise QuantConfigError(f"unknown domain {domain!r}")
    if not jobs:
        return PendingGroup(0, [], None)
    device = jobs[0].tensor.device
    for job in jobs:
        if job.tensor.device != device or not batchable(job.tensor):
            raise QuantConfigError("quantize_group() takes non-empty float32/bfloat16/float16 "
                                   "tensors on one device that takes the torch path")
    # warm starts are the parent's centroids, read into host memory (`parent_centroids`)
    plans = [_plan(job, k0, family, None if job.init is None else
                   job.init.detach().reshape(-1).to("cpu", torch.float64).numpy())
             for job in jobs]
    need = [i for i, p in enumerate(plans) if p.centres is None and p.keep is None]
    if need:
        sub = [jobs[i] for i in need]
        if domain != "linear" or drop_zeros or any(j.pruned_by is not None for j in sub):
            raise QuantConfigError("sensitivity rules apply to weights only")
        dropped = _dropped_sketches(GroupData(sub, device, domain, drop_zeros),
                                    _rules([plans[i].thr for i in need], device), chunk)
        for i, sk in zip(need, dropped, strict=True):
            plans[i].keep = jobs[i].sketch.subtract(sk)
    # no more distinct buckets than bins: `quantize_prepared` takes exact means (module doc)
    live = [i for i, p in enumerate(plans)
            if p.keep is None or not 0 < p.keep.buckets()[0].size <= p.k]
    todo = [plans[i] for i in live if plans[i].centres is None]

    def kmeans(p: _Plan) -> None:
        # each from its own seeded generator: the same centres in any order, on any thread
        p.centres = approx_kmeans(p.keep, p.k, sigma=sigma,  # type: ignore[arg-type]
                                  generator=seeded_generator(seed), init=p.init)

    pmap(kmeans, todo)  # the native k-means, one tensor per pool thread
    launched = _launch(GroupData([jobs[i] for i in live], device, domain, drop_zeros),
                       [plans[i] for i in live], chunk, to_host) if live else None
    return PendingGroup(len(jobs), live, launched)


def _plan(job: GroupJob, k: int, family: str, init: np.ndarray | None) -> _Plan:
    """The host's part before the device's, as `quantize_prepared` takes it (`host_plan`), and
    the kept values' sketch where magnitude alone decides what is kept."""
    if job.thr.needs_sensitivity and job.grad is None:
        raise QuantConfigError("these thresholds need sensitivity scores (a gradient)")
    thr, k, grid, init = host_plan(job.sketch, job.thr, k, family, init)
    if grid is not None:
        return _Plan(thr, k, init, centres=grid)
    return _Plan(thr, k, init, keep=magnitude_keep(job.sketch, thr))


DOMAINS = ("linear", "log")


class GroupData:
    """A group's tensors as its chunks read them: values, gradients, error-sum weights and the
    joint-pruning levels, flattened (and the pruned levels' table sent to the device) once per
    group, not per chunk."""

    def __init__(self, jobs: list[GroupJob], device: torch.device, domain: str,
                 drop_zeros: bool) -> None:
        self.jobs = jobs
        self.device = device
        self.domain = domain
        self.drop_zeros = drop_zeros
        self.flats = [j.tensor.detach().reshape(-1) for j in jobs]
        self.sizes = [f.numel() for f in self.flats]
        self.grads = [_flat(j.grad) for j in jobs]
        self.weights = [_flat(j.weight) for j in jobs]
        self.weighted = any(w is not None for w in self.weights)
        # A proxy search's error-sum weights are the gradients the rules read: where every job's
        # are the same tensor, a chunk reads them once (from the host, for a GPU run's).
        self.weights_are_grads = all(j.weight is j.grad for j in jobs)
        self.pruned = [_flat(j.pruned_by) for j in jobs]
        self.pruned_levels = None if all(p is None for p in self.pruned) else upload(
            torch.tensor([j.pruned_level if j.pruned_by is not None else -1 for j in jobs],
                         dtype=torch.int32), device)

    def values(self, c: Chunk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(raw float32 values, the values quantized, the entries set aside or None) of chunk
        `c`: in the log domain the values quantized are `log32` of the kept entries (0 where
        set aside)."""
        raw = flat_values(self.flats, c)
        drop = None
        if self.drop_zeros:
            drop = raw <= 0 if self.domain == "log" else raw == 0
        if self.pruned_levels is not None:
            joint = flat_values(self.pruned, c, torch.int32, fill=-2) == \
                self.pruned_levels.index_select(0, c.seg)
            drop = joint if drop is None else drop.logical_or_(joint)
        if self.domain == "linear":
            return raw, raw, drop
        tiny = torch.finfo(torch.float32).tiny
        return raw, log32(raw, floor=tiny if drop is not None else None), drop

    def sensitivity(self, c: Chunk, xs: torch.Tensor, g: torch.Tensor | None = None
                    ) -> torch.Tensor:
        """|g w| of the chunk's elements (0 where a job has no gradient: none of its rules
        read it); `g`: the chunk's gradients, where the caller read them already."""
        return sensitivity_values(xs, flat_values(self.grads, c) if g is None else g)

    def weight_values(self, c: Chunk, g: torch.Tensor | None = None) -> torch.Tensor:
        """The error-sum weights of the chunk's elements (0 where a job has none): `g`, the
        chunk's gradients the caller read, where they are the same."""
        return g if g is not None and self.weights_are_grads else flat_values(self.weights, c)

    def abs_weights(self, c: Chunk, g: torch.Tensor | None = None) -> torch.Tensor:
        """|w| of the chunk's elements in float64 (0 where a job has no weights)."""
        return self.weight_values(c, g).to(torch.float64).abs_()

    def shared_grads(self, c: Chunk, needs_sens: bool) -> torch.Tensor | None:
        """The chunk's gradients read once for both the rules and the error-sum weights, where
        both read them and they are the same tensors; else None (each reads its own)."""
        if needs_sens and self.weighted and self.weights_are_grads:
            return flat_values(self.grads, c)
        return None


def _flat(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.detach().reshape(-1) if t is not None else None


# ----------------------------------------------------------------------------- masks
@dataclass(frozen=True)
class _Rules:
    """Per-job thresholds as float32 device tables (a rule that is off never fires)."""

    prune: torch.Tensor | None
    prune_on_sens: torch.Tensor | None  # bool per job, None when every job prunes alike
    sens_prunes: bool                   # every job that prunes does so by sensitivity
    protect_mag: torch.Tensor | None
    protect_sens: torch.Tensor | None

    @property
    def active(self) -> bool:
        return self.prune is not None or self.protect_mag is not None or \
            self.protect_sens is not None

    @property
    def needs_sens(self) -> bool:
        return self.protect_sens is not None or (self.prune is not None and (
            self.sens_prunes or self.prune_on_sens is not None))


def _rules(thrs: list[Thresholds], device: torch.device) -> _Rules:
    inf = float("inf")

    def table(vals: list[float | None], off: float) -> torch.Tensor | None:
        if all(v is None for v in vals):
            return None
        # float32, as `mvc.quant.partition.masks` compares (a Python float against a float32
        # tensor is rounded to float32 first)
        return upload(torch.tensor([off if v is None else v for v in vals],
                                   dtype=torch.float32), device)

    pruning = [t for t in thrs if t.prune is not None]
    by_sens = {t.prune_metric == "sensitivity" for t in pruning}
    return _Rules(
        prune=table([t.prune for t in thrs], -inf),
        prune_on_sens=(upload(torch.tensor([t.prune_metric == "sensitivity" for t in thrs]),
                              device) if len(by_sens) > 1 else None),
        sens_prunes=by_sens == {True},
        protect_mag=table([t.protect_magnitude for t in thrs], inf),
        protect_sens=table([t.protect_sensitivity for t in thrs], inf))


def _masks(rules: _Rules, xs: torch.Tensor, sens: torch.Tensor | None, seg: torch.Tensor
           ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(pruned, protected) over the chunk, as `mvc.quant.partition.masks` per job."""
    mag = xs.abs()
    protect = mag > rules.protect_mag.index_select(0, seg) if rules.protect_mag is not None else None
    if rules.protect_sens is not None:
        assert sens is not None
        ps = sens > rules.protect_sens.index_select(0, seg)
        protect = ps if protect is None else protect.logical_or_(ps)
    if rules.prune is None:
        return None, protect
    if rules.prune_on_sens is not None:
        assert sens is not None
        imp = torch.where(rules.prune_on_sens.index_select(0, seg), sens, mag)
    elif rules.sens_prunes:
        assert sens is not None
        imp = sens
    else:
        imp = mag
    prune = imp <= rules.prune.index_select(0, seg)
    if protect is not None:
        prune.logical_and_(protect.logical_not())
    return prune, protect


def _dropped_sketches(data: GroupData, rules: _Rules, step: int | None) -> list[LogSketch]:
    """Each job's sketch of the values its thresholds prune or protect."""
    def values(c: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
        xs = data.values(c)[1]
        sens = data.sensitivity(c, xs) if rules.needs_sens else None
        prune, protect = _masks(rules, xs, sens, c.seg)
        dropped = prune if protect is None else (
            protect if prune is None else prune.logical_or_(protect))
        return xs, (~dropped if dropped is not None else torch.ones_like(xs, dtype=torch.bool))

    return finite(count_sketches(data.sizes, data.device, data.jobs[0].sketch.alpha, values,
                                 step))


# ----------------------------------------------------------------------------- assignment
def _measured(cen: torch.Tensor, dtype: torch.dtype, domain: str) -> torch.Tensor:
    """float32 value of each centroid in the quantity the sums measure: as the tensor restores
    it (rounded to its dtype); in the log domain sqrt of the restored v (exp in float64, as
    `mvc.quant.optimizer.restore` takes it)."""
    if domain == "linear":
        return cen.to(dtype).to(torch.float32)
    return float64_sqrt(exp_levels(cen, dtype).to(torch.float32))


@dataclass
class _Launched:
    """A group's assignment pass as enqueued: what `_collect` reads back and cuts into results."""

    data: GroupData
    ks: list[int]
    cens: list[torch.Tensor]
    starts: np.ndarray
    arena: torch.Tensor
    acc: torch.Tensor      # (jobs, sums): 6 sums with error-sum weights, else 4
    counts: torch.Tensor   # jobs x (largest k + 2) level counts, flat
    to_host: bool


def _launch(data: GroupData, plans: list[_Plan], step: int | None,
            to_host: bool = False) -> _Launched:
    jobs, device, domain = data.jobs, data.device, data.domain
    n_jobs = len(jobs)
    ks = [p.k for p in plans]
    width = max(ks) + 2
    cens = [torch.from_numpy(np.asarray(p.centres, dtype=np.float64)).to(torch.float32)
            for p in plans]
    # host-built tables, one transfer each, none waited for
    mids = [midpoints(c) for c in cens]
    table = torch.zeros(n_jobs, width, dtype=torch.float32)
    for j, (job, cen) in enumerate(zip(jobs, cens, strict=True)):
        table[j, :cen.numel() + 2] = level_values(_measured(cen, job.tensor.dtype, domain),
                                                  torch.device("cpu"))
    table = upload(table.reshape(-1), device)
    rules = _rules([p.thr for p in plans], device)
    weighted = data.weighted
    ldt = level_dtype(max(ks))
    starts = np.cumsum([0] + data.sizes)
    arena = torch.empty(int(starts[-1]), dtype=ldt, device=device)
    n_sums = 6 if weighted else 4
    acc = torch.zeros(n_jobs, n_sums, dtype=torch.float64, device=device)
    counts = torch.zeros(n_jobs * width, dtype=torch.int64, device=device)
    tri = (triton_assign.Tables(mids, ks, rules.prune, rules.protect_mag, table, width, device,
                                protect_sens=rules.protect_sens,
                                by_sens=_by_sens([p.thr for p in plans]))
           if triton_assign.wanted(device) else None)
    keyed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    pos = 0
    for c in chunks(data.sizes, device, step):
        n = c.size
        if tri is not None:
            if _triton_chunk(tri, data, c, arena[pos:pos + n], acc, counts, rules.needs_sens):
                pos += n
                continue
            tri = None  # the kernel failed (warned): the torch path from here on
        if keyed is None:  # the torch path's tables, made only where it runs
            keyed = _key_tables(mids, ks, device)
        mid_keys, mid_off, kvec = keyed
        raw, xs, drop = data.values(c)
        g = data.shared_grads(c, rules.needs_sens)
        sens = data.sensitivity(c, xs, g) if rules.needs_sens else None
        prune, protect = _masks(rules, xs, sens, c.seg) if rules.active else (None, None)
        del sens
        if drop is not None:  # set aside: pruned, never protected
            prune = drop if prune is None else prune.logical_or_(drop)
            if protect is not None:
                protect.logical_and_(~drop)
        lv = torch.searchsorted(mid_keys, float_keys(xs, c.seg), out_int32=True)
        lv.sub_(mid_off.index_select(0, c.seg))
        del xs, drop
        if prune is not None:
            lv = torch.where(prune, kvec.index_select(0, c.seg), lv)
        if protect is not None:
            lv = torch.where(protect, kvec.index_select(0, c.seg) + 1, lv)
        del prune
        arena[pos:pos + n].copy_(lv)
        pos += n
        idx = lv.add_(c.seg, alpha=width)
        # the chunk's jobs are consecutive: its keys fall in their rows of the counts
        count_into(counts, idx, c.pieces[0][0] * width, (c.pieces[-1][0] + 1) * width)
        x64 = raw.to(torch.float64)
        del raw
        if domain != "linear":
            # sqrt(v) correctly rounded to float32 (float64's, rounded once), as the native
            # measure and a GPU's sqrtf take it: torch's host float32 sqrt is not correctly
            # rounded (an ulp off for 17% of exp(10 N(0,1)) samples here)
            x64.clamp_min_(0).sqrt_()
            x64.copy_(x64.to(torch.float32))
        d = table.index_select(0, idx).to(torch.float64).sub_(x64)
        del idx, lv
        if protect is not None:
            d.masked_fill_(protect, 0.0)  # protected values restore exactly
        del protect
        dd, xx = d.mul_(d), x64.mul_(x64)  # x64 is not needed past here: |x| = sqrt(x^2)
        del d, x64  # (the squares are them, in place: held as dd, xx until the sums are taken)

        def total(t: torch.Tensor) -> torch.Tensor:
            return piece_reduce(c, t)

        # The chunk's float64 arrays are its biggest temporaries (8 B a value each): the
        # products are taken in place once a factor's own sum is in, three arrays deep
        # (four for a weighted proxy's one product with a temporary).
        parts = [total(dd), total(xx)]
        if weighted:
            aw = data.abs_weights(c, g)
            parts += [total(aw * dd), total(aw.mul_(xx))]
            del aw
        del g
        ax = xx.sqrt()
        parts[2:2] = [total(dd.mul_(ax)), total(ax.mul_(xx))]
        del ax, dd, xx
        sums = torch.stack(parts, dim=1)
        acc.index_add_(0, c.jobs, sums)  # a job has one piece per chunk: no two adds meet
    return _Launched(data, ks, cens, starts, arena, acc, counts, to_host)


def _key_tables(mids: list[torch.Tensor], ks: list[int], device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(every job's midpoint keys, each job's offset among them, k per job) on `device`: host
    built, one transfer each, none waited for."""
    mid_keys = upload(torch.cat([float_keys(m, torch.full_like(m, j, dtype=torch.int64))
                                 for j, m in enumerate(mids)]), device)
    # int32 level arithmetic (a chunk's levels at 4 B a value, not 8): its largest value,
    # a level index of the last job, is below n_jobs * width
    mid_off = upload(torch.tensor(np.cumsum([0] + [m.numel() for m in mids[:-1]]),
                                  dtype=torch.int32), device)
    return mid_keys, mid_off, upload(torch.tensor(ks, dtype=torch.int32), device)


def _by_sens(thrs: list[Thresholds]) -> list[bool]:
    # which jobs prune by sensitivity (`_rules`: a job that does not prune is never asked)
    return [t.prune is not None and t.prune_metric == "sensitivity" for t in thrs]


def _triton_chunk(tri: triton_assign.Tables, data: GroupData, c: Chunk, out: torch.Tensor,
                  acc: torch.Tensor, counts: torch.Tensor, needs_sens: bool) -> bool:
    """Chunk `c` by the Triton kernel (`mvc.quant.triton_assign`); False, with a warning and
    nothing written, where it fails to compile or launch (the caller takes the torch path)."""
    raw, xs, drop = data.values(c)
    g = data.shared_grads(c, needs_sens)
    sens = data.sensitivity(c, xs, g) if needs_sens else None
    w = data.weight_values(c, g) if data.weighted else None
    del g
    try:
        triton_assign.assign_chunk(tri, c.pieces, c.jobs, raw, xs, drop, w,
                                   data.domain == "log", out, acc, counts, sens)
    except Exception as e:  # noqa: BLE001 - any compiler or driver error: the torch path serves
        triton_assign.mark_failed()
        warnings.warn(f"the Triton assignment kernel failed ({type(e).__name__}: {e}); "
                      "the torch path serves from here on", RuntimeWarning, stacklevel=2)
        return False
    return True


def _read_back(launched: _Launched) -> tuple[np.ndarray, np.ndarray]:
    # the group's one synchronisation (the second copy finds nothing left to wait for)
    counts_h = launched.counts.cpu().reshape(len(launched.ks), -1).numpy()
    return counts_h, launched.acc.cpu().numpy()


def _collect(launched: _Launched, counts_h: np.ndarray, sums_h: np.ndarray) -> list[GroupResult]:
    data, ks, cens, starts = launched.data, launched.ks, launched.cens, launched.starts
    jobs, device, arena, n_sums = data.jobs, data.device, launched.arena, sums_h.shape[1]
    ldt = arena.dtype
    n_prot = [int(counts_h[j, k + 1]) for j, k in enumerate(ks)]
    # A protected value's level is its tensor's k + 1: with the counts on the host, each
    # tensor's are gathered by position, no chunk waiting to learn how many it holds.
    protected = [select_where(data.flats[j], arena[int(starts[j]):int(starts[j + 1])] == k + 1,
                              n_prot[j]).to(torch.float32)
                 for j, k in enumerate(ks) if n_prot[j]]
    prot_all = (torch.cat(protected) if protected
                else torch.empty(0, dtype=torch.float32, device=device))
    del protected
    if launched.to_host:  # (`.cpu()` also on the host, where it is the tensor itself: one code path)
        arena, prot_all = arena.cpu(), prot_all.cpu()
        cens_out = tuple(cens)
    else:
        cens_out = upload(torch.cat(cens), device).split([c.numel() for c in cens])
    prot = prot_all.split(n_prot)
    del prot_all
    out = []
    for j, (job, k) in enumerate(zip(jobs, ks, strict=True)):
        levels = arena[int(starts[j]):int(starts[j + 1])]
        if level_dtype(k) != ldt:
            levels = levels.to(level_dtype(k))
        q = QuantizedTensor(levels.view(job.tensor.shape), cens_out[j],
                            prot[j].to(job.tensor.dtype), job.tensor.dtype, k)
        s = [float(v) for v in sums_h[j]] + [0.0] * (6 - n_sums)
        out.append(GroupResult(q, (s[0], s[1], s[2], s[3], s[4], s[5]),
                               counts_h[j, :k + 2].copy()))
    return out
