"""Many tensors' sketches in one batched pass on their device (issue 27): a search's first
step, which sketched each tensor, and each gradient's sensitivity, with a host
synchronisation apiece.

The tensors are laid end to end and walked in chunks (`mvc.quant.device_chunks`); each
element's histogram key (`mvc.quant.sketch.bucket_keys`) is offset by its tensor's index, and
one count per chunk (`count_into`) adds every tensor's counts at once (`count_sketches`, which
the batched quantizer's kept- and dropped-value sketches use too). The counts cross to the
host once per batch of tensors (their table is 19k int64s a tensor at alpha 0.01, so a batch
holds at most `_BATCH` tensors). The counts are those of `LogSketch.from_tensor` on either
path.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

import torch

from mvc.errors import InternalError
from mvc.quant.device_chunks import Chunk, chunks, count_into, flat_values
from mvc.quant.errors import NonFiniteTensorError, QuantConfigError
from mvc.quant.importance import sensitivity_values
from mvc.quant.sketch import LogSketch, bucket_count, bucket_keys, check_alpha

#: Tensors per count table: 64 x 19k int64s is 10 MiB, on the device and on the host.
_BATCH = 64


def sketch_many(tensors: Sequence[torch.Tensor], alpha: float, *,
                grads: Sequence[torch.Tensor | None] | None = None,
                chunk: int | None = None) -> list[LogSketch | None]:
    """Each tensor's `LogSketch` (its values as float32), or, with `grads`, the sketch of its
    sensitivity |g w| (`mvc.quant.importance.sensitivity`; None where it has no gradient). None
    where a value or gradient is NaN or +-Inf (`LogSketch.from_tensor` raises
    `NonFiniteTensorError` there; the search keeps such a tensor lossless). The tensors share
    one device; a gradient must have its tensor's shape."""
    a = check_alpha(alpha)
    if grads is not None and len(grads) != len(tensors):
        raise QuantConfigError("sketch_many(): one gradient (or None) per tensor")
    out: list[LogSketch | None] = [None] * len(tensors)
    todo = [i for i in range(len(tensors)) if grads is None or grads[i] is not None]
    for s in range(0, len(todo), _BATCH):
        idx = todo[s:s + _BATCH]
        got = _sketch_batch([tensors[i] for i in idx],
                            [grads[i] for i in idx] if grads is not None else None, a, chunk)
        for i, sk in zip(idx, got, strict=True):
            out[i] = sk
    return out


def _sketch_batch(tensors: list[torch.Tensor], grads: list[torch.Tensor | None] | None,
                  alpha: float, chunk: int | None) -> list[LogSketch | None]:
    if not tensors:
        return []
    flats = [t.detach().reshape(-1) for t in tensors]
    gflats: list[torch.Tensor | None] = []
    if grads is not None:
        for t, g in zip(tensors, grads, strict=True):
            assert g is not None
            if tuple(g.shape) != tuple(t.shape):
                raise QuantConfigError(f"gradient has shape {tuple(g.shape)}, expected "
                                       f"{tuple(t.shape)}")
            gflats.append(g.detach().reshape(-1))

    def values(c: Chunk) -> tuple[torch.Tensor, None]:
        xs = flat_values(flats, c)
        if grads is None:
            return xs, None
        gs = flat_values(gflats, c)
        # a NaN / Inf gradient is named as such, whatever the product saturated to
        return sensitivity_values(xs, gs).masked_fill_(~torch.isfinite(gs), math.nan), None

    return count_sketches([f.numel() for f in flats], tensors[0].device, alpha, values, chunk)


def count_sketches(sizes: list[int], device: torch.device, alpha: float,
                   values: Callable[[Chunk], tuple[torch.Tensor, torch.Tensor | None]],
                   chunk: int | None = None) -> list[LogSketch | None]:
    """For tensors of `sizes` elements (end to end, in chunks on `device`), the sketch of the
    values `values(c)` gives for each chunk `c`: (float32 values, a mask of the entries not to
    count, or None). One count over (tensor, bucket) keys per chunk, one transfer in all; None
    for a tensor with a NaN or +-Inf among its counted values."""
    width = 2 * bucket_count(alpha) + 2
    trash = len(sizes) * width
    if trash >= 1 << 31:  # pragma: no cover - ~100,000 tensors in one pass
        raise QuantConfigError(f"{len(sizes)} tensors in one sketch pass: int32 keys overflow")
    counts = torch.zeros(trash + 1, dtype=torch.int64, device=device)
    for c in chunks(sizes, device, chunk):
        x, skip = values(c)
        key = bucket_keys(x, alpha).add_(c.seg, alpha=width)  # no int64 temporary
        if skip is not None:
            key.masked_fill_(skip, trash)
        count_into(counts, key)
    host = counts.cpu().numpy()
    out: list[LogSketch | None] = []
    for j in range(len(sizes)):
        try:
            out.append(LogSketch.from_key_counts(host[j * width:(j + 1) * width], alpha))
        except NonFiniteTensorError:
            out.append(None)
    return out


def finite(sketches: list[LogSketch | None]) -> list[LogSketch]:
    """`count_sketches`'s answer where every counted value is finite by construction."""
    if any(s is None for s in sketches):
        raise InternalError("a non-finite value among values counted as finite")
    return cast(list[LogSketch], sketches)
