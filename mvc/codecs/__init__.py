"""Codecs: one tensor to stored bytes and back (lossless, quantized base, quantized delta)."""
from mvc.codecs.base import (
    CodecError,
    Encoded,
    TensorCodec,
    UnknownCodecError,
    get_codec,
    register,
    registered,
)
from mvc.codecs import raw as _raw  # noqa: F401  (registers raw/1)
from mvc.codecs import lossless as _lossless  # noqa: F401

__all__ = ["CodecError", "Encoded", "TensorCodec", "UnknownCodecError", "get_codec",
           "register", "registered"]
