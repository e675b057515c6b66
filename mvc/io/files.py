"""Checkpoint files in and out: torch ``.pt/.pth/.ckpt/.bin`` and ``.safetensors``.

Checkpoint files are untrusted input.  torch files are unpickled only by
torch's weights-only unpickler (what ``torch.load(weights_only=True)`` uses),
so a pickle that needs any other global is refused before anything runs
(`UnsafeCheckpointError` names the global, and how to allow it); numpy arrays
and scalars are additionally allowed because RNG states carry them, and so are the
globals a caller trusts (`load_checkpoint(..., safe_globals=...)`; the CLI passes
the repository's `checkpoint.safe_globals`, `mvc.state.safe_globals`).  Every
failure is one line naming the file, with its own exit code.

Zip checkpoints are memory-mapped, not copied, and every record is validated
before it becomes a storage (`mvc.io.torch_zip`).

Writes are atomic: a temporary file in the target's directory is written,
flushed and fsync-ed, then renamed over the target.
"""
from __future__ import annotations

import os
import pickle
import pickletools
import re
import secrets
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path
from collections.abc import Iterable
from typing import IO, Any, cast

import torch

from mvc.errors import DiskFullError, UsageError, is_disk_full
from mvc.progress import Progress, phase
from mvc.io.checkpoint_errors import (  # noqa: F401  (re-exported: callers import them from here)
    CheckpointFileError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    UnsupportedCheckpointError,
)
from mvc.io.torch_zip import LOCAL_MAGIC, WeightsOnlyRefusal, load_torch_zip, short_error
from mvc.state.safe_globals import allow_hint, allowing

TORCH_SUFFIXES = frozenset({".pt", ".pth", ".ckpt", ".bin"})
SAFETENSORS_SUFFIXES = frozenset({".safetensors"})
FORMATS = ("pt", "safetensors")
#: Key of a safetensors file's header metadata in the loaded state's ``_metadata`` (see `safetensors_metadata`).
SAFETENSORS_METADATA_KEY = "__safetensors__"

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
# torch's legacy (non-zip) format opens with this pickled magic number.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"
_MAX_PICKLES_SCANNED = 8




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


def load_checkpoint(path: str | os.PathLike, *, safe_globals: Iterable[Any] = ()) -> Any:
    """Load a checkpoint file safely into CPU memory (memory-mapped where possible).

    `safe_globals`: globals the weights-only unpickler may also build for this load --
    ``module.qualname`` names (as the config key ``checkpoint.safe_globals`` holds them)
    or the classes themselves, e.g. ``["argparse.Namespace"]``. Trusted classes only:
    unpickling one runs its construction. `UnknownSafeGlobalError` (exit 111) for a name
    that does not resolve.

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
    with allowing(safe_globals):
        return _load_torch(target)


def save_checkpoint(state: Any, path: str | os.PathLike, format: str | None = None, *,
                    progress: Progress | None = None) -> None:
    """Write `state` to `path` atomically as ``"pt"`` (torch.save) or ``"safetensors"``.

    `progress` hears of the bytes as they are written (a ``.pt`` file; a ``.safetensors``
    one at the end), in one "writing" phase whose total is the state's tensor bytes.

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
        with phase(progress, f"writing {target.name}", total_bytes=_tensor_bytes(state)) as p:
            if tensors is None:
                # os.open with 0o666 lets the umask pick the mode, as for a plain open().
                with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as out:
                    torch.save(state, cast(IO[bytes], _Counted(out, p)) if progress is not None else out)
                    out.flush()
                    os.fsync(out.fileno())
            else:
                from safetensors.torch import save_file

                save_file(tensors, str(tmp), metadata=header_metadata)
                _fsync_path(tmp, os.O_RDONLY)
                p.advance(tmp.stat().st_size, 1)
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


class _Counted:
    """A binary file that tells `progress` of every byte written through it (torch.save
    writes a zip through any object with `write`)."""

    def __init__(self, out: IO[bytes], progress: Progress) -> None:
        self._out = out
        self._progress = progress

    def write(self, data: Any) -> int:
        n = self._out.write(data)
        self._progress.advance(n if n is not None else memoryview(data).nbytes)
        return n if n is not None else memoryview(data).nbytes

    def flush(self) -> None:
        self._out.flush()


def _tensor_bytes(state: Any) -> int:
    """The bytes of the distinct tensor storages in `state` (containers walked, nothing
    else): what writing it moves, near enough for a progress total."""
    seen: set[tuple[str, int]] = set()
    total = 0
    stack = [state]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            key = (str(value.device), storage.data_ptr())
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend(value)
    return total


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
    with allowing(_numpy_safe_globals()), warnings.catch_warnings():
        # Raw pickles (a refused payload, usually) make torch warn about the protocol; the error says it all.
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        try:
            if _read_head(target, 4) == LOCAL_MAGIC:  # torch's own test for its zip format
                return load_torch_zip(target)
            # Legacy (pre-zip) files: torch copies each storage out of the stream and checks its size.
            return torch.load(target, weights_only=True, map_location="cpu")
        except (CheckpointFileError, MemoryError):
            raise
        except pickle.UnpicklingError as exc:
            refusal = isinstance(exc, WeightsOnlyRefusal) or "Weights only load failed" in str(exc)
            unsafe = _forbidden_globals(target, str(exc)) if refusal else []
            if unsafe:
                raise UnsafeCheckpointError(
                    f"{target}: refused: the pickle needs {', '.join(unsafe)}, which torch.load(weights_only=True) "
                    f"does not allow (nothing was executed); {allow_hint(unsafe)}"
                ) from None
            proto = _pickle_protocol(target)
            op = re.search(r"Unsupported operand (\d+)", str(exc))
            # an opcode protocols 4 and 5 added (SHORT_BINUNICODE .. READONLY_BUFFER), in a pickle
            # that says it is one: a valid file, not damage
            if refusal and proto is not None and proto > 3 and op and 0x8C <= int(op[1]) <= 0x98:
                raise UnsupportedCheckpointError(
                    f"{target}: written with pickle protocol {proto} (torch.save(..., "
                    f"pickle_protocol={proto})), which torch's weights-only loader does not read "
                    "(neither does torch.load(weights_only=True)); re-save it with the default "
                    "protocol, from a process that trusts the file") from None
            raise CorruptCheckpointError(f"{target}: not a valid torch checkpoint ({short_error(exc)})") from None
        except Exception as exc:  # untrusted bytes fail in many ways inside torch/pickle
            raise CorruptCheckpointError(f"{target}: truncated or not a torch checkpoint ({short_error(exc)})") from None


def _pickle_protocol(target: Path) -> int | None:
    """The protocol of the file's (first) pickle, from its PROTO opcode: a zip checkpoint's
    ``data.pkl`` or a legacy file's first pickle; None if it has none or cannot be read."""
    try:
        with open(target, "rb") as handle:
            if zipfile.is_zipfile(handle):
                with zipfile.ZipFile(handle) as archive:
                    name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                    if name is None:
                        return None
                    with archive.open(name) as member:
                        head = member.read(2)
            else:
                handle.seek(0)
                head = handle.read(2)
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    return head[1] if len(head) == 2 and head[0] == 0x80 else None


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
        raise CorruptCheckpointError(f"{target}: truncated or not a safetensors file ({short_error(exc)})") from None
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

