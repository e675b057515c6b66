"""Quantized tensors in history: what a record is, and choosing base or delta on commit.

A quantized tensor is stored either as a base (`qbase/1`) or as a delta
(`qdelta/1`) against the same tensor in the first parent's snapshot.  Deltas
are of integer levels, so the chain is lossless at the level: any commit
restores exactly dequantize(quantize(W_t)), however deep (DESIGN invariant 3).

A delta record names its parent as ``meta["parent"] = {"snapshot", "name"}``
with the parent commit's *original* snapshot id (`parent_ref`).  This module
holds the facts about records and the encoding decisions (`choose_encoding`,
`step_cost`, `chain_cost`, `same_quantization`); chains are walked on checkout
by `mvc.repo.reader.TensorReader`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mvc.codecs.base import Encoded, quantized_codec, registered
from mvc.errors import InternalError
from mvc.native import parallel
from mvc.native.parallel import pmap, segments
from mvc.quant import QuantizedTensor
from mvc.repo.objects import TensorRecord
# What a record is (its codec's kind, a delta's parent) needs no torch: `mvc.repo.records`,
# re-exported here where callers have always found it.
from mvc.repo.records import BrokenChainError as BrokenChainError
from mvc.repo.records import is_delta as is_delta
from mvc.repo.records import is_quantized as is_quantized
from mvc.repo.records import parent_ref as parent_ref
from mvc.repo.tensors import dtype_name

#: The codecs new commits write quantized tensors with (readers ask a record's codec what it
#: is: `is_quantized`, `is_delta`).
QBASE = "qbase/1"
QDELTA = "qdelta/1"
#: Every quantized codec's name; kept for code not yet asking the codec (`is_quantized`).
QUANT_CODECS = tuple(registered(quantized=True))


def _encoded_len(enc: Encoded) -> int:
    return sum(len(memoryview(p).cast("B")) for p in enc.parts)


#: Where a commit compares and encodes a quantization against its parent's: host memory.
#: The parent comes from the level caches or the store (decoded by C code, on the host), and the
#: entropy coders run in C on the host too; so a quantization made on an accelerator crosses
#: to the host once, here, rather than meeting its parent on whatever device each one is.
HOST = torch.device("cpu")


def _parts(q: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.levels, q.centroids, q.protected


def on_host(q: QuantizedTensor) -> QuantizedTensor:
    """`q` in host memory (`HOST`): what meets a parent's quantization, the encoders and the
    level caches. `q` itself for a quantization on the host already."""
    return q.to(HOST)


def common_device(a: QuantizedTensor, b: QuantizedTensor) -> torch.device:
    """Where `a` and `b` are compared: the device all their parts are on, else the host (never
    on whichever device one of them happens to be on)."""
    dev = a.levels.device
    if all(t.device == dev for t in (*_parts(a), *_parts(b))):
        return dev
    return HOST


def aligned(a: QuantizedTensor, b: QuantizedTensor) -> tuple[QuantizedTensor, QuantizedTensor]:
    """(a, b) on their `common_device`: the two sides of a comparison, on one device on purpose."""
    dev = common_device(a, b)
    return a.to(dev), b.to(dev)


def same_quantization(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """True when `a` and `b` restore bit-identical tensors from identical levels (on any
    devices: compared on their `common_device`)."""
    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(-1).view(torch.uint8)

    if a.bins != b.bins or a.dtype != b.dtype or a.levels.shape != b.levels.shape:
        return False
    a, b = aligned(a, b)
    return (torch.equal(a.centroids, b.centroids)
            and _changed_levels(a, b) == 0
            and torch.equal(bits(a.protected), bits(b.protected)))


#: A step changing this share of levels costs the chain walker about one full pass over the
#: tensor (native/chain.c switches to a dense pass at n / 8 symbols, ~2 symbols per change).
DENSE_SHARE = 1 / 16


def step_cost(q: QuantizedTensor, parent: QuantizedTensor) -> float:
    """Estimated checkout work of the delta parent -> q, in full passes over the tensor.

    The chain walker pays for the levels a step changes until they make a
    dense pass cheaper: measured on a 1M-parameter layer, a step changing 1%
    of its levels took 0.15 of the time of one changing 10% or more.
    """
    n = q.levels.numel()
    if n == 0:
        return 0.0
    return min(1.0, _changed_levels(q, parent) / (n * DENSE_SHARE))


def _changed_levels(a: QuantizedTensor, b: QuantizedTensor) -> int:
    """Parameters whose level differs (same shape), counted on the two's `common_device`.
    torch promotes mixed level dtypes itself: widening both to int32 first would cost 8 bytes
    per parameter."""
    dev = common_device(a, b)
    la, lb = a.levels.to(dev).reshape(-1), b.levels.to(dev).reshape(-1)
    if dev.type != "cpu" or la.numel() <= parallel.SPLIT:
        return int(torch.count_nonzero(la != lb))
    # A large host tensor by segments on the pool: it takes every thread (the pipeline
    # encodes the largest tensors one at a time) and no whole-tensor mask is made.
    na, nb = la.numpy(), lb.numpy()
    return sum(pmap(lambda s: int(np.count_nonzero(na[s] != nb[s])), segments(na.size)))


def chain_cost(rec: TensorRecord) -> float:
    """Walking work accumulated along a record's chain (passes; 0 for a base).

    Records written before the cost was kept count every step as a full pass.
    """
    if not is_delta(rec):
        return 0.0
    cost = rec.meta.get("chain_cost")
    return float(cost) if isinstance(cost, (int, float)) else float(rec.depth)


def choose_encoding(q: QuantizedTensor, parent: tuple[str, TensorRecord, QuantizedTensor] | None,
                    base_every: int, delta_max_ratio: float = 1.0, chain_budget: float = 0.0,
                    ) -> tuple[str, Encoded, dict[str, Any], int, Encoded]:
    """(codec, encoding, extra meta, depth, base encoding) for `q` (its levels are encoded on
    the host, whatever device `q` and the parent's quantization are on: see `encode_for_commit`).

    A delta when one is allowed (same shape and dtype, chain shorter than
    `base_every`, its walking cost within `chain_budget` passes when that is
    set) and smaller than `delta_max_ratio` times the base (1.0: any saving,
    the paper's rule; lower keeps deltas that barely pay, such as a first
    moment that changes at every commit, out of chains, for faster checkouts
    of old commits); the base encoding is returned too so callers can cache it.
    """
    base_codec, delta_codec = quantized_codec(QBASE), quantized_codec(QDELTA)
    q = on_host(q)  # once, for both encodings and the step cost (a no-op on the host)
    base = base_codec.encode_quantized(q)
    if parent is None:
        return QBASE, base, {}, 0, base
    psid, prec, pq = parent
    pq = on_host(pq)
    depth = prec.depth + 1
    if (base_every and depth >= base_every) or prec.dtype != dtype_name(q.dtype) \
            or list(prec.shape) != list(q.shape):
        return QBASE, base, {}, 0, base
    cost = chain_cost(prec) + step_cost(q, pq)
    if chain_budget and cost > chain_budget:
        return QBASE, base, {}, 0, base
    delta = delta_codec.encode_quantized(q, pq)
    if _encoded_len(delta) >= delta_max_ratio * _encoded_len(base):
        return QBASE, base, {}, 0, base
    extra = {"parent": {"snapshot": psid, "name": prec.name}, "refs": [psid],
             "chain_cost": round(cost, 4)}
    return QDELTA, delta, extra, depth, base


def encode_for_commit(q: QuantizedTensor, prec: TensorRecord | None, parent_snapshot: str | None,
                      read_quantized: Callable[[str, TensorRecord], QuantizedTensor], *,
                      base_every: int, delta_max_ratio: float = 1.0, chain_budget: float = 0.0
                      ) -> TensorRecord | tuple[str, Encoded, dict[str, Any], int, Encoded]:
    """How a commit stores `q`: the parent's record `prec` itself when q equals the parent's
    quantization (an unchanged tensor re-commits to the identical record), else
    `choose_encoding` against it (`prec`: the parent's record of this tensor in q's domain,
    or None).  Thread-safe given a thread-safe `read_quantized`: commits encode tensors in
    parallel.

    Any device: `q` (quantized where the state lives, an accelerator perhaps) crosses to the
    host once, and the comparison with the parent, the delta against its levels and both
    encodings run there (`HOST`), whichever device the parent was read onto.  A quantization
    on the host is used as is (no copy)."""
    if q.measured_only:   # a search's stand-in: its levels are placeholders
        raise InternalError("a measured-only stand-in reached the writer")
    q = on_host(q)
    pinfo = None
    if prec is not None and parent_snapshot is not None:
        pq = on_host(read_quantized(parent_snapshot, prec))
        if same_quantization(q, pq):
            return prec
        pinfo = (parent_snapshot, prec, pq)
    return choose_encoding(q, pinfo, base_every, delta_max_ratio, chain_budget)
