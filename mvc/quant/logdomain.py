"""A second moment's log domain (`mvc.quant.optimizer`): the arithmetic every path shares, so a
moment quantizes and restores to the same bits wherever it is done.

* `log32`: the values quantized, float32(log(float64(v))) of the positive entries;
* `exp_levels`: a level's restored value, exp of its centroid in float64 on the host (numpy's
  exp: the same on every device), rounded once to the moment's dtype.
"""
from __future__ import annotations

import numpy as np
import torch


def log32(v: torch.Tensor, floor: float | None = None) -> torch.Tensor:
    """float32(log(float64(v))), on v's device; v itself is left alone. `floor` (a float32
    value): log of max(v, floor), as if v were clamped first. The clamp and the log are taken
    in place on a float64 copy that is always made (a float64 v is not copied by a plain
    cast): one float64 temporary, not three (a chunk's largest, on a GPU)."""
    d = v.to(torch.float64, copy=True)
    if floor is not None:
        d.clamp_min_(floor)
    return d.log_().to(torch.float32)


def exp_levels(cen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """exp of log-domain centroids as the restore gives them: exp in float64 on the host, then
    one rounding to `dtype` (a host tensor)."""
    table64 = np.exp(cen.detach().cpu().numpy().astype(np.float64))
    return torch.from_numpy(table64).to(dtype)
