"""Zip checkpoints (torch.save's format) loaded as validated slices of one memory map.

Each tensor's storage is a slice of one map of the file.  A slice trusts the zip and the
pickle, so before a record becomes a storage `_TorchZip` checks it against what the pickle
asks for (see there): anything torch.save would not have written is a
`CorruptCheckpointError` naming the record, never bytes of the surrounding zip read as
tensor values.  Every record read is also checked against the CRC-32 the central directory
gives it, as its bytes are read (torch itself never checks them), so a bit-rotted file is a
`CorruptCheckpointError` too.  Unpickling is torch's weights-only unpickler; `mvc.io.files`
maps its refusals to `UnsafeCheckpointError`.
"""
from __future__ import annotations

import io
import itertools
import os
import pickle
import re
import struct
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, cast

import torch

from mvc.dtypes import dtype_name
from mvc.io.checkpoint_errors import CheckpointFileError, CorruptCheckpointError

#: torch's own test for its zip format: the first local file header.
LOCAL_MAGIC = b"PK\x03\x04"
# torch.save pads every record's data to this boundary unless the file's .storage_alignment says otherwise.
_DEFAULT_STORAGE_ALIGNMENT = 64
_LOCAL_HEADER = struct.Struct("<4s4xH12x4xHH")  # signature, method, name length, extra length (30 bytes)
# Metadata records mvc itself reads; every other record that is not a storage is CRC-checked and dropped.
_METADATA = ("data.pkl", ".storage_alignment", "byteorder", "constants.pkl")
_CHUNK = 1 << 20
#: Check each record's CRC-32 as it is read.  Off only for benchmarks/bench_pt_crc.py, which times the check.
_VERIFY_CRC = True
# A storage longer than this is checksummed in pieces this long on mvc's thread pool, the pieces'
# CRCs then combined: zlib's crc32 runs at a few GB/s per core, as slow as torch.load's copy.
_CRC_PIECE = 8 << 20
_CRC_POLY = 0xEDB88320  # CRC-32's polynomial, bit-reversed as zlib keeps it


def short_error(exc: BaseException) -> str:
    """First sentence of an exception message, without torch's terminal escapes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    line = text.splitlines()[0].strip() if text else ""
    if len(line) > 120 and ". " in line:
        line = line.split(". ", 1)[0]
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def _gf2_multiply(a: int, b: int) -> int:
    """a * b modulo CRC-32's polynomial, both bit-reversed (zlib's multmodp)."""
    m, product = 1 << 31, 0
    while True:
        if a & m:
            product ^= b
            if not a & (m - 1):
                return product
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


_X_POW_2K = [1 << 30]  # x^(2^k) modulo the polynomial, for k = 0..31
for _ in range(31):
    _X_POW_2K.append(_gf2_multiply(_X_POW_2K[-1], _X_POW_2K[-1]))


def _x_pow_8n(n: int) -> int:
    """x^(8n) modulo the polynomial: what moves a CRC-32 past n more bytes (zlib's x2nmodp)."""
    power, k = 1 << 31, 3
    while n:
        if n & 1:
            power = _gf2_multiply(_X_POW_2K[k & 31], power)
        n >>= 1
        k += 1
    return power


def parallel_crc32(buffer: Any) -> int:
    """``zlib.crc32(buffer)`` of a contiguous uint8 numpy array, its pieces checksummed in parallel."""
    if len(buffer) <= _CRC_PIECE:
        return zlib.crc32(buffer)
    from mvc.native.parallel import pmap  # the shared pool; zlib releases the GIL over large buffers

    pieces = [buffer[i:i + _CRC_PIECE] for i in range(0, len(buffer), _CRC_PIECE)]
    crcs = pmap(zlib.crc32, pieces)
    crc, shift = crcs[0], _x_pow_8n(_CRC_PIECE)
    for piece_crc in crcs[1:-1]:
        crc = _gf2_multiply(shift, crc) ^ piece_crc  # zlib's crc32_combine
    return _gf2_multiply(_x_pow_8n(len(pieces[-1])), crc) ^ crcs[-1]


class WeightsOnlyRefusal(pickle.UnpicklingError):
    """torch's weights-only unpickler refused the pickle (called directly, so without torch.load's wording)."""


class _Record(NamedTuple):
    """One zip entry: its name, where its local header and its data start, its sizes, and its CRC-32."""

    name: str
    header: int
    start: int
    stored: int
    size: int
    method: int
    crc: int


def load_torch_zip(target: Path) -> Any:
    """Load a zip checkpoint with every storage a validated slice of one memory map of the file."""
    try:
        # Private: where torch.load(weights_only=True) keeps its unpickler and zip reader.
        from torch import _weights_only_unpickler as wou

        unpickler_class, reader_class = wou.Unpickler, torch._C.PyTorchFileReader
    except (ImportError, AttributeError):
        # torch moved its internals: its copying reader still refuses records of the wrong size,
        # but checks no CRC, so zipfile reads (and checks) every record first.
        _check_every_crc(target)
        return torch.load(target, weights_only=True, map_location="cpu")
    archive = _TorchZip(target, reader_class)
    unpickler = unpickler_class(io.BytesIO(archive.read("data.pkl")), encoding="utf-8")
    # pickle's documented hook is an instance attribute (torch.load assigns it the same way);
    # torch's stubs declare it a method, hence the targeted ignore.
    unpickler.persistent_load = archive.storage  # type: ignore[method-assign]
    tls = getattr(torch.serialization, "_serialization_tls", None)
    if tls is not None:
        tls.map_location = "cpu"  # read by the rebuild functions of wrapper subclasses, as under torch.load
    try:
        result = unpickler.load()
        validate = getattr(torch._utils, "_validate_loaded_sparse_tensors", None)
        if validate is not None:
            validate()  # what torch.load does after unpickling (sparse tensors, when torch's checks are on)
    except pickle.UnpicklingError as exc:
        raise WeightsOnlyRefusal(str(exc)) from None
    except (CheckpointFileError, MemoryError):
        raise
    except Exception as exc:
        if archive.last_record is None:
            raise
        reason = short_error(exc)
        if "not resizable" in reason:  # set_ refusing to grow the fixed-size slice
            reason = "its storage offset, sizes or strides reach past the end of the record"
        raise CorruptCheckpointError(
            f"{target}: bad tensor on storage record {archive.last_record}: {reason}"
        ) from None
    finally:
        if tls is not None:
            tls.map_location = None
    return result


class _TorchZip:
    """The layout of a torch zip checkpoint, checked before any record becomes a tensor storage.

    The zip structure is read with `zipfile` and every entry's local header
    is read too: each entry's header and data lie inside the file, before the
    central directory, overlapping no other entry, with a local header that
    agrees with the central directory.  A storage record additionally must be
    stored uncompressed, exactly ``numel * element size`` bytes long for the
    storage id the pickle gives (so neither a short record nor a patched
    numel or dtype reaches bytes outside it), aligned as the file declares
    (torch.save pads to 64 bytes) and to its element size, and read with one
    dtype and numel however many tensors view it.  Tensor offsets, sizes and
    strides are then checked by torch when it sets each tensor on its
    storage: the storage is a fixed-size slice of the map, so a tensor that
    reaches past its record cannot grow it and is refused.
    """

    def __init__(self, target: Path, reader_class: Any) -> None:
        self.target = target
        try:
            with open(target, "rb") as handle:
                stat = os.fstat(handle.fileno())
                self.file_size = stat.st_size
                self._identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
                with zipfile.ZipFile(handle) as archive:
                    infos = archive.infolist()
                    self._entries = self._read_entries(handle, infos)
                    self.prefix = infos[0].filename.split("/", 1)[0] + "/" if infos else ""
                    self._check_disjoint(archive.start_dir)
                    self._small = self._read_metadata(handle, archive)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, struct.error) as exc:
            raise CorruptCheckpointError(f"{target}: truncated or not a zip archive ({short_error(exc)})") from None
        if "data.pkl" not in self._small:
            raise CorruptCheckpointError(f"{target}: a zip archive without data.pkl, not a torch checkpoint")
        if "constants.pkl" in self._small:
            raise CorruptCheckpointError(
                f"{target}: a TorchScript archive, not a checkpoint (torch.load(weights_only=True) refuses it)"
            )
        self.alignment = self._alignment()
        order = self._small.get("byteorder", b"little")
        if order not in (b"little", b"big"):
            raise CorruptCheckpointError(f"{target}: unknown byteorder {order[:16]!r} in {self.prefix}byteorder")
        self.swap = order.decode() != sys.byteorder
        try:
            # torch's reader must accept the archive (its version too) and find each record where we do.
            self._reader = reader_class(str(target))
        except (RuntimeError, ValueError, OSError) as exc:
            raise CorruptCheckpointError(f"{target}: torch cannot read this zip archive ({short_error(exc)})") from None
        self._mapped: torch.UntypedStorage | None = None
        self._loaded: dict[str, tuple[torch.storage.TypedStorage, torch.dtype, int]] = {}
        self.last_record: str | None = None  # for errors raised while rebuilding the tensor that follows

    def _read_entries(self, handle: BinaryIO, infos: list[zipfile.ZipInfo]) -> dict[str, _Record]:
        entries: dict[str, _Record] = {}
        for info in infos:
            name = info.filename
            if name in entries:
                raise CorruptCheckpointError(f"{self.target}: duplicate zip entry {name}")
            handle.seek(info.header_offset)
            head = handle.read(_LOCAL_HEADER.size)
            if len(head) < _LOCAL_HEADER.size:
                raise CorruptCheckpointError(f"{self.target}: zip entry {name}: local header past the end of the file")
            magic, method, name_len, extra_len = _LOCAL_HEADER.unpack(head)
            local_name = handle.read(name_len)
            encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
            if magic != LOCAL_MAGIC or local_name.decode(encoding, "replace") != info.orig_filename:
                raise CorruptCheckpointError(
                    f"{self.target}: zip entry {name}: the central directory points at no local header for it"
                )
            if method != info.compress_type:
                raise CorruptCheckpointError(
                    f"{self.target}: zip entry {name}: local header and central directory disagree on compression"
                )
            start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
            entries[name] = _Record(name, info.header_offset, start, info.compress_size, info.file_size, method,
                                    info.CRC)
        return entries

    def _read_metadata(self, handle: BinaryIO, archive: zipfile.ZipFile) -> dict[str, bytes]:
        """Read every record that is not a storage, CRC-checked; keep the ones mvc uses (`_METADATA`).

        torch's own reader reads some of the others (``version``), so they are checked too; they
        are a few bytes each in a torch.save file, and any size is read in bounded chunks.
        """
        kept: dict[str, bytes] = {}
        for name, record in self._entries.items():
            if name.startswith(self.prefix + "data/"):
                continue  # checked as each becomes a storage (`storage`)
            short = name[len(self.prefix):]
            keep = short in _METADATA
            parts = []
            if record.method == zipfile.ZIP_STORED:
                handle.seek(record.start)
                crc, left = 0, record.stored
                while left:
                    chunk = handle.read(min(_CHUNK, left))
                    if not chunk:
                        raise EOFError(f"zip entry {name} runs past the end of the file")
                    crc, left = zlib.crc32(chunk, crc), left - len(chunk)
                    parts += [chunk] if keep else []
                self._check_crc(record, crc)
            else:
                # Not what torch.save writes: zipfile inflates it and checks its CRC-32 itself.
                try:
                    with archive.open(name) as stream:
                        parts = [chunk for chunk in iter(lambda: stream.read(_CHUNK), b"") if keep]
                except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                    raise CorruptCheckpointError(f"{self.target}: zip entry {name} is damaged ({exc})") from None
            if keep:
                kept[short] = b"".join(parts)
        return kept

    def _check_crc(self, record: _Record, crc: int) -> None:
        if _VERIFY_CRC and crc != record.crc:
            raise CorruptCheckpointError(
                f"{self.target}: zip entry {record.name} fails its CRC-32 check (its bytes give {crc:#010x}, "
                f"the central directory says {record.crc:#010x}): the file is damaged"
            )

    def _check_disjoint(self, central: int) -> None:
        """Every entry (header and data) lies before the central directory and overlaps no other one."""
        spans = sorted(self._entries.values(), key=lambda e: e.header)
        for entry, after in itertools.pairwise(spans):
            if entry.start + entry.stored > after.header:
                raise CorruptCheckpointError(
                    f"{self.target}: zip entry {entry.name} runs into entry {after.name} "
                    f"({entry.stored} bytes from offset {entry.start}, next header at {after.header})"
                )
        if spans and spans[-1].start + spans[-1].stored > min(central, self.file_size):
            last = spans[-1]
            raise CorruptCheckpointError(
                f"{self.target}: zip entry {last.name} runs into the central directory "
                f"({last.stored} bytes from offset {last.start}, central directory at {central})"
            )

    def _alignment(self) -> int:
        raw = self._small.get(".storage_alignment")
        if raw is None:
            return _DEFAULT_STORAGE_ALIGNMENT
        try:
            value = int(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            value = 0
        if value <= 0 or value & (value - 1) or value > 1 << 20:
            raise CorruptCheckpointError(f"{self.target}: bad {self.prefix}.storage_alignment {raw[:16]!r}")
        return value

    def read(self, name: str) -> bytes:
        """The bytes of a small metadata entry (data.pkl, byteorder, ...) read at open time."""
        return self._small[name]

    def storage(self, pid: Any) -> torch.storage.TypedStorage:
        """The unpickler's persistent_load: a validated storage for ``('storage', type, key, location, numel)``."""
        if type(pid) is not tuple or len(pid) != 5:
            raise CorruptCheckpointError(f"{self.target}: malformed storage id in data.pkl ({type(pid).__name__})")
        _tag, storage_type, key, _location, numel = pid
        if isinstance(key, bytes):
            key = key.decode("ascii", "replace")
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else getattr(storage_type, "dtype", None)
        if type(key) is not str or not isinstance(dtype, torch.dtype) or type(numel) is not int or numel < 0:
            raise CorruptCheckpointError(f"{self.target}: malformed storage id in data.pkl ({pid[1:]!r:.80})")
        name = self.last_record = f"{self.prefix}data/{key}"
        if key in self._loaded:
            storage, first_dtype, first_numel = self._loaded[key]
            if (first_dtype, first_numel) != (dtype, numel):
                raise CorruptCheckpointError(
                    f"{self.target}: storage record {name} is read as {numel} x {dtype_name(dtype)} and as "
                    f"{first_numel} x {dtype_name(first_dtype)}; torch.save writes one dtype per storage"
                )
            return storage
        data = self._validated_record(name, dtype, numel)
        if self._mapped is None:
            stat = os.stat(self.target)
            if (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns) != self._identity:
                raise CorruptCheckpointError(f"{self.target}: the file changed while it was being read")
            # from_file is typed on _StorageBase (returns a union); on UntypedStorage it returns one.
            self._mapped = cast(torch.UntypedStorage,
                                torch.UntypedStorage.from_file(str(self.target), False, self.file_size))
        raw = self._mapped[data.start:data.start + data.size]
        if _VERIFY_CRC:
            # Over a uint8 view of the map itself: no copy, and the pages it faults in are the ones
            # the caller reads next.  Before the byteswap, which rewrites them.
            self._check_crc(data, parallel_crc32(torch.empty(0, dtype=torch.uint8).set_(raw).numpy()))
        if self.swap and dtype.itemsize > 1:
            raw.byteswap(dtype)  # the map is private (copy-on-write): the file is untouched
        storage = torch.storage.TypedStorage(wrap_storage=raw, dtype=dtype, _internal=True)
        self._loaded[key] = (storage, dtype, numel)
        return storage

    def _validated_record(self, name: str, dtype: torch.dtype, numel: int) -> _Record:
        record = self._entries.get(name)
        where = f"{self.target}: storage record {name}"
        if record is None:
            raise CorruptCheckpointError(f"{where} is missing from the archive")
        if record.method != zipfile.ZIP_STORED or record.stored != record.size:
            raise CorruptCheckpointError(
                f"{where} is compressed (zip method {record.method}); torch.save stores storages uncompressed"
            )
        need = numel * dtype.itemsize
        if record.size != need:
            raise CorruptCheckpointError(
                f"{where} is {record.size} bytes, but data.pkl reads it as {numel} x {dtype_name(dtype)} "
                f"({need} bytes)"
            )
        if record.size and (record.start % self.alignment or record.start % dtype.itemsize):
            raise CorruptCheckpointError(
                f"{where} starts at offset {record.start}, not aligned to {self.alignment} bytes as torch.save writes"
            )
        try:
            torch_offset = self._reader.get_record_offset(name[len(self.prefix):])
        except (RuntimeError, ValueError) as exc:
            raise CorruptCheckpointError(f"{where}: torch cannot read it ({short_error(exc)})") from None
        if torch_offset != record.start:
            raise CorruptCheckpointError(
                f"{where}: torch finds it at offset {torch_offset}, the zip directory at {record.start}"
            )
        return record


def _check_every_crc(target: Path) -> None:
    """Read every record with zipfile, which checks its CRC-32 (the fallback path's only check of it)."""
    try:
        with zipfile.ZipFile(target) as archive:
            for info in archive.infolist():
                with archive.open(info) as stream:
                    while stream.read(_CHUNK):
                        pass
    except zipfile.BadZipFile as exc:
        raise CorruptCheckpointError(f"{target}: the zip archive is damaged ({exc})") from None
    except (zipfile.LargeZipFile, OSError, EOFError, ValueError, struct.error, zlib.error) as exc:
        raise CorruptCheckpointError(f"{target}: truncated or not a zip archive ({short_error(exc)})") from None
