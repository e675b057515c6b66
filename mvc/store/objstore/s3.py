"""``s3://bucket/prefix``: object storage on any S3-compatible service, through obstore.

obstore (Python bindings of the Rust ``object_store`` crate) was chosen over
boto3 and s3fs (docs/remotes.md has the figures): it was as fast on uploads
and faster on downloads and small requests against the same server, it
releases the GIL for the whole request, it retries 5xx answers, dropped
connections and timeouts with exponential backoff and jitter by itself, and it
maps ``If-None-Match: *`` / ``If-Match: <etag>`` writes to typed errors.

Endpoint, region and credentials come from the standard AWS environment
(``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, plus
instance / container / web-identity credentials), so any S3-compatible server
works; without keys in the environment, the AWS config files (``~/.aws/credentials``,
``~/.aws/config``, ``AWS_PROFILE``) are read through boto3 when it is installed.
``MVC_S3_MAX_RETRIES`` bounds the retries (default 10, over at most
``MVC_S3_RETRY_TIMEOUT`` seconds, default 180).

Every message goes through `redact_url`: the client's errors quote the request URL, endpoint
userinfo (``http://user:password@host``) and query included.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from mvc.errors import UsageError
from mvc.store.base import BytesLike
from mvc.store.objstore.storage import (
    CREATE,
    OVERWRITE,
    ObjectStorage,
    PreconditionFailed,
    RemoteAccessError,
    RemoteMissingError,
    RemoteUnavailableError,
    Stored,
    redact_url,
)


class S3ClientMissingError(UsageError):
    """An s3:// remote was used but obstore (the `s3` extra) is not installed."""

    exit_code = 147


class BadEndpointError(UsageError):
    """``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) is not an http(s) URL with a host."""

    exit_code = 155


def _check_endpoint(name: str, endpoint: str) -> None:
    """Refuse an endpoint the S3 client cannot use (it panics on some, e.g. a bad port, and
    puts a query string in front of every key): `BadEndpointError`, naming no part of it
    that can be a secret."""
    try:
        parts = urlsplit(endpoint)
        _ = parts.port  # ValueError for a port that is not a number in range
    except ValueError:
        raise BadEndpointError(f"{name} is not a valid URL: {redact_url(endpoint)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in endpoint):
        raise BadEndpointError(f"{name} must be http://HOST[:PORT] or https://HOST[:PORT]: "
                               f"{redact_url(endpoint)}")
    if parts.query or parts.fragment or "?" in endpoint or "#" in endpoint:
        raise BadEndpointError(f"{name} must not have a query string or fragment: "
                               f"{redact_url(endpoint)}")


def _import_obstore() -> Any:
    try:
        import obstore
    except ImportError:
        raise S3ClientMissingError(
            "s3:// remotes need obstore: pip install 'mvc[s3]'") from None
    return obstore


class S3Storage(ObjectStorage):
    """Keys under `prefix` in `bucket` on the S3 service the AWS environment names."""

    def __init__(self, bucket: str, prefix: str, url: str) -> None:
        obstore = _import_obstore()
        from obstore.store import S3Store

        self.url = redact_url(url)
        self._ob = obstore
        from obstore import exceptions as exc
        self._exc = exc
        # obstore raises the built-in FileNotFoundError for a 404 (its NotFoundError too).
        self._notfound = (exc.NotFoundError, FileNotFoundError)
        env = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
        endpoint = os.environ.get(env)
        config: dict[str, Any] = {}
        if endpoint:
            _check_endpoint(env, endpoint)
            config["endpoint"] = endpoint
            config["allow_http"] = endpoint.startswith("http://")
            # Most non-AWS servers (MinIO, Ceph, moto) want bucket-in-path addressing.
            config["virtual_hosted_style_request"] = False
        if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
            config["region"] = "us-east-1"
        retry = {
            "max_retries": int(os.environ.get("MVC_S3_MAX_RETRIES", "10")),
            "retry_timeout": timedelta(seconds=float(os.environ.get("MVC_S3_RETRY_TIMEOUT", "180"))),
            "backoff": {"init_backoff": timedelta(milliseconds=100),
                        "max_backoff": timedelta(seconds=15), "base": 2},
        }
        provider = _shared_files_credentials(config)  # may set the region from ~/.aws/config
        self._store = S3Store(bucket, prefix=prefix or None, config=config,  # type: ignore[arg-type]
                              retry_config=retry,  # type: ignore[arg-type]
                              client_options={"timeout": "300s", "connect_timeout": "20s"},
                              credential_provider=provider)

    @contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        # Every client error leaves as one of ours, its text redacted (from None: the client's
        # own exception, URL and all, is not chained to be printed with a traceback).
        exc = self._exc
        where = f"{self.url}: {key}" if key else self.url
        try:
            yield
        except (exc.PermissionDeniedError, exc.UnauthenticatedError) as e:
            raise RemoteAccessError(f"{self.url}: access denied ({_first_line(e)})") from None
        except exc.GenericError as e:
            status, code = _answer(e)
            if code == "NoSuchBucket":
                raise RemoteMissingError(f"{self.url}: no such bucket") from None
            if status in (401, 403) or code in _DENIED_CODES:
                raise RemoteAccessError(f"{self.url}: access denied") from None
            raise RemoteUnavailableError(f"{where}: {_first_line(e)}") from None
        except self._notfound as e:
            if _answer(e)[1] == "NoSuchBucket":
                raise RemoteMissingError(f"{self.url}: no such bucket") from None
            # A 404 the operation did not expect (a listing's): the bucket or its path is gone.
            raise RemoteMissingError(f"{where}: not found ({_first_line(e)})") from None
        except exc.BaseError as e:  # the client's other errors (configuration, paths)
            raise RemoteUnavailableError(f"{where}: {_first_line(e)}") from None

    def check_exists(self) -> None:
        # A listing of one key: NoSuchBucket (141) or access denied (140) if it cannot be read.
        with self._errors(""):
            next(iter(self._ob.list(self._store, chunk_size=1)), None)

    def get(self, key: str) -> Stored | None:
        with self._errors(key):
            try:
                res = self._ob.get(self._store, key)
                etag = res.meta.get("e_tag") or ""
                return Stored(bytes(res.bytes()), etag)
            except self._notfound as e:
                if _answer(e)[1] == "NoSuchBucket":
                    raise
                return None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        with self._errors(key):
            try:
                return bytes(self._ob.get_range(self._store, key, start=start, end=end))
            except self._notfound as e:
                if _answer(e)[1] == "NoSuchBucket":
                    raise
                raise KeyError(key) from None

    def head(self, key: str) -> int | None:
        with self._errors(key):
            try:
                return int(self._ob.head(self._store, key)["size"])
            except self._notfound as e:
                if _answer(e)[1] == "NoSuchBucket":
                    raise
                return None

    def put(self, key: str, data: BytesLike, mode: str = OVERWRITE) -> str:
        if mode == OVERWRITE:
            ob_mode: Any = "overwrite"
        elif mode == CREATE:
            ob_mode = "create"
        else:
            ob_mode = {"e_tag": mode}
        with self._errors(key):
            try:
                res = self._ob.put(self._store, key, bytes(data) if isinstance(data, memoryview) else data,
                                   mode=ob_mode)
            except (self._exc.AlreadyExistsError, self._exc.PreconditionError):
                raise PreconditionFailed(key) from None
            except self._notfound as e:
                if _answer(e)[1] == "NoSuchBucket":
                    raise
                # If-Match on a key that vanished: the condition did not hold.
                raise PreconditionFailed(key) from None
        return res.get("e_tag") or ""

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        with self._errors(prefix):
            for batch in self._ob.list(self._store, prefix=prefix or None, chunk_size=1000):
                out.extend((m["path"], int(m["size"])) for m in batch)
        out.sort()
        return iter(out)

    def delete(self, key: str) -> None:
        with self._errors(key):
            try:
                self._ob.delete(self._store, key)
            except self._notfound as e:
                if _answer(e)[1] == "NoSuchBucket":
                    raise


def _shared_files_credentials(config: dict[str, Any]) -> Any:
    """Credentials (and region) from the AWS config files (~/.aws/credentials, ~/.aws/config,
    AWS_PROFILE) through boto3 when it is installed and the environment names no keys;
    None otherwise (obstore then uses the environment, or instance / container roles)."""
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return None
    session = boto3.Session()
    if session.get_credentials() is None:
        return None
    if session.region_name and "region" in config:
        config["region"] = session.region_name
    return Boto3CredentialProvider(session)


# The client's message quotes the request (URL, key, request id) before the server's answer,
# so a bare substring test misreads a key that happens to contain "403": only the status line
# and the error document's <Code> are read.
_STATUS = re.compile(r"non-2xx status code: (\d{3})\b")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_DENIED_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"})


def _answer(exc: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and S3 error code of the server's answer quoted in a client error
    (None for either that the message does not carry)."""
    text = str(exc)
    status, code = _STATUS.search(text), _CODE.search(text)
    return (int(status.group(1)) if status else None, code.group(1) if code else None)


def _first_line(exc: BaseException) -> str:
    """The first line of the client's message, redacted before it is cut (a cut URL could
    keep a password whose '@' fell beyond the cut)."""
    text = redact_url(str(exc)).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
