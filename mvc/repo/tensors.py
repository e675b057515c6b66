"""One tensor to content-addressed chunks and back, through a codec."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import torch

from mvc.codecs.base import BytesLike, TensorCodec, tensor_codec
from mvc.dtypes import bits_view, dtype_name, parse_dtype
from mvc.errors import DataError
from mvc.repo.objects import TensorRecord
from mvc.store import BlobStore, object_id

#: Small payloads are written in batches so a model with thousands of small
#: tensors costs a few write transactions (each one an fsync), not thousands.
BATCH_BYTES = 64 << 20


def _rechunk(parts: Iterable[BytesLike], size: int) -> Iterator[BytesLike]:
    """Re-cut a stream of byte pieces into pieces of exactly `size` (the last may be shorter)."""
    pending: list[memoryview] = []
    have = 0
    for part in parts:
        mv = memoryview(part).cast("B")
        while len(mv):
            take = min(size - have, len(mv))
            pending.append(mv[:take])
            have += take
            mv = mv[take:]
            if have == size:
                yield pending[0] if len(pending) == 1 else b"".join(pending)
                pending, have = [], 0
    if pending:
        yield pending[0] if len(pending) == 1 else b"".join(pending)


class ChunkSink(Protocol):
    """What `ChunkWriter` writes through: the writing half of a `BlobStore`."""

    def put(self, data: BytesLike) -> str: ...

    def put_many(self, items: Iterable[BytesLike]) -> list[str]: ...


class ChunkWriter:
    """Buffers small chunks and writes them with few transactions; big ones go straight through.

    Writes only content-addressed objects (`put` / `put_many` of a `BlobStore`), so any number
    of writers, in any number of processes, may store the same chunks at once.
    """

    def __init__(self, store: ChunkSink, chunk_size: int) -> None:
        self.store = store
        self.chunk_size = chunk_size
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def write(self, tensor: torch.Tensor, codec: TensorCodec, name: str,
              meta_extra: dict | None = None, depth: int = 0) -> TensorRecord:
        """Encode `tensor` with `codec` and store it; returns the snapshot record."""
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        if not t.is_contiguous():
            t = _contiguous_bits(t)
        enc = codec.encode(t)
        return self.write_encoded(enc, codec.name, name, t.dtype, tuple(t.shape), meta_extra, depth,
                                  raw_bytes=t.numel() * t.element_size())

    def write_encoded(self, enc, codec_name: str, name: str, dtype: torch.dtype,
                      shape: tuple[int, ...], meta_extra: dict | None = None,
                      depth: int = 0, *, raw_bytes: int) -> TensorRecord:
        """Store an already encoded tensor; returns the snapshot record."""
        ids: list[str] = []
        stored = 0
        for piece in _rechunk(enc.parts, self.chunk_size):
            stored += len(piece)
            if len(piece) >= self.chunk_size // 2:
                ids.append(self.store.put(piece))
            else:
                ids.append(self.add(bytes(piece)))
                if self._pending_bytes >= BATCH_BYTES:
                    self.flush()
        meta = dict(enc.meta)
        if meta_extra:
            meta.update(meta_extra)
        return TensorRecord(
            name=name, dtype=dtype_name(dtype), shape=list(shape), codec=codec_name,
            chunks=ids, stored_bytes=stored, raw_bytes=raw_bytes,
            meta=meta, depth=depth,
        )

    def add(self, data: bytes) -> str:
        """Queue one small object for the next flush; returns its id."""
        oid = object_id(data)
        self._pending.append(data)
        self._pending_bytes += len(data)
        return oid

    def flush(self) -> None:
        """Write every buffered chunk (call before anything refers to them)."""
        if self._pending:
            self.store.put_many(self._pending)
            self._pending, self._pending_bytes = [], 0


def _contiguous_bits(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy that is bit-exact for every dtype, incl. ones torch cannot copy itself."""
    try:
        return t.contiguous()
    except (RuntimeError, NotImplementedError):  # sub-byte dtypes (uint1..7) have no copy kernel
        return bits_view(t).contiguous().view(t.dtype)


class PayloadSizeError(DataError):
    """A tensor record's `stored_bytes` disagrees with what its chunks actually hold."""

    exit_code = 96


def read_payload(store: BlobStore, rec: TensorRecord) -> bytearray:
    """The concatenated, verified payload of one tensor record.

    The buffer is sized by the chunks' stored lengths, checked against the
    record before anything is allocated: a snapshot claiming 3 GB for a
    1 kB chunk is an error, not a 3 GB allocation.
    """
    held = sum(store.size(oid) for oid in rec.chunks)
    if held != rec.stored_bytes:
        raise PayloadSizeError(f"tensor {rec.name!r}: chunks hold {held} bytes, "
                               f"snapshot says {rec.stored_bytes}")
    buf = bytearray(held)
    view = memoryview(buf)
    off = 0
    for oid in rec.chunks:
        off += store.get_into(oid, view[off:])
    if off != held:  # get_into verifies each chunk's id, so this only trips on a racing writer
        raise PayloadSizeError(f"tensor {rec.name!r}: chunks hold {off} bytes, snapshot says {held}")
    return buf


def read_payload_head(store: BlobStore, rec: TensorRecord, n: int) -> bytes:
    """The first `n` bytes of a record's payload (all of it when shorter), from as few of its
    chunks as cover them, each verified against its id."""
    if n > rec.stored_bytes:
        raise PayloadSizeError(f"tensor {rec.name!r}: {n} bytes wanted of a {rec.stored_bytes}-byte payload")
    got: list[bytes] = []
    have = 0
    for oid in rec.chunks:
        if have >= n:
            break
        got.append(store.get(oid))
        have += len(got[-1])
    if have < n:
        raise PayloadSizeError(f"tensor {rec.name!r}: chunks hold {have} bytes, snapshot says "
                               f"{rec.stored_bytes}")
    return got[0] if len(got) == 1 else b"".join(got)


def read_tensor(store: BlobStore, rec: TensorRecord) -> torch.Tensor:
    """Decode one tensor of a snapshot (lossless codecs; lossy ones go through their chain reader)."""
    codec = tensor_codec(rec.codec)  # a quantized record is its chain reader's, never this
    return codec.decode(rec.meta, read_payload(store, rec), parse_dtype(rec.dtype), tuple(rec.shape))
