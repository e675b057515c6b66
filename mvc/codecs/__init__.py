"""Codecs: one tensor to stored bytes and back (lossless, quantized base, quantized delta)."""
from mvc.codecs.base import (
    Codec,
    CodecError,
    CodecKindError,
    Encoded,
    QuantizedCodec,
    TensorCodec,
    UnknownCodecError,
    exact_codecs,
    find_codec,
    get_codec,
    quantized_codec,
    register,
    registered,
    tensor_codec,
)
from mvc.codecs import raw as _raw  # noqa: F401  (registers raw/1)
from mvc.codecs import lossless as _lossless  # noqa: F401
from mvc.codecs import quantized as _quantized  # noqa: F401  (registers qbase/1, qdelta/1)

__all__ = ["Codec", "CodecError", "CodecKindError", "Encoded", "QuantizedCodec", "TensorCodec",
           "UnknownCodecError", "exact_codecs", "find_codec", "get_codec", "quantized_codec",
           "register", "registered", "tensor_codec"]
