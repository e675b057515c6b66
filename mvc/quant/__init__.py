"""mvc's quantizer: DDSketch histograms, sensitivity-weighted approximate k-means and
prune / protect partitioning (Inshrinkerator §4, Algorithms 1-3).

Standalone use, no repository needed::

    from mvc.quant import quantize
    q = quantize(weight, 16, prune=0.2, protect=0.001)
    q.levels, q.centroids, q.dequantize()

NaN/Inf policy: tensors holding NaN or +-Inf are never binned; `quantize` raises
`NonFiniteTensorError` naming the tensor, and the repository keeps such a tensor
lossless or refuses it (`quantize_state(..., nonfinite="lossless")` maps it to None).
"""
from mvc.layer_types import LAYER_TYPES, layer_type
from mvc.quant._kernels import AssignStats
from mvc.quant.assign import assign, level_dtype
from mvc.quant.config import LayerQuant, QuantConfig, QuantPolicy
from mvc.quant.errors import (NonFiniteTensorError, QuantConfigError, QuantError,
                              QuantizedPartsError, QuantStateError)
from mvc.quant.importance import magnitude, sensitivity
from mvc.quant.kmeans import approx_kmeans, weighted_kmeans_1d
from mvc.quant.partition import Thresholds, masks, thresholds
from mvc.quant.sketch import LogSketch
from mvc.quant.state import dequantize_state, quantize_state
from mvc.quant.tensor import QuantizedTensor, quantize, quantize_prepared
from mvc.quant.uniform import FAMILIES

__all__ = [
    "AssignStats", "FAMILIES", "LAYER_TYPES", "LayerQuant", "LogSketch", "NonFiniteTensorError", "QuantConfig",
    "QuantConfigError", "QuantError", "QuantPolicy", "QuantStateError", "QuantizedPartsError",
    "QuantizedTensor", "Thresholds", "approx_kmeans", "assign", "dequantize_state",
    "layer_type", "level_dtype", "magnitude", "masks", "quantize", "quantize_prepared",
    "quantize_state", "sensitivity", "thresholds", "weighted_kmeans_1d",
]
