"""`open_store`: the one way to open a store from a location.

A location is a filesystem path of a ``.mvc`` directory (an `LmdbStore`),
``memory:`` (a fresh `MemoryStore`, for tests and throwaway repositories), or
a URL.  Remote URLs (``s3://bucket/prefix``, ``file:///dir``) name object
storage for push, fetch and clone: they hold blobs and refs but no local
store (no write lock, no metadata), so `open_store` refuses them and
`mvc.store.objstore.open_remote` opens their parts.
"""
from __future__ import annotations

import os
import re

from mvc.errors import UsageError
from mvc.store.base import StoreNotFoundError
from mvc.store.contracts import ObjectStore
from mvc.store.lmdb_env import STORE_DIR
from mvc.store.lmdb_store import LmdbStore
from mvc.store.memory import MemoryStore

MEMORY = "memory:"
#: URL schemes of remote object storage (push / fetch targets).
REMOTE_SCHEMES = ("s3", "file")
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


class UnsupportedLocationError(UsageError):
    """The location names no kind of store this mvc can open (an unknown URL scheme)."""

    exit_code = 120


class RemoteNotSupportedError(UnsupportedLocationError):
    """The location is a remote (object storage) URL, not a repository store (use clone/push/fetch)."""

    exit_code = 121


def open_store(location: str | os.PathLike[str], *, create: bool = False) -> ObjectStore:
    """Open (or, with `create`, create) the store at `location`.

    A path is a ``.mvc`` directory: `LmdbStore.open` (`StoreNotFoundError` when
    it holds no store) or `LmdbStore.create` (`StoreExistsError` when it does).
    ``memory:`` is a new, empty `MemoryStore` either way.  ``s3://`` and
    ``file://`` (remotes: `mvc.store.objstore.open_remote`) raise `RemoteNotSupportedError`; any other URL scheme
    `UnsupportedLocationError`.
    """
    if isinstance(location, str):
        if location.startswith(MEMORY):
            if location != MEMORY:
                raise UnsupportedLocationError(
                    f"{location!r}: an in-memory store takes no path (use {MEMORY!r})")
            return MemoryStore()
        url = _URL.match(location)
        if url:
            scheme = url.group(1).lower()
            if scheme in REMOTE_SCHEMES:
                raise RemoteNotSupportedError(
                    f"{location!r}: {scheme}:// is a remote, not a repository store: "
                    "use it with mvc clone, push, fetch or pull")
            raise UnsupportedLocationError(
                f"{location!r}: unknown store location scheme {scheme!r} (want a path to a "
                f"'.mvc' directory or {MEMORY!r})")
    path = os.fspath(location)
    if create:
        return LmdbStore.create(path)
    if not os.path.isdir(os.path.join(path, STORE_DIR)):
        raise StoreNotFoundError(f"no mvc store at {os.path.realpath(path)}")
    return LmdbStore.open(path)
