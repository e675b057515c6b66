"""Optimizer moments compressed in batched passes on their device (issue 27): what
`mvc.quant.optimizer.quantize_optimizer_state` and the guard rails run for moments on the torch
path (CUDA) instead of a loop with several host synchronisations a moment.

Per domain (first moments "linear", second moments "log"), for all moments at once:

1. `scan_many`: each moment's non-finite and negative entry counts (one transfer);
2. the sketch of each moment's kept entries (nonzero, weight not pruned; v > 0, as log v),
   one count over (moment, bucket) keys and one transfer per batch of moments
   (`mvc.quant.batched_sketch.count_sketches`);
3. thresholds and k-means on the host, as `quantize` takes them;
4. `mvc.quant.batched.quantize_group`: levels, counts, protected values and the guard rail's
   error sums in the quantity Adam uses (`moment_error_sums`), in one pass.

`ratio_bounds` takes each first moment's largest |m| / sqrt(v) (the restore's clamp) in one
pass over all pairs. Every result is the per-moment path's (tests/quant/test_quant_batched_moments.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from mvc.native.parallel import pmap
from mvc.quant.batched import GroupData, GroupJob, GroupResult, batchable, quantize_group
from mvc.quant.batched_sketch import count_sketches, finite
from mvc.quant.device_chunks import Chunk, chunks, default_step, flat_values, piece_reduce
from mvc.quant.moment_bound import float64_sqrt, moment_ratio_bound
from mvc.quant.partition import thresholds
from mvc.quant.sketch import LogSketch

#: Moments per sketch count table (32 x 2 x 48k int64s at the log domain's alpha: 24 MiB: the
#: table was the largest buffer of a commit's GPU peak at 64).
_BATCH = 32


def scan_many(tensors: Sequence[torch.Tensor], chunk: int | None = None) -> list[tuple[int, int]]:
    """(non-finite, < 0) entry counts of each tensor (float32 / bfloat16 / float16, on one
    device), as `mvc.quant.optimizer`'s scan: -inf is both, NaN only the first."""
    if not tensors:
        return []
    device = tensors[0].device
    chunk = _moment_step(device, chunk)
    flats = [t.detach().reshape(-1) for t in tensors]
    acc = torch.zeros(len(flats), 2, dtype=torch.float64, device=device)
    for c in chunks([f.numel() for f in flats], device, chunk):
        xs = flat_values(flats, c)
        # counts below 2^24 add exactly in float32: half the bytes of float64 0/1 arrays,
        # which were a commit's largest device buffers at the moments' scan
        dt = torch.float32 if c.size <= 1 << 24 else torch.float64
        bad = (~torch.isfinite(xs)).to(dt)
        neg = (xs < 0).to(dt)
        del xs
        sums = torch.stack([piece_reduce(c, bad), piece_reduce(c, neg)], dim=1)
        del bad, neg
        acc.index_add_(0, c.jobs, sums.to(torch.float64))  # one piece per tensor per chunk
    return [(int(a), int(b)) for a, b in acc.cpu().tolist()]


def kept_sketches(jobs: list[GroupJob], alpha: float, domain: str,
                  chunk: int | None = None) -> list[LogSketch]:
    """Each moment's sketch of its kept entries' quantized values (`GroupData.values`, zeros
    set aside): what `quantize` sketches of the compacted moment."""
    out: list[LogSketch] = []
    for s in range(0, len(jobs), _BATCH):
        data = GroupData(jobs[s:s + _BATCH], jobs[0].tensor.device, domain, drop_zeros=True)

        def values(c: Chunk, data: GroupData = data) -> tuple[torch.Tensor, torch.Tensor | None]:
            _, xs, drop = data.values(c)
            return xs, drop

        out += finite(count_sketches(data.sizes, data.device, alpha, values, chunk))
    return out


def quantize_moments(jobs: list[GroupJob], bins: int, *, domain: str, prune: float,
                     protect: float, seed: int, alpha: float, sigma: float,
                     chunk: int | None = None, to_host: bool = False) -> list[GroupResult | None]:
    """Each moment compressed as `mvc.quant.optimizer` does one (`quantize` of its kept entries,
    in `domain`, spread back with the rest at the pruned level), with the sums of
    `moment_error_sums` as the result's first two. None where the moment is left to that path:
    no kept entry, or no more distinct buckets than bins. The jobs' `sketch` and `thr` are
    ignored: they are taken here. `to_host`: as `quantize_group`'s."""
    if jobs:
        chunk = _moment_step(jobs[0].tensor.device, chunk)
    sketches = kept_sketches(jobs, alpha, domain, chunk)
    ready: list[GroupJob] = []
    where: list[int] = []
    for i, (job, sk) in enumerate(zip(jobs, sketches, strict=True)):
        if sk.count == 0:
            continue
        thr = thresholds(sk.abs(), None, prune=prune, prune_metric="magnitude", protect=protect)
        ready.append(replace(job, sketch=sk, thr=thr))
        where.append(i)
    out: list[GroupResult | None] = [None] * len(jobs)
    # With `to_host`, a pass's levels cross when it is done: in passes of at most
    # `_PASS_ELEMENTS` values the device holds a slice of a domain's levels, not all of them
    # (they were the largest buffer at a commit's peak: 124 MB of a 124M state's 350 MB).
    # Levels and counts do not depend on the split; the sums' float64 order may.
    for part in (_by_size(ready) if to_host else [list(range(len(ready)))]):
        got = quantize_group([ready[k] for k in part], bins, seed=seed, sigma=sigma,
                             chunk=chunk, domain=domain, drop_zeros=True, to_host=to_host)
        for k, r in zip(part, got, strict=True):
            out[where[k]] = r
    return out


#: Most values per chunk of a moments' pass (the scan, the sketches, the quantization, and the
#: bounds' pass after them): half a GPU's usual chunk. They run while the weights' levels are
#: still on the device (joint pruning reads them; the commit encodes them after), and a chunk's
#: float64 temporaries (three arrays, 8 B a value; the sketch's `log32`, one) came on top of
#: them: the commit hook's estimated device peak, 0.177x of a 124M state, was reached there.
_MOMENT_CHUNK = 1 << 21


def _moment_step(device: torch.device, chunk: int | None) -> int:
    """A moments' pass's chunk: `chunk` if given, else the device's, at most `_MOMENT_CHUNK`."""
    return chunk if chunk is not None else min(default_step(device), _MOMENT_CHUNK)

#: Values per moments' pass when its levels go to the host (`quantize_moments`): 32 MiB of
#: uint8 levels on the device.
_PASS_ELEMENTS = 1 << 25


def _by_size(jobs: list[GroupJob]) -> list[list[int]]:
    """The jobs' indices cut into consecutive runs of at most `_PASS_ELEMENTS` values (a
    larger tensor alone)."""
    runs: list[list[int]] = []
    size = 0
    for k, job in enumerate(jobs):
        n = job.tensor.numel()
        if runs and size + n <= _PASS_ELEMENTS:
            runs[-1].append(k)
            size += n
        else:
            runs.append([k])
            size = n
    return runs


def ratio_bounds(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 chunk: int | None = None) -> list[float]:
    """The largest |m| / sqrt(v) over each pair's entries with v > 0 (0.0 if none), float32
    arithmetic with the correctly rounded sqrt, the bits of `mvc.quant.optimizer.
    moment_ratio_bound`'s native pass; m and v of one shape, every pair on one device."""
    if not pairs:
        return []
    device = pairs[0][0].device
    chunk = _moment_step(device, chunk)
    ms = [m.detach().reshape(-1) for m, _ in pairs]
    vs = [v.detach().reshape(-1) for _, v in pairs]
    acc = torch.zeros(len(pairs), dtype=torch.float32, device=device)
    for c in chunks([m.numel() for m in ms], device, chunk):
        mf, vf = flat_values(ms, c), flat_values(vs, c)
        # the correctly rounded sqrt, as the native pass takes it (torch's host float32 sqrt is
        # not: under `device_path()` the bound came out an ulp off the native one)
        r = torch.where(vf > 0, mf.abs_() / float64_sqrt(vf), torch.zeros((), device=device))
        top = piece_reduce(c, r, "max")
        acc[c.jobs] = torch.maximum(acc[c.jobs], top)  # one piece per pair per chunk
    return [float(b) for b in acc.cpu().tolist()]


def moment_ratio_bounds(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """`moment_ratio_bound` of each (m, v) pair: pairs on the torch path in one batched pass
    per device (`mvc.quant.batched_moments.ratio_bounds`), host pairs one per pool thread."""
    out: list[float | None] = [None] * len(pairs)
    by_device: dict[torch.device, list[int]] = {}
    for i, (m, v) in enumerate(pairs):
        if batchable(m) and batchable(v) and m.device == v.device:
            by_device.setdefault(m.device, []).append(i)
    for idx in by_device.values():
        for i, b in zip(idx, ratio_bounds([pairs[i] for i in idx]), strict=True):
            out[i] = b
    left = [i for i, b in enumerate(out) if b is None]
    for i, b in zip(left, pmap(lambda i: moment_ratio_bound(*pairs[i]), left), strict=True):
        out[i] = b
    return [float(b) for b in out if b is not None]
