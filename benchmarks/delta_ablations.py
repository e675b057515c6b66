"""The two ablations of the qdelta/1 codec that bench_delta.py measures it against.

Inshrinkerator §9.3 compares its parent-level grouping ("PE", `qdelta/1`) with
coding the same cyclic delta D = (L_parent - L) mod B in original order:

  HE   Huffman of D (QD-compressor style)
  RLE  sign-trick RLE + Huffman of D

Both produce a payload in the layout of `qdelta/1` (centroids | protected |
level sections, with the same meta and checksum) but with one level section
and `meta["mode"]` "he" or "rle", so stored sizes compare like for like.  The
repository never writes them and mvc's `qdelta/1` decoder refuses them: they
live here, with their decoder, for the benchmark (and its tests) only.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import xxhash

from mvc.codecs import delta_groups as dg
from mvc.codecs.base import BytesLike, Encoded, tensor_codec
from mvc.native import huffman, rle
from mvc.quant import QuantizedTensor, level_dtype

ABLATIONS = ("he", "rle")
_LOSSLESS = "lossless/1"


def _check_mode(mode: str) -> None:
    if mode not in ABLATIONS:
        raise ValueError(f"unknown ablation {mode!r}; one of {ABLATIONS}")


def encode(mode: str, q: QuantizedTensor, parent_levels: torch.Tensor, parent_n_levels: int
           ) -> Encoded:
    """Encode `q` against the parent's levels as ablation `mode` ("he" or "rle")."""
    _check_mode(mode)
    k, n_prev = int(q.bins), int(parent_n_levels)
    modulus = max(n_prev, k + 2)
    dt = dg.delta_dtype(modulus)
    levels = q.levels.detach().reshape(-1).cpu().numpy().astype(dt)
    parent = parent_levels.detach().reshape(-1).cpu().numpy().astype(dt)
    dg.group_counts(parent, n_prev)  # range check, as the real encoder does
    d = dg.grouped_delta(parent, levels, modulus, None)
    if not d.any():
        stream = b""  # nothing migrated: the decoder knows the length
    elif mode == "he":
        stream = huffman.encode(d)
    else:
        stream = rle.encode_huffman(d)
    cent = q.centroids.detach().to("cpu", torch.float32).numpy().astype("<f4").tobytes()
    prot = q.protected.detach().reshape(-1).cpu()
    prot_bytes, prot_meta = b"", {}
    if prot.numel():
        enc = tensor_codec(_LOSSLESS).encode(prot)
        prot_bytes, prot_meta = b"".join(bytes(p) for p in enc.parts), {"protected": enc.meta}
    parts = [cent, prot_bytes, bytes(stream)]
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    meta = {
        "mode": mode, "bins": k, "numel": int(levels.size), "n_protected": int(prot.numel()),
        **prot_meta, "parent_n_levels": n_prev, "sections": [len(p) for p in parts],
        "xxh3": h.hexdigest(),
    }
    return Encoded(meta=meta, parts=parts)


def decode(mode: str, meta: dict[str, Any], payload: BytesLike, dtype: torch.dtype,
           shape: tuple[int, ...], parent_levels: torch.Tensor) -> QuantizedTensor:
    """Rebuild the QuantizedTensor from an ablation payload and the parent's levels.

    Trusts its input apart from the checks the native level pass makes: it reads
    only what `encode` wrote in the same run.
    """
    _check_mode(mode)
    if meta.get("mode") != mode:
        raise ValueError(f"payload is mode {meta.get('mode')!r}, not {mode!r}")
    view = memoryview(payload).cast("B")
    if xxhash.xxh3_64(view).hexdigest() != meta["xxh3"]:
        raise ValueError("ablation payload does not match its checksum")
    k, n_prev, n_prot = meta["bins"], meta["parent_n_levels"], meta["n_protected"]
    c_len, p_len, l_len = meta["sections"]
    modulus = max(n_prev, k + 2)
    dt = dg.delta_dtype(modulus)
    parent = np.ascontiguousarray(parent_levels.detach().reshape(-1).cpu().numpy().astype(dt))
    levels, _ = dg.decode_levels(parent, n_prev, modulus, k + 2, grouped=False,
                                 rle=mode == "rle", sections=view[c_len + p_len:],
                                 lengths=[l_len])
    cent = torch.from_numpy(np.frombuffer(view[:c_len], dtype="<f4").astype(np.float32))
    if n_prot:
        prot = tensor_codec(_LOSSLESS).decode(meta["protected"], view[c_len:c_len + p_len], dtype,
                                           (n_prot,))
    else:
        prot = torch.empty(0, dtype=dtype)
    lv = torch.from_numpy(levels.astype(np.int64)).to(level_dtype(k)).reshape(shape)
    return QuantizedTensor(lv, cent, prot.reshape(-1), dtype, k)
