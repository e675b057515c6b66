"""Globals a repository lets torch's weights-only unpickler build (`checkpoint.safe_globals`).

Checkpoint files, and the non-tensor values a commit keeps as torch bytes
(`mvc.state.leaves`), are read only by torch's weights-only unpickler, which
refuses any global outside its allow-list: an ``argparse.Namespace`` of
hyper-parameters (older scripts', Lightning's ``hparams``) is refused with
nothing run. A user who trusts a class names it, as ``module.qualname``, in
the repository config key ``checkpoint.safe_globals``; while a file is loaded,
a state flattened for a commit, or a stored state rebuilt, `allowing` adds those
globals to torch's list (``torch.serialization.safe_globals``) and takes away
only what it added. The same names allow a value in and out, so what was
committed restores as it was; a repository (or a clone) without them refuses
to rebuild it, naming the global and the key (`GlobalNotAllowedError`).

Only `check_names` runs at configuration time without importing anything;
`resolve` imports each name's module (as `quality.hook` does), and torch is
imported only when a context is entered.
"""
from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from mvc.errors import MvcError, UsageError

#: The repository config key holding the allowed names.
CONFIG_KEY = "checkpoint.safe_globals"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")

#: Top-level modules whose globals are the usual tools of a malicious pickle (running
#: commands or code, importing, reaching attributes, opening files): never allowed, and
#: never suggested. Not a proof of safety for the rest: only trusted classes belong here.
_NEVER = frozenset({
    "builtins", "__builtin__", "os", "posix", "nt", "subprocess", "sys", "shutil", "importlib",
    "pickle", "_pickle", "marshal", "runpy", "code", "codeop", "ctypes", "socket", "pty",
    "webbrowser", "functools", "operator", "types", "io", "_io", "pathlib", "tempfile",
})


class UnknownSafeGlobalError(UsageError):
    """A `checkpoint.safe_globals` entry is not a `module.qualname` naming an importable
    class or function."""

    exit_code = 111


class GlobalNotAllowedError(MvcError):
    """A stored non-tensor value needs a global that `checkpoint.safe_globals` does not allow
    (a repository or clone without the config its commit was made with); nothing was run."""

    exit_code = 112


def check_names(value: Any) -> list[str]:
    """`value` as a list of `module.qualname` names: a list of them, or one string of names
    separated by commas or spaces (a JSON or Python list's text too, as `mvc config` prints
    it). Checks the form only (nothing is imported): `UnknownSafeGlobalError` names the
    first bad entry."""
    if isinstance(value, str):
        # Brackets and quotes cannot be part of a name: a list's text splits like a plain one.
        value = [v for v in re.split(r"[\s,\[\]'\"]+", value) if v]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UnknownSafeGlobalError(f"{CONFIG_KEY} expects module.qualname names, got {value!r}")
    for name in value:
        if not _NAME.fullmatch(name):
            raise UnknownSafeGlobalError(
                f"{CONFIG_KEY}: {name!r} is not module.qualname (e.g. argparse.Namespace)")
        if not allowable(name):
            raise UnknownSafeGlobalError(f"{CONFIG_KEY}: {name!r} is never allowed: the globals of "
                                         f"{name.split('.')[0]} can run code or reach the system")
    return list(dict.fromkeys(value))


def allowable(name: str) -> bool:
    """Whether `name` may be allowed at all (its top-level module is not in `_NEVER`)."""
    return name.split(".", 1)[0] not in _NEVER


def resolve(names: Iterable[Any]) -> list[Any]:
    """The objects `names` name (strings as `check_names` accepts; anything else, e.g. a
    class, is taken as given). Imports each name's module: `UnknownSafeGlobalError` when
    none of its prefixes imports or the rest is no class or function in it."""
    out: list[Any] = []
    for item in names:
        if not isinstance(item, str):
            out.append(item)
            continue
        [name] = check_names([item])
        out.append(_resolve_one(name))
    return out


def _resolve_one(name: str) -> Any:
    parts = name.split(".")
    problem = f"no module of {name!r} can be imported"
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        except Exception as exc:  # the user's module failing as it imports
            raise UnknownSafeGlobalError(
                f"{CONFIG_KEY}: importing {module_name} for {name!r} failed: {type(exc).__name__}: {exc}") from None
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            problem = f"{module_name} has no {'.'.join(parts[cut:])}"
            continue
        if not callable(obj):  # classes and functions: what a pickle's GLOBAL names
            raise UnknownSafeGlobalError(f"{CONFIG_KEY}: {name!r} is a {type(obj).__name__}, "
                                         "not a class or function")
        return obj
    raise UnknownSafeGlobalError(f"{CONFIG_KEY}: {name!r} does not resolve: {problem}")


def global_name(obj: Any) -> str:
    """The `module.qualname` torch's allow-list knows `obj` by."""
    return f"{obj.__module__}.{obj.__qualname__}"


@contextmanager
def allowing(names: Iterable[Any]) -> Iterator[list[Any]]:
    """Within the block, torch's weights-only unpickler (also behind `torch.load(...,
    weights_only=True)`) allows the globals `names` names (see `resolve`); yields them.

    Adds only those not allowed already, and removes only those on exit: torch's own
    `safe_globals` context would drop a global the caller had allowed before."""
    wanted = resolve(names)
    if not wanted:
        yield wanted
        return
    import torch

    present = {global_name(g) for g in torch.serialization.get_safe_globals() if not isinstance(g, tuple)}
    added = [g for g in wanted if global_name(g) not in present]
    if not added:
        yield wanted
        return
    with torch.serialization.safe_globals(added):
        yield wanted


def allow_hint(names: Iterable[str]) -> str:
    """The end of a refusal naming `names`: how to allow them, if trusted (nothing to
    suggest for a global that can run code: see `_NEVER`)."""
    names = list(names)
    if not names or not all(allowable(n) for n in names):
        return "it cannot be allowed"
    return (f"if you trust it: `mvc config {CONFIG_KEY} {','.join(names)}` (Python: "
            f"safe_globals=[...] / torch.serialization.add_safe_globals)")


def refused_globals(message: str) -> list[str]:
    """The globals a weights-only refusal's `message` names (torch: "GLOBAL module.name was
    not an allowed global", "Unsupported global: ..."), or []."""
    return list(dict.fromkeys(re.findall(r"GLOBAL ([\w.]+)", message)))
