"""The restore-time bound of an Adam first moment: |m| <= bound * sqrt(v), elementwise.

m and v are quantized independently (m with absolute, v with relative error), so where v is
tiny the restored m / sqrt(v) -- Adam's step -- can be hundreds of times larger than anything
the exact state had. The commit records the exact state's largest |m| / sqrt(v) in the first
moment's record (`bound_meta`); the restore clamps m to it (`clamp_first_moment`).

Two forms, named by the record's ``meta.moment.sqrt``:

* ``"ieee"`` (every commit since issue 27's device checkout): limit = float32(bound) times the
  correctly rounded float32 sqrt of v (0 where v <= 0 or NaN), rounded once to m's dtype;
  entries of |m| above it become the limit with m's sign, the rest keep their bits (signed
  zeros and NaN included). Each step is exactly rounded, so every host and device gets the
  same bits: float32 moments on the host take one native pass (`mvc_moment_clamp_f32`, the
  processor's sqrt instruction), other host moments numpy's sqrt, and an accelerator (or the
  host under `device_path()`, as CI runs it) the float64 sqrt rounded to float32, which is
  the correctly rounded float32 sqrt (53 >= 2 * 24 + 2 bits).
* absent (earlier commits): torch's own host float32 sqrt and `clamp`, as those commits always
  restored. torch's CPU float32 sqrt is not correctly rounded (measured: 0.6% of float32
  inputs an ulp off on this project's CI machine; on a second intra-op thread it was once
  measured ~3e-4 off, tests/repo/test_device_boundaries.py), so it is taken on the host only,
  and kept only so old commits restore as they did.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mvc.errors import InternalError
from mvc.quant._kernels import moment_clamp, ratio_max
from mvc.quant.backend import on_host_kernels

#: ``meta.moment.sqrt`` of the correctly rounded form.
IEEE_SQRT = "ieee"
SQRT_FORMS = (IEEE_SQRT,)

#: Elements per step of the legacy form: a power of two, so chunk boundaries fall on torch's
#: vector lanes (the same bits as over the whole tensor), and the limits cost 2 MiB per
#: thread, not a copy of the moment.
LEGACY_CHUNK = 1 << 18
#: Elements per step of the IEEE form on a GPU (float64 temporaries: 32 MiB).
_DEVICE_CHUNK = 1 << 22


def bound_meta(partner: str, ratio_bound: float) -> dict[str, Any]:
    """A compressed first moment's ``meta.moment``: its second moment's name and the bound,
    restored by the IEEE form."""
    return {"partner": partner, "ratio_bound": ratio_bound, "sqrt": IEEE_SQRT}


def uses_host(meta: dict[str, Any]) -> bool:
    """Whether a first moment of this ``meta.moment`` must be bounded on the host (the legacy
    form), whatever device it is restored to."""
    return meta.get("sqrt") != IEEE_SQRT


def clamp_first_moment(m: torch.Tensor, v: torch.Tensor, meta: dict[str, Any]) -> None:
    """Clamp first moment `m` (a dense tensor) to its bound by second moment `v` (same
    element count, any device), in place, in the form ``meta`` names (module docstring)."""
    form = meta.get("sqrt")
    if form is not None and form not in SQRT_FORMS:
        # records are checked when read (`mvc.repo.objects`): a form unknown here is a bug
        raise InternalError(f"unknown first-moment bound form {form!r}; known: {SQRT_FORMS}")
    bound = float(meta["ratio_bound"])
    mf, vf = m.view(-1), v.reshape(-1)  # m is dense, so the view writes m
    if form is None:
        for a in range(0, mf.numel(), LEGACY_CHUNK):
            mc = mf[a:a + LEGACY_CHUNK]
            limit = vf[a:a + LEGACY_CHUNK].cpu().float().clamp_min(0).sqrt_().mul_(bound) \
                .to(m.dtype)
            torch.clamp(mc, min=-limit.to(mc.device), max=limit.to(mc.device), out=mc)
        return
    # float32(bound) times a float32: the product is exact in float64, so whether a kernel
    # multiplies in float32 or float64 the one rounding gives the same bits
    b32 = float(np.float32(bound))
    if _native(mf) and _native(vf):
        moment_clamp(mf, vf, b32)  # one pass in C, the same steps
        return
    torch_clamp(mf, vf, b32)


def torch_clamp(mf: torch.Tensor, vf: torch.Tensor, b32: float) -> None:
    """The IEEE form's clamp of flat `mf` by `vf` (any dtypes and devices) in torch ops, in
    place, `b32` the bound rounded to float32: what the native pass computes. Off the native
    kernels (an accelerator, or `device_path()` on the host) the sqrt goes through float64 on
    m's device; on them, numpy's."""
    step = LEGACY_CHUNK if mf.device.type == "cpu" else _DEVICE_CHUNK
    for a in range(0, mf.numel(), step):
        mc = mf[a:a + step]
        vc = vf[a:a + step]
        root = host_sqrt(vc).to(mc.device) if on_host_kernels(mc) else \
            float64_sqrt(vc.to(mc.device))
        limit = root.mul_(b32).to(mf.dtype)
        torch.where(mc.abs() > limit, limit.copysign(mc), mc, out=mc)


def _native(t: torch.Tensor) -> bool:
    return on_host_kernels(t) and t.dtype == torch.float32 and t.is_contiguous()


def float64_sqrt(v: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 sqrt of `v` (0 where v <= 0) on v's device, by way of
    float64: exact in float64 for a float32 input, and even a float64 sqrt one ulp off would
    round to the same float32 (a float32's sqrt lies at least 2^-51 relative from a float32
    rounding boundary)."""
    vd = v.double()
    return torch.where(vd > 0, vd, 0.0).sqrt_().float()


def host_sqrt(v: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 sqrt of `v` (0 where v <= 0) as a host tensor: numpy's,
    which is the processor's sqrt instruction (torch's CPU float32 sqrt is not exact)."""
    x = v.detach().cpu().float().numpy()
    return torch.from_numpy(np.sqrt(np.where(x > 0, x, np.float32(0))))


def moment_ratio_bound(m: torch.Tensor, v: torch.Tensor) -> float:
    """The largest |m| / sqrt(v) over the entries with v > 0 (0.0 if none), in float32:
    what restore clamps a compressed first moment to (Adam's step stays bounded)."""
    mf = m.detach().reshape(-1).float()
    vf = v.detach().reshape(-1).float()
    if on_host_kernels(mf) and on_host_kernels(vf):
        # one native pass, correctly rounded sqrt and division, no masked copies
        return ratio_max(mf.contiguous(), vf.contiguous())
    pos = vf > 0
    # the correctly rounded sqrt: the native pass's bits on every device
    return float((mf[pos].abs() / float64_sqrt(vf[pos])).max()) if bool(pos.any()) else 0.0
