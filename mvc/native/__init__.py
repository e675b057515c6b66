"""Thin Python bindings over the C core in `native/` (compiled as `mvc._mvc_native`)."""
from mvc.native._lib import NativeBuildError, ffi, lib

__all__ = ["NativeBuildError", "ffi", "lib"]
