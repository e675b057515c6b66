"""moto's S3 server on 127.0.0.1 for the remote tests, with a thin WSGI layer in front:

* writes (PUT, POST, DELETE) are serialized: moto checks a conditional PUT's If-Match /
  If-None-Match and then writes without a lock, so two racing requests could both pass;
  S3 itself decides them atomically, and so does this server;
* counters of the bytes received in PUT bodies and sent in GET answers, of the requests by
  method (``requests``: "LIST" for a bucket listing, else the HTTP method) and the prefix of
  each listing (``list_prefixes``), per run, and the access key id of the last signed request
  (``GET /__mvc/stats``, ``POST /__mvc/reset``), counted here on the server's side;
* fault injection: ``POST /__mvc/fail?status=503&count=N[&method=PUT]`` answers the next N
  matching requests (``&path=SUBSTRING`` of the URL path) with that status instead of passing
  them to moto; status 0 resets the connection instead of answering, and status -1 passes the
  request to moto and then resets the connection (it took effect, its answer is lost).

Run as ``python s3_server.py PORTFILE``: writes the port it listens on to PORTFILE.
"""
from __future__ import annotations

import json
import socket
import struct
import sys
import threading
from urllib.parse import parse_qs

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server


class Counting:
    def __init__(self, app):
        self.app = app
        self.write_lock = threading.Lock()
        self.guard = threading.Lock()
        self.stats: dict = {}
        self._reset()
        self.fail: dict = {"count": 0}

    def _reset(self) -> None:
        self.stats = {"put_bytes": 0, "puts": 0, "get_bytes": 0, "gets": 0, "failed": 0, "last_key": "",
                      "requests": {}, "list_prefixes": []}

    def _count(self, environ, method: str) -> None:
        """One request by kind; a GET of the bucket itself (path /BUCKET) is a listing."""
        parts = environ["PATH_INFO"].strip("/").split("/", 1)
        qs = parse_qs(environ.get("QUERY_STRING", ""))
        kind = "LIST" if method == "GET" and len(parts) == 1 and "uploads" not in qs else method
        self.stats["requests"][kind] = self.stats["requests"].get(kind, 0) + 1
        if kind == "LIST":
            self.stats["list_prefixes"].append(qs.get("prefix", [""])[0])

    def _ctl(self, environ, start_response):
        path = environ["PATH_INFO"]
        qs = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        with self.guard:
            if path == "/__mvc/reset":
                self._reset()
            elif path == "/__mvc/fail":
                self.fail = {"count": int(qs.get("count", 1)), "status": int(qs.get("status", 503)),
                             "method": qs.get("method"), "path": qs.get("path", "")}
            body = json.dumps(self.stats).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    def __call__(self, environ, start_response):
        if environ["PATH_INFO"].startswith("/__mvc/"):
            return self._ctl(environ, start_response)
        method = environ["REQUEST_METHOD"]
        auth = environ.get("HTTP_AUTHORIZATION", "")
        with self.guard:
            if "Credential=" in auth:  # the access key id the client signed with
                self.stats["last_key"] = auth.split("Credential=", 1)[1].split("/", 1)[0]
            f = self.fail
            hit = (f["count"] > 0 and f.get("method") in (None, method)
                   and f.get("path", "") in environ["PATH_INFO"])
            lost = hit and f["status"] == -1
            if hit:
                f["count"] -= 1
                self.stats["failed"] += 1
            if hit and not lost:
                body = b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
                # Drain the request body so the client sees the answer, not a reset.
                n = int(environ.get("CONTENT_LENGTH") or 0)
                if n:
                    environ["wsgi.input"].read(n)
                if f["status"] == 0:  # a connection reset: the socket closed with no answer
                    sock = environ["werkzeug.socket"]
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.close()
                    return []
                start_response(f"{f['status']} Injected", [("Content-Length", str(len(body)))])
                return [body]
            self._count(environ, method)
            if method == "PUT":
                self.stats["puts"] += 1
                self.stats["put_bytes"] += int(environ.get("CONTENT_LENGTH") or 0)
            elif method == "GET":
                self.stats["gets"] += 1

        def counting_start(status, headers, exc_info=None):
            if method == "GET":
                for k, v in headers:
                    if k.lower() == "content-length":
                        with self.guard:
                            self.stats["get_bytes"] += int(v)
            return start_response(status, headers, exc_info)
        if lost:  # the request takes effect, its answer is lost: the socket closes unanswered
            with self.write_lock:
                list(self.app(environ, lambda *a, **k: None))
            sock = environ["werkzeug.socket"]
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            return []
        if method in ("PUT", "POST", "DELETE"):
            with self.write_lock:
                return list(self.app(environ, counting_start))
        return self.app(environ, counting_start)


def main() -> None:
    app = Counting(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    with open(sys.argv[1] + ".tmp", "w") as fh:
        fh.write(str(server.server_address[1]))
    import os
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    server.serve_forever()


if __name__ == "__main__":
    main()
