"""What a quantization costs in reconstruction error, in one pass over the tensor.

`error_sums(q, x, w)` gives, with d = dequantize(q) - x (centroids rounded to the
tensor's dtype, pruned entries 0, protected entries exact) and x the tensor as float32:

    (sum d^2, sum x^2, sum |x| d^2, sum |x| x^2, sum |w| d^2, sum |w| x^2)

every term in float64 (the last two 0 without `w`).  The config search reads its
proxy metric (magnitude- and gradient-weighted relative errors) and its per-tensor
guard rail from these sums, so one pass over levels and values serves a trial; no
dequantized copy of the tensor is made.  On CPU a native kernel does the pass
(blocks sized from the length alone: the same bits whatever the thread count);
elsewhere torch does it chunk by chunk on the tensor's device.
"""
from __future__ import annotations

import weakref

import torch

from mvc.quant._kernels import level_counts, qerr_sums
from mvc.quant.assign import native_ok
from mvc.quant.tensor import QuantizedTensor

#: Elements per chunk of the torch path (bounds its temporaries to a few MiB).
_CHUNK = 1 << 20

ErrorSums = tuple[float, float, float, float, float, float]


def level_table(q: QuantizedTensor, device: torch.device) -> torch.Tensor:
    """float32 value of each level: centroids rounded to q's dtype, 0 (pruned), 0 (protected:
    its exact values are never looked up here)."""
    table = torch.zeros(q.n_levels, dtype=torch.float32, device=device)
    table[:q.bins] = q.centroids.to(device=device, dtype=q.dtype).to(torch.float32)
    return table


def error_sums(q: QuantizedTensor, x: torch.Tensor, w: torch.Tensor | None = None) -> ErrorSums:
    """The six error sums of the module docstring for `q` against the values `x` (any
    float dtype and shape with q's element count; `w`, optional weights, likewise)."""
    lv = q.levels.reshape(-1)
    xf = x.detach().reshape(-1).to(device=lv.device, dtype=torch.float32).contiguous()
    wf = (w.detach().reshape(-1).to(device=lv.device, dtype=torch.float32).contiguous()
          if w is not None else None)
    if xf.numel() != lv.numel() or (wf is not None and wf.numel() != lv.numel()):
        raise ValueError("error_sums: x / w do not match the levels' element count")
    table = level_table(q, lv.device)
    if native_ok(xf, lv.dtype):
        s = qerr_sums(xf, lv.contiguous(), table, wf)
        return (float(s[0]), float(s[1]), float(s[2]), float(s[3]), float(s[4]), float(s[5]))
    acc = torch.zeros(6, dtype=torch.float64, device=lv.device)
    prot = q.protected_level
    for s0 in range(0, lv.numel(), _CHUNK):
        lc = lv[s0:s0 + _CHUNK]
        xc = xf[s0:s0 + _CHUNK].to(torch.float64)
        idx = lc if lc.dtype in (torch.int32, torch.int64) else lc.to(torch.int32)
        d = torch.index_select(table, 0, idx).to(torch.float64).sub_(xc)
        d.masked_fill_(lc == prot, 0.0)
        dd, xx, ax = d.mul_(d), xc * xc, xc.abs()
        parts = [dd.sum(), xx.sum(), (ax * dd).sum(), (ax * xx).sum()]
        if wf is not None:
            aw = wf[s0:s0 + _CHUNK].to(torch.float64).abs()
            parts += [(aw * dd).sum(), (aw * xx).sum()]
        else:
            parts += [acc.new_zeros(()), acc.new_zeros(())]
        acc += torch.stack(parts)
    a = acc.tolist()
    return (a[0], a[1], a[2], a[3], a[4], a[5])


_COUNTS: weakref.WeakKeyDictionary[QuantizedTensor, tuple[int, torch.Tensor]] = \
    weakref.WeakKeyDictionary()


def level_histogram(q: QuantizedTensor) -> torch.Tensor:
    """int64 count of each of q's `n_levels` levels (on the CPU for CPU levels), remembered
    for q while it lives: the search asks once per trial for every quantization it keeps."""
    hit = _COUNTS.get(q)
    if hit is not None and hit[0] == q.levels._version:
        return hit[1]
    lv = q.levels.reshape(-1)
    if native_ok(lv, lv.dtype):
        counts = level_counts(lv.contiguous(), q.n_levels)
    else:
        counts = torch.bincount(lv.to(torch.int64), minlength=q.n_levels)
    _COUNTS[q] = (q.levels._version, counts)
    return counts
