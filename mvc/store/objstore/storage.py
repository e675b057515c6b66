"""Key/value object storage: the few operations a remote needs, and its errors.

A remote (``s3://bucket/prefix`` or ``file:///dir``) is a flat namespace of
keys holding byte strings.  `ObjectStorage` is what the remote blob and ref
stores (`blobs.py`, `refs.py`) are written against:

* `get` / `get_range` / `head` / `list` / `delete` -- plain reads and removal;
  `iter_range` reads an object of any size as pieces of at most `READ_RANGE`
  bytes (what verification in bounded memory is built on);
* `put` with a *mode*: overwrite, create-only (``If-None-Match: *``) or
  replace-if-unchanged (``If-Match: <etag>``).  The last two are what make
  compare-and-swap of refs possible on storage without transactions;
  `PreconditionFailed` says the condition did not hold.

Errors a user can act on are `MvcError`s with their own exit codes: access
denied (`RemoteAccessError`), no such bucket / directory
(`RemoteMissingError`), the service still failing after the client's retries
(`RemoteUnavailableError`).

URLs reach messages from the user (a remote's URL, ``AWS_ENDPOINT_URL``) and from the S3
client (whose errors quote the request URL, endpoint included); `redact_url` takes out what
can be a secret in them, and the errors here apply it to their own message.
"""
from __future__ import annotations

import abc
import re
from collections.abc import Iterator
from dataclasses import dataclass

from mvc.errors import DataError, MvcError, UsageError
from mvc.store.base import BytesLike

#: `put` modes: replace whatever is there, or create only when the key is absent.
OVERWRITE = "overwrite"
CREATE = "create"
#: The most bytes one read of an object brings into memory (`iter_range`): remote objects
#: can be GBs and are untrusted until hashed, so they are never read whole.
READ_RANGE = 16 << 20

#: What a secret is replaced by in messages.
REDACTED = "<redacted>"
# A URL ends at whitespace or a quote: messages quote URLs with repr() or put them between words.
_URL = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>`]*""")
# Signed-request parameters outside a URL's query: an Authorization header quoted by an error
# ("Credential=AKIA.../..., Signature=...") or a query string without its URL.
_SECRET_PARAM = re.compile(
    r"\b((?:X-Amz-[A-Za-z-]+|Signature|Credential|AWSAccessKeyId|Security-Token)=)[^\s&,;'\"]+",
    re.IGNORECASE)


def redact_url(text: str) -> str:
    """`text` with the secrets URLs carry taken out of every URL in it: the userinfo
    (``user:password@``) and the query and fragment (signed URLs carry X-Amz-Signature,
    X-Amz-Credential, tokens there) become `REDACTED`; so do signed-request parameters
    (``X-Amz-*=``, ``Signature=``, ``Credential=``) outside a URL.  Idempotent."""
    return _SECRET_PARAM.sub(lambda m: m.group(1) + REDACTED, _URL.sub(_redact_one, text))


def _redact_one(match: re.Match[str]) -> str:
    scheme, rest = match.group(0).split("://", 1)
    # The last '@' ends the userinfo even when the password holds an unescaped '@' or '/'.
    at = rest.rfind("@")
    query = re.search(r"[?#]", rest)
    if at >= 0 and query is not None and query.start() < at:
        # '?' before '@': a password holding '?' or a query holding '@'; either way nothing
        # after the scheme can be told apart from a secret.
        return f"{scheme}://{REDACTED}"
    if query is not None and query.end() < len(rest):  # (an empty one may be redacted already)
        rest = rest[:query.start() + 1] + REDACTED
    if at >= 0:
        rest = REDACTED + rest[at:]
    return f"{scheme}://{rest}"


class _RedactedMessage(MvcError):
    """An error whose message can quote a remote's URL or the S3 client's request URL: built
    through `redact_url`, wherever the text came from."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact_url(a) if isinstance(a, str) else a for a in args))


class RemoteAccessError(_RedactedMessage, UsageError):
    """The object storage refused access (HTTP 403, bad credentials, or file permissions)."""

    exit_code = 140


class RemoteMissingError(_RedactedMessage, UsageError):
    """The remote's bucket or directory does not exist."""

    exit_code = 141


class RemoteUnavailableError(_RedactedMessage):
    """The object storage kept failing (5xx, timeouts, resets) after every retry."""

    exit_code = 144


class CorruptRemoteError(_RedactedMessage, DataError):
    """A remote's own bookkeeping (a pack index, a ref record, its format marker) is unreadable."""

    exit_code = 146


class PreconditionFailed(Exception):
    """A conditional `put` found the key in another state than it asked for (not an MvcError:
    the ref store turns it into a retry or a `RefConflictError`)."""


@dataclass(frozen=True)
class Stored:
    """One object as read: its bytes and the tag a conditional write names it by."""

    data: bytes
    etag: str


class ObjectStorage(abc.ABC):
    """A flat key -> bytes namespace with conditional writes (safe to share between threads)."""

    #: The URL this storage was opened from, passed through `redact_url` (for messages).
    url: str

    @abc.abstractmethod
    def get(self, key: str) -> Stored | None:
        """The object at `key` with its etag, or None if there is none."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object at `key` (`KeyError` if there is none)."""

    def iter_range(self, key: str, start: int, end: int, step: int = READ_RANGE) -> Iterator[bytes]:
        """Bytes [start, end) of the object at `key` as consecutive pieces of at most `step`
        bytes (`KeyError` if there is none).  Stops early, after a short piece or none, if the
        object ends before `end`: the caller compares the total with what it expected."""
        for a in range(start, end, step):
            want = min(end, a + step) - a
            piece = self.get_range(key, a, a + want)
            got = len(piece)
            if got:
                yield piece
            del piece  # not held while the next range downloads
            if got < want:
                return

    @abc.abstractmethod
    def head(self, key: str) -> int | None:
        """The size of the object at `key`, or None if there is none."""

    @abc.abstractmethod
    def put(self, key: str, data: BytesLike, mode: str = OVERWRITE) -> str:
        """Write `data` at `key`; return the new etag.

        `mode`: `OVERWRITE`, `CREATE` (fails if the key exists) or an etag (fails
        unless the key holds exactly that version).  A failed condition raises
        `PreconditionFailed` and changes nothing.
        """

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object whose key starts with `prefix` (a "dir/" prefix)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object at `key` (no error if there is none)."""

    def check_exists(self) -> None:
        """Raise `RemoteMissingError` if the bucket or directory itself does not exist (an
        existing one without an mvc repository is fine: an empty remote)."""

    def close(self) -> None:
        """Release connections (idempotent)."""
