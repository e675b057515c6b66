"""The batched quantizer's chunks (mvc.quant.device_chunks) against plain per-tensor answers:
each element's tensor index, the per-piece reductions over short runs, and the histograms."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mvc.quant.device_chunks as dc
from mvc.quant.device_chunks import chunks, count_into, piece_reduce

SIZES = st.lists(st.integers(1, 5000), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(sizes=SIZES, step=st.integers(1, 9000), run=st.sampled_from([1, 7, 64, 1 << 14]))
def test_chunks_tag_their_elements_and_reduce_each_piece(sizes, step, run):
    old = dc._RUN
    dc._RUN = run
    try:
        g = torch.Generator().manual_seed(len(sizes) * 7 + step)
        flats = [torch.randn(n, generator=g, dtype=torch.float64) for n in sizes]
        seen = [0] * len(sizes)
        for c in chunks(sizes, torch.device("cpu"), step):
            jobs = [j for j, _, _ in c.pieces]
            lengths = [b - a for _, a, b in c.pieces]
            assert c.seg.tolist() == torch.repeat_interleave(
                torch.tensor(jobs), torch.tensor(lengths)).tolist()
            assert c.runs.tolist() and max(c.runs.tolist()) <= run
            assert int(c.runs.sum()) == c.size == len(c.seg)
            values = torch.cat([flats[j][a:b] for j, a, b in c.pieces])
            sums, tops = piece_reduce(c, values), piece_reduce(c, values, "max")
            for i, (j, a, b) in enumerate(c.pieces):
                assert torch.allclose(sums[i], flats[j][a:b].sum(), rtol=1e-12, atol=1e-9)
                assert tops[i] == flats[j][a:b].max()
                seen[j] += b - a
        assert seen == sizes
    finally:
        dc._RUN = old


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(0, 2999), min_size=1, max_size=400),
       histc_bins=st.sampled_from([0, 1000, 1 << 16]))
def test_count_into_is_a_histogram_on_either_path(keys, histc_bins):
    old = dc._HISTC_BINS
    dc._HISTC_BINS = histc_bins   # 0: always index_add_; 1 << 16: always histc here
    try:
        k = torch.tensor(keys, dtype=torch.int64)
        expect = torch.bincount(k, minlength=3000)
        counts = torch.zeros(3000, dtype=torch.int64)
        assert torch.equal(count_into(counts, k), expect)
        # only the rows the keys fall in, where the caller knows them
        lo, hi = min(keys), max(keys) + 1
        counts = torch.zeros(3000, dtype=torch.int64)
        assert torch.equal(count_into(counts, k, lo, hi), expect)
    finally:
        dc._HISTC_BINS = old


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), p=st.floats(0, 1), dtype=st.sampled_from(
    [torch.float32, torch.bfloat16, torch.float16]))
def test_select_where_is_masked_select_given_the_count(n, p, dtype):
    g = torch.Generator().manual_seed(n)
    values = torch.randn(n, generator=g).to(dtype)
    mask = torch.rand(n, generator=g) < p
    got = dc.select_where(values, mask, int(mask.sum()))
    assert got.dtype == dtype
    assert torch.equal(got, torch.masked_select(values, mask))


def test_select_where_falls_back_where_a_build_has_no_static_kernel(monkeypatch):
    def missing(*a, **k):
        raise NotImplementedError("Could not run 'aten::nonzero_static' with arguments "
                                  "from the 'CUDA' backend")

    monkeypatch.setattr(torch, "nonzero_static", missing)
    values = torch.arange(10.0)
    mask = values % 3 == 0
    assert dc.select_where(values, mask, 4).tolist() == [0.0, 3.0, 6.0, 9.0]
