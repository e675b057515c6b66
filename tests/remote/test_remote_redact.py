"""Secrets in URLs never reach a message (issue 25, defect 8): an ``AWS_ENDPOINT_URL`` with
``user:password@`` or a query string, a remote URL with a query, and the request URLs the S3
client quotes in its errors are redacted in every error, listing, reflog entry and progress
phase (moto's server, `remote_helpers`, with its fault injection)."""
from __future__ import annotations

import pytest
import torch
from cli_helpers import run
from remote_helpers import S3Server

from mvc.errors import MvcError
from mvc.remote.porcelain import clone
from mvc.remote.transfer import push
from mvc.repo.repository import Repo
from mvc.store.objstore import BadRemoteUrlError, open_remote
from mvc.store.objstore.s3 import BadEndpointError
from mvc.store.objstore.storage import REDACTED, RemoteUnavailableError, redact_url

SECRET = "s3cr3tpw"


@pytest.mark.parametrize("text, want", [
    (f"GET http://user:{SECRET}@127.0.0.1:9000/b?list-type=2 in 3ms",
     f"GET http://{REDACTED}@127.0.0.1:9000/b?{REDACTED} in 3ms"),
    (f"'s3://k:{SECRET}@bucket/p'", f"'s3://{REDACTED}@bucket/p'"),
    (f"http://user:p@{SECRET}@host/x", f"http://{REDACTED}@host/x"),  # an unescaped '@'
    (f"http://user:pa/{SECRET}@host/x", f"http://{REDACTED}@host/x"),  # an unescaped '/'
    (f"http://u:a?{SECRET}@host/x", f"http://{REDACTED}"),  # '?' before '@': all of it
    (f"https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA%2F&X-Amz-Signature={SECRET}",
     f"https://b.s3.amazonaws.com/k?{REDACTED}"),
    (f"file:///srv/x#{SECRET}", f"file:///srv/x#{REDACTED}"),
    (f"Authorization: AWS4-HMAC-SHA256 Credential=AKIA/x, SignedHeaders=host, Signature={SECRET}",
     f"Authorization: AWS4-HMAC-SHA256 Credential={REDACTED}, SignedHeaders=host, Signature={REDACTED}"),
    ("s3://bucket/runs/exp1: no such bucket", "s3://bucket/runs/exp1: no such bucket"),
    ("nothing to hide", "nothing to hide"),
])
def test_redact_url(text, want):
    assert redact_url(text) == want
    assert redact_url(want) == want  # idempotent: a message redacted twice reads the same


def test_remote_errors_redact_their_own_message():
    err = RemoteUnavailableError(f"failed: GET http://me:{SECRET}@host/b/k?X-Amz-Signature={SECRET}")
    assert SECRET not in str(err) and err.exit_code == 144


@pytest.fixture
def secret_endpoint(monkeypatch):
    """The moto server as an endpoint with a password in it, failing fast."""
    s3_server = S3Server.shared()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://user:{SECRET}@127.0.0.1:{s3_server.port}")
    monkeypatch.setenv("MVC_S3_MAX_RETRIES", "1")
    monkeypatch.setenv("MVC_S3_RETRY_TIMEOUT", "5")
    yield s3_server
    s3_server.fail(0)  # no injected fault outlives its test


def _clone_cli(tmp_path, url: str) -> tuple[int, str]:
    code, out, err = run(tmp_path, "clone", "-q", url, "c")
    return code, out + err


@pytest.mark.parametrize("status, code", [(403, 140), (401, 140), (500, 144), (0, 144)])
def test_s3_errors_never_print_the_endpoint_password(secret_endpoint, tmp_path, status, code):
    url = secret_endpoint.fresh_url()
    secret_endpoint.fail(100, status)  # every request: the retry too
    got, text = _clone_cli(tmp_path, url)
    assert got == code, text
    assert SECRET not in text and text.count("\n") == 1
    assert not (tmp_path / "c").exists()
    # the exception itself, as a library user sees it (its message and anything chained)
    storage = open_remote(url).storage
    with pytest.raises(MvcError) as info:
        storage.get("objects/ab/cd")
    assert SECRET not in str(info.value) and info.value.__cause__ is None
    assert info.value.__suppress_context__


@pytest.mark.parametrize("prefix", ["run-403-a", "AccessDenied", "NoSuchBucket", "x401 Unauthorized"])
def test_a_key_that_looks_like_an_answer_is_not_read_as_one(secret_endpoint, tmp_path, prefix):
    """The class of an error comes from the server's answer, never from the URL the client
    quotes: a 500 on a key containing "403" is a retryable outage (144), not access denied
    (a random remote path once held "4037" and CI failed on it)."""
    url = f"{secret_endpoint.fresh_url()}/{prefix}"
    secret_endpoint.fail(100, 500)
    got, text = _clone_cli(tmp_path, url)
    assert got == RemoteUnavailableError.exit_code == 144, text
    secret_endpoint.fail(100, 403)
    got, text = _clone_cli(tmp_path, url)
    assert got == 140, text


def test_missing_bucket_and_unreachable_endpoint(secret_endpoint, tmp_path, monkeypatch):
    code, text = _clone_cli(tmp_path, "s3://no-such-bucket-r/p")
    assert code == 141 and SECRET not in text
    # nothing listens on port 1: the client's error quotes the whole request URL
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://user:{SECRET}@127.0.0.1:1")
    code, text = _clone_cli(tmp_path, secret_endpoint.fresh_url())
    assert code == 144 and SECRET not in text and f"http://{REDACTED}@127.0.0.1:1/" in text


def test_a_working_endpoint_with_a_password_still_works(secret_endpoint, tmp_path):
    url = secret_endpoint.fresh_url()
    src = Repo.init(tmp_path / "src")
    cid = src.commit({"w": torch.arange(8, dtype=torch.float32)}, "one")
    push(src.odb, open_remote(url), {"refs/heads/main": cid})
    src.close()
    code, text = _clone_cli(tmp_path, url)
    assert code == 0 and SECRET not in text
    c = Repo(tmp_path / "c")
    assert c.head() == cid and c.fsck().problems == []
    c.close()


@pytest.mark.parametrize("endpoint", [
    "http://127.0.0.1:{port}/?X-Amz-Signature={secret}",  # a query string: not an endpoint
    "http://user:pa/{secret}@127.0.0.1:{port}",  # an unescaped '/': the client would panic
    "ftp://user:{secret}@127.0.0.1:{port}",
])
def test_unusable_endpoints_are_refused_without_echoing_secrets(secret_endpoint, tmp_path,
                                                                  monkeypatch, endpoint):
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.format(port=secret_endpoint.port, secret=SECRET))
    code, text = _clone_cli(tmp_path, secret_endpoint.fresh_url())
    assert code == BadEndpointError.exit_code == 155, text
    assert SECRET not in text and "AWS_ENDPOINT_URL" in text


def test_bad_remote_urls_are_not_echoed_with_their_secrets(tmp_path):
    code, text = _clone_cli(tmp_path, f"s3://key:{SECRET}@bucket-1/p")
    assert code == BadRemoteUrlError.exit_code and SECRET not in text and "AWS_ACCESS_KEY_ID" in text
    code, text = _clone_cli(tmp_path, f"https://user:{SECRET}@example.com/x?sig={SECRET}")
    assert code == BadRemoteUrlError.exit_code and SECRET not in text


class _Phases:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def phase(self, description: str, **_: object) -> None:
        self.seen.append(description)

    def advance(self, nbytes: int = 0, items: int = 0) -> None:
        pass

    def end(self) -> None:
        pass


def test_listing_reflog_and_progress_redact_a_query_string(tmp_path):
    """A file:// remote whose URL carries a token: `remote -v`, the 145 error, the progress
    phases of push and clone and the clone's reflog show it redacted."""
    (tmp_path / "remote").mkdir()
    url = f"file://{tmp_path / 'remote'}?token={SECRET}"
    src = Repo.init(tmp_path / "src")
    cid = src.commit({"w": torch.ones(4)}, "one")
    src.close()
    assert run(tmp_path / "src", "remote", "add", "origin", url)[0] == 0
    code, out, err = run(tmp_path / "src", "remote", "-v")
    assert code == 0 and SECRET not in out and f"?{REDACTED}" in out
    code, out, err = run(tmp_path / "src", "remote", "add", "origin", url)
    assert code == 145 and SECRET not in out + err
    assert open_remote(url).url == f"file://{tmp_path / 'remote'}?{REDACTED}"
    src = Repo(tmp_path / "src")
    phases = _Phases()
    push(src.odb, open_remote(url), {"refs/heads/main": cid}, progress=phases)
    src.close()
    res = clone(url, tmp_path / "c", progress=phases)
    assert res.commit == cid
    assert phases.seen and not any(SECRET in p for p in phases.seen), phases.seen
    code, out, err = run(tmp_path / "c", "reflog")
    assert code == 0 and "clone: from" in out and SECRET not in out + err
