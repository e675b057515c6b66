"""The remotes a repository knows: ``.mvc/remotes.json``, name -> URL.

Its own small file next to ``config.json`` (whose keys are a fixed, typed
set): one JSON object, replaced atomically on every change.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from mvc.errors import MvcError, UsageError
from mvc.repo import refs as R
from mvc.store.objstore import open_storage
from mvc.store.objstore.storage import redact_url

REMOTES_FILE = "remotes.json"
#: The remote a clone names, and the default of push/fetch/pull.
ORIGIN = "origin"
#: Remote-tracking branches: refs/remotes/NAME/BRANCH.
REMOTES = R.REMOTES
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class UnknownRemoteError(UsageError):
    """No remote of that name is configured (mvc remote -v lists them)."""

    exit_code = 143


class RemoteExistsError(MvcError):
    """A remote of that name is already configured."""

    exit_code = 145


class RemoteConfig:
    """Read and change the remotes of the repository whose ``.mvc`` directory is `mvc_dir`."""

    def __init__(self, mvc_dir: str | os.PathLike[str]) -> None:
        self.path = Path(mvc_dir) / REMOTES_FILE

    def items(self) -> dict[str, str]:
        """Every remote: name -> URL, sorted by name (as given: a URL can carry a secret, so
        what is shown of it goes through `redact_url`)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise UsageError(f"{self.path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise UsageError(f"{self.path} must hold a JSON object of name -> URL")
        return dict(sorted(data.items()))

    def url(self, name: str) -> str:
        """The URL of remote `name` (`UnknownRemoteError`)."""
        remotes = self.items()
        if name not in remotes:
            known = ", ".join(remotes) or "none; add one with `mvc remote add NAME URL`"
            raise UnknownRemoteError(f"no remote named {name!r} (known: {known})")
        return remotes[name]

    def add(self, name: str, url: str) -> None:
        """Add remote `name` at `url` (checked for form, not contacted)."""
        if not _NAME.fullmatch(name):
            raise UsageError(f"invalid remote name {name!r} (letters, digits, '.', '_', '-')")
        open_storage(url).close()  # BadRemoteUrlError for a malformed URL
        remotes = self.items()
        if name in remotes:
            raise RemoteExistsError(f"remote {name!r} already exists ({redact_url(remotes[name])})")
        remotes[name] = url
        self._write(remotes)

    def remove(self, name: str) -> str:
        """Forget remote `name`; return its URL."""
        url = self.url(name)
        remotes = self.items()
        del remotes[name]
        self._write(remotes)
        return url

    def _write(self, remotes: dict[str, str]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".remotes.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(dict(sorted(remotes.items())), fh, indent=2)
            fh.write("\n")
        os.replace(tmp, self.path)
