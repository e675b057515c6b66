"""Layer types of checkpoint tensors, by name and shape: the one set of rules.

The quantizer groups tensors by them (one prune / protect fraction and bin count per layer
type, `mvc.quant.QuantConfig`; `QuantPolicy.lossless_types`), and `mvc show` summarises a
commit by them.  Pure string rules, no torch: a bottom module beside `mvc.errors`, so the
CLI reads history without importing torch.

A name's components are separated by "." (a state dict's keys) and, in a flattened
checkpoint name, by "/" between nesting levels ("model/embed.weight"): a nested state's
"model/ln_f.weight" is a norm and "model/wte.weight" an embedding, as in the flat state dict.
(Until issue 27's session the quantizer did not split on "/", so a nested checkpoint -- the
usual {"model": ..., "optimizer": ...} -- had its embeddings grouped as linear layers and its
norms quantized instead of kept exact; `mvc show` already read "/" as ".".)
"""
from __future__ import annotations

import re
from collections.abc import Sequence

LAYER_TYPES = ("embedding", "linear", "conv", "attention", "norm", "bias", "other")


def _words(*alts: str) -> re.Pattern[str]:
    # whole name components only: "key" must not match "monkey"
    return re.compile(r"(?:^|[._])(?:" + "|".join(alts) + r")(?:\d*)(?=[._]|$)", re.I)


_NORM = _words(r"\w*norm\w*", r"ln(?:_\w+)?", "bn", "gn", "running_mean", "running_var",
               "num_batches_tracked")
_EMBED = _words("emb", r"\w*embed\w*", r"\w*_emb", r"emb_\w*", "wte", "wpe", "shared")
_ATTN = _words(r"\w*attn", r"\w*attention", "[qkvo]_proj", "out_proj", "in_proj\\w*", "qkv",
               "query", "key", "value", "w[qkvo]")
_CONV = _words(r"\w*conv\w*")


def layer_type(name: str, shape: Sequence[int]) -> str:
    """Infer a tensor's layer type from its state-dict name and shape.

    One of LAYER_TYPES.  Names win where they are explicit (bias, norm, conv,
    embedding, attention); otherwise rank decides: >= 3-D is a convolution, 2-D a
    linear layer, anything else "other".
    """
    name = name.replace("/", ".")
    leaf = name.rsplit(".", 1)[-1].lower()
    ndim = len(tuple(shape))
    if leaf == "bias" or leaf.endswith("_bias") or (leaf.startswith("bias") and ndim <= 1):
        return "bias"
    if ndim <= 1:
        return "norm" if _NORM.search(name) else "other"
    if _CONV.search(name) and ndim >= 3:
        return "conv"
    if _EMBED.search(name) and ndim <= 3:
        return "embedding"
    if _ATTN.search(name):
        return "attention"
    return "conv" if ndim >= 3 else "linear"
