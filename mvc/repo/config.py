"""Repository configuration: a small JSON file, `.mvc/config.json`, with typed defaults.

A file (rather than a key in LMDB) so that people can read and edit it, and so
that `mvc config` never needs the store's write lock.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

from mvc.errors import UsageError
from mvc.state.safe_globals import check_names, resolve
from mvc.repo.refs import HEADS, RefNameError, check_ref_name

#: Every known key with its default. Unknown keys are refused so typos surface.
DEFAULTS: dict[str, Any] = {
    "user.name": None,
    "user.email": None,
    "checkpoint.path": None,
    "checkpoint.format": "pt",
    # Globals (module.qualname, e.g. argparse.Namespace) torch's weights-only unpickler may build
    # when checkpoint files are loaded and their non-tensor values stored and restored: trusted
    # classes only (mvc.state.safe_globals). A list; on the command line, names separated by commas.
    "checkpoint.safe_globals": [],
    "commit.lossless_codec": "lossless/1",
    "commit.chunk_mib": 32,
    "core.lock_timeout": 600.0,
    # How commits store tensors: "search" (the quantization-config search, the commit hook),
    # "fixed" (always commit.quant) or "lossless".
    "commit.mode": "search",
    # The QuantConfig (as a JSON object) used by commit.mode = fixed.
    "commit.quant": None,
    # A fixed-config commit is measured by the quality gates and the tensor cap; when outside
    # them: "warn" (store it as configured, record and warn) or "refuse" (store nothing).
    "commit.fixed_gate": "warn",
    # Optimizer state (Adam moments, SGD momentum): "exact", or "compressed" (ExCP-style: first
    # moment k-means with joint weight-momentum pruning, second moment in the log domain).
    "commit.optimizer": "compressed",
    # The quality hook for `mvc commit`: "module:function" taking the candidate state, returning
    # a loss (lower is better) or per-example losses, or "module:name" of a mvc.quality.fidelity
    # object. Without one the search uses its proxy metric.
    "quality.hook": None,
    # Bound on the relative degradation of quality.hook's value (the proxy has its own bound).
    "quality.epsilon": 0.005,
    # Guard rail on every trial of the config search, whatever the quality gate: each quantized
    # tensor's relative L2 error ||q - w|| / ||w|| must stay within it (provisional value).
    "quality.tensor_cap": 0.5,
    # A quality.hook returning one loss is also measured on each passing trial's mirror,
    # w - (q - w), and the trial accepted only when both are within quality.epsilon: selection
    # cannot pick a trial for its calibration noise (docs/quality.md). false: the trial alone.
    "quality.mirror": True,
    # Guard rail on compressed optimizer second moments: ||sqrt(v') - sqrt(v)|| / ||sqrt(v)|| of each
    # must stay within it, else that moment is stored exactly (first moments: never worse than zeros).
    "quality.moment_cap": 1.0,
    # A quantized tensor is stored as a base at least every this many commits (0 = never forced):
    # caps the per-step overheads of long chains of tiny late-training deltas.
    "commit.base_every": 64,
    # A quantized tensor is stored as a delta only when the delta is smaller than this fraction
    # of its base (1.0: any saving). Lower values keep barely-paying deltas out of chains:
    # less walking when old commits are checked out, for somewhat more storage.
    "commit.delta_max_ratio": 1.0,
    # A quantized tensor's delta chain may cost checkout at most this many full passes over the
    # tensor (a step changing >= 1/16 of the levels counts 1, fewer proportionally less); the
    # commit that would exceed it stores a base. Bounds checkout at any depth while late-training
    # chains of small changes grow long. 0 = no budget.
    "commit.chain_budget": 8.0,
    # Base encodings of the newest N commits' quantized levels kept under .mvc/cache/levels, so a
    # new process (resume after a failure, a CLI commit) restores or deltas against them without
    # walking delta chains. 0 disables the cache.
    "cache.levels_keep": 2,
    # gc re-encodes tensors whose delta chain is deeper than this (or over commit.chain_budget)
    # as bases.
    "gc.max_chain": 64,
    # Days a deleted branch's (or tag's) reflog -- and so its last tip -- stays for gc to keep,
    # like git's gc.reflogExpire; 0: gc drops it at once (`mvc gc --expire now`).
    "gc.reflog_expire": 30.0,
}

#: Keys whose values are JSON objects (given as JSON text on the command line).
JSON_KEYS = {"commit.quant"}

#: Per-branch keys, git's: a branch's upstream (`branch.NAME.remote`: a remote's name;
#: `branch.NAME.merge`: that remote's branch, ``refs/heads/X``), set by clone, `switch`'s
#: remote-branch DWIM and `push -u` (mvc.remote.tracking). No default: unset.
BRANCH_KEY = re.compile(r"branch\.(.+)\.(remote|merge)")
_REMOTE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # mvc.remote.config's rule


class ConfigError(UsageError):
    """An unknown configuration key or a value of the wrong type."""

    exit_code = 19


#: Numeric keys with a valid range: (test, what the error says the value must be).
_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "commit.base_every": (lambda v: v >= 0, ">= 0 (0: never forced)"),
    "commit.delta_max_ratio": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
    "commit.chain_budget": (lambda v: v >= 0.0 and math.isfinite(v), ">= 0 (0: no budget)"),
    # 4096 MiB is 2^32 bytes: one more than the largest value LMDB stores
    "commit.chunk_mib": (lambda v: 1 <= v <= 4095, "in [1, 4095]"),
    "core.lock_timeout": (lambda v: v >= 0.0 and math.isfinite(v), ">= 0 seconds"),
    "quality.epsilon": (lambda v: 0.0 < v < 1.0, "in (0, 1) (a relative degradation)"),
    "quality.tensor_cap": (lambda v: v > 0.0 and math.isfinite(v),
                           "> 0 (a relative L2 error; 1 or more: effectively no cap)"),
    "quality.moment_cap": (lambda v: v > 0.0 and math.isfinite(v),
                           "> 0 (a relative L2 error of sqrt(v))"),
    "cache.levels_keep": (lambda v: v >= 0, ">= 0 (0: no level cache)"),
    "gc.max_chain": (lambda v: v >= 0, ">= 0 (0: no depth bound)"),
    "gc.reflog_expire": (lambda v: v >= 0.0, ">= 0 days (0: deleted refs' reflogs go at the next gc)"),
}

def _exact_codecs() -> list[str]:
    # The codec registry is filled by the codec modules, which import torch: only a
    # commit.lossless_codec other than its default asks it.
    from mvc.codecs import exact_codecs

    return exact_codecs()


#: String keys with a fixed set of values (a callable: the set is known only at run time).
_CHOICES: dict[str, Callable[[], list[str]]] = {
    "commit.mode": lambda: ["search", "fixed", "lossless"],
    "commit.fixed_gate": lambda: ["warn", "refuse"],
    "commit.optimizer": lambda: ["exact", "compressed"],
    "checkpoint.format": lambda: ["pt", "safetensors"],
    "commit.lossless_codec": _exact_codecs,  # a quantized codec cannot store a tensor exactly
}


def _check_key(key: str) -> None:
    """`ConfigError` unless `key` is known: a fixed key, or ``branch.NAME.remote|merge``."""
    m = BRANCH_KEY.fullmatch(key) if isinstance(key, str) else None
    if key in DEFAULTS or m is not None and _valid_branch(m.group(1)):
        return
    raise ConfigError(f"unknown config key {key!r} (known: {', '.join(sorted(DEFAULTS))}, "
                      "branch.NAME.remote, branch.NAME.merge)")


def _valid_branch(name: str) -> bool:
    try:
        check_ref_name(name, "branch")
    except RefNameError:
        return False
    return True


def _branch_value(key: str, value: Any) -> Any:
    """A `BRANCH_KEY` value, checked: a remote name, or a branch (``X`` is ``refs/heads/X``)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"config {key} expects a str, got {value!r}")
    if key.endswith(".remote"):
        if not _REMOTE_NAME.fullmatch(value):
            raise ConfigError(f"config {key} must be a remote name, got {value!r}")
        return value
    branch = value.removeprefix(HEADS)
    if not _valid_branch(branch):
        raise ConfigError(f"config {key} must be a branch (refs/heads/NAME), got {value!r}")
    return HEADS + branch


def _coerce(key: str, value: Any) -> Any:
    if key not in DEFAULTS:
        return _branch_value(key, value)
    value = _coerce_type(key, value)
    check = _RANGES.get(key)
    if check is not None and value is not None and not check[0](value):
        raise ConfigError(f"config {key} must be {check[1]}, got {value!r}")
    choices = _CHOICES.get(key)
    # A default is valid by construction: not asking spares `mvc config` the codec registry.
    if choices is not None and value is not None and value != DEFAULTS[key] and value not in choices():
        raise ConfigError(f"config {key} must be one of {', '.join(choices())}, got {value!r}")
    return value


#: Keys with a validator of their own (the value as given -> the value stored).
_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "checkpoint.safe_globals": check_names,  # form only: reading the config imports nothing
}

#: Checks made when a key is set, not when it is read: a typo fails where it is made.
_ON_SET: dict[str, Callable[[Any], Any]] = {
    "checkpoint.safe_globals": resolve,  # imports each name's module
}


def _coerce_type(key: str, value: Any) -> Any:
    default = DEFAULTS[key]
    validate = _VALIDATORS.get(key)
    if validate is not None:
        return validate(value)
    if key in JSON_KEYS:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ConfigError(f"config {key} expects JSON, got {value!r}") from None
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"config {key} expects a JSON object or null, got {value!r}")
        return value
    if value is None or default is None or isinstance(value, type(default)):
        return value
    if isinstance(value, str):
        try:
            if isinstance(default, bool):
                if value.lower() in ("true", "1", "yes", "on"):
                    return True
                if value.lower() in ("false", "0", "no", "off"):
                    return False
                raise ValueError(value)
            return type(default)(value)
        except ValueError:
            pass
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    raise ConfigError(f"config {key} expects a {type(default).__name__}, got {value!r}")


class Config:
    """Read/write access to `.mvc/config.json`.

    The parsed file is kept until the file changes (size, mtime or inode), so the dozen
    lookups of one commit cost one parse while an edit by `mvc config` or by hand in
    another process is still seen by the next lookup.
    """

    def __init__(self, path: Path):
        self.path = path
        self._cached: tuple[tuple[int, int, int], dict[str, Any]] | None = None

    def _load(self) -> dict[str, Any]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._cached is not None and self._cached[0] == stamp:
            return dict(self._cached[1])
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ConfigError(f"{self.path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{self.path} must hold a JSON object")
        self._cached = (stamp, data)
        return dict(data)

    def get(self, key: str) -> Any:
        """The configured value of `key`, or its default."""
        _check_key(key)
        return _coerce(key, self._load().get(key, DEFAULTS.get(key)))

    def is_set(self, key: str) -> bool:
        """Whether `key` is set in the file (not just its default)."""
        _check_key(key)
        return key in self._load()

    def set(self, key: str, value: Any) -> None:
        """Set `key` (validated against its default's type); None unsets it."""
        _check_key(key)
        data = self._load()
        if value is None:
            data.pop(key, None)
        else:
            data[key] = _coerce(key, value)
            on_set = _ON_SET.get(key)
            if on_set is not None:
                on_set(data[key])
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".config.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, self.path)
        st = os.stat(self.path)
        self._cached = ((st.st_mtime_ns, st.st_size, st.st_ino), data)

    def items(self) -> dict[str, Any]:
        """Every key with its effective value, then the per-branch keys that are set."""
        data = self._load()
        out = {k: _coerce(k, data.get(k, d)) for k, d in DEFAULTS.items()}
        out.update((k, _coerce(k, v)) for k, v in sorted(data.items())
                   if k not in DEFAULTS and (m := BRANCH_KEY.fullmatch(k)) and _valid_branch(m.group(1)))
        return out


def register_key(key: str, default: Any) -> None:
    """Let a later layer (quantizer, search, gc) declare its own config keys."""
    DEFAULTS.setdefault(key, default)
