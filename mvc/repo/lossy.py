"""Quantized tensors in history: choosing base or delta on commit, walking chains on checkout.

A quantized tensor is stored either as a base (`qbase/1`) or as a delta
(`qdelta/1`) against the same tensor in the first parent's snapshot.  Deltas
are of integer levels, so the chain is lossless at the level: any commit
restores exactly dequantize(quantize(W_t)), however deep (DESIGN invariant 3).

A delta record names its parent as ``meta["parent"] = {"snapshot", "name"}``
with the parent commit's *original* snapshot id; `Repo.read_snapshot` follows
gc's replacements, so a parent later re-encoded as a base still serves.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import torch

from mvc.codecs.base import Encoded, find_codec, quantized_codec, registered
from mvc.codecs.quantized import decode_base, decode_chain
from mvc.errors import DataError
from mvc.quant import QuantizedTensor
from mvc.repo.levelcache import DiskLevelCache  # noqa: F401  (Repo builds it as lossy.DiskLevelCache)
from mvc.repo.objects import TensorRecord
from mvc.repo.tensors import dtype_name, parse_dtype, read_payload

if TYPE_CHECKING:
    from mvc.repo.repository import Repo

#: The codecs new commits write quantized tensors with (readers ask a record's codec what it
#: is: `is_quantized`, `is_delta`).
QBASE = "qbase/1"
QDELTA = "qdelta/1"
#: Every quantized codec's name; kept for code not yet asking the codec (`is_quantized`).
QUANT_CODECS = tuple(registered(quantized=True))


def is_quantized(rec: TensorRecord) -> bool:
    """Whether the record stores a quantized tensor (its codec says so; unknown codec: no)."""
    codec = find_codec(rec.codec)
    return codec is not None and codec.is_quantized


def is_delta(rec: TensorRecord) -> bool:
    """Whether the record is encoded against the same tensor in its parent snapshot."""
    codec = find_codec(rec.codec)
    return codec is not None and codec.is_quantized and codec.has_parent



class BrokenChainError(DataError):
    """A delta names a parent tensor that is not in the parent snapshot."""

    exit_code = 27


class LevelCache:
    """Recently materialized quantized tensors, keyed by (snapshot id, tensor name).

    Keeps a live training process from re-walking delta chains on every
    commit, and makes consecutive checkouts cheap. Bounded by level bytes.
    """

    def __init__(self, max_bytes: int = 2 << 30):
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], QuantizedTensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # checkout fills it from several threads

    @staticmethod
    def _size(q: QuantizedTensor) -> int:
        return q.levels.numel() * q.levels.element_size() + q.protected.numel() * q.protected.element_size()

    def get(self, key: tuple[str, str]) -> QuantizedTensor | None:
        with self._lock:
            q = self._items.get(key)
            if q is not None:
                self._items.move_to_end(key)
            return q

    def put(self, key: tuple[str, str], q: QuantizedTensor) -> None:
        with self._lock:
            self._put(key, q)

    def _put(self, key: tuple[str, str], q: QuantizedTensor) -> None:
        if key in self._items:
            self._bytes -= self._size(self._items.pop(key))
        size = self._size(q)
        if size > self.max_bytes:
            return
        self._items[key] = q
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= self._size(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


def _encoded_len(enc: Encoded) -> int:
    return sum(len(memoryview(p).cast("B")) for p in enc.parts)


def parent_ref(rec: TensorRecord) -> tuple[str, str] | None:
    """(original snapshot id, name) a delta record is encoded against."""
    if not is_delta(rec):
        return None
    p = rec.meta.get("parent") or {}
    if not isinstance(p.get("snapshot"), str) or not isinstance(p.get("name"), str):
        raise BrokenChainError(f"delta tensor {rec.name!r} does not name its parent")
    return p["snapshot"], p["name"]


def same_quantization(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """True when `a` and `b` restore bit-identical tensors from identical levels."""
    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(-1).view(torch.uint8)

    return (a.bins == b.bins and a.dtype == b.dtype and a.levels.shape == b.levels.shape
            and torch.equal(a.centroids, b.centroids)
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
    """Parameters whose level differs (same shape). torch promotes mixed level dtypes
    itself: widening both to int32 first would cost 8 bytes per parameter."""
    return int(torch.count_nonzero(a.levels.reshape(-1) != b.levels.reshape(-1)))


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
    """(codec, encoding, extra meta, depth, base encoding) for `q`.

    A delta when one is allowed (same shape and dtype, chain shorter than
    `base_every`, its walking cost within `chain_budget` passes when that is
    set) and smaller than `delta_max_ratio` times the base (1.0: any saving,
    the paper's rule; lower keeps deltas that barely pay, such as a first
    moment that changes at every commit, out of chains, for faster checkouts
    of old commits); the base encoding is returned too so callers can cache it.
    """
    base_codec, delta_codec = quantized_codec(QBASE), quantized_codec(QDELTA)
    base = base_codec.encode_quantized(q)
    if parent is None:
        return QBASE, base, {}, 0, base
    psid, prec, pq = parent
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


def read_quantized(repo: "Repo", snapshot_id: str, rec: TensorRecord,
                   snapshots: dict[str, Any] | None = None) -> QuantizedTensor:
    """Materialize a quantized tensor, walking its delta chain back to the nearest base or cache hit.

    `snapshots` memoizes the parent snapshots the walk reads (one checkout
    walks every tensor's chain through the same commits).
    """
    cache = repo._levels
    chain: list[tuple[str, TensorRecord]] = []
    sid, cur = snapshot_id, rec
    disk = repo.disk_levels

    def cached(sid: str, rec: TensorRecord) -> QuantizedTensor | None:
        hit = cache.get((sid, rec.name))
        if hit is None and rec.codec == QDELTA and disk is not None:
            hit = disk.load(sid, rec)
            if hit is not None:
                cache.put((sid, rec.name), hit)
        return hit

    q = cached(sid, cur)
    seen: set[tuple[str, str]] = set()
    while q is None and cur.codec == QDELTA:
        # Content ids make the committed chain acyclic; only a bogus replacement can
        # close a loop, and that must be an error, not a walk that never ends.
        if (sid, cur.name) in seen:
            raise BrokenChainError(f"tensor {cur.name!r}: delta chain loops back to snapshot {sid}")
        seen.add((sid, cur.name))
        chain.append((sid, cur))
        psid, pname = parent_ref(cur)
        snap = snapshots.get(psid) if snapshots is not None else None
        if snap is None:
            snap = repo.read_snapshot(psid)
            if snapshots is not None:
                snapshots[psid] = snap
        prec = next((r for r in snap.tensors if r.name == pname), None)
        if prec is None or prec.codec not in QUANT_CODECS:
            raise BrokenChainError(f"tensor {cur.name!r}: parent {pname!r} missing in snapshot {psid}")
        sid, cur = psid, prec
        q = cached(sid, cur)
    if q is None:
        if cur.codec != QBASE:
            raise BrokenChainError(f"tensor {cur.name!r}: chain ends in codec {cur.codec}")
        q = decode_base(cur.meta, read_payload(repo.store, cur), parse_dtype(cur.dtype),
                        tuple(cur.shape))
        cache.put((sid, cur.name), q)
    if chain:
        last_sid, last = chain[0]
        steps = [(crec.meta, lambda crec=crec: read_payload(repo.store, crec))
                 for _, crec in reversed(chain)]
        q = decode_chain(q, steps, parse_dtype(last.dtype), tuple(last.shape))
        cache.put((last_sid, last.name), q)
    return q


def read_all(repo: "Repo", snapshot_id: str, records: list[TensorRecord]) -> dict[str, torch.Tensor]:
    """Every tensor of a snapshot, by name (in record order).

    The quantized tensors are decoded on the native thread pool (chain walks,
    entropy decoding and level lookups run in C without the GIL) through one
    shared snapshot memo, so at most one tensor per thread is being walked at a
    time; Adam first moments are then bounded by their second moments,
    restored once for both.
    """
    from mvc.native.parallel import pmap
    from mvc.repo.tensors import read_tensor

    quant = [r for r in records if r.codec in QUANT_CODECS]
    memo: dict[str, Any] = {}
    out: dict[str, torch.Tensor] = {}

    def decode(rec: TensorRecord) -> None:
        if rec.codec in QUANT_CODECS:
            out[rec.name] = _values(rec, read_quantized(repo, snapshot_id, rec, memo))
        else:
            out[rec.name] = read_tensor(repo.store, rec)

    # Costliest first (size times chain cost): the pool takes tasks in order, and the longest
    # walk is the critical path.
    pmap(decode, sorted(quant, key=lambda r: -math.prod(r.shape) * (1.0 + chain_cost(r))))
    # Exact tensors after: their codec spreads one tensor's blocks over the pool itself.
    for rec in records:
        if rec.name not in out:
            decode(rec)
    moments = [r for r in quant if r.meta.get("moment")]
    pmap(lambda rec: _bound_first_moment(rec, out[rec.name], out), moments)
    return {rec.name: out[rec.name] for rec in records}


def _values(rec: TensorRecord, q: QuantizedTensor) -> torch.Tensor:
    """A quantized record's tensor before any first-moment bound."""
    domain = rec.meta.get("domain", "linear")
    if domain == "linear":
        return q.dequantize()
    from mvc.quant.optimizer import restore

    return restore(q, domain)


def read_any(repo: "Repo", snapshot_id: str, rec: TensorRecord,
             records: list[TensorRecord] | None = None) -> torch.Tensor:
    """The tensor a record restores, whatever its codec (`records`: the snapshot's records,
    if the caller has them, saves re-reading the snapshot)."""
    from mvc.repo.tensors import read_tensor

    if rec.codec not in QUANT_CODECS:
        return read_tensor(repo.store, rec)
    out = _values(rec, read_quantized(repo, snapshot_id, rec))
    if rec.meta.get("moment"):
        if records is None:
            records = repo.read_snapshot(snapshot_id).tensors
        partner = _partner(rec, records)
        _bound_first_moment(rec, out, {partner.name: read_any(repo, snapshot_id, partner, records)})
    return out


def _partner(rec: TensorRecord, records: list[TensorRecord]) -> TensorRecord:
    name = rec.meta["moment"].get("partner")
    partner = next((r for r in records if r.name == name), None)
    if partner is None:
        raise BrokenChainError(f"tensor {rec.name!r}: second moment {name!r} missing")
    return partner


def _bound_first_moment(rec: TensorRecord, m: torch.Tensor, restored: dict[str, torch.Tensor]) -> None:
    """Clamp a restored Adam first moment to |m| <= bound * sqrt(v), in place.

    m and v are quantized independently (m with absolute, v with relative
    error), so where v is tiny the restored m / sqrt(v) -- Adam's step -- can be
    hundreds of times larger than anything the exact state had, and the first
    steps after a resume blow up. The bound is the exact state's largest
    |m| / sqrt(v), recorded at commit time; where v restores to 0, m does too.
    Deterministic, so restores stay bit-identical across runs. `restored` holds
    the partner v by name.
    """
    info = rec.meta["moment"]
    v = restored.get(info.get("partner"))
    if v is None:
        raise BrokenChainError(f"tensor {rec.name!r}: second moment {info.get('partner')!r} missing")
    if v.shape != m.shape:
        return
    limit = v.float().clamp_min(0).sqrt_().mul_(float(info["ratio_bound"])).to(m.dtype)
    torch.clamp(m, min=-limit, max=limit, out=m)
