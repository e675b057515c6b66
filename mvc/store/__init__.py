"""The store layer: content-addressed objects, refs, reflog and metadata.

Three contracts (`mvc.store.contracts`): `BlobStore` (immutable objects; what
object storage can implement), `RefStore` (compare-and-swap per ref, with its
reflog; `TransactionalRefStore` adds atomic batches) and `StoreMaintenance`
(local only: write lock, shrink, disk usage, metadata).  `ObjectStore` is a
repository's local store, one of each as `blobs`, `refs` and `maintenance`:
`LmdbStore` is the on-disk one, `MemoryStore` an in-memory one for tests.
`open_store` opens either from a location.
"""
from mvc.store.base import (
    ANY,
    FORMAT_KEY,
    REPO_ID_KEY,
    SUPPORTED_FORMAT,
    BufferTooSmallError,
    CorruptRefError,
    CorruptReflogError,
    FormatTooNewError,
    IntegrityError,
    InvalidIdError,
    InvalidRefError,
    LockError,
    ObjectMissingError,
    OnCorrupt,
    RefConflictError,
    RefExpect,
    ReflogEntry,
    RefUpdate,
    StoreClosedError,
    StoreExistsError,
    StoreFormatError,
    StoreNotFoundError,
    object_id,
)
from mvc.store.contracts import (
    BlobStore,
    ObjectStore,
    RefBatchUnsupportedError,
    RefStore,
    StoreMaintenance,
    TransactionalRefStore,
    require_transactional,
)
from mvc.store.factory import (
    MEMORY,
    RemoteNotSupportedError,
    UnsupportedLocationError,
    open_store,
)
from mvc.store.lmdb_env import MapGrowthError, StoreIOError
from mvc.store.lmdb_store import LmdbStore
from mvc.store.memory import (
    MemoryBlobStore,
    MemoryMaintenance,
    MemoryRefStore,
    MemoryStore,
)

__all__ = [
    "ANY",
    "FORMAT_KEY",
    "MEMORY",
    "REPO_ID_KEY",
    "SUPPORTED_FORMAT",
    "BlobStore",
    "BufferTooSmallError",
    "CorruptRefError",
    "CorruptReflogError",
    "FormatTooNewError",
    "IntegrityError",
    "InvalidIdError",
    "InvalidRefError",
    "LmdbStore",
    "LockError",
    "MapGrowthError",
    "MemoryBlobStore",
    "MemoryMaintenance",
    "MemoryRefStore",
    "MemoryStore",
    "ObjectMissingError",
    "ObjectStore",
    "OnCorrupt",
    "RefBatchUnsupportedError",
    "RefConflictError",
    "RefExpect",
    "RefStore",
    "RefUpdate",
    "ReflogEntry",
    "RemoteNotSupportedError",
    "StoreClosedError",
    "StoreExistsError",
    "StoreFormatError",
    "StoreIOError",
    "StoreMaintenance",
    "StoreNotFoundError",
    "TransactionalRefStore",
    "UnsupportedLocationError",
    "object_id",
    "open_store",
    "require_transactional",
]
