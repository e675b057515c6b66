"""The chunks the batched quantizer walks (issue 27): tensors laid end to end, cut into pieces
of at most a fixed number of elements, each element tagged with its tensor's index on the
device (`mvc.quant.batched`, `mvc.quant.batched_sketch`)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

#: Elements per chunk: on an accelerator its temporaries (~50 bytes an element at their peak)
#: stay ~200 MiB whatever the model's size; on the host (tests) smaller chunks exercise the
#: pieces that straddle chunk boundaries.
_DEVICE_CHUNK = 1 << 22
_HOST_CHUNK = 1 << 20


@dataclass(frozen=True)
class Chunk:
    pieces: list[tuple[int, int, int]]  # (job, start, stop) in the job's flat values
    seg: torch.Tensor                   # int64 job index of each element, on the device
    lengths: torch.Tensor               # int64 piece lengths, on the device
    jobs: torch.Tensor                  # int64 piece job indices, on the device

    @property
    def size(self) -> int:
        return sum(b - a for _, a, b in self.pieces)


def chunks(sizes: list[int], device: torch.device, step: int | None = None) -> Iterator[Chunk]:
    """Tensors of `sizes` elements, end to end, in chunks of at most `step` (default: by
    device), made one at a time as they are walked: a chunk's tensor index per element is 8
    bytes an element, so all of them at once would be a copy of the state's size."""
    step = int(step or (_HOST_CHUNK if device.type == "cpu" else _DEVICE_CHUNK))
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
    small = upload(torch.tensor([[j, b - a] for j, a, b in pieces], dtype=torch.int64), device)
    jobs, lengths = small[:, 0].contiguous(), small[:, 1].contiguous()
    n = sum(b - a for _, a, b in pieces)
    seg = torch.repeat_interleave(jobs, lengths, output_size=n)  # no sync: the size is given
    return Chunk(pieces, seg, lengths, jobs)


def flat_values(flats: Sequence[torch.Tensor | None], c: Chunk, dtype: torch.dtype = torch.float32,
                fill: float = 0) -> torch.Tensor:
    """Chunk `c`'s pieces of `flats` (flat tensors, any device; None: `fill` for that tensor's
    elements), end to end, as `dtype` on the chunk's device."""
    device = c.seg.device
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
    elsewhere than the tensors they go with)."""
    return t if t.device == device else t.to(device)


def count_into(counts: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`counts[k] += 1` for every k in int64 `keys` (all in range), in place: a histogram
    without `torch.bincount`, which on CUDA reads its input's min and max back to the host
    (two synchronisations a call). Integer adds: the same counts in any order."""
    one = torch.ones((), dtype=counts.dtype, device=counts.device)
    return counts.index_add_(0, keys, one.expand(keys.numel()))


def upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor `t` (a small table) on `device` without the host waiting: to a CUDA device
    from pinned memory, asynchronously. A plain copy from pageable memory synchronises the
    stream (`cudaMemcpy` and a stream sync), which once per table per chunk is a wait per
    chunk; the pinned block is not reused before the copy is done (torch's host allocator
    records the copy)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
