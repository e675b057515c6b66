"""`file:///dir`: object storage in a plain directory (NFS-style sharing, tests).

Each key is a file under the root.  Writes go to a temporary file that is
renamed into place, so a reader (or a killed writer) never sees half an
object.  A conditional write holds an exclusive ``flock`` on the key's lock
file (under ``.locks/``) while it compares the current content's etag (its
xxh3-128 digest) and renames: compare-and-swap between threads and processes
of one machine, and on network file systems whose locks are coherent (NFSv4).
"""
from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

from mvc.store.base import BytesLike, object_id
from mvc.store.objstore.storage import (
    CREATE,
    OVERWRITE,
    READ_RANGE,
    ObjectStorage,
    PreconditionFailed,
    RemoteAccessError,
    RemoteMissingError,
    Stored,
)

_LOCKS = ".locks"
_TMP = ".tmp-"


class FileStorage(ObjectStorage):
    """Object storage in directory `root` (created on the first write if its parent exists)."""

    def __init__(self, root: str, url: str | None = None) -> None:
        self.root = os.path.abspath(root)
        self.url = url or f"file://{self.root}"

    # ------------------------------------------------------------ helpers
    def _path(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad object key {key!r}")
        return os.path.join(self.root, key)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except PermissionError as exc:
            raise RemoteAccessError(f"{self.url}: permission denied ({exc.filename})") from None

    def _write(self, path: str, data: BytesLike) -> None:
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
        except FileNotFoundError:
            raise RemoteMissingError(f"{self.url}: no such directory") from None
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=_TMP)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        lock = os.path.join(self.root, _LOCKS, quote(key, safe=""))
        os.makedirs(os.path.dirname(lock), exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # ------------------------------------------------------------ the contract
    def check_exists(self) -> None:
        if not os.path.isdir(self.root):
            raise RemoteMissingError(f"{self.url}: no such directory")

    def get(self, key: str) -> Stored | None:
        with self._errors():
            try:
                with open(self._path(key), "rb") as fh:
                    data = fh.read()
            except (FileNotFoundError, NotADirectoryError):
                return None
        return Stored(data, object_id(data))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self._errors():
            try:
                with open(self._path(key), "rb") as fh:
                    fh.seek(start)
                    return fh.read(end - start)
            except (FileNotFoundError, NotADirectoryError):
                raise KeyError(key) from None

    def iter_range(self, key: str, start: int, end: int, step: int = READ_RANGE) -> Iterator[bytes]:
        # One open file for the whole read: a rename over the key while it is read (a racing
        # writer) cannot mix two versions.
        with self._errors():
            try:
                fh = open(self._path(key), "rb")
            except (FileNotFoundError, NotADirectoryError):
                raise KeyError(key) from None
            with fh:
                fh.seek(start)
                pos = start
                while pos < end:
                    piece = fh.read(min(step, end - pos))
                    if not piece:
                        return
                    pos += len(piece)
                    yield piece
                    del piece  # not held while the next range is read

    def head(self, key: str) -> int | None:
        try:
            return os.stat(self._path(key)).st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def put(self, key: str, data: BytesLike, mode: str = OVERWRITE) -> str:
        path = self._path(key)
        with self._errors():
            if mode == OVERWRITE:
                self._write(path, data)
                return object_id(data)
            if not os.path.isdir(self.root):
                try:
                    os.mkdir(self.root)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    raise RemoteMissingError(f"{self.url}: no such directory") from None
            with self._locked(key):
                current = self.get(key)
                if mode == CREATE:
                    if current is not None:
                        raise PreconditionFailed(key)
                elif current is None or current.etag != mode:
                    raise PreconditionFailed(key)
                self._write(path, data)
        return object_id(data)

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        base = os.path.join(self.root, prefix.rstrip("/")) if prefix else self.root
        out: list[tuple[str, int]] = []
        with self._errors():
            for dirpath, dirnames, files in os.walk(base):
                dirnames[:] = [d for d in dirnames if d != _LOCKS]
                rel = os.path.relpath(dirpath, self.root)
                for f in files:
                    if f.startswith(_TMP):
                        continue
                    key = f if rel == "." else f"{rel}/{f}".replace(os.sep, "/")
                    try:
                        size = os.stat(os.path.join(dirpath, f)).st_size
                    except FileNotFoundError:
                        continue
                    out.append((key, size))
        out.sort()
        return iter(out)

    def delete(self, key: str) -> None:
        with self._errors():
            try:
                os.unlink(self._path(key))
            except (FileNotFoundError, NotADirectoryError):
                pass
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
