"""Branches, tags and HEAD on top of the store's raw refs."""
from __future__ import annotations

import re

from mvc.errors import MvcError, UsageError

HEAD = "HEAD"
HEADS = "refs/heads/"
TAGS = "refs/tags/"
SYMREF = "ref: "

# git's rules, simplified: no control chars, spaces, ~^:?*[\ , no "..", no leading "-" or "/",
# no trailing "/" or ".lock", no "//".
_BAD_NAME = re.compile(r"[\x00-\x20~^:?*\[\\\x7f]|\.\.|//|@\{")


class RefNameError(UsageError):
    """A branch or tag name that cannot be used."""

    exit_code = 15


class RefExistsError(MvcError):
    """A branch or tag of that name already exists."""

    exit_code = 16


class NoSuchRefError(MvcError):
    """A branch or tag of that name does not exist."""

    exit_code = 17


class CurrentBranchError(MvcError):
    """The operation would remove or rewrite the branch HEAD is on."""

    exit_code = 18


def check_ref_name(name: str, kind: str) -> None:
    """Raise RefNameError unless `name` is a valid branch/tag name."""
    if (not name or _BAD_NAME.search(name) or name.startswith(("-", "/", "."))
            or name.endswith(("/", ".lock", ".")) or name == "HEAD"):
        raise RefNameError(f"invalid {kind} name {name!r}")


def is_symbolic(value: str | None) -> bool:
    return value is not None and value.startswith(SYMREF)


def symbolic_target(value: str) -> str:
    return value[len(SYMREF):]
