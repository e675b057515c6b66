"""Remote stores on object storage: ``s3://bucket/prefix`` and ``file:///dir``.

`open_remote(url)` gives a `Remote`: a `RemoteBlobStore` (the `BlobStore`
contract, small objects packed) and a `RemoteRefStore` (the `RefStore`
contract, compare-and-swap by conditional writes) over one `ObjectStorage`
(`FileStorage` or `S3Storage`).  A remote has no maintenance part (no write
lock, no metadata): every operation on it stands alone.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from mvc.errors import UsageError
from mvc.store.objstore.blobs import PACK_MAX_OBJECT, PACK_TARGET, RemoteBlobStore
from mvc.store.objstore.local import FileStorage
from mvc.store.objstore.refs import RemoteRefStore
from mvc.store.objstore.storage import (
    CREATE,
    CorruptRemoteError,
    ObjectStorage,
    PreconditionFailed,
    RemoteAccessError,
    RemoteMissingError,
    RemoteUnavailableError,
    redact_url,
)

#: The key of the remote's format marker, written by the first push.
FORMAT_KEY = "mvc-remote.json"
REMOTE_FORMAT = 1
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class BadRemoteUrlError(UsageError):
    """A remote URL that is not ``s3://bucket[/prefix]`` or ``file:///absolute/dir``."""

    exit_code = 148


@dataclass
class Remote:
    """A remote's parts: its objects and its refs, over one storage."""

    url: str  # redacted (`redact_url`): for messages
    storage: ObjectStorage
    blobs: RemoteBlobStore
    refs: RemoteRefStore

    def check_format(self) -> bool:
        """Whether the remote holds an mvc repository (`CorruptRemoteError` if it is a newer
        or unreadable format)."""
        got = self.storage.get(FORMAT_KEY)
        if got is None:
            return False
        try:
            version = int(json.loads(got.data)["format"])
        except (ValueError, KeyError, TypeError):
            raise CorruptRemoteError(f"{self.url}: {FORMAT_KEY} is unreadable") from None
        if version > REMOTE_FORMAT:
            raise CorruptRemoteError(f"{self.url}: remote format {version} is newer than this mvc "
                                     f"reads ({REMOTE_FORMAT}); upgrade mvc")
        return True

    def ensure_format(self) -> None:
        """Write the format marker unless it is there (create-only: racing pushers agree)."""
        if self.check_format():
            return
        try:
            self.storage.put(FORMAT_KEY, json.dumps({"format": REMOTE_FORMAT}).encode(), CREATE)
        except PreconditionFailed:
            pass

    def close(self) -> None:
        self.blobs.close()
        self.refs.close()


def open_storage(url: str) -> ObjectStorage:
    """The `ObjectStorage` a remote URL names (`BadRemoteUrlError` if it names none)."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    shown = redact_url(url)  # messages never quote a password or a signed query
    if scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise BadRemoteUrlError(f"{shown!r}: a file remote is file:///absolute/path")
        return FileStorage(unquote(parsed.path), shown)
    if scheme == "s3":
        bucket = parsed.netloc
        if "@" in bucket:
            raise BadRemoteUrlError(f"{shown!r}: credentials do not go in an s3:// URL (set "
                                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
        if not _BUCKET.fullmatch(bucket):
            raise BadRemoteUrlError(f"{shown!r}: {bucket!r} is not an S3 bucket name")
        from mvc.store.objstore.s3 import S3Storage

        return S3Storage(bucket, parsed.path.strip("/"), url)
    raise BadRemoteUrlError(f"{shown!r}: a remote URL is s3://bucket/prefix or file:///dir")


def open_remote(url: str, workers: int = 8, spool_dir: str | os.PathLike[str] | None = None) -> Remote:
    """Open the remote at `url` (nothing is read until it is used).  `spool_dir`: where
    objects larger than one read range are spooled while they are verified (a fetch gives
    its repository's directory: the system's temporary directory may be memory)."""
    storage = open_storage(url)
    spool = None if spool_dir is None else os.fspath(spool_dir)
    return Remote(storage.url, storage, RemoteBlobStore(storage, workers, spool),
                  RemoteRefStore(storage))


__all__ = [
    "FORMAT_KEY",
    "PACK_MAX_OBJECT",
    "PACK_TARGET",
    "BadRemoteUrlError",
    "CorruptRemoteError",
    "FileStorage",
    "ObjectStorage",
    "Remote",
    "RemoteAccessError",
    "RemoteBlobStore",
    "RemoteMissingError",
    "RemoteRefStore",
    "RemoteUnavailableError",
    "open_remote",
    "open_storage",
]
