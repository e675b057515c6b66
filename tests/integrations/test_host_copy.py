"""clone_to_cpu / copy_through_staging: a state's host copy through two staging buffers.

The packing (small tensors share a buffer, large ones are cut) is the same on every device, so
host tensors test it here; the CUDA test checks the pinned memory it leaves behind."""
from __future__ import annotations

import pytest
import torch

from mvc.integrations.host_copy import clone_to_cpu, copy_through_staging, cut


def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(3000, generator=g)
    return [big, big.to(torch.bfloat16), torch.randn(5, 7, generator=g).t(),   # not contiguous
            torch.tensor(3.5), torch.empty(0), torch.arange(11, dtype=torch.int64),
            torch.rand(13, generator=g) > 0.5, torch.randn(9, generator=g).to(torch.float16),
            torch.randn(4, 4, generator=g, dtype=torch.complex64)]


@pytest.mark.parametrize("staging", [1, 7, 64, 1000, 1 << 20])
def test_every_destination_gets_its_sources_bits(staging):
    srcs = _tensors()
    dsts = [torch.full(s.shape, 0, dtype=s.dtype) if s.dtype != torch.bool
            else torch.zeros(s.shape, dtype=torch.bool) for s in srcs]
    copy_through_staging(list(zip(srcs, dsts)), staging)
    for s, d in zip(srcs, dsts):
        assert d.dtype == s.dtype and d.shape == s.shape and d.is_contiguous()
        assert torch.equal(d.reshape(-1).view(torch.uint8), s.contiguous().reshape(-1).view(torch.uint8))


def test_batches_fill_the_buffer_and_cut_large_tensors():
    sizes = [10, 3, 40, 1, 0, 25]
    pieces = cut(sizes, 16)
    assert pieces[4] == []   # the empty one takes no room
    batches: dict[int, list[tuple[int, int]]] = {}
    for item in pieces:
        for buf, at, _, n in item:
            batches.setdefault(buf, []).append((at, n))
    for got in batches.values():   # each buffer filled back to back from its start
        assert [at for at, _ in got] == [sum(n for _, n in got[:i]) for i in range(len(got))]
    totals = [sum(n for _, n in batches[b]) for b in sorted(batches)]
    assert all(t <= 16 for t in totals) and sum(totals) == sum(sizes)
    assert totals[:-1] == [16] * (len(totals) - 1)   # only the last buffer is partly full
    assert [n for b in sorted(batches) for _, n in batches[b]] == [10, 3, 3, 16, 16, 5, 1, 10, 15]
    # each item's pieces cover it in order
    assert all([start for _, _, start, _ in item] == [sum(p[3] for p in item[:i]) for i in range(len(item))]
               and sum(p[3] for p in item) == n for item, n in zip(pieces, sizes))


def test_non_contiguous_sources_are_made_contiguous_one_batch_at_a_time(monkeypatch):
    """A non-contiguous source (a channels_last conv weight, its Adam moments) is made
    contiguous on its device when its first piece is staged and dropped after its last: not
    every one of them at once before the first piece moves, a second copy of them all on the
    GPU."""
    import weakref

    import mvc.integrations.host_copy as host_copy

    alive, peak = [0], [0]
    real = host_copy._bytes_of

    def counted(t: torch.Tensor) -> torch.Tensor | None:
        got = real(t)
        if got is not None and not t.is_contiguous():
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
            weakref.finalize(got.untyped_storage(), lambda: alive.__setitem__(0, alive[0] - 1))
        return got

    monkeypatch.setattr(host_copy, "_bytes_of", counted)
    g = torch.Generator().manual_seed(0)
    srcs = [torch.randn(8, 3, 5, 5, generator=g).to(memory_format=torch.channels_last)
            for _ in range(6)]
    dsts = [torch.empty(s.shape) for s in srcs]
    copy_through_staging(list(zip(srcs, dsts)), 256)   # each source spans several batches
    assert all(torch.equal(d, s) for s, d in zip(srcs, dsts))
    assert peak[0] <= 2, peak   # a batch's last piece of one and first of the next, at most


def test_a_staging_size_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        copy_through_staging([(torch.ones(2), torch.empty(2))], 0)


def test_clone_to_cpu_keeps_host_tensors_apart_from_their_sources():
    t = torch.ones(3)
    c = clone_to_cpu({"a": t, "b": [t]})
    assert c["a"] is c["b"][0] and c["a"] is not t
    t.add_(1)
    assert torch.equal(c["a"], torch.ones(3))


def test_tied_weights_stay_one_tensor_in_the_copy():
    # a state_dict detaches each name's parameter into an object of its own: two objects, one
    # tensor; the copy (a background commit's) keeps them one, as the live state's flatten does
    m = torch.nn.Module()
    m.emb, m.head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    m.head.weight = m.emb.weight
    base = torch.arange(8.0)
    live = {"model": m.state_dict(), "a": base[:4], "b": base[4:], "again": base[:4]}
    got = clone_to_cpu(live)
    tied = got["model"]["emb.weight"], got["model"]["head.weight"]
    assert tied[0] is not tied[1] and tied[0].data_ptr() == tied[1].data_ptr()
    assert got["again"].data_ptr() == got["a"].data_ptr() != got["b"].data_ptr()
    assert torch.equal(got["b"], base[4:]) and got["a"].data_ptr() != base.data_ptr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_clone_goes_through_two_pinned_buffers():
    """A CUDA state's copy is exact, keeps ties, and leaves only the two staging buffers
    pinned (not a power-of-two rounded pinned block per tensor)."""
    g = torch.Generator().manual_seed(1)
    ref = {"w": torch.randn(3 * (1 << 18) + 5, generator=g), "h": torch.randn(77, generator=g),
           "b": torch.randn(1000, generator=g).to(torch.bfloat16)}
    dev = {k: v.cuda() for k, v in ref.items()}
    state = {"model": dev, "tied": dev["w"], "step": 3}
    empty = getattr(torch._C, "_host_emptyCache", None)   # what earlier pinned blocks held
    if empty is not None:
        torch.cuda.synchronize()
        empty()
    c = clone_to_cpu(state, staging_bytes=1 << 20)
    assert c["tied"] is c["model"]["w"] and c["step"] == 3
    for k, v in ref.items():
        assert c["model"][k].device.type == "cpu" and torch.equal(c["model"][k], v)
    if empty is not None and hasattr(torch.cuda, "host_memory_stats"):
        reserved = torch.cuda.host_memory_stats().get("reserved_bytes.all.current")
        if reserved is not None:
            assert reserved <= 2 << 20
