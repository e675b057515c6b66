"""The store layer: content-addressed objects, refs, reflog and metadata.

`LmdbStore` is the on-disk store of a repository; `MemoryStore` is an
in-memory stand-in with the same contract (`ObjectStore`) for tests.
"""
from mvc.store.base import (
    ANY, BufferTooSmallError, CorruptRefError, CorruptReflogError, FormatTooNewError,
    IntegrityError, InvalidIdError, InvalidRefError, LockError, ObjectMissingError, ObjectStore,
    RefConflictError, RefUpdate, ReflogEntry, StoreClosedError, StoreExistsError,
    StoreFormatError, StoreNotFoundError, object_id)
from mvc.store.lmdb_env import MapGrowthError, StoreIOError
from mvc.store.lmdb_store import SUPPORTED_FORMAT, LmdbStore
from mvc.store.memory import MemoryStore

__all__ = [
    "ANY", "BufferTooSmallError", "CorruptRefError", "CorruptReflogError", "FormatTooNewError",
    "IntegrityError", "InvalidIdError", "InvalidRefError", "LmdbStore", "LockError",
    "MapGrowthError", "MemoryStore", "ObjectMissingError", "ObjectStore", "RefConflictError",
    "RefUpdate", "ReflogEntry", "SUPPORTED_FORMAT", "StoreClosedError", "StoreExistsError",
    "StoreFormatError", "StoreIOError", "StoreNotFoundError", "object_id",
]
