"""The root of mvc's error hierarchy.

Each layer defines its own errors next to the code that raises them, all
subclassing `MvcError`.  Every concrete class carries a distinct `exit_code`
that the CLI uses, so scripts can tell "not a repository" from "corrupt data"
from "a bug in mvc".  `DataError` marks stored data that is missing or corrupt;
`InternalError` marks a broken invariant inside mvc itself (a bug).
"""
from __future__ import annotations


class MvcError(Exception):
    """Base of every error mvc raises on purpose."""

    exit_code: int = 1


class UsageError(MvcError):
    """The caller asked for something that cannot be done as asked."""

    exit_code = 2


class DataError(MvcError):
    """Stored data is missing or corrupt (not a bug in mvc, not a user mistake)."""

    exit_code = 6


class InternalError(MvcError):
    """An invariant inside mvc broke: this is a bug, please report it."""

    exit_code = 70
