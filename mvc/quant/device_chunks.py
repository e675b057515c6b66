"""The chunks the batched quantizer walks (issue 27): tensors laid end to end, cut into pieces
of at most a fixed number of elements, each element tagged with its tensor's index on the
device (`mvc.quant.batched`, `mvc.quant.batched_sketch`)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

#: Elements per chunk: on an accelerator its temporaries (~50 bytes an element at their peak)
#: stay ~200 MiB whatever the model's size; on the host (tests) smaller chunks exercise the
#: pieces that straddle chunk boundaries.
_DEVICE_CHUNK = 1 << 22
_HOST_CHUNK = 1 << 20
#: Longest run that one segment of a segmented reduction covers (`piece_reduce`). CUB's
#: segmented reduction, which CUDA's `segment_reduce` is, gives each segment one thread block:
#: a chunk's few long pieces (a 768x3072 matrix is 2.4M values) kept a GPU's other blocks idle,
#: 0.6 ms a call and 43% of a 124M first commit's GPU time on an H200 (torch.profiler, issue 27).
_RUN = 1 << 14
#: Up to this many bins a histogram is taken by `torch.histc`, whose CUDA kernel gives each
#: block its own copy of the bins below 1000 (in shared memory below 100): `index_add_` of
#: ones sends every value's atomic add to the same few dozen counters of a chunk's few tensors
#: (1.3 ms a chunk on an H200, 23% of a 124M first commit's GPU time). Beyond it (the
#: sketches' bucket tables) a float32 copy of the bins would cost more than it saves.
_HISTC_BINS = 1 << 16


@dataclass(frozen=True)
class Chunk:
    pieces: list[tuple[int, int, int]]  # (job, start, stop) in the job's flat values
    jobs: torch.Tensor                  # int64 piece job indices, on the device
    runs: torch.Tensor                  # int64 lengths of the pieces cut in runs of <= _RUN
    runs_per_piece: torch.Tensor        # int64 number of those runs in each piece
    starts: torch.Tensor                # int64 offset of each piece in the chunk, on the device
    steps: torch.Tensor                 # int64 job index step at each piece's start

    @property
    def size(self) -> int:
        return sum(b - a for _, a, b in self.pieces)

    @cached_property
    def seg(self) -> torch.Tensor:
        """int64 job index of each element, on the device: made on first use (8 bytes an
        element; the Triton kernel, `mvc.quant.triton_assign`, reads its blocks' jobs instead)."""
        # the steps at the pieces' starts, summed along the chunk (`repeat_interleave` writes a
        # segment per thread: 0.55 ms a chunk of few long pieces)
        seg = torch.zeros(self.size, dtype=torch.int64, device=self.jobs.device)
        seg.index_copy_(0, self.starts, self.steps)
        return seg.cumsum_(0)


def default_step(device: torch.device) -> int:
    """Elements per chunk of a pass on `device` when its caller names none."""
    return _HOST_CHUNK if device.type == "cpu" else _DEVICE_CHUNK


def chunks(sizes: list[int], device: torch.device, step: int | None = None) -> Iterator[Chunk]:
    """Tensors of `sizes` elements, end to end, in chunks of at most `step` (default: by
    device), made one at a time as they are walked: a chunk's tensor index per element is 8
    bytes an element, so all of them at once would be a copy of the state's size."""
    step = int(step or default_step(device))
    pieces: list[tuple[int, int, int]] = []
    room = step
    for j, n in enumerate(sizes):
        a = 0
        while a < n:
            b = min(n, a + room)
            pieces.append((j, a, b))
            room -= b - a
            a = b
            if room == 0:
                yield _chunk(pieces, device)
                pieces, room = [], step
    if pieces:
        yield _chunk(pieces, device)


def _chunk(pieces: list[tuple[int, int, int]], device: torch.device) -> Chunk:
    lengths = [b - a for _, a, b in pieces]
    jobs = [j for j, _, _ in pieces]
    runs: list[int] = []
    per_piece = []
    for n in lengths:
        full, rest = divmod(n, _RUN)
        runs += [_RUN] * full + ([rest] if rest else [])
        per_piece.append(full + (1 if rest else 0))
    starts = np.cumsum([0] + lengths[:-1])
    steps = np.diff(jobs, prepend=0)   # the job index grows by this at each piece's start
    k = len(pieces)
    # one upload for the chunk's small tables (one pinned copy, not waited for)
    small = upload(torch.tensor(np.concatenate([jobs, per_piece, starts, steps, runs]),
                                dtype=torch.int64), device)
    t_jobs, t_per, t_starts, t_steps = small[:4 * k].view(4, k).unbind(0)
    return Chunk(pieces, t_jobs, small[4 * k:], t_per, t_starts, t_steps)


def piece_reduce(c: Chunk, t: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
    """`reduce` ("sum", "max") of `t` (a chunk's values, end to end) over each of the chunk's
    pieces: over runs of at most `_RUN` values first, then over each piece's runs, so a GPU
    reduces many short segments at once instead of a few long ones. Deterministic: the runs are
    fixed by the chunk's layout, and no atomics are used."""
    partial = torch.segment_reduce(t, reduce, lengths=c.runs, unsafe=True)
    return torch.segment_reduce(partial, reduce, lengths=c.runs_per_piece, unsafe=True)


def flat_values(flats: Sequence[torch.Tensor | None], c: Chunk, dtype: torch.dtype = torch.float32,
                fill: float = 0) -> torch.Tensor:
    """Chunk `c`'s pieces of `flats` (flat tensors, any device; None: `fill` for that tensor's
    elements), end to end, as `dtype` on the chunk's device."""
    device = c.jobs.device
    parts = [torch.full((b - a,), fill, dtype=dtype, device=device) if flats[j] is None
             else to_device(flats[j][a:b], device)  # type: ignore[index]
             for j, a, b in c.pieces]
    if len({p.dtype for p in parts}) == 1:
        return torch.cat(parts).to(dtype)
    return torch.cat([p.to(dtype) for p in parts])


def float_keys(x: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as (seg, x) for float32 `x` (no NaN): equal floats get equal keys
    (-0.0 is taken as +0.0) and a larger float a larger key, within each `seg`. One
    `searchsorted` of such keys finds every element's level among its own tensor's midpoints."""
    # in place where it can be: a chunk's keys are its largest temporaries (8 B a value)
    b = (x + 0.0).view(torch.int32)   # -0.0 + 0.0 is +0.0
    b.bitwise_xor_((b >> 31).bitwise_and_(0x7FFFFFFF))  # negative floats: magnitude bits reversed
    keys = b.to(torch.int64)
    del b
    return keys.add_(1 << 31).add_(seg, alpha=1 << 32)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`: itself when it is there (a gradient or a weight's levels may live
    elsewhere than the tensors they go with). A host slice goes up through `upload`: a plain
    copy from pageable memory would wait for the stream, once per chunk (a GPU run's gradients
    are kept on the host: `mvc.integrations.grad_ema`)."""
    if t.device == device:
        return t
    return upload(t, device) if t.device.type == "cpu" else t.to(device)


def count_into(counts: torch.Tensor, keys: torch.Tensor, lo: int = 0, hi: int | None = None) -> torch.Tensor:
    """`counts[k] += 1` for every k in int64 `keys` (all in range; all in [lo, hi) where
    given), in place: a histogram without `torch.bincount`, which on CUDA reads its input's min
    and max back to the host (two synchronisations a call). Up to `_HISTC_BINS` bins (and
    where torch may be nondeterministic) by `torch.histc` over float32 keys, given its range
    (so it reads none back), exact: each key sits mid-bin, and counts below 2^24 are float32
    integers. Integer counts: the same in any order."""
    hi = counts.numel() if hi is None else hi
    bins = hi - lo
    if 0 < bins < _HISTC_BINS and keys.numel() < (1 << 24) and not (
            keys.is_cuda and torch.are_deterministic_algorithms_enabled()):
        # each key at the middle of its bin: no rounding of histc's bin arithmetic moves it
        local = (keys - lo).to(torch.float32).add_(0.5)
        hist = torch.histc(local, bins=bins, min=0, max=bins)
        counts[lo:hi].add_(hist.to(counts.dtype))
        return counts
    one = torch.ones((), dtype=counts.dtype, device=counts.device)
    return counts.index_add_(0, keys, one.expand(keys.numel()))


def select_where(values: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """`values[mask]` (1-D, in order) where the host knows that `mask` holds `n` Trues: by
    `torch.nonzero_static`, which takes the output size from the caller instead of reading it
    back, so the host does not wait for the stream (`masked_select` and boolean indexing do).
    A torch build whose CUDA has no `nonzero_static` (before 2.6) takes `masked_select`."""
    try:
        where = torch.nonzero_static(mask, size=n).reshape(-1)
    except NotImplementedError:  # no kernel for this device in this build (torch's dispatcher)
        return torch.masked_select(values, mask)
    return values.index_select(0, where)


def upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor `t` (a small table, or a chunk's slice of a host tensor) on `device` without
    the host waiting: to a CUDA device from pinned memory, asynchronously. A plain copy from
    pageable memory synchronises the stream (`cudaMemcpy` and a stream sync), which once per
    table per chunk is a wait per chunk; the pinned block is not reused before the copy is done
    (torch's host allocator records the copy), and the host's copy into it is slower than the
    device's out of it, so few blocks are in flight at once."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
