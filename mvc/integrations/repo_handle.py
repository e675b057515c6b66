"""The repository a framework object commits to or reads from, opened on first use.

Framework objects (a Lightning plugin, a Trainer callback, a DCP storage writer or reader)
are built on every rank and may be pickled by a launcher; only the processes that use one
open the store.
"""
from __future__ import annotations

import os
from pathlib import Path

from mvc.repo.repository import Repo


class RepoOnDemand:
    """A repository given open, or named by path and opened by this process on first use.

    `create`: initialise a repository where there is none."""

    def __init__(self, repo: Repo | str | os.PathLike, *, create: bool = False) -> None:
        self._repo: Repo | None = repo if isinstance(repo, Repo) else None
        self.path = Path(repo.path if isinstance(repo, Repo) else os.fspath(repo))
        self.create = create

    def get(self) -> Repo:
        """The repository, opened (or created, with `create`) on the first call."""
        if self._repo is None:
            self._repo = Repo.init(self.path) if self.create else Repo(self.path)
        return self._repo

    def close(self) -> None:
        """Close the repository (a later `get` opens it again)."""
        if self._repo is not None:
            self._repo.close()
            self._repo = None

    def retarget(self, path: str | os.PathLike) -> None:
        """Name another repository (closing this one when it differs)."""
        if Path(path) != self.path:
            self.close()
            self.path = Path(path)


class UsesRepo:
    """`repo`, `path` and `close` for a DCP storage writer or reader that holds a
    `RepoOnDemand` as `_repo`."""

    _repo: RepoOnDemand

    @property
    def repo(self) -> Repo:
        """The repository, opened by this process on first use (every rank opens its own)."""
        return self._repo.get()

    @property
    def path(self) -> Path:
        return self._repo.path

    def close(self) -> None:
        """Close the repository this object opened."""
        self._repo.close()
