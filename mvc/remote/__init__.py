"""Remotes: push, fetch, pull and clone over object storage (``s3://``, ``file://``).

`mvc.remote.config` keeps the remotes a repository knows (``.mvc/remotes.json``);
`mvc.remote.transfer` moves objects and refs between a repository's store and a
remote (`mvc.store.objstore`), with the one reachability walker of `mvc.repo.objectdb`
deciding what the other side lacks; `mvc.remote.shallow` fetches part of a history, and
`mvc.remote.readonly` reads a remote in place (`open_remote_repo(url).read_state(rev)`,
re-exported here).  docs/remotes.md describes the layout and the consistency rules.
"""
from __future__ import annotations

from typing import Any

__all__ = ["RemoteRepo", "open_remote_repo"]


def __getattr__(name: str) -> Any:
    # On use: the CLI imports this package's config at start, and the reader brings the
    # repository code with it.
    if name in __all__:
        from mvc.remote import readonly

        return getattr(readonly, name)
    raise AttributeError(f"module 'mvc.remote' has no attribute {name!r}")
