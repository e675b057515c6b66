"""The store's shared vocabulary: errors, ids, ref values, reflog entries, metadata keys.

A store holds three things, each behind its own contract (`mvc.store.contracts`):

* **objects** -- immutable byte strings addressed by the xxh3-128 hex digest of
  their content.  Every read verifies the digest, so corruption surfaces as an
  `IntegrityError` naming the object instead of garbage further up.
* **refs** -- named pointers (``HEAD``, ``refs/heads/<b>``, ``refs/tags/<t>``)
  holding either an object id or ``"ref: <name>"`` (symbolic), moved only by
  compare-and-swap (a `RefUpdate`), each move logged in the ref's reflog.
* **metadata** -- small key/values of a local store such as the repository
  format version (`FORMAT_KEY`) and the repository id (`REPO_ID_KEY`).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from mvc.errors import DataError, InternalError, MvcError, UsageError

BytesLike = bytes | bytearray | memoryview

OID_HEX_LEN = 32
_OID_RE = re.compile(r"[0-9a-f]{32}")
_HEX_PREFIX_RE = re.compile(r"[0-9a-f]{0,32}")
SYMREF_PREFIX = "ref: "
# LMDB keys are at most 511 bytes; the reflog key adds a separator and a counter.
MAX_REF_NAME_BYTES = 400
#: The newest repository format version this mvc reads and the one it writes.
SUPPORTED_FORMAT = 1
#: Metadata key of the repository format version (ASCII digits).
FORMAT_KEY = "format_version"
#: Metadata key of the repository id (32 hex digits), written when a local store is created;
#: the level cache binds its entries to it (`mvc.repo.levelcache`).
REPO_ID_KEY = "repo.id"


# --------------------------------------------------------------------- errors
class IntegrityError(DataError):
    """A stored object's content no longer matches its id (corrupt storage)."""

    exit_code = 7

    def __init__(self, oid: str, actual: str | None = None) -> None:
        self.oid = oid
        self.actual = actual
        detail = f" (content hashes to {actual})" if actual else ""
        super().__init__(f"object {oid} is corrupt{detail}")


class ObjectMissingError(DataError):
    """An object that should be in the store is not there."""

    exit_code = 8

    def __init__(self, oid: str) -> None:
        self.oid = oid
        super().__init__(f"object {oid} is missing from the store")


class FormatTooNewError(MvcError):
    """The repository was written by a newer mvc with an unknown storage format."""

    exit_code = 9

    def __init__(self, found: int, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            f"repository format version {found} is newer than this mvc supports "
            f"(up to {supported}); upgrade mvc to open it")


class LockError(MvcError):
    """The repository write lock could not be taken in time."""

    exit_code = 10


class RefConflictError(MvcError):
    """A ref did not hold the value a compare-and-swap expected."""

    exit_code = 11

    def __init__(self, name: str, expected: object, actual: str | None) -> None:
        self.name = name
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"ref {name} was changed concurrently: expected {expected!r}, found {actual!r}")


class StoreNotFoundError(MvcError):
    """There is no store at the given path."""

    exit_code = 60


class InvalidRefError(UsageError):
    """A ref name or ref value is malformed."""

    exit_code = 61


class InvalidIdError(UsageError, ValueError):
    """A string passed as an object id (or id prefix) is not lowercase hex of the right length."""

    exit_code = 62


class StoreFormatError(DataError):
    """The store's own bookkeeping (e.g. its format version) is missing or unreadable, or LMDB
    found its file damaged (a page of the wrong type, not an LMDB file)."""

    exit_code = 63


class StoreExistsError(UsageError):
    """`create` was asked to make a store where one already exists."""

    exit_code = 64


class BufferTooSmallError(UsageError, ValueError):
    """`get_into` was given an output buffer shorter than the object."""

    exit_code = 66


class StoreClosedError(InternalError):
    """The store was used after `close()` (a bug in the caller)."""

    exit_code = 65


class CorruptRefError(DataError):
    """A stored ref record (its name or its value) cannot be decoded: the ref store is corrupt."""

    exit_code = 90

    def __init__(self, name: str, detail: str) -> None:
        self.name = name
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        return f"ref {self.name}: corrupt record ({self.detail})"


class CorruptReflogError(CorruptRefError):
    """A stored reflog entry (its key or its value) cannot be decoded."""

    exit_code = 91

    def __init__(self, name: str, detail: str, seq: int | None = None) -> None:
        self.seq = seq
        super().__init__(name, detail)

    def _message(self) -> str:
        where = f" entry {self.seq}" if self.seq is not None else ""
        return f"reflog of {self.name}:{where} corrupt record ({self.detail})"


#: Receives each unreadable ref / reflog record when a caller (fsck) wants to go on past it.
OnCorrupt = Callable[[CorruptRefError], None]


# ------------------------------------------------------------ refs and reflog
class _Any:
    """Sentinel type for "do not check the old value" in a `RefUpdate`."""

    _instance: _Any | None = None

    def __new__(cls) -> _Any:  # noqa: PYI034 - a singleton; typing.Self needs Python 3.11
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ANY"

    def __reduce__(self) -> str:
        return "ANY"


ANY = _Any()
#: What a compare-and-swap expects a ref to hold: a value, None (absent) or `ANY` (unchecked).
RefExpect = str | None | _Any


@dataclass(frozen=True)
class RefUpdate:
    """One compare-and-swap of a ref (`RefStore.update_ref`, `TransactionalRefStore.update_refs`).

    `old` is the value the ref must hold now (``None``: must not exist;
    `ANY`: not checked).  `new` is the value to set (``None``: delete the ref).
    """

    name: str
    old: RefExpect
    new: str | None


@dataclass(frozen=True)
class ReflogEntry:
    """One move of a ref: its value before and after, when (UTC epoch seconds) and why."""

    old: str | None
    new: str | None
    time: float
    reason: str


# ----------------------------------------------------------------- helpers
def object_id(data: BytesLike) -> str:
    """Return the id of `data`: the xxh3-128 hex digest (32 lowercase hex chars)."""
    return xxhash.xxh3_128_hexdigest(data)


def id_hasher() -> xxhash.xxh3_128:
    """An incremental hasher whose ``hexdigest()`` after ``update()`` with every piece of an
    object is that object's id (`object_id`): verification of content read in ranges."""
    return xxhash.xxh3_128()


def byte_view(data: BytesLike) -> memoryview:
    """A flat byte view of `data` (any C-contiguous buffer) without copying."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def check_oid(oid: str) -> str:
    """Return `oid` if it is a well-formed object id, else raise `InvalidIdError`."""
    if not isinstance(oid, str) or not _OID_RE.fullmatch(oid):
        raise InvalidIdError(f"not an object id (32 lowercase hex digits): {oid!r}")
    return oid


def check_prefix(prefix: str) -> str:
    """Return `prefix` if it is lowercase hex of at most 32 chars, else raise `InvalidIdError`."""
    if not isinstance(prefix, str) or not _HEX_PREFIX_RE.fullmatch(prefix):
        raise InvalidIdError(f"not an object id prefix (lowercase hex): {prefix!r}")
    return prefix


def check_ref_name(name: str) -> str:
    """Return `name` if it can be stored as a ref name, else raise `InvalidRefError`.

    Only storage constraints are checked here (non-empty, no control characters,
    bounded length); naming policy such as ``refs/heads/`` belongs to the repo.
    """
    if (not isinstance(name, str) or not name or name != name.strip()
            or any(ord(c) < 0x20 or c == "\x7f" for c in name)
            or len(name.encode("utf-8")) > MAX_REF_NAME_BYTES):
        raise InvalidRefError(f"invalid ref name: {name!r}")
    return name


def check_ref_value(value: str) -> str:
    """Return `value` if it is an object id or ``"ref: <name>"``, else raise `InvalidRefError`."""
    if isinstance(value, str):
        if _OID_RE.fullmatch(value):
            return value
        if value.startswith(SYMREF_PREFIX):
            try:
                check_ref_name(value[len(SYMREF_PREFIX):])
                return value
            except InvalidRefError:
                pass
    raise InvalidRefError(f"invalid ref value (want an object id or 'ref: <name>'): {value!r}")


def check_update(update: RefUpdate) -> None:
    """Validate every field of a `RefUpdate` before any transaction starts."""
    if not isinstance(update, RefUpdate):
        raise InvalidRefError(f"expected a RefUpdate, got {type(update).__name__}")
    check_ref_name(update.name)
    if update.old is not None and update.old is not ANY:
        check_ref_value(update.old)  # type: ignore[arg-type]
    if update.new is not None:
        check_ref_value(update.new)
