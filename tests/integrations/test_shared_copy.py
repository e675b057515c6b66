"""A state's host copy in shared memory, and the frames that hand it to another process."""
from __future__ import annotations

import os
import pickle
import socket
import threading
from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mvc.integrations import shared_copy
from mvc.integrations.host_copy import clone_to_cpu
from mvc.integrations.shared_copy import (ChannelClosedError, MappedSegments, SharedArena,
                                          recv_frame, send_frame)

pytestmark = pytest.mark.skipif(not shared_copy.supported(), reason="Linux memfd and fd passing")

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn]


def _sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g, dtype=dtype)


def _across(arena: SharedArena, obj):
    """`obj` as the other process gets it: its own descriptors, mapped, and unpickled."""
    maps = MappedSegments([os.dup(fd) for fd in arena.fds], arena.sizes)
    return maps, maps.loads(arena.dumps(obj))


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.reshape(-1).view(torch.uint8) if a.numel() and a.dtype.itemsize else a,
                       b.reshape(-1).view(torch.uint8) if b.numel() and b.dtype.itemsize else b)


def test_a_nested_state_crosses_bit_for_bit_with_its_structure():
    weight = _sample(torch.float32, (8, 4))
    model = OrderedDict(weight=weight, tied=weight, bias=_sample(torch.bfloat16, (4,)))
    model._metadata = OrderedDict({"": {"version": 2}})
    state = {
        "model": model,
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": _sample(torch.float32, (8, 4), 1)}},
                      "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "every": [_sample(d, (3, 5), i) for i, d in enumerate(DTYPES)],
        "empty": torch.empty(0, 7), "scalar": torch.tensor(2, dtype=torch.int64),
        "strided": _sample(torch.float32, (6, 5)).t(), "epoch": 3, "name": "run",
    }
    arena = SharedArena()
    copy = clone_to_cpu(state, allocate=arena.allocate)
    maps, got = _across(arena, copy)
    for a, b in zip(state["every"], got["every"]):
        _same(a, b)
    _same(state["model"]["weight"], got["model"]["weight"])
    _same(state["model"]["bias"], got["model"]["bias"])
    assert got["model"]["tied"] is got["model"]["weight"]          # tied weights stay tied
    assert got["model"]._metadata == {"": {"version": 2}}
    _same(state["optimizer"]["state"][0]["exp_avg"], got["optimizer"]["state"][0]["exp_avg"])
    assert got["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert got["empty"].shape == (0, 7) and int(got["scalar"]) == 2
    assert torch.equal(got["strided"], state["strided"].contiguous())
    assert (got["epoch"], got["name"]) == (3, "run")
    # the other side reads the same pages: a write here shows there
    copy["model"]["weight"].fill_(7)
    assert bool((got["model"]["weight"] == 7).all())
    del got
    maps.close()
    arena.release()


def test_a_state_dicts_tied_weights_cross_as_two_objects_over_one_copy():
    # state_dict() detaches each name's parameter into an object of its own: the copy keeps two
    # objects over one block of shared memory, and both cross as references (not the second
    # pickled whole), arriving as two objects over the same pages, as in the live state
    m = torch.nn.Module()
    m.emb, m.head = torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64, bias=False)
    m.head.weight = m.emb.weight
    arena = SharedArena()
    copy = clone_to_cpu({"model": m.state_dict()}, allocate=arena.allocate)
    payload = arena.dumps(copy)
    assert len(payload) < m.emb.weight.numel() * 4   # no tensor's bytes in the pickle
    maps, got = _across(arena, copy)
    a, b = got["model"]["emb.weight"], got["model"]["head.weight"]
    assert a is not b and a.data_ptr() == b.data_ptr()
    _same(m.emb.weight.detach(), b)
    del got, a, b
    maps.close()
    arena.release()


def test_closing_keeps_a_viewed_mapping_and_says_so():
    arena = SharedArena(min_segment=4096)
    copy = clone_to_cpu({"a": torch.arange(100.0)}, allocate=arena.allocate)
    maps, got = _across(arena, copy)
    kept = got["a"]
    del got
    assert maps.close() is False                     # still viewed: not to be written again
    arena.release()
    del copy
    assert torch.equal(kept, torch.arange(100.0))    # and still readable: mapped while it lives
    arena = SharedArena(min_segment=4096)
    copy = clone_to_cpu({"a": torch.arange(10.0)}, allocate=arena.allocate)
    maps, got = _across(arena, copy)
    del got
    assert maps.close() is True                      # nothing views it any more
    arena.release()


def test_tensors_the_arena_cannot_hold_cross_whole():
    q = torch.quantize_per_tensor(torch.randn(10), 0.1, 3, torch.quint8)
    arena = SharedArena()
    copy = clone_to_cpu({"q": q, "w": torch.ones(3)}, allocate=arena.allocate)
    maps, got = _across(arena, copy)
    assert torch.equal(got["q"].int_repr(), q.int_repr()) and got["q"].q_scale() == q.q_scale()
    del got
    maps.close()
    arena.release()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.integers(0, 3000)), min_size=1, max_size=12),
       st.integers(4096, 3 * 4096))
def test_segments_grow_and_every_tensor_stays_inside_one(items, min_segment):
    state = [_sample(d, (n,), i) for i, (d, n) in enumerate(items)]
    arena = SharedArena(min_segment=min_segment)
    copy = clone_to_cpu(state, allocate=arena.allocate)
    for i, size in enumerate(arena.sizes):   # each new file at least all the earlier ones
        assert size >= max(min_segment, sum(arena.sizes[:i])) and size % 4096 == 0
    maps, got = _across(arena, copy)
    for a, b in zip(state, got):
        _same(a, b)
    del got
    maps.close()
    arena.release()


def test_a_reused_arena_lays_the_same_state_out_in_the_same_memory():
    state = {"a": torch.randn(1000), "b": torch.randn(300, 7).to(torch.bfloat16)}
    arena = SharedArena(min_segment=4096)
    first = clone_to_cpu(state, allocate=arena.allocate)
    sizes, ptrs = arena.sizes, [t.data_ptr() for t in first.values()]
    arena.reuse()
    again = clone_to_cpu({k: v + 1 for k, v in state.items()}, allocate=arena.allocate)
    assert arena.sizes == sizes and [t.data_ptr() for t in again.values()] == ptrs
    maps, got = _across(arena, again)
    assert torch.equal(got["a"], state["a"] + 1)
    del got, first
    maps.close()
    arena.release()


def test_a_reference_outside_its_file_is_refused():
    arena = SharedArena(min_segment=4096)
    clone_to_cpu({"a": torch.ones(4)}, allocate=arena.allocate)
    maps = MappedSegments([os.dup(fd) for fd in arena.fds], arena.sizes)

    class Forged:
        def __reduce__(self):
            return (int, (0,))

    for pid in [("mvc-arena", 0, 4096, 8, "float32", (2,)), ("mvc-arena", 5, 0, 4, "float32", (1,)),
                ("mvc-arena", 0, 0, 4, "no_such_dtype", (1,)), ("other", 1)]:
        class P(pickle.Pickler):
            def persistent_id(self, obj, pid=pid):
                return pid if isinstance(obj, Forged) else None
        import io
        buf = io.BytesIO()
        P(buf).dump([Forged()])
        with pytest.raises(pickle.UnpicklingError):
            maps.loads(buf.getvalue())
    maps.close()
    arena.release()


def test_a_shared_file_shorter_than_announced_is_refused():
    arena = SharedArena(min_segment=4096)
    clone_to_cpu({"a": torch.ones(4)}, allocate=arena.allocate)
    with pytest.raises(ChannelClosedError, match="not the"):
        MappedSegments([os.dup(arena.fds[0])], [arena.sizes[0] * 2])
    with pytest.raises(ChannelClosedError, match="arrived"):
        MappedSegments([os.dup(arena.fds[0])], [])
    arena.release()


def test_frames_carry_payloads_and_descriptors():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    try:
        # larger than the socket's buffer: the frame arrives in several reads
        sender = threading.Thread(target=send_frame, args=(a, b"x" * 3_000_000, [r]))
        sender.start()
        payload, fds = recv_frame(b)
        sender.join()
        assert payload == b"x" * 3_000_000 and len(fds) == 1
        os.write(w, b"hi")
        assert os.read(fds[0], 2) == b"hi"
        os.close(fds[0])
        send_frame(a, b"")
        assert recv_frame(b) == (b"", [])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


@pytest.mark.parametrize("cut", [0, 5, 12, 20])
def test_a_frame_cut_short_says_the_channel_closed(cut):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    whole = shared_copy._HEADER.pack(16, 0) + b"y" * 16
    a.sendall(whole[:cut])
    a.close()
    with pytest.raises(ChannelClosedError):
        recv_frame(b)
    b.close()


def test_a_frame_whose_descriptor_count_lies_is_refused():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.sendall(shared_copy._HEADER.pack(0, 2))
    with pytest.raises(ChannelClosedError, match="descriptors"):
        recv_frame(b)
    a.close()
    b.close()
