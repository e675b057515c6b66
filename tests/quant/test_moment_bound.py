"""The first-moment bound's two forms (mvc.quant.moment_bound): the IEEE form gives the same
bits whichever way its sqrt is taken (the host's numpy, a GPU's float64 route, run here on
host tensors) and matches a plain reference; the legacy form stays torch's own."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mvc.quant.moment_bound as mb
from mvc.errors import InternalError
from mvc.quant.backend import device_path
from mvc.quant._kernels import moment_clamp
from mvc.quant.moment_bound import (IEEE_SQRT, SQRT_FORMS, bound_meta, clamp_first_moment,
                                    float64_sqrt, host_sqrt, torch_clamp, uses_host)
from mvc.quant.optimizer import DOMAINS
from mvc.repo.objects import MOMENT_DOMAINS, MOMENT_SQRT_FORMS


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def float32_samples() -> torch.Tensor:
    """float32 bit patterns across every exponent (random mantissas), every 97th subnormal,
    and the edges: zeros of both signs, negatives, infinities, NaN, the extremes."""
    g = torch.Generator().manual_seed(11)
    exps = torch.arange(0, 255, dtype=torch.int64).repeat_interleave(4096) << 23
    mant = torch.randint(0, 1 << 23, (exps.numel(),), generator=g)
    sub = torch.arange(1, 1 << 23, 97, dtype=torch.int64)
    edges = torch.tensor([0, 1 << 31, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F7FFFFF, 1,
                          0x00800000, 0xBF800000], dtype=torch.int64)
    return torch.cat([exps | mant, sub, edges]).to(torch.int32).view(torch.float32)


def test_both_sqrt_routes_are_the_correctly_rounded_sqrt():
    x = float32_samples()
    a, b = host_sqrt(x), float64_sqrt(x)
    assert torch.equal(bits(a), bits(b))
    # against Python's correctly rounded double sqrt, rounded once (exact for float32 inputs)
    xs = x.double().numpy()
    ref = np.where(xs > 0, np.sqrt(np.where(xs > 0, xs, 0.0)), 0.0).astype(np.float32)
    assert np.array_equal(a.numpy().view(np.uint32), ref.view(np.uint32))
    # v <= 0 and NaN give +0 (a limit of +0 keeps m's own zero and sign elsewhere)
    for v in (0.0, -0.0, -3.0, math.nan, -math.inf):
        assert bits(host_sqrt(torch.tensor([v]))).tolist() == [0, 0, 0, 0]


def reference(m: torch.Tensor, v: torch.Tensor, bound: float) -> torch.Tensor:
    """The IEEE form written out elementwise in numpy."""
    x = v.float().numpy().astype(np.float64)
    root = np.where(x > 0, np.sqrt(np.where(x > 0, x, 0.0)), 0.0).astype(np.float32)
    limit = torch.from_numpy(root * np.float32(bound)).to(m.dtype)
    over = m.abs() > limit
    return torch.where(over, limit.copysign(m), m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_ieee_form_matches_the_reference_across_chunks(dtype, monkeypatch):
    g = torch.Generator().manual_seed(5)
    n = 3 * 4096 + 77
    v = (torch.rand(n, generator=g) * 1e-6).to(dtype)
    v[torch.rand(n, generator=g) < 0.2] = 0.0
    v[::97] = 52.25
    v[5], v[6] = -0.0, -1.0
    m = (torch.randn(n, generator=g) * 1e-3).to(dtype)
    m[10], m[11], m[12] = 0.0, -0.0, -5.0     # zeros keep their sign; -5 is clamped
    v[10] = v[11] = v[12] = 0.0
    want = reference(m, v, 3.7)
    assert not torch.equal(want, m)            # the bound binds somewhere
    assert bits(want[11:12]).tolist() == bits(torch.tensor([-0.0], dtype=dtype)).tolist()
    for chunk in (4096, 1000, 1 << 18):
        monkeypatch.setattr(mb, "LEGACY_CHUNK", chunk)
        got = m.clone()
        clamp_first_moment(got, v, bound_meta("v", 3.7))
        assert torch.equal(bits(got), bits(want)), chunk


def test_legacy_form_is_torchs_own_sqrt_and_clamp():
    g = torch.Generator().manual_seed(2)
    v, m = torch.rand(5000, generator=g) * 1e-4, torch.randn(5000, generator=g) * 1e-2
    got = m.clone()
    clamp_first_moment(got, v, {"partner": "v", "ratio_bound": 2.5})
    limit = v.clamp_min(0).sqrt_().mul_(2.5)
    assert torch.equal(got, torch.clamp(m, min=-limit, max=limit))


def test_forms_and_their_names():
    meta = bound_meta("v", 1.5)
    assert meta == {"partner": "v", "ratio_bound": 1.5, "sqrt": IEEE_SQRT}
    assert not uses_host(meta) and uses_host({"partner": "v", "ratio_bound": 1.5})
    assert tuple(MOMENT_SQRT_FORMS) == SQRT_FORMS   # the record check's copy of the names
    assert MOMENT_DOMAINS == DOMAINS                # and of the domains
    with pytest.raises(InternalError):
        clamp_first_moment(torch.ones(3), torch.ones(3), dict(meta, sqrt="fast"))


SPECIAL = [0.0, -0.0, 1e-45, -1e-45, 1.17549435e-38, 1e-30, 0.5, 1.0, 3.4e38, -2.0,
           math.inf, -math.inf, math.nan]


@settings(max_examples=150, deadline=None)
@given(pairs=st.lists(st.tuples(
    st.one_of(st.floats(width=32, allow_nan=True), st.sampled_from(SPECIAL)),
    st.one_of(st.floats(width=32, allow_nan=True), st.sampled_from(SPECIAL))),
    min_size=0, max_size=70),
    bound=st.one_of(st.floats(0, 1e6, width=32), st.sampled_from([0.0, -0.0, math.inf])))
def test_native_pass_is_the_torch_form(pairs, bound):
    m = torch.tensor([p[0] for p in pairs], dtype=torch.float32)
    v = torch.tensor([p[1] for p in pairs], dtype=torch.float32)
    native, by_torch = m.clone(), m.clone()
    moment_clamp(native, v, bound)
    torch_clamp(by_torch, v, bound)
    assert torch.equal(bits(native), bits(by_torch))


def test_native_pass_splits_across_threads_with_the_same_bits():
    g = torch.Generator().manual_seed(9)
    n = (1 << 19) + 13    # parallel_chunks cuts it in two on a 2-core machine
    v, m = torch.rand(n, generator=g) * 1e-6, torch.randn(n, generator=g) * 1e-3
    a, b = m.clone(), m.clone()
    moment_clamp(a, v, 3.7)
    torch_clamp(b, v, 3.7)
    assert torch.equal(bits(a), bits(b)) and not torch.equal(a, m)


def test_native_pass_refuses_bad_arguments():
    for bound in (-1.0, math.nan):
        with pytest.raises(InternalError):
            moment_clamp(torch.ones(4), torch.ones(4), bound)
    with pytest.raises(InternalError):
        moment_clamp(torch.ones(4), torch.ones(3), 1.0)


def test_the_gpu_route_run_on_the_host_gives_the_native_bits(monkeypatch):
    """A CUDA device takes the float64 sqrt (`float64_sqrt`); `device_path()` runs that route
    on host tensors, through `clamp_first_moment` as a restore calls it."""
    x = float32_samples()
    m = torch.randn(x.numel(), generator=torch.Generator().manual_seed(1)) * 1e3
    native = m.clone()
    moment_clamp(native, x, 1.25)
    gpu_like = m.clone()
    calls: list[int] = []
    monkeypatch.setattr(mb, "float64_sqrt", lambda v: (calls.append(v.numel()), float64_sqrt(v))[1])
    with device_path():
        clamp_first_moment(gpu_like, x, bound_meta("v", 1.25))
    assert calls   # the float64 route ran
    assert torch.equal(bits(native), bits(gpu_like)) and not torch.equal(native, m)
