"""Alg. 5/6 rearrangement: the numpy reference (tests/helpers/reference_coders.py) equals a literal
reading of the paper, and the fused native passes equal the reference."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import reference_coders as rc
from mvc.codecs import delta_groups as dg
from mvc.errors import InternalError
from mvc.native import ffi, lib, parallel, status


def ref_split(delta: list[int], parent: list[int]) -> dict[int, list[int]]:
    """Algorithm 5, as written: append each delta to its parent level's group."""
    groups: dict[int, list[int]] = {b: [] for b in sorted(set(parent))}
    for j in range(len(parent)):
        groups[parent[j]].append(delta[j])
    return groups


def ref_merge(groups: dict[int, list[int]], parent: list[int]) -> list[int]:
    """Algorithm 6, as written: pop each parameter's delta from its parent level's group."""
    groups = {b: list(v) for b, v in groups.items()}
    out = [0] * len(parent)
    for j in range(len(parent)):
        b = parent[j]
        if groups[b]:
            out[j] = groups[b].pop(0)
    return out


streams = st.integers(2, 40).flatmap(
    lambda n_levels: st.tuples(
        st.just(n_levels),
        st.lists(st.tuples(st.integers(0, n_levels - 1), st.integers(0, n_levels - 1)), max_size=200),
    )
)


@settings(max_examples=200, deadline=None)
@given(streams)
def test_split_and_merge_match_reference(case):
    n_levels, pairs = case
    parent = np.array([p for p, _ in pairs], dtype=np.uint8)
    delta = np.array([d for _, d in pairs], dtype=np.uint8)
    grouped, counts = rc.split_by_parent(delta, parent, n_levels)
    ref = ref_split(delta.tolist(), parent.tolist())
    for g, sl in enumerate(dg.group_slices(counts)):
        assert grouped[sl].tolist() == ref.get(g, [])
    assert counts.sum() == parent.size and counts.size == n_levels
    merged = rc.merge_by_parent(grouped, parent)
    assert merged.tolist() == ref_merge(ref, parent.tolist()) == delta.tolist()


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 300), st.integers(2, 300), st.lists(st.integers(0, 10**6), max_size=100))
def test_cyclic_delta_inverts(n_prev, n_cur, seeds):
    rng = np.random.default_rng(len(seeds) * 7919 + n_prev)
    prev = rng.integers(0, n_prev, len(seeds))
    cur = rng.integers(0, n_cur, len(seeds))
    modulus = max(n_prev, n_cur)
    d = rc.cyclic_delta(prev, cur, modulus)
    assert d.dtype == (np.uint8 if modulus <= 256 else np.uint16)
    assert all(int(x) == (int(p) - int(c)) % modulus for x, p, c in zip(d, prev, cur))
    assert rc.apply_cyclic_delta(prev, d, modulus).tolist() == cur.tolist()


def test_unchanged_levels_give_zero_delta_and_pure_groups():
    parent = np.random.default_rng(0).integers(0, 18, 10_000).astype(np.uint8)
    d = rc.cyclic_delta(parent, parent, 18)
    assert not d.any()
    grouped, counts = rc.split_by_parent(parent, parent, 18)
    for g, sl in enumerate(dg.group_slices(counts)):
        assert (grouped[sl] == g).all()


def test_uint16_levels_and_multidimensional_input():
    rng = np.random.default_rng(1)
    parent = rng.integers(0, 1000, (30, 40)).astype(np.uint16)
    delta = rng.integers(0, 1000, (30, 40)).astype(np.uint16)
    grouped, counts = rc.split_by_parent(delta, parent, 1000)
    assert np.array_equal(rc.merge_by_parent(grouped, parent), delta.reshape(-1))


def level_pair(n_prev: int, n_cur: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Parent and current levels in `delta_dtype`, mostly unchanged (where runs matter)."""
    rng = np.random.default_rng(seed)
    dt = dg.delta_dtype(max(n_prev, n_cur))
    parent = rng.integers(0, n_prev, n).astype(dt)
    cur = rng.integers(0, n_cur, n).astype(dt)
    keep = rng.random(n) < 0.8
    cur[keep & (parent < n_cur)] = parent[keep & (parent < n_cur)]
    return parent, cur


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 300), st.integers(2, 300), st.integers(0, 300), st.integers(0, 2**31),
       st.booleans())
def test_native_fused_passes_match_reference(n_prev, n_cur, n, seed, grouped):
    modulus = max(n_prev, n_cur)
    dt = dg.delta_dtype(modulus)
    parent, cur = level_pair(n_prev, n_cur, n, seed)
    counts = dg.group_counts(parent, n_prev) if grouped else None
    d = dg.grouped_delta(parent, cur, modulus, counts)
    ref = rc.cyclic_delta(parent, cur, modulus)
    if grouped:
        ref_grouped, ref_counts = rc.split_by_parent(ref, parent, n_prev)
        assert np.array_equal(counts, ref_counts)
        assert np.array_equal(d, ref_grouped)
        assert np.array_equal(rc.merge_by_parent(d, parent), ref)
    else:
        assert np.array_equal(d, ref)
    levels, n_top = dg.apply_grouped_delta(parent, d, modulus, n_cur, counts)
    assert levels.dtype == dt and np.array_equal(levels, cur)
    assert n_top == int(np.count_nonzero(cur == n_cur - 1))


def test_native_passes_reject_out_of_range_input():
    parent = np.array([0, 1, 5], dtype=np.uint8)
    with pytest.raises(dg.LevelRangeError):
        dg.group_counts(parent, 5)
    with pytest.raises(dg.LevelRangeError):
        dg.grouped_delta(parent, np.array([0, 1, 6], np.uint8), 6, None)
    counts = dg.group_counts(parent, 6)
    # a delta that would move a parameter to level 5 when the child has only 4 levels
    with pytest.raises(dg.GroupedDeltaError):
        dg.apply_grouped_delta(parent, np.zeros(3, np.uint8), 6, 4, counts)
    # a delta value >= modulus
    with pytest.raises(dg.GroupedDeltaError):
        dg.apply_grouped_delta(parent, np.array([0, 0, 9], np.uint8), 6, 6, counts)
    # counts that do not describe this parent are a bug, not data corruption
    with pytest.raises(InternalError):
        dg.apply_grouped_delta(parent, np.zeros(3, np.uint8), 6, 6, np.array([3, 0, 0, 0, 0, 0]))
    with pytest.raises(InternalError):
        dg.grouped_delta(parent, np.zeros(3, np.uint8), 6, np.array([1, 1, 1, 0, 0, 0]))
    with pytest.raises(InternalError):
        dg.grouped_delta(parent, np.zeros(3, np.uint16), 6, None)


def test_mismatched_lengths_are_a_bug():
    with pytest.raises(InternalError):
        dg.grouped_delta(np.zeros(3, np.uint8), np.zeros(4, np.uint8), 2, None)
    with pytest.raises(InternalError):
        dg.apply_grouped_delta(np.zeros(3, np.uint8), np.zeros(4, np.uint8), 2, 2, None)
    with pytest.raises(rc.RefError):  # the numpy references check it too
        rc.split_by_parent(np.zeros(3, np.uint8), np.zeros(4, np.uint8), 2)
    with pytest.raises(rc.RefError):
        rc.cyclic_delta(np.zeros(3, np.uint8), np.zeros(4, np.uint8), 2)
    with pytest.raises(InternalError):
        dg.delta_dtype(70_000)


# ---- one tensor's passes split into segments across the pool (parallel.SPLIT)

@contextlib.contextmanager
def segment(size: int):
    old, parallel.SPLIT = parallel.SPLIT, size
    try:
        yield
    finally:
        parallel.SPLIT = old


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 300), st.integers(2, 300), st.integers(0, 400), st.integers(1, 60),
       st.integers(0, 2**31))
def test_segmented_passes_match_the_reference_and_the_one_call_form(n_prev, n_cur, n, size, seed):
    modulus = max(n_prev, n_cur)
    dt = dg.delta_dtype(modulus)
    parent, cur = level_pair(n_prev, n_cur, n, seed)
    whole_counts = dg.group_counts(parent, n_prev)
    whole = dg.grouped_delta(parent, cur, modulus, whole_counts)
    with segment(size):
        counts = dg.group_counts(parent, n_prev)
        d = dg.grouped_delta(parent, cur, modulus, counts)
    ref, ref_counts = rc.split_by_parent(rc.cyclic_delta(parent, cur, modulus), parent, n_prev)
    assert np.array_equal(counts, ref_counts) and np.array_equal(counts, whole_counts)
    assert d.dtype == dt and np.array_equal(d, ref) and np.array_equal(d, whole)


def test_segmented_passes_reject_what_the_one_call_form_rejects():
    parent = np.array([0, 1, 2, 3, 1, 5], dtype=np.uint8)
    with segment(2):
        with pytest.raises(dg.LevelRangeError):   # a level >= n_groups in the last segment
            dg.group_counts(parent, 5)
        counts = dg.group_counts(parent, 6)
        with pytest.raises(dg.LevelRangeError):   # a current level >= modulus
            dg.grouped_delta(parent, np.array([0, 1, 2, 3, 1, 6], np.uint8), 6, counts)
        with pytest.raises(dg.LevelRangeError):   # a parent level >= its group count
            dg.grouped_delta(parent, parent, 6, counts[:5].copy())
        with pytest.raises(InternalError):        # counts of another parent: a bug
            dg.grouped_delta(parent, parent, 6, np.array([1, 1, 1, 1, 1, 1]))


def _part(parent, cur, modulus, counts, starts, delta):
    return lib.mvc_grp_delta_part(
        ffi.from_buffer(parent), ffi.from_buffer(cur), parent.size, parent.itemsize, modulus,
        ffi.from_buffer("int64_t[]", counts), ffi.from_buffer("int64_t[]", starts), counts.size,
        ffi.from_buffer(delta, require_writable=True), delta.size)


def test_native_segment_pass_checks_its_ranges_against_the_stream():
    parent = np.array([0, 1, 1, 0], dtype=np.uint8)
    cur = np.array([1, 1, 0, 0], dtype=np.uint8)
    out = np.full(6, 99, dtype=np.uint8)
    counts = np.array([2, 2], dtype=np.int64)
    assert _part(parent, cur, 2, counts, np.array([1, 4], dtype=np.int64), out) == status.OK
    assert out.tolist() == [99, 1, 0, 99, 0, 1]   # group 0 at 1..2, group 1 at 4..5; rest kept
    for starts, cts in (([5, 0], [2, 2]),          # group 0's range runs past the stream
                        ([0, 7], [2, 2]),          # a start past the stream
                        ([-1, 2], [2, 2]),         # a negative start
                        ([0, 2], [3, 1]),          # counts that do not match the parent
                        ([0, 2], [1, 1]),          # counts that do not add up to n
                        ([0, 2], [-1, 5])):        # a negative count
        before = out.copy()
        rc_ = _part(parent, cur, 2, np.array(cts, dtype=np.int64), np.array(starts, dtype=np.int64),
                    out)
        assert rc_ == status.ERR_ARG, (starts, cts)
        if cts == [2, 2]:
            assert np.array_equal(out, before)     # rejected before anything is written
    assert _part(parent, np.array([1, 1, 2, 0], np.uint8), 2, counts,
                 np.array([0, 2], dtype=np.int64), out) == status.ERR_RANGE
