"""`Repo` for the command modules, imported on first use.

`mvc.repo.repository` imports the store (LMDB) and the object code (~0.15 s; torch only
once a command touches tensors: see `Repo`); a command module that names `Repo` through
this stand-in costs nothing to import, so listing the commands (`mvc --help`) does not pay
for it. Type checkers see the real class (the modules import it under TYPE_CHECKING).
"""
from __future__ import annotations

from typing import Any


class _LazyRepo:
    """Forwards attribute access (`Repo.discover`, `Repo.init`) to the real `Repo` class."""

    def __getattr__(self, name: str) -> Any:
        from mvc.repo.repository import Repo as _Repo

        return getattr(_Repo, name)


Repo: Any = _LazyRepo()
