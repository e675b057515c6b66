"""Child process for the SIGKILL test: a zygote that imports mvc once, then for each line
``ROOT URL`` on stdin forks a pusher (pushing ROOT's main to URL with small packs and batches,
so that a push is many separate uploads: more moments to be killed at), prints ``pid N``, and
on the next line ``reap`` waits for it and prints ``exit STATUS``. The test kills the pusher by its pid. Nothing is opened
before the fork (no LMDB environment, no S3 client), so each pusher starts clean."""
from __future__ import annotations

import os
import sys

import mvc.remote.transfer as transfer
import mvc.store.objstore.blobs as blobs
from mvc.remote.transfer import push
from mvc.repo.repository import Repo
from mvc.store.objstore import open_remote


def pusher(root: str, url: str) -> None:
    blobs.PACK_TARGET = 16 << 10
    blobs.PACK_MAX_OBJECT = 8 << 10
    transfer.BATCH_BYTES = 64 << 10
    repo = Repo(root)
    remote = open_remote(url, workers=2)
    push(repo.odb, remote, {"refs/heads/main": repo.resolve("main")})


def main() -> None:
    print("ready", flush=True)
    for line in sys.stdin:
        root, url = line.split()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                pusher(root, url)
            except BaseException as exc:  # noqa: BLE001 - reported through the exit status
                print(f"pusher failed: {exc!r}", file=sys.stderr, flush=True)
                code = 1
            os._exit(code)
        print(f"pid {pid}", flush=True)
        # Reaped only when the test says so: until then a finished pusher stays a zombie, so
        # the test's SIGKILL can never reach a process that reused its pid.
        sys.stdin.readline()
        _, status = os.waitpid(pid, 0)
        print(f"exit {status}", flush=True)


if __name__ == "__main__":
    main()
