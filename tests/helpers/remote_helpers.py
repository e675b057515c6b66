"""Test helpers for remotes: moto's S3 server (tests/helpers/s3_server.py) in a child process,
shared by the test session, with its server-side byte counters and fault injection; and the
comparison of a clone's states with the original's."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


class S3Server:
    """One moto server; `env` holds the AWS environment that points clients at it."""

    _shared: S3Server | None = None

    def __init__(self) -> None:
        d = self._dir = tempfile.mkdtemp(prefix="mvc-s3-")
        portfile = os.path.join(d, "port")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "s3_server.py"), portfile],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while not os.path.exists(portfile):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("moto server did not start")
            time.sleep(0.05)
        self.port = int(Path(portfile).read_text())
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                    "MVC_S3_RETRY_TIMEOUT": "30"}
        os.environ.update(self.env)
        self.bucket = "mvc-test"
        self.create_bucket(self.bucket)
        atexit.register(self.stop)

    @classmethod
    def shared(cls) -> S3Server:
        if cls._shared is None:
            cls._shared = cls()
        os.environ.update(cls._shared.env)
        return cls._shared

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT", data=b"")
        urllib.request.urlopen(req).read()

    def fresh_url(self) -> str:
        return f"s3://{self.bucket}/{uuid.uuid4().hex}"

    def _ctl(self, path: str) -> dict:
        req = urllib.request.Request(f"{self.endpoint}/__mvc/{path}", method="POST", data=b"")
        return json.loads(urllib.request.urlopen(req).read())

    def stats(self) -> dict:
        return self._ctl("stats")

    def reset(self) -> dict:
        return self._ctl("reset")

    def fail(self, count: int, status: int = 503, method: str | None = None, path: str = "") -> None:
        q = (f"fail?count={count}&status={status}" + (f"&method={method}" if method else "")
             + (f"&path={path}" if path else ""))
        self._ctl(q)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture
def s3_server() -> S3Server:
    """The session's moto S3 server (started on first use)."""
    return S3Server.shared()


def bits(t: torch.Tensor) -> bytes:
    """The tensor's bytes, whatever its dtype."""
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def same_state(a: dict, b: dict) -> bool:
    """Same names, dtypes, shapes and bits (flat states of tensors)."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and bits(a[k]) == bits(b[k]) for k in a)
