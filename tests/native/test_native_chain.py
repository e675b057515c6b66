"""The one-call delta decoder and the in-place chain walker (native/qdelta.c, native/chain.c).

Both must give exactly what folding the reference decoder step by step gives,
on chains whose steps take the sparse path (few changes) and the dense path
(many), with bin counts changing along the way; and fail cleanly, never read
out of bounds, on truncated or corrupted sections (run under ASan in CI).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quantized_tensors import assert_same, evolve, make_q, payload

from mvc.codecs import delta_groups as dg
from mvc.codecs import quantized as qc
from mvc.codecs.base import CodecError
from mvc.errors import InternalError
from mvc.native import ffi, huffman, lib, rle

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _chain(seed: int, n: int, steps: int, bins_choices: list[int], changes: list[float]):
    rng = np.random.default_rng(seed)
    bins = [int(rng.choice(bins_choices)) for _ in range(steps + 1)]
    lv = [rng.integers(0, bins[0] + 2, n)]
    for t in range(1, steps + 1):
        lv.append(evolve(lv[-1], bins[t - 1] + 2, bins[t] + 2, float(rng.choice(changes)), rng))
    qs = [make_q(l, b, seed=seed + i) for i, (l, b) in enumerate(zip(lv, bins))]
    deltas = []
    for t in range(1, steps + 1):
        enc = qc.encode_delta(qs[t], qs[t - 1].levels, bins[t - 1] + 2)
        deltas.append((json.loads(json.dumps(enc.meta)), payload(enc)))
    return qs, deltas


def _loaders(deltas):
    """decode_chain takes payload loaders (it reads one step at a time)."""
    return [(m, lambda data=data: data) for m, data in deltas]


@SETTINGS
@given(st.integers(0, 2**31), st.integers(0, 3000), st.integers(1, 12))
def test_chain_walk_matches_folded_reference(seed, n, steps):
    qs, deltas = _chain(seed, n, steps, [2, 4, 7, 16, 30], [0.0, 0.002, 0.02, 0.3, 0.9])
    shape = (n,)
    got = qc.decode_chain(qs[0], _loaders(deltas), torch.float32, shape)
    assert_same(qs[-1], got)
    # every intermediate commit too, and the fold of the per-step decoder agrees
    q = qs[0]
    for t, (meta, data) in enumerate(deltas, 1):
        q = qc.decode_delta(meta, data, torch.float32, shape, q.levels)
        assert_same(qs[t], q)
        assert_same(qs[t], qc.decode_chain(qs[0], _loaders(deltas[:t]), torch.float32, shape))


def test_chain_walk_over_many_blocks_and_sparse_steps():
    # > 256-level blocks and 0.1% changes: the block-count select path does the work
    qs, deltas = _chain(7, 50_000, 20, [14, 16], [0.001, 0.0005, 0.01])
    assert_same(qs[-1], qc.decode_chain(qs[0], _loaders(deltas), torch.float32, (50_000,)))


def test_wide_levels_fall_back_to_the_per_step_decoder():
    qs, deltas = _chain(3, 2000, 4, [300], [0.01, 0.5])
    assert qs[0].levels.dtype == torch.int16
    assert_same(qs[-1], qc.decode_chain(qs[0], _loaders(deltas), torch.float32, (2000,)))


def _walker_inputs(seed: int, n: int = 4000, change: float = 0.01):
    qs, deltas = _chain(seed, n, 1, [16], [change])
    meta, data = deltas[0]
    parts = qc._DeltaParts(meta, data, torch.float32, (n,))
    parent = qs[0].levels.numpy().astype(np.uint8)
    return parent, parts


@pytest.mark.parametrize("change", [0.002, 0.5])
def test_walker_rejects_truncated_and_corrupted_sections(change):
    parent, parts = _walker_inputs(11, change=change)
    good = bytes(parts.levels_view)
    lengths = parts.lengths
    rng = np.random.default_rng(5)
    for trial in range(150):
        data = bytearray(good)
        lens = list(lengths)
        g = int(rng.choice([i for i, ln in enumerate(lens) if ln] or [0]))
        start = sum(lens[:g])
        if trial % 3 == 0 and lens[g]:  # cut a group's stream short
            cut = int(rng.integers(0, lens[g]))
            del data[start + cut:start + lens[g]]
            lens[g] = cut
        else:  # flip bytes inside one stream
            for _ in range(int(rng.integers(1, 4))):
                if lens[g]:
                    data[start + int(rng.integers(0, lens[g]))] ^= int(rng.integers(1, 256))
        with dg.ChainWalker(parent) as w:
            try:
                w.step(parts.n_prev, parts.modulus, parts.k + 2, memoryview(bytes(data)), lens)
            except (dg.GroupedDeltaError, dg.LevelRangeError):
                with pytest.raises(InternalError):  # a failed walker refuses further use
                    w.step(parts.n_prev, parts.modulus, parts.k + 2, memoryview(good), lengths)
            else:
                assert w.levels().max() < parts.k + 2


def test_walker_rejects_a_parent_it_was_not_made_against():
    parent, parts = _walker_inputs(13)
    wrong = parent.copy()
    wrong[17] = parts.n_prev  # a level the delta's parent cannot hold
    with dg.ChainWalker(wrong) as w, pytest.raises(dg.LevelRangeError):
        w.step(parts.n_prev, parts.modulus, parts.k + 2, parts.levels_view, parts.lengths)
    # a parent with other group sizes: a group's stream no longer fits its group
    coded = [g for g, ln in enumerate(parts.lengths) if ln]
    moved = parent.copy()
    i = int(np.flatnonzero(parent == coded[0])[0])
    moved[i] = coded[1]
    with dg.ChainWalker(moved) as w, pytest.raises(dg.GroupedDeltaError):
        w.step(parts.n_prev, parts.modulus, parts.k + 2, parts.levels_view, parts.lengths)


def test_section_lengths_must_match_the_groups():
    parent, parts = _walker_inputs(17)
    with dg.ChainWalker(parent) as w, pytest.raises(InternalError):
        w.step(parts.n_prev, parts.modulus, parts.k + 2, parts.levels_view, parts.lengths[:-1])


@SETTINGS
@given(st.integers(0, 2**31), st.integers(0, 5000), st.sampled_from([np.uint8, np.uint16]))
def test_whole_stream_decoders_match_the_python_framing(seed, n, dtype):
    rng = np.random.default_rng(seed)
    top = 6 if dtype == np.uint8 else 3000
    values = np.where(rng.random(n) < 0.9, 0, rng.integers(0, top, n)).astype(dtype)
    w = np.dtype(dtype).itemsize
    for enc, fn in ((huffman.encode(values, block_bytes=512), "huf"),
                    (rle.encode_huffman(values), "rlehuf")):
        out = np.empty(n, dtype=dtype)
        src = ffi.from_buffer("uint8_t[]", enc) if len(enc) else ffi.NULL
        dst = ffi.from_buffer("uint8_t[]", out, require_writable=True) if n else ffi.NULL
        rc = (lib.mvc_huf_decode_stream(src, len(enc), dst, n, w) if fn == "huf"
              else lib.mvc_rlehuf_decode_stream(src, len(enc), w, dst, n))
        assert rc == 0 and np.array_equal(out, values)
        for cut in sorted(set(rng.integers(0, max(len(enc), 1), 5).tolist())):
            if cut >= len(enc):
                continue
            part = bytes(enc[:cut])
            src = ffi.from_buffer("uint8_t[]", part) if part else ffi.NULL
            rc = (lib.mvc_huf_decode_stream(src, cut, dst, n, w) if fn == "huf"
                  else lib.mvc_rlehuf_decode_stream(src, cut, w, dst, n))
            assert rc < 0 or n == 0


def test_checkout_errors_stay_codec_errors():
    assert issubclass(dg.GroupedDeltaError, CodecError)
    assert issubclass(qc.QuantPayloadError, CodecError)


def _section_args(parts):
    lengths = list(parts.lengths)
    return bytes(parts.levels_view), lengths, ffi.new("uint64_t[]", lengths)


@pytest.mark.parametrize("short_by", [1, 7, "all"])
def test_raw_entry_points_check_the_total_section_length(short_by):
    """Called directly with a buffer shorter than its section lengths claim, the C entry
    points refuse (MVC_ERR_ARG) instead of reading past the buffer (ASan in the sanitizer run
    caught the over-read when only the per-section lengths were passed)."""
    from mvc.native.status import ERR_ARG

    parent, parts = _walker_inputs(23, change=0.3)
    data, lengths, lens_c = _section_args(parts)
    cut = len(data) if short_by == "all" else short_by
    short = np.frombuffer(data[:len(data) - cut] or b"\0", dtype=np.uint8).copy()  # its own heap block
    total = len(data) - cut
    out = np.empty(parent.size, dtype=np.uint8)
    top = ffi.new("uint64_t *")
    pp = ffi.from_buffer("uint8_t[]", parent)
    op = ffi.from_buffer("uint8_t[]", out, require_writable=True)
    sp = ffi.from_buffer("uint8_t[]", short) if total else ffi.NULL
    args = (parts.n_prev, parts.modulus, parts.k + 2)
    assert lib.mvc_qdelta_levels(pp, parent.size, 1, *args, 1, 1, sp, total, lens_c, len(lengths),
                                 op, top) == ERR_ARG
    # more bytes than the sections: trailing bytes are an argument error too
    long_ = np.frombuffer(data + b"\0", dtype=np.uint8).copy()
    lp = ffi.from_buffer("uint8_t[]", long_)
    assert lib.mvc_qdelta_levels(pp, parent.size, 1, *args, 1, 1, lp, long_.size, lens_c,
                                 len(lengths), op, top) == ERR_ARG
    with dg.ChainWalker(parent) as w:
        assert lib.mvc_chain_step(w._live(), *args, sp, total, lens_c, len(lengths), top) == ERR_ARG
        # an argument error leaves the walker usable: the right buffer still applies
        good = np.frombuffer(data, dtype=np.uint8).copy()
        gp = ffi.from_buffer("uint8_t[]", good)
        assert lib.mvc_chain_step(w._live(), *args, gp, good.size, lens_c, len(lengths), top) == 0
        want, _ = dg.decode_levels(parent, *args, grouped=True, rle=True, sections=memoryview(data),
                                   lengths=lengths)
        assert np.array_equal(w.levels(), want)


def test_bindings_refuse_sections_that_do_not_fit_their_buffer():
    parent, parts = _walker_inputs(29)
    data, lengths, _ = _section_args(parts)
    short = memoryview(data[:-1])
    with pytest.raises(InternalError):
        dg.decode_levels(parent, parts.n_prev, parts.modulus, parts.k + 2, grouped=True, rle=True,
                         sections=short, lengths=lengths)
    with dg.ChainWalker(parent) as w, pytest.raises(InternalError):
        w.step(parts.n_prev, parts.modulus, parts.k + 2, short, lengths)
