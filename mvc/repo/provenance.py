"""Who made a commit, and from which code: author identity and the training repo's git state."""
from __future__ import annotations

import getpass
import os
from typing import Any


def author(config_name: str | None, config_email: str | None) -> str:
    """'Name <email>' from mvc config, then MVC_AUTHOR_*/GIT_AUTHOR_* env, then git config, then the login."""
    name = config_name or os.environ.get("MVC_AUTHOR_NAME") or os.environ.get("GIT_AUTHOR_NAME")
    email = config_email or os.environ.get("MVC_AUTHOR_EMAIL") or os.environ.get("GIT_AUTHOR_EMAIL")
    if not (name and email):
        try:
            import pygit2

            cfg = pygit2.Config.get_global_config()
            name = name or cfg["user.name"]
            email = email or cfg["user.email"]
        except Exception:  # no global git config: fine, fall through
            pass
    if not name:
        try:
            name = getpass.getuser()
        except Exception:
            name = "unknown"
    return f"{name} <{email}>" if email else name


def code_provenance(path: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """HEAD commit, branch and dirty flag of the git repository containing `path` (cwd by default).

    Returns None outside a git repository. Never raises: provenance is best effort
    and must not block a commit.
    """
    try:
        # Imported here, inside the try: a missing or broken pygit2 must cost the commit its
        # provenance, never the commit.
        import pygit2

        where = os.fspath(path if path is not None else os.getcwd())
        gitdir = pygit2.discover_repository(where)
        if gitdir is None:
            return None
        repo = pygit2.Repository(gitdir)
        info: dict[str, Any] = {"repo": repo.workdir or repo.path}
        if repo.head_is_unborn:
            info.update(commit=None, branch=None)
        else:
            info["commit"] = str(repo.head.target)
            info["branch"] = None if repo.head_is_detached else repo.head.shorthand
        try:
            status = repo.status(untracked_files="no")
        except TypeError:  # older pygit2 without the keyword
            status = repo.status()
        info["dirty"] = any(
            flags not in (pygit2.GIT_STATUS_CURRENT, pygit2.GIT_STATUS_IGNORED)
            for flags in status.values()
        )
        return info
    except Exception:
        return None
