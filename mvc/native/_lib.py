"""Load the compiled cffi extension, failing with an actionable message."""
from __future__ import annotations

from mvc.errors import InternalError

__all__ = ["NativeBuildError", "ffi", "lib"]

_ABI_VERSION = 10


class NativeBuildError(InternalError):
    """The native extension is missing or does not match this Python package."""

    exit_code = 71


try:
    from mvc._mvc_native import ffi, lib  # type: ignore[import-not-found]
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise NativeBuildError(
        "mvc's native core is not built; reinstall with `pip install .` "
        f"(a C compiler is required): {exc}"
    ) from exc

if lib.mvc_native_abi_version() != _ABI_VERSION:  # pragma: no cover
    raise NativeBuildError(
        f"native core ABI {lib.mvc_native_abi_version()} != expected {_ABI_VERSION}; rebuild mvc"
    )
