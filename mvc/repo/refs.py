"""Branches, tags and HEAD on top of the store's raw refs."""
from __future__ import annotations

import re

from mvc.errors import MvcError, UsageError

HEAD = "HEAD"
#: The commit the last fetch of one revision took (`mvc fetch REMOTE REV`), as git's.
FETCH_HEAD = "FETCH_HEAD"
HEADS = "refs/heads/"
TAGS = "refs/tags/"
#: Remote-tracking branches: refs/remotes/REMOTE/BRANCH (written by fetch, push and clone only).
REMOTES = "refs/remotes/"
SYMREF = "ref: "

# git check-ref-format's rules: no control characters (C0, DEL, and C1 too: CSI is U+009B),
# space, ~ ^ : ? * [ \ , no "..", no "@{", no "//"; per component: no leading ".", no trailing
# ".lock"; no leading "-" or "/", no trailing "/" or "."; not "@" alone.
_BAD_NAME = re.compile(r"[\x00-\x20~^:?*\[\\\x7f-\x9f]|\.\.|//|@\{|(^|/)\.|\.lock(/|$)")
# A name made only of hex digits could be read as a commit id or id prefix (4 digits or more
# are one): it is refused whatever its length, so every spelling of an id means that id.
_HEX_NAME = re.compile(r"^[0-9a-fA-F]{4,}$")


class RefNameError(UsageError):
    """A branch or tag name that cannot be used."""

    exit_code = 15


class AmbiguousRefNameError(RefNameError):
    """A branch or tag name that reads as a commit id, an id prefix or a full ref name."""

    exit_code = 93


class RefExistsError(MvcError):
    """A branch or tag of that name already exists."""

    exit_code = 16


class NoSuchRefError(MvcError):
    """A branch or tag of that name does not exist."""

    exit_code = 17


class CurrentBranchError(MvcError):
    """The operation would remove or rewrite the branch HEAD is on."""

    exit_code = 18


class UnmergedBranchError(MvcError):
    """A branch whose tip no other branch, tag or HEAD reaches: deleting it needs force (-D)."""

    exit_code = 135


def check_ref_name(name: str, kind: str) -> None:
    """Raise RefNameError unless `name` is a valid branch/tag name.

    git's `check-ref-format` rules, plus two of mvc's own so that a name can never
    shadow another kind of revision: no all-hex names of 4 digits or more (an id or
    id prefix), and nothing starting with `refs/` (the full form of a ref).
    """
    if (not isinstance(name, str) or not name or _BAD_NAME.search(name)
            or name.startswith(("-", "/")) or name.endswith(("/", "."))
            or name in ("HEAD", "@")):
        raise RefNameError(f"invalid {kind} name {name!r}")
    if _HEX_NAME.match(name):
        raise AmbiguousRefNameError(
            f"{kind} name {name!r} is all hex digits and would read as a commit id "
            f"(or id prefix); pick a name with a non-hex character, e.g. 'v-{name}'")
    if name.startswith("refs/"):
        raise AmbiguousRefNameError(
            f"{kind} name {name!r} starts with 'refs/' and would read as a full ref name; "
            "drop the prefix")


def is_symbolic(value: str | None) -> bool:
    return value is not None and value.startswith(SYMREF)


def symbolic_target(value: str) -> str:
    return value[len(SYMREF):]
