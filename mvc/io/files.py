"""Checkpoint files in and out: torch ``.pt/.pth/.ckpt/.bin`` and ``.safetensors``.

Checkpoint files are untrusted input.  torch files are unpickled only by
torch's weights-only unpickler (what ``torch.load(weights_only=True)`` uses),
so a pickle that needs any other global is refused before anything runs
(`UnsafeCheckpointError` names the global); numpy arrays and scalars are
additionally allowed because RNG states carry them.  Every failure is one line
naming the file, with its own exit code.

Zip checkpoints are memory-mapped, not copied: each tensor's storage is a
slice of one map of the file.  A slice trusts the zip and the pickle, so
before a record becomes a storage `_TorchZip` checks it against what the
pickle asks for (see there); anything torch.save would not have written is a
`CorruptCheckpointError` naming the record, never bytes of the surrounding
zip read as tensor values.

Writes are atomic: a temporary file in the target's directory is written,
flushed and fsync-ed, then renamed over the target.
"""
from __future__ import annotations

import io
import itertools
import os
import pickle
import pickletools
import re
import secrets
import struct
import sys
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, BinaryIO, NamedTuple, cast

import torch

from mvc.dtypes import dtype_name
from mvc.errors import DiskFullError, MvcError, UsageError, is_disk_full

TORCH_SUFFIXES = frozenset({".pt", ".pth", ".ckpt", ".bin"})
SAFETENSORS_SUFFIXES = frozenset({".safetensors"})
FORMATS = ("pt", "safetensors")
#: Key of a safetensors file's header metadata in the loaded state's ``_metadata`` (see `safetensors_metadata`).
SAFETENSORS_METADATA_KEY = "__safetensors__"

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
# torch's legacy (non-zip) format opens with this pickled magic number.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"
_MAX_PICKLES_SCANNED = 8
# torch.save pads every record's data to this boundary unless the file's .storage_alignment says otherwise.
_DEFAULT_STORAGE_ALIGNMENT = 64
_LOCAL_MAGIC = _ZIP_MAGIC[0]
_LOCAL_HEADER = struct.Struct("<4s4xH12x4xHH")  # signature, method, name length, extra length (30 bytes)


class CheckpointFileError(MvcError):
    """Base of errors about a checkpoint file given to mvc."""


class CheckpointNotFoundError(CheckpointFileError):
    """The checkpoint path does not exist, is a directory, or cannot be opened."""

    exit_code = 20


class CorruptCheckpointError(CheckpointFileError):
    """The file is truncated, damaged, or not a checkpoint at all."""

    exit_code = 21


class UnsafeCheckpointError(CheckpointFileError):
    """The file's pickle needs globals outside torch's weights-only allowlist (it was not run)."""

    exit_code = 22


class UnsupportedCheckpointError(CheckpointFileError):
    """The file's extension or format is not one mvc reads or writes."""

    exit_code = 23


def detect_format(path: str | os.PathLike) -> str:
    """Return ``"pt"`` or ``"safetensors"`` for an existing checkpoint file.

    The extension decides; an unknown extension is sniffed from the first
    bytes (zip or legacy torch magic, safetensors header).
    """
    target = _existing_file(path)
    suffix = target.suffix.lower()
    if suffix in TORCH_SUFFIXES:
        return "pt"
    if suffix in SAFETENSORS_SUFFIXES:
        return "safetensors"
    head = _read_head(target, 16)
    if head.startswith(_ZIP_MAGIC) or head.startswith(_LEGACY_MAGIC):
        return "pt"
    if len(head) >= 9 and head[8:9] == b"{":
        header_len = int.from_bytes(head[:8], "little")
        if 0 < header_len <= target.stat().st_size - 8:
            return "safetensors"
    raise UnsupportedCheckpointError(
        f"{target}: unknown checkpoint format (expected .pt, .pth, .ckpt, .bin or .safetensors)"
    )


def load_checkpoint(path: str | os.PathLike) -> Any:
    """Load a checkpoint file safely into CPU memory (memory-mapped where possible).

    A ``.safetensors`` file loads as a dict of its tensors; when its header has
    ``__metadata__`` (e.g. ``{'format': 'pt'}``) it is an OrderedDict carrying that map in
    ``_metadata`` (see `safetensors_metadata`), which commits keep and checkouts write back.

    Raises `CheckpointNotFoundError`, `CorruptCheckpointError`,
    `UnsafeCheckpointError` or `UnsupportedCheckpointError`.
    """
    target = _existing_file(path)
    _read_head(target, 1)  # surfaces permission problems as "cannot be read", before any parser runs
    if detect_format(target) == "safetensors":
        return _load_safetensors(target)
    return _load_torch(target)


def save_checkpoint(state: Any, path: str | os.PathLike, format: str | None = None) -> None:
    """Write `state` to `path` atomically as ``"pt"`` (torch.save) or ``"safetensors"``.

    `format` defaults from the extension.  safetensors holds only a flat dict
    of str -> tensor and cannot express shared storage: tensors that share
    memory are written as independent copies (use ``"pt"`` to keep sharing).
    A safetensors file gets the header metadata the state carries (`safetensors_metadata`).
    """
    target = Path(os.fspath(path))
    fmt = _save_format(target, format)
    if target.is_dir():
        raise UsageError(f"{target}: is a directory; expected a checkpoint file path")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"{parent}: directory does not exist")
    tensors = _safetensors_payload(state, target) if fmt == "safetensors" else None
    header_metadata = safetensors_metadata(state) if fmt == "safetensors" else None
    tmp = parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    try:
        if tensors is None:
            # os.open with 0o666 lets the umask pick the mode, as for a plain open().
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as out:
                torch.save(state, out)
                out.flush()
                os.fsync(out.fileno())
        else:
            from safetensors.torch import save_file

            save_file(tensors, str(tmp), metadata=header_metadata)
            _fsync_path(tmp, os.O_RDONLY)
        os.replace(tmp, target)
    except BaseException as exc:
        # Asked before the partial file is removed: torch's zip writer reports ENOSPC as
        # a RuntimeError, and only a nearly empty filesystem tells it apart from a bug.
        full = isinstance(exc, (OSError, RuntimeError)) and is_disk_full(exc, parent)
        tmp.unlink(missing_ok=True)
        if full:
            raise DiskFullError(f"no space left on device to write {target}; "
                                "it was left as it was") from exc
        raise
    _fsync_path(parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


# --------------------------------------------------------------------------- helpers


def _existing_file(path: str | os.PathLike) -> Path:
    target = Path(os.fspath(path)).expanduser()
    if not target.exists():
        raise CheckpointNotFoundError(f"{target}: no such file")
    if target.is_dir():
        raise CheckpointNotFoundError(f"{target}: is a directory; expected a checkpoint file")
    if not target.is_file():
        raise CheckpointNotFoundError(f"{target}: not a regular file; expected a checkpoint file")
    return target


def _read_head(target: Path, size: int) -> bytes:
    try:
        with open(target, "rb") as handle:
            return handle.read(size)
    except OSError as exc:
        raise CheckpointNotFoundError(f"{target}: cannot be read ({exc.strerror or exc})") from None


def _short(exc: BaseException) -> str:
    """First sentence of an exception message, without torch's terminal escapes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    line = text.splitlines()[0].strip() if text else ""
    if len(line) > 120 and ". " in line:
        line = line.split(". ", 1)[0]
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def _numpy_safe_globals() -> list:
    """numpy array/scalar reconstructors: they rebuild plain data and run no user code."""
    try:
        import numpy as np
    except ImportError:
        return []
    found = [np.ndarray, np.dtype, np.zeros(1).__reduce__()[0], np.float64(0).__reduce__()[0]]
    found += sorted({type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"}, key=str)
    return found


def _load_torch(target: Path) -> Any:
    with torch.serialization.safe_globals(_numpy_safe_globals()), warnings.catch_warnings():
        # Raw pickles (a refused payload, usually) make torch warn about the protocol; the error says it all.
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        try:
            if _read_head(target, 4) == _LOCAL_MAGIC:  # torch's own test for its zip format
                return _load_torch_zip(target)
            # Legacy (pre-zip) files: torch copies each storage out of the stream and checks its size.
            return torch.load(target, weights_only=True, map_location="cpu")
        except (CheckpointFileError, MemoryError):
            raise
        except pickle.UnpicklingError as exc:
            refusal = isinstance(exc, _WeightsOnlyRefusal) or "Weights only load failed" in str(exc)
            unsafe = _forbidden_globals(target, str(exc)) if refusal else []
            if unsafe:
                raise UnsafeCheckpointError(
                    f"{target}: refused: the pickle needs {', '.join(unsafe)}, which torch.load(weights_only=True) "
                    "does not allow (nothing was executed)"
                ) from None
            raise CorruptCheckpointError(f"{target}: not a valid torch checkpoint ({_short(exc)})") from None
        except Exception as exc:  # untrusted bytes fail in many ways inside torch/pickle
            raise CorruptCheckpointError(f"{target}: truncated or not a torch checkpoint ({_short(exc)})") from None


class _WeightsOnlyRefusal(pickle.UnpicklingError):
    """torch's weights-only unpickler refused the pickle (called directly, so without torch.load's wording)."""


class _Record(NamedTuple):
    """One zip entry: its name, where its local header and its data start, and its sizes."""

    name: str
    header: int
    start: int
    stored: int
    size: int
    method: int


def _load_torch_zip(target: Path) -> Any:
    """Load a zip checkpoint with every storage a validated slice of one memory map of the file."""
    try:
        # Private: where torch.load(weights_only=True) keeps its unpickler and zip reader.
        from torch import _weights_only_unpickler as wou

        unpickler_class, reader_class = wou.Unpickler, torch._C.PyTorchFileReader
    except (ImportError, AttributeError):
        # torch moved its internals: its copying reader still refuses records of the wrong size.
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
        raise _WeightsOnlyRefusal(str(exc)) from None
    except (CheckpointFileError, MemoryError):
        raise
    except Exception as exc:
        if archive.last_record is None:
            raise
        reason = _short(exc)
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
                    central = archive.start_dir
                    self._entries = self._read_entries(handle, infos)
                    self.prefix = infos[0].filename.split("/", 1)[0] + "/" if infos else ""
                    self._small = {name: archive.read(self.prefix + name)
                                   for name in ("data.pkl", ".storage_alignment", "byteorder", "constants.pkl")
                                   if self.prefix + name in self._entries}
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, struct.error) as exc:
            raise CorruptCheckpointError(f"{target}: truncated or not a zip archive ({_short(exc)})") from None
        self._check_disjoint(central)
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
            raise CorruptCheckpointError(f"{target}: torch cannot read this zip archive ({_short(exc)})") from None
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
            if magic != _LOCAL_MAGIC or local_name.decode(encoding, "replace") != info.orig_filename:
                raise CorruptCheckpointError(
                    f"{self.target}: zip entry {name}: the central directory points at no local header for it"
                )
            if method != info.compress_type:
                raise CorruptCheckpointError(
                    f"{self.target}: zip entry {name}: local header and central directory disagree on compression"
                )
            start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
            entries[name] = _Record(name, info.header_offset, start, info.compress_size, info.file_size, method)
        return entries

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
            raise CorruptCheckpointError(f"{where}: torch cannot read it ({_short(exc)})") from None
        if torch_offset != record.start:
            raise CorruptCheckpointError(
                f"{where}: torch finds it at offset {torch_offset}, the zip directory at {record.start}"
            )
        return record


def _forbidden_globals(target: Path, message: str) -> list[str]:
    """Names of the disallowed globals behind a weights-only refusal (`message`), or []."""
    named = re.findall(r"GLOBAL ([\w.]+)", message)
    if named:
        return list(dict.fromkeys(named))
    try:
        allowed = _allowed_globals()
        return [name for name in _scan_globals(target) if name not in allowed]
    except Exception:
        return []


def _allowed_globals() -> set[str]:
    from torch import _weights_only_unpickler as wou  # private, hence the caller's try

    names = set(wou._get_allowed_globals()) | set(wou._get_user_allowed_globals())
    return names | {f"{g.__module__}.{g.__name__}" for g in _numpy_safe_globals()}


def _scan_globals(target: Path) -> list[str]:
    """Statically list the globals a torch file's pickle(s) reference, without unpickling."""
    with open(target, "rb") as handle:
        if zipfile.is_zipfile(handle):
            with zipfile.ZipFile(handle) as archive:
                member = next(n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl"))
                with archive.open(member) as pkl:
                    return _pickle_globals(pkl)
        handle.seek(0)
        return _pickle_globals(handle)


def _pickle_globals(stream: IO[bytes]) -> list[str]:
    found: list[str] = []
    for _ in range(_MAX_PICKLES_SCANNED):  # the legacy format is several pickles in a row
        memo: dict[int, Any] = {}
        recent: list[Any] = []
        try:
            for opcode, arg, _pos in pickletools.genops(stream):
                name = opcode.name
                if name == "GLOBAL":
                    found.append(str(arg).replace(" ", "."))
                elif name == "STACK_GLOBAL" and len(recent) >= 2:
                    found.append(f"{recent[-2]}.{recent[-1]}")
                if name in ("MEMOIZE",):
                    memo[len(memo)] = recent[-1] if recent else None
                elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                    if isinstance(arg, int):  # genops decodes every memo index to an int
                        memo[arg] = recent[-1] if recent else None
                elif name in ("GET", "BINGET", "LONG_BINGET"):
                    recent.append(memo.get(arg) if isinstance(arg, int) else None)
                elif isinstance(arg, str) and ("UNICODE" in name or "STRING" in name):
                    recent.append(arg)
                elif name not in ("FRAME", "PROTO"):
                    recent.append(None)
                if name == "STOP":
                    break
            else:
                break
        except Exception:
            break  # past the pickles (raw storage bytes) or damaged
    return list(dict.fromkeys(found))


def _load_safetensors(target: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(target), framework="pt", device="cpu") as f:
            tensors = f.get_tensors()
            metadata = f.metadata()
    except (SafetensorError, OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(f"{target}: truncated or not a safetensors file ({_short(exc)})") from None
    if not metadata:
        return tensors
    # The header's __metadata__ rides in the state through the one per-container side channel
    # the skeleton already stores (an OrderedDict's `_metadata`), under a key no module prefix
    # uses, so load_state_dict ignores it and save_checkpoint can write it back.
    state: OrderedDict[str, torch.Tensor] = OrderedDict(tensors)
    state._metadata = {SAFETENSORS_METADATA_KEY: dict(metadata)}  # type: ignore[attr-defined]
    return state


def _save_format(target: Path, format: str | None) -> str:
    if format is not None:
        if format not in FORMATS:
            raise UnsupportedCheckpointError(f"{target}: unknown format {format!r} (expected 'pt' or 'safetensors')")
        return format
    suffix = target.suffix.lower()
    if suffix in TORCH_SUFFIXES:
        return "pt"
    if suffix in SAFETENSORS_SUFFIXES:
        return "safetensors"
    raise UnsupportedCheckpointError(
        f"{target}: cannot tell the format from the extension; use .pt/.pth/.ckpt/.bin or .safetensors, or give a format"
    )


def safetensors_metadata(state: Any) -> dict[str, str] | None:
    """The safetensors header metadata (``__metadata__``) `state` carries, or None.

    `load_checkpoint` puts a file's metadata in ``state._metadata[SAFETENSORS_METADATA_KEY]``
    (the state is then an OrderedDict); `save_checkpoint` writes it back to ``.safetensors``.
    """
    metadata = getattr(state, "_metadata", None)
    if not isinstance(metadata, dict):
        return None
    value = metadata.get(SAFETENSORS_METADATA_KEY)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(type(k) is str and type(v) is str for k, v in value.items()):
        raise UsageError(f"_metadata[{SAFETENSORS_METADATA_KEY!r}] must map str to str, got {value!r}")
    return dict(value)


def _safetensors_payload(state: Any, target: Path) -> dict[str, torch.Tensor]:
    """The flat str -> contiguous CPU tensor dict safetensors accepts; shared memory is copied apart."""
    hint = "; use format 'pt' for nested checkpoints"
    if not isinstance(state, dict):
        raise UsageError(f"{target}: safetensors holds only a flat dict of tensors, got {type(state).__name__}{hint}")
    payload: dict[str, torch.Tensor] = {}
    seen: set[tuple[str, int]] = set()
    for key, value in state.items():
        if type(key) is not str or not isinstance(value, torch.Tensor):
            raise UsageError(
                f"{target}: safetensors holds only str -> tensor entries, got {key!r}: {type(value).__name__}{hint}"
            )
        if value.layout != torch.strided or value.is_quantized or value.is_nested:
            raise UsageError(f"{target}: safetensors cannot hold the {value.layout} tensor {key!r}{hint}")
        tensor = value.detach().cpu().contiguous()
        if tensor.untyped_storage().nbytes():
            pointer = (str(tensor.device), tensor.untyped_storage().data_ptr())
            if pointer in seen:
                tensor = tensor.clone()
            seen.add((str(tensor.device), tensor.untyped_storage().data_ptr()))
        payload[key] = tensor
    import safetensors.torch

    # safetensors keeps its writable dtypes in a private table; skip the check if it moves.
    writable = set(getattr(safetensors.torch, "_TYPES", {}).values())
    for key, tensor in payload.items():
        if writable and tensor.dtype not in writable:
            raise UsageError(f"{target}: safetensors cannot store {tensor.dtype} (tensor {key!r}){hint}")
    return payload


def _fsync_path(path: Path, flags: int) -> None:
    try:
        fd = os.open(path, flags)
    except OSError:
        return  # some platforms cannot open directories; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

