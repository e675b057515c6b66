"""Codecs for quantized tensors: a standalone base and a delta against the parent.

`qbase/1` stores one `QuantizedTensor` on its own: its centroids (float32), the
level of every parameter (Huffman coded) and the protected parameters' exact
values (in the tensor's dtype, through the `lossless/1` codec, whose meta is
nested as `meta["protected"]`; their positions are the parameters at level
k+1, so they cost nothing extra).

`qdelta/1` stores it against the same tensor's levels in the parent commit
(Inshrinkerator §6): D = (L_parent - L) mod B, B the larger level count of the
two, split into one group per parent level (Alg. 5), each group run-length
coded (sign-trick form) and Huffman coded on its own.  Centroids and protected
values are stored as in the base.  Decoding (Alg. 6) rebuilds the grouping
from the parent's levels, so no permutation is stored.  A group whose deltas
are all zero (the common case late in training) is stored as zero bytes.

Every delta records `meta["mode"] = "pe"` (parent-level grouping); the
decoder refuses any other mode.  The benchmark's ablations in original order
(Huffman of D, RLE + Huffman of D) live in benchmarks/delta_ablations.py.

Layout of every payload: centroids | protected | level sections, with each
section's byte length and an xxh3-64 of the payload in `meta`; decoding
validates all of it against the declared shape before allocating anything.

Level convention (shared with `mvc.quant`): level i < k is centroid i, level k
is pruned (0), level k+1 is protected; a tensor has k + 2 levels.
"""
from __future__ import annotations

import contextlib
import json
import math
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch
import xxhash

from mvc.codecs.base import (BytesLike, ChainStep, CodecError, Encoded, register,
                             tensor_codec)
from mvc.codecs import delta_groups as dg
from mvc.errors import InternalError, MvcError, UsageError
from mvc.native import huffman, rle
from mvc.native.parallel import pmap
from mvc.native.status import NativeDecodeError
from mvc.quant import QuantizedTensor, level_dtype
from mvc.quant._kernels import level_census
from mvc.quant.error import checked_level_histogram

__all__ = [
    "QBASE", "QDELTA",
    "QuantPayloadError", "QuantChecksumError", "DeltaParentError", "DeltaShapeError",
    "QuantInputError",
    "encode_base", "decode_base", "encode_delta",
    "decode_delta", "decode_chain", "encoded_size", "QBaseCodec", "QDeltaCodec", "QBASE_CODEC",
    "QDELTA_CODEC", "DeltaParentMissingError",
]

QBASE = "qbase/1"
QDELTA = "qdelta/1"
_MODE = "pe"  # meta["mode"] of every qdelta/1 payload: deltas grouped by parent level

# A level stream is Huffman coded as uint8 or uint16 symbols.
MAX_LEVELS = 1 << 16
_CENTROID_DTYPE = np.dtype("<f4")
_LOSSLESS = "lossless/1"  # protected values are exact floats: the project's lossless codec
_NP_LEVEL_DTYPES = {torch.uint8: np.uint8, torch.int16: np.int16, torch.int32: np.int32}


class QuantPayloadError(CodecError):
    """A quantized payload or its meta is corrupt, truncated or inconsistent."""

    exit_code = 40


class QuantChecksumError(QuantPayloadError):
    """A quantized payload does not match the checksum recorded at encode time."""

    exit_code = 41


class DeltaParentError(CodecError):
    """The parent levels handed to the delta decoder are not the ones it was encoded against."""

    exit_code = 42


class DeltaShapeError(UsageError):
    """Child and parent differ in shape, so a delta cannot be formed (store a base)."""

    exit_code = 43


class QuantInputError(InternalError):
    """The QuantizedTensor handed to an encoder breaks the level convention (a bug upstream)."""

    exit_code = 44


# --------------------------------------------------------------------------- helpers

def encoded_size(enc: Encoded) -> int:
    """Bytes an `Encoded` costs in the store: payload plus its JSON meta.

    Consumes `enc.parts` if it is an iterator; meant for benchmarks and for
    callers that hold the parts as a list.
    """
    parts = list(enc.parts)
    enc.parts = parts
    return sum(len(p) for p in parts) + len(json.dumps(enc.meta, separators=(",", ":")))


def _levels_np(t: torch.Tensor, n_levels: int, what: str, dtype: Optional[np.dtype] = None,
               check: bool = True) -> np.ndarray:
    """Flattened levels on the CPU as `dtype` (default: narrowest for `n_levels`).

    Range checked against `n_levels` unless `check` is False and the values
    arrive as uint8 already (the native passes then do the check themselves).
    """
    dtype = dg.delta_dtype(n_levels) if dtype is None else dtype
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.to("cpu")
    if flat.dtype.is_floating_point or flat.dtype.is_complex or flat.dtype == torch.bool:
        raise QuantInputError(f"{what} must be an integer tensor, got {flat.dtype}")
    arr = flat.numpy()
    if (check or arr.dtype != np.uint8) and arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= n_levels:
            raise QuantInputError(f"{what} hold values outside [0, {n_levels}): min {lo}, max {hi}")
    return np.ascontiguousarray(arr.astype(dtype, copy=False))


def _census(levels: np.ndarray, n_levels: int) -> np.ndarray | None:
    """int64 count of each level in [0, n_levels) of flat `levels`, or None when one is outside:
    the range check and the protected count in one pass (native and threaded for 8- and 16-bit
    levels; numpy's bincount would make an int64 copy of them: 8 bytes a value)."""
    if levels.dtype in (np.uint8, np.uint16) and levels.size:
        flat = levels.reshape(-1)
        view = flat if flat.dtype == np.uint8 else flat.view(np.int16)   # the C reads uint16
        counts = level_census(torch.from_numpy(view), n_levels)
        return counts.numpy() if counts is not None else None
    if levels.size and (int(levels.min()) < 0 or int(levels.max()) >= n_levels):
        return None
    return np.bincount(levels.reshape(-1), minlength=n_levels).astype(np.int64)


def _quant_parts(q: Any) -> tuple[np.ndarray, int, np.ndarray, torch.Tensor, int]:
    """(levels, k, centroids float32, protected values, n_protected) of a QuantizedTensor."""
    k = int(q.bins)
    if not 1 <= k <= MAX_LEVELS - 2:
        raise QuantInputError(f"bins must be in [1, {MAX_LEVELS - 2}], got {k}")
    levels = _levels_np(q.levels, k + 2, "levels", check=False)
    if isinstance(q, QuantizedTensor):
        # q's level counts as the search left them, or counted once and kept for q (a base and
        # a delta encoding of one quantization share the pass); range checked either way
        hist = checked_level_histogram(q)
        counts = hist.cpu().numpy() if hist is not None else None
    else:
        counts = _census(levels, k + 2)
    if counts is None:
        raise QuantInputError(f"levels hold values outside [0, {k + 2}): "
                              f"min {int(levels.min())}, max {int(levels.max())}")
    cent = q.centroids.detach().to("cpu", torch.float32).reshape(-1).contiguous()
    if cent.numel() != k:
        raise QuantInputError(f"{cent.numel()} centroids for {k} bins")
    prot = q.protected.detach().to("cpu").reshape(-1).contiguous()
    if prot.dtype != q.dtype:
        raise QuantInputError(f"protected values are {prot.dtype}, tensor dtype is {q.dtype}")
    n_prot = int(counts[k + 1])
    if prot.numel() != n_prot:
        raise QuantInputError(f"{prot.numel()} protected values for {n_prot} protected levels")
    return levels, k, cent.numpy().astype(_CENTROID_DTYPE, copy=False), prot, n_prot


def _encode_protected(prot: torch.Tensor) -> tuple[bytes, dict[str, Any]]:
    """Protected values through the lossless codec; (section, meta entries)."""
    if prot.numel() == 0:
        return b"", {}
    enc = tensor_codec(_LOSSLESS).encode(prot)
    return b"".join(bytes(p) for p in enc.parts), {"protected": enc.meta}


def _huffman_encode(values: np.ndarray) -> bytes:
    return bytes(huffman.encode(np.ascontiguousarray(values)))


def _rle_encode(values: np.ndarray) -> bytes:
    return bytes(rle.encode_huffman(np.ascontiguousarray(values)))


def _decode_with(fn, data: BytesLike, n: int, dtype: np.dtype, what: str) -> np.ndarray:
    """Run a native decoder, turning whatever it raises on bad input into a CodecError."""
    try:
        out = fn(data, n, dtype)
    except CodecError:
        raise
    except NativeDecodeError as exc:  # the native layer's own error, as the codec's
        raise CodecError(str(exc)) from exc
    except (MvcError, ValueError, OverflowError, IndexError, TypeError, MemoryError) as exc:
        raise QuantPayloadError(f"{what}: {exc}") from exc
    out = np.asarray(out).reshape(-1)
    if out.size != n:
        raise QuantPayloadError(f"{what}: decoded {out.size} symbols, expected {n}")
    return out


def _checksum(parts: Sequence[BytesLike]) -> str:
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    return h.hexdigest()


def _config_meta(config: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    return {} if config is None else {"config": dict(config)}


# --------------------------------------------------------------------------- meta validation

def _int_field(meta: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    v = meta.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise QuantPayloadError(f"meta field {key!r} = {v!r} is not an integer in [{lo}, {hi}]")
    return v


def _numel(shape: Sequence[int]) -> int:
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise QuantPayloadError(f"invalid shape {list(shape)}")
    return math.prod(int(d) for d in shape)


def _sections(meta: Mapping[str, Any], payload: BytesLike, count: int) -> list[memoryview]:
    """Split `payload` by the recorded section lengths after checking them and the checksum."""
    lens = meta.get("sections")
    if (not isinstance(lens, list) or len(lens) != count
            or any(type(n) is not int or n < 0 for n in lens)):
        raise QuantPayloadError(f"meta 'sections' must list {count} byte lengths, got {lens!r}")
    view = memoryview(payload).cast("B")
    if sum(lens) != len(view):
        raise QuantPayloadError(
            f"payload is {len(view)} bytes but its sections add up to {sum(lens)} (truncated?)"
        )
    digest = meta.get("xxh3")
    if not isinstance(digest, str) or _checksum([view]) != digest:
        raise QuantChecksumError("quantized payload does not match its checksum")
    out, pos = [], 0
    for n in lens:
        out.append(view[pos:pos + n])
        pos += n
    return out


def _common_parts(meta: Mapping[str, Any], dtype: torch.dtype, shape: Sequence[int]
                  ) -> tuple[int, int, int]:
    """(numel, k, n_protected) from meta, validated against the declared shape."""
    numel = _numel(shape)
    if _int_field(meta, "numel", 0, numel) != numel:
        raise QuantPayloadError(f"meta numel {meta['numel']} != {numel} for shape {list(shape)}")
    k = _int_field(meta, "bins", 1, MAX_LEVELS - 2)
    n_prot = _int_field(meta, "n_protected", 0, numel)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise QuantPayloadError(f"quantized tensors are floating point, not {dtype}")
    return numel, k, n_prot


def _decode_centroids(sec: memoryview, k: int) -> torch.Tensor:
    if len(sec) != k * _CENTROID_DTYPE.itemsize:
        raise QuantPayloadError(f"centroid section is {len(sec)} bytes, {k} centroids need {4 * k}")
    cent = np.frombuffer(sec, dtype=_CENTROID_DTYPE).astype(np.float32)
    if not np.all(np.isfinite(cent)):
        raise QuantPayloadError("stored centroids are not finite")
    if k > 1 and bool(np.any(cent[1:] < cent[:-1])):
        raise QuantPayloadError("stored centroids are not sorted")
    return torch.from_numpy(cent)


def centroid_bytes(meta: Mapping[str, Any]) -> int:
    """Bytes at the start of a `qbase/1` or `qdelta/1` payload holding its centroids (the first
    section of both): what `stored_centroids` needs read."""
    k, lens = _int_field(meta, "bins", 1, MAX_LEVELS - 2), meta.get("sections")
    if not isinstance(lens, list) or not lens or lens[0] != k * _CENTROID_DTYPE.itemsize:
        raise QuantPayloadError(f"meta 'sections' {lens!r} does not start with {k} centroids")
    return lens[0]


def stored_centroids(meta: Mapping[str, Any], head: BytesLike) -> torch.Tensor:
    """A stored quantized tensor's centroids from the start of its payload (`head`), its levels
    not decoded: a commit's warm start needs nothing else. `head` is not checked against the
    payload's checksum (the rest is not read): it comes from chunks verified against their ids,
    and the centroids are validated (count, finite, sorted)."""
    n = centroid_bytes(meta)
    return _decode_centroids(memoryview(head).cast("B")[:n], n // _CENTROID_DTYPE.itemsize)


def _decode_protected(sec: memoryview, n_prot: int, dtype: torch.dtype,
                      meta: Mapping[str, Any]) -> torch.Tensor:
    if n_prot == 0:
        if len(sec):
            raise QuantPayloadError("protected section present but no protected values")
        return torch.empty(0, dtype=dtype)
    pmeta = meta.get("protected")
    if not isinstance(pmeta, dict):
        raise QuantPayloadError("meta lacks the protected values' codec meta")
    try:
        prot = tensor_codec(_LOSSLESS).decode(pmeta, sec, dtype, (n_prot,))
    except CodecError:
        raise
    except (MvcError, ValueError, OverflowError, TypeError) as exc:
        raise QuantPayloadError(f"protected values: {exc}") from exc
    return prot.reshape(-1)


def _assemble(levels: np.ndarray, k: int, cent: torch.Tensor, prot: torch.Tensor,
              dtype: torch.dtype, shape: Sequence[int]):
    """Build the QuantizedTensor from parts the caller has fully validated.

    The constructor is used rather than `from_parts` because every check
    `from_parts` makes has been made here already, on the fly, and repeating
    them costs more than decoding a delta.
    """
    np_dtype = _NP_LEVEL_DTYPES[level_dtype(k)]
    if levels.dtype == np.uint16 and np_dtype == np.int16:
        levels = levels.view(np.int16)  # every level is < 32768 here: same bits
    lv = torch.from_numpy(np.ascontiguousarray(levels.astype(np_dtype, copy=False)))
    return QuantizedTensor(lv.reshape(tuple(int(d) for d in shape)), cent, prot, dtype, k)


# --------------------------------------------------------------------------- base

def encode_base(q: Any, *, config: Optional[Mapping[str, Any]] = None) -> Encoded:
    """Encode a QuantizedTensor on its own (codec ``qbase/1``).

    `config` (JSON-able) records the quantization configuration used; it is
    kept in `meta["config"]` for the commit log and gc.
    """
    levels, k, cent, prot, n_prot = _quant_parts(q)
    level_bytes = _huffman_encode(levels) if levels.size else b""
    prot_bytes, prot_meta = _encode_protected(prot)
    parts = [cent.tobytes(), prot_bytes, level_bytes]
    meta = {
        "bins": k, "numel": int(levels.size), "n_protected": n_prot, **prot_meta,
        "sections": [len(p) for p in parts], "xxh3": _checksum(parts), **_config_meta(config),
    }
    return Encoded(meta=meta, parts=parts, extra={"codec": QBASE})


def decode_base(meta: Mapping[str, Any], payload: BytesLike, dtype: torch.dtype,
                shape: Sequence[int]):
    """Rebuild the QuantizedTensor `encode_base` stored (levels bit-exact)."""
    numel, k, n_prot = _common_parts(meta, dtype, shape)
    cent_sec, prot_sec, level_sec = _sections(meta, payload, 3)
    cent = _decode_centroids(cent_sec, k)
    prot = _decode_protected(prot_sec, n_prot, dtype, meta)
    if numel == 0:
        if len(level_sec):
            raise QuantPayloadError("level section present for an empty tensor")
        levels = np.empty(0, dtype=dg.delta_dtype(k + 2))
    else:
        levels = _decode_with(huffman.decode, level_sec, numel, dg.delta_dtype(k + 2), "level stream")
    counts = _census(levels, k + 2)
    if counts is None:
        raise QuantPayloadError(f"decoded level {int(levels.max())} >= {k + 2} levels")
    if int(counts[k + 1]) != n_prot:
        raise QuantPayloadError("protected level count does not match stored protected values")
    return _assemble(levels, k, cent, prot, dtype, shape)


# --------------------------------------------------------------------------- delta

def _encode_stream(d: np.ndarray) -> bytes:
    # An all-zero stream (nothing migrated) costs nothing: the decoder knows its length.
    if d.size == 0 or not d.any():
        return b""
    return _rle_encode(d)


def encode_delta(q: Any, parent_levels: torch.Tensor, parent_n_levels: int, *,
                 config: Optional[Mapping[str, Any]] = None) -> Encoded:
    """Encode `q` against the same tensor's levels in the parent (codec ``qdelta/1``).

    `parent_levels` are the parent's decoded levels (any integer dtype, any
    device, same shape as `q`), `parent_n_levels` its level count (bins + 2).
    Raises DeltaShapeError when the shapes differ: the caller stores a base.
    """
    if not 2 <= int(parent_n_levels) <= MAX_LEVELS:
        raise QuantInputError(f"parent_n_levels must be in [2, {MAX_LEVELS}], got {parent_n_levels}")
    n_prev = int(parent_n_levels)
    levels, k, cent, prot, n_prot = _quant_parts(q)
    if tuple(parent_levels.shape) != tuple(q.levels.shape):
        raise DeltaShapeError(
            f"parent shape {list(parent_levels.shape)} != {list(q.levels.shape)}: store a base"
        )
    modulus = max(n_prev, k + 2)
    dt = dg.delta_dtype(modulus)
    parent = _levels_np(parent_levels, n_prev, "parent levels", dt, check=False)
    levels = levels.astype(dt, copy=False)
    try:
        counts = dg.group_counts(parent, n_prev)
        d = dg.grouped_delta(parent, levels, modulus, counts)
        streams = pmap(lambda s: _encode_stream(d[s]), dg.group_slices(counts))
    except dg.LevelRangeError as exc:
        raise QuantInputError(f"parent levels: {exc}") from exc
    prot_bytes, prot_meta = _encode_protected(prot)
    parts = [cent.tobytes(), prot_bytes, *streams]
    meta = {
        "mode": _MODE, "bins": k, "numel": int(levels.size), "n_protected": n_prot, **prot_meta,
        "parent_n_levels": n_prev, "sections": [len(p) for p in parts],
        "xxh3": _checksum(parts), **_config_meta(config),
    }
    return Encoded(meta=meta, parts=parts, extra={"codec": QDELTA})


class _DeltaParts:
    """A delta payload's validated pieces (everything but the parent's levels)."""

    def __init__(self, meta: Mapping[str, Any], payload: BytesLike, dtype: torch.dtype,
                 shape: Sequence[int]):
        self.numel, self.k, self.n_prot = _common_parts(meta, dtype, shape)
        mode = meta.get("mode")
        if mode != _MODE:  # the repository writes no other (the ablations are benchmark code)
            raise QuantPayloadError(f"unknown delta mode {mode!r}: {QDELTA} writes {_MODE!r} only")
        self.n_prev = _int_field(meta, "parent_n_levels", 2, MAX_LEVELS)
        self.modulus = max(self.n_prev, self.k + 2)
        secs = _sections(meta, payload, 2 + self.n_prev)
        self._secs = secs
        self._meta, self.dtype, self.shape = meta, dtype, tuple(shape)
        self.lengths = list(meta["sections"][2:])
        start = sum(meta["sections"][:2])
        self.levels_view = memoryview(payload).cast("B")[start:]

    def assemble(self, levels: np.ndarray, n_top: int) -> QuantizedTensor:
        if n_top != self.n_prot:
            raise QuantPayloadError(f"{n_top} protected levels but {self.n_prot} protected values stored")
        cent = _decode_centroids(self._secs[0], self.k)
        prot = _decode_protected(self._secs[1], self.n_prot, self.dtype, self._meta)
        return _assemble(levels, self.k, cent, prot, self.dtype, self.shape)


def _parent_np(parts: _DeltaParts, parent_levels: torch.Tensor) -> np.ndarray:
    if parent_levels.numel() != parts.numel:
        raise DeltaParentError(f"parent has {parent_levels.numel()} parameters, delta {parts.numel}")
    try:
        return _levels_np(parent_levels, parts.n_prev, "parent levels",
                          dg.delta_dtype(parts.modulus), check=False)
    except QuantInputError as exc:
        raise DeltaParentError(f"parent levels do not fit parent_n_levels={parts.n_prev}: {exc}") from exc


@contextlib.contextmanager
def _level_errors(parts: _DeltaParts):
    """Native level-pass failures as the codec's errors: wrong parent vs corrupt delta."""
    try:
        yield
    except dg.LevelRangeError as exc:
        raise DeltaParentError(f"parent levels do not fit parent_n_levels={parts.n_prev}: {exc}") from exc
    except dg.GroupedDeltaError as exc:
        raise QuantPayloadError(f"delta level sections: {exc}") from exc


def decode_delta(meta: Mapping[str, Any], payload: BytesLike, dtype: torch.dtype,
                 shape: Sequence[int], parent_levels: torch.Tensor):
    """Rebuild the QuantizedTensor from a delta and the parent's levels (Alg. 6).

    `parent_levels` may be of any integer dtype, any device (they are read on
    the host, where the levels are decoded) and any shape with the right
    number of elements (a flattened cache works).  Raises DeltaParentError if
    they cannot be the parent this delta was encoded against, QuantPayloadError
    for a payload of any mode but "pe" (the only one the repository writes).
    """
    parts = _DeltaParts(meta, payload, dtype, shape)
    parent = _parent_np(parts, parent_levels)
    with _level_errors(parts):
        levels, n_top = dg.decode_levels(
            parent, parts.n_prev, parts.modulus, parts.k + 2, grouped=True, rle=True,
            sections=parts.levels_view, lengths=parts.lengths)
    return parts.assemble(levels, n_top)


def _walkable(meta: Mapping[str, Any]) -> bool:
    """Whether a delta's meta says the chain walker can take it (checked again on decode)."""
    k, n_prev, numel = meta.get("bins"), meta.get("parent_n_levels"), meta.get("numel")
    if meta.get("mode") != _MODE or type(k) is not int or type(n_prev) is not int \
            or type(numel) is not int:
        return False
    return dg.ChainWalker.supports(numel, max(n_prev, k + 2))


def decode_chain(base: QuantizedTensor,
                 deltas: Sequence[tuple[Mapping[str, Any], Callable[[], BytesLike]]],
                 dtype: torch.dtype, shape: Sequence[int]):
    """The tensor at the end of a delta chain from `base`: `deltas` are (meta, payload loader), oldest first.

    Same result as folding `decode_delta`, but a chain of real-codec deltas
    over 8-bit levels is walked in place by `ChainWalker`, so each step costs
    about its changes rather than a pass over every parameter.  Payloads are
    loaded one step at a time (a deep chain of a huge tensor never sits in
    memory at once), and only the last delta's centroids and protected values
    are decoded.
    """
    if not deltas:
        return base
    if not all(_walkable(m) for m, _ in deltas):
        q = base
        for m, load in deltas:
            q = decode_delta(m, load(), dtype, shape, q.levels)
        return q
    (m0, load0), rest = deltas[0], deltas[1:]
    pt = _DeltaParts(m0, load0(), dtype, shape)
    with dg.ChainWalker(_parent_np(pt, base.levels)) as walker:
        top = _walk_step(walker, pt)
        for m, load in rest:
            pt = _DeltaParts(m, load(), dtype, shape)
            top = _walk_step(walker, pt)
        levels = walker.levels()
    return pt.assemble(levels, top)


def _walk_step(walker: dg.ChainWalker, pt: _DeltaParts) -> int:
    """Apply one delta's level sections in place; the protected-level count it leaves."""
    with _level_errors(pt):
        top = walker.step(pt.n_prev, pt.modulus, pt.k + 2, pt.levels_view, pt.lengths)
    if top != pt.n_prot:
        raise QuantPayloadError(f"{top} protected levels but {pt.n_prot} protected values stored")
    return top


# --------------------------------------------------------------------------- registered codecs

class DeltaParentMissingError(InternalError):
    """A delta codec was asked to encode or decode without the parent it needs (a bug)."""

    exit_code = 116


def _quantized_on(q: QuantizedTensor, device: torch.device | str | None) -> QuantizedTensor:
    return q if device is None else q.to(device)


class QBaseCodec:
    """`qbase/1`: a quantized tensor on its own."""

    name = QBASE
    lossless = False
    is_quantized = True
    has_parent = False

    def encode_quantized(self, q: QuantizedTensor, parent: QuantizedTensor | None = None
                         ) -> Encoded:
        """`encode_base(q)`; `parent` is ignored (a base stands alone)."""
        return encode_base(q)

    def decode_quantized(self, meta: dict[str, Any], payload: BytesLike, dtype: torch.dtype,
                         shape: tuple[int, ...], *, parent: QuantizedTensor | None = None,
                         device: torch.device | str | None = None) -> QuantizedTensor:
        """`decode_base`, the result on `device`."""
        return _quantized_on(decode_base(meta, payload, dtype, shape), device)

    def decode_chain(self, base: QuantizedTensor, deltas: Sequence[ChainStep],
                     dtype: torch.dtype, shape: tuple[int, ...], *,
                     device: torch.device | str | None = None) -> QuantizedTensor:
        if deltas:
            raise DeltaParentMissingError(f"{QBASE} has no deltas to walk")
        return _quantized_on(base, device)


class QDeltaCodec:
    """`qdelta/1`: a quantized tensor as grouped deltas against its parent's levels."""

    name = QDELTA
    lossless = False
    is_quantized = True
    has_parent = True

    def encode_quantized(self, q: QuantizedTensor, parent: QuantizedTensor | None = None
                         ) -> Encoded:
        """`encode_delta(q, parent.levels, parent.n_levels)`."""
        if parent is None:
            raise DeltaParentMissingError(f"{QDELTA} encodes against a parent; none given")
        return encode_delta(q, parent.levels, parent.n_levels)

    def decode_quantized(self, meta: dict[str, Any], payload: BytesLike, dtype: torch.dtype,
                         shape: tuple[int, ...], *, parent: QuantizedTensor | None = None,
                         device: torch.device | str | None = None) -> QuantizedTensor:
        """`decode_delta` against `parent`'s levels, the result on `device`."""
        if parent is None:
            raise DeltaParentMissingError(f"{QDELTA} decodes against a parent; none given")
        return _quantized_on(decode_delta(meta, payload, dtype, shape, parent.levels), device)

    def decode_chain(self, base: QuantizedTensor, deltas: Sequence[ChainStep],
                     dtype: torch.dtype, shape: tuple[int, ...], *,
                     device: torch.device | str | None = None) -> QuantizedTensor:
        """`decode_chain` (walked in place by the native chain walker), the result on `device`."""
        return _quantized_on(decode_chain(base, deltas, dtype, shape), device)


QBASE_CODEC = register(QBaseCodec())
QDELTA_CODEC = register(QDeltaCodec())
