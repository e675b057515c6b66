"""mvc: git-like version control for deep-learning training checkpoints.

    >>> import mvc
    >>> repo = mvc.Repo.init("runs/exp1")
    >>> cid = repo.commit(state, "epoch 3", step=3000, metrics={"val_loss": 2.1})
    >>> state = repo.checkout(cid)
"""
from __future__ import annotations

from typing import Any

from mvc.errors import DataError, InternalError, MvcError, UsageError

__version__ = "0.1.0"

__all__ = ["Repo", "Commit", "Tracker", "MvcError", "DataError", "InternalError", "UsageError", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy so that `import mvc` (and the CLI's --help) does not pay for torch and LMDB.
    if name == "Repo":
        from mvc.repo.repository import Repo

        return Repo
    if name == "Tracker":
        from mvc.integrations.tracker import Tracker

        return Tracker
    if name == "Commit":
        from mvc.repo.objects import Commit

        return Commit
    raise AttributeError(f"module 'mvc' has no attribute {name!r}")
