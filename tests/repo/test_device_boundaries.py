"""Issue 27: every path that compares, encodes or decodes against a parent accepts any device.

A commit quantizes where the state lives (an accelerator perhaps); the parent's quantization is
read from the store or the level caches, on the host.  The boundaries where the two meet
(`mvc.repo.lossy`: same_quantization, the step cost, the delta; the level cache's entries; the
warm-start centroids; the first-moment bound on restore) move one side on purpose, to the host.

CPU tests: the resume-after-failure path (a lossy commit, then a second one of a changed state in
a fresh process, through `Repo.commit` and through the `Tracker`, moments compressed) restores
bit-identically and stores what one process committing both states stores; and each boundary
helper, handed a quantization on a device this machine lacks (`Elsewhere`: only its device,
shape, size and `.to()` work, so any use that does not move it first fails), moves that side to the
host and gives the all-CPU answer.  CUDA-marked tests run the same on a real device.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoints import adam_state, on_device
from locations import HELPERS

from mvc.quant import QuantConfig, QuantizedTensor, quantize
from mvc.quant.moment_bound import bound_meta
from mvc.quant.optimizer import quantize_optimizer_state
from mvc.repo import lossy, pipeline
from mvc.repo.levelcache import LevelCache
from mvc.repo.reader import _bound_first_moment
from mvc.repo.replace_verify import same_bits
from mvc.repo.repository import Repo
from mvc.state import flatten

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# One intra-op thread, as the workers use: restores are compared across processes bit for bit, and
# on a 2-core CI machine torch 2.13's float32 sqrt (the first-moment bound's) was measured to come
# out approximate (~3e-4) on the second thread's half of a small tensor in ~5% of processes.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: The commits' fixed config: pruned and protected levels too (every part of a quantization
#: meets the parent's).
CONFIG = QuantConfig(bins=16, prune=0.1, protect=0.01, prune_metric="magnitude")
#: The Tracker's: it hands its gradient EMA to the commit, which protects by sensitivity; without
#: protection its levels depend on the weights alone, as a reference commit's do.
TRACKER_CONFIG = QuantConfig(bins=16, prune=0.1, protect=0.0, prune_metric="magnitude")


# ----------------------------------------------------------------------------- helpers

def lossy_repo(root: Path, config: QuantConfig = CONFIG) -> Path:
    repo = Repo.init(root)
    repo.config.set("commit.mode", "fixed")
    repo.config.set("commit.quant", config.to_dict())
    assert repo.config.get("commit.optimizer") == "compressed"   # moments quantized too
    repo.close()
    return root


def worker(root: Path, out: Path, *, device: str, via: str, phase: str) -> dict[str, Any]:
    """One commit in a fresh process (tests/helpers/device_commit_worker.py); its report."""
    job = out.with_suffix(".json")
    job.write_text(json.dumps({"repo": str(root), "device": device, "via": via, "phase": phase,
                               "out": str(out)}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, str(HELPERS / "device_commit_worker.py"), str(job)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


def flat_bits(state: Any) -> dict[str, bytes]:
    return {k: (str(t.dtype), tuple(t.shape), t.detach().cpu().contiguous().view(-1).view(torch.uint8)
                .numpy().tobytes()) for k, t in flatten(state).tensors.items()}


def records(repo: Repo, cid: str) -> dict[str, Any]:
    return {r.name: r for r in repo.read_snapshot(repo.read_commit(cid).snapshot).tensors}


def resume_history(tmp_path: Path, device: str, via: str) -> tuple[Path, dict, dict]:
    """A lossy commit, then a second one in a fresh process on top of it: (repo, reports)."""
    root = lossy_repo(tmp_path / "r", TRACKER_CONFIG if via == "tracker" else CONFIG)
    first = worker(root, tmp_path / "first.pt", device=device, via=via, phase="first")
    nxt = worker(root, tmp_path / "next.pt", device=device, via=via, phase="next")
    return root, first, nxt


def check_resumed(root: Path, first: dict, nxt: dict) -> dict[str, Any]:
    """What every resume must show: the second commit is a child of the first holding deltas
    (weights and moments) against the parent read from disk, and every way to restore it (the
    committing process, a fresh one with the disk cache, one walking chains) gives the same
    bits; returns its records."""
    with Repo(root) as repo:
        assert repo.read_commit(nxt["commit"]).parents == [first["commit"]]
        recs = records(repo, nxt["commit"])
        deltas = {n for n, r in recs.items() if r.codec == lossy.QDELTA}
        assert any(n.startswith("model/") for n in deltas), sorted(deltas)
        assert any(n.startswith("optimizer/") for n in deltas), sorted(deltas)   # a moment
        assert any(n.endswith("exp_avg_sq") and lossy.is_quantized(r) for n, r in recs.items())
        fresh = flat_bits(repo.read_state(nxt["commit"]))
    with Repo(root) as repo:
        repo.disk_levels = None   # chains walked from their stored bases
        walked = flat_bits(repo.read_state(nxt["commit"]))
    assert fresh == walked == flat_bits(nxt["read"]) == flat_bits(nxt["read_device"])
    # what was committed, as stored: quantized tensors close to it, the rest exact
    exact = flatten(nxt["state"]).tensors
    restored = flatten(nxt["read"]).tensors
    for name, rec in recs.items():
        a, b = exact[name].float(), restored[name].float()
        if lossy.is_quantized(rec):
            if name.startswith("model/"):
                assert float((a - b).norm() / a.norm()) < 0.1, name
        else:
            assert torch.equal(exact[name], restored[name]), name
    return recs


def reference(tmp_path: Path, first: dict, nxt: dict, config: QuantConfig) -> dict[str, Any]:
    """The records one process commits for the same two exact states (the parent from its
    memory): what the fresh-process commit must store too."""
    root = lossy_repo(tmp_path / "ref", config)
    with Repo(root) as repo:
        repo.commit(first["state"], "first")
        cid = repo.commit(nxt["state"], "next")
        return records(repo, cid)


def same_records(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for name in a:
        ra, rb = a[name], b[name]
        assert (ra.codec, ra.chunks, ra.depth) == (rb.codec, rb.chunks, rb.depth), name


def quantized(seed: int = 0, n: int = 4096, bins: int = 8) -> tuple[torch.Tensor, QuantizedTensor]:
    w = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    return w, quantize(w, bins, prune=0.1, protect=0.01)


def changed(q: QuantizedTensor, every: int = 50) -> QuantizedTensor:
    """q with every `every`-th unpruned, unprotected level moved by one."""
    lv = q.levels.clone().reshape(-1)
    idx = torch.arange(0, lv.numel(), every)
    idx = idx[lv[idx].to(torch.int64) < q.bins - 1]
    lv[idx] += 1
    return QuantizedTensor(lv.reshape(q.shape), q.centroids, q.protected, q.dtype, q.bins)


class Elsewhere:
    """A tensor on a device this machine lacks: only `device`, `shape`, `numel()` and `.to()`
    work, so anything that does not move it first fails.  `.to()` records where it was asked
    to go."""

    device = torch.device("cuda", 7)

    def __init__(self, t: torch.Tensor, moves: list[torch.device]):
        self._t, self.shape, self._moves = t, t.shape, moves

    def numel(self) -> int:
        return self._t.numel()

    def to(self, device: Any, *args: Any, **kw: Any) -> torch.Tensor:
        device = torch.device(device)
        self._moves.append(device)
        assert device.type == "cpu", f"moved to {device}: only the host can take it"
        return self._t.to(device, *args, **kw)


def elsewhere(q: QuantizedTensor, moves: list[torch.device]) -> QuantizedTensor:
    return QuantizedTensor(Elsewhere(q.levels, moves), Elsewhere(q.centroids, moves),  # type: ignore[arg-type]
                           Elsewhere(q.protected, moves), q.dtype, q.bins)


def enc_bytes(got: Any) -> tuple:
    codec, enc, extra, depth, base = got
    return codec, [bytes(p) for p in enc.parts], enc.meta, extra, depth


# ----------------------------------------------------------------------------- CPU: a resume

@pytest.mark.parametrize("via", ["repo", "tracker"])
def test_a_resumed_lossy_commit_in_a_fresh_process_stores_and_restores_exactly(tmp_path, via):
    root, first, nxt = resume_history(tmp_path, "cpu", via)
    recs = check_resumed(root, first, nxt)
    # the same records as one process committing both states (today's path: bit-identical)
    same_records(recs, reference(tmp_path, first, nxt, TRACKER_CONFIG if via == "tracker" else CONFIG))


# ----------------------------------------------------------------------------- CPU: the boundaries

def test_helpers_leave_host_quantizations_alone():
    _, q = quantized()
    assert lossy.on_host(q) is q and q.to("cpu") is q
    a, b = lossy.aligned(q, changed(q))
    assert a is q and lossy.common_device(q, b) == torch.device("cpu")


def test_comparisons_with_a_quantization_elsewhere_move_it_to_the_host():
    _, q = quantized()
    moves: list[torch.device] = []
    far = elsewhere(q, moves)
    assert lossy.common_device(far, q) == lossy.HOST == lossy.common_device(q, far)
    assert lossy.same_quantization(far, q) and lossy.same_quantization(q, far)
    assert not lossy.same_quantization(elsewhere(changed(q), moves), q)
    assert lossy.step_cost(elsewhere(changed(q), moves), q) == lossy.step_cost(changed(q), q) > 0
    assert moves and all(d.type == "cpu" for d in moves)


def test_a_commit_encodes_against_a_parent_elsewhere_as_on_the_host(tmp_path):
    """encode_for_commit / choose_encoding: the new quantization and the parent's, each on a
    device this machine lacks, give the all-host encoding (the delta, its cost, the base)."""
    root = lossy_repo(tmp_path / "r")
    w, q = quantized(n=8192)
    with Repo(root) as repo:
        cid = repo.commit({"w": w.reshape(64, 128)}, "parent")
        sid = repo.read_commit(cid).snapshot
        prec = records(repo, cid)["w"]
        parent = repo.reader.read_quantized(sid, prec)
    new = changed(parent, 40)
    kw = dict(base_every=64, delta_max_ratio=1.0, chain_budget=8.0)
    on_host = lossy.encode_for_commit(new, prec, sid, lambda s, r: parent, **kw)
    moves: list[torch.device] = []
    far = lossy.encode_for_commit(elsewhere(new, moves), prec, sid,
                                  lambda s, r: elsewhere(parent, moves), **kw)
    assert on_host[0] == lossy.QDELTA and enc_bytes(far) == enc_bytes(on_host)
    assert lossy.encode_for_commit(elsewhere(parent, moves), prec, sid,
                                   lambda s, r: elsewhere(parent, moves), **kw) is prec
    got = lossy.choose_encoding(elsewhere(new, moves), (sid, prec, elsewhere(parent, moves)), **kw)
    assert enc_bytes(got) == enc_bytes(on_host)
    assert moves and all(d.type == "cpu" for d in moves)


@pytest.mark.parametrize("device", ["elsewhere", pytest.param("cuda", marks=cuda)])
def test_the_writer_moves_a_plans_device_quantizations_to_the_host_itself(tmp_path, device):
    """A plan keeps each quantization where it was made; `pipeline.write` moves each to the host
    as it encodes it (on its threads), and writes what a plan made on the host writes."""
    import shutil

    from mvc.search import Quantization

    root = lossy_repo(tmp_path / "r")
    g = torch.Generator().manual_seed(5)
    w = {"a": torch.randn(64, 128, generator=g), "b": torch.randn(96, 64, generator=g)}
    with Repo(root) as repo:
        repo.commit(w, "parent")
    shutil.copytree(root, tmp_path / "twin")
    w2 = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in w.items()}
    got = []
    for where in ("host", device):
        with Repo(root if where == "host" else tmp_path / "twin") as repo:
            tx = repo.commit_transaction()
            plan = pipeline.plan(flatten(w2), Quantization("fixed", config=CONFIG),
                                 tx.parent(repo.head()), read_centroids=tx.read_centroids,
                                 settings=tx.settings)
            assert set(plan.write.quantized) == {"a", "b"}
            moves: list[torch.device] = []
            if where == "elsewhere":
                plan.write.quantized = {n: elsewhere(q, moves) for n, q in plan.write.quantized.items()}
            elif where == "cuda":
                plan.write.quantized = {n: q.to("cuda") for n, q in plan.write.quantized.items()}
                moves.append(torch.device("cpu"))
            recs = pipeline.write(plan.write, plan.write.names, blobs=repo.store.blobs,
                                  read_quantized=tx.read_quantized)
            assert all(d.type == "cpu" for d in moves) and (moves or where == "host")
            got.append([(r.name, r.codec, r.chunks, r.meta) for r in recs])
    assert got[0] == got[1] and {r[1] for r in got[0]} == {lossy.QDELTA}


def test_the_level_cache_keeps_host_copies():
    _, q = quantized()
    cache = LevelCache()
    cache.put(("s", "w"), q)
    assert cache.get(("s", "w")) is q   # on the host already: kept as is
    moves: list[torch.device] = []
    cache.put(("s", "far"), elsewhere(q, moves))
    hit = cache.get(("s", "far"))
    assert hit is not None and moves
    for mine, theirs in zip((hit.levels, hit.centroids, hit.protected), (q.levels, q.centroids, q.protected)):
        assert isinstance(mine, torch.Tensor) and mine.device.type == "cpu" and torch.equal(mine, theirs)


def test_warm_start_centroids_are_handed_over_on_the_host(tmp_path):
    _, q = quantized()
    moves: list[torch.device] = []
    parent = pipeline.ParentInfo("c", "s", None, {"w": None})  # type: ignore[dict-item]
    init = pipeline.parent_centroids(parent, lambda s, r: elsewhere(q, moves).centroids)
    assert isinstance(init["w"], torch.Tensor) and torch.equal(init["w"], q.centroids)
    assert moves == [torch.device("cpu")]


def test_first_moment_bound_is_taken_on_the_host():
    g = torch.Generator().manual_seed(3)
    m, v = torch.randn(3000, generator=g), torch.rand(3000, generator=g) * 1e-3
    rec = type("Rec", (), {"meta": {"moment": {"partner": "v", "ratio_bound": 2.0}}, "name": "m"})()
    a = m.clone()
    _bound_first_moment(rec, a, {"v": v})  # type: ignore[arg-type]
    assert not torch.equal(a, m) and bool((a.abs() <= 2.0 * v.sqrt() * (1 + 1e-6)).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_lookup_through_host_made_values_is_the_restore(dtype):
    """A checkout to CUDA makes each tensor's value table on the host (`restore_values`) and
    looks the uploaded levels up in it: the restore's bits, in both domains."""
    from mvc.quant.optimizer import quantize_second_moment, restore, restore_values

    g = torch.Generator().manual_seed(5)
    m = torch.randn(5000, generator=g).to(dtype)
    v = (torch.randn(5000, generator=g) * 3).exp().mul(1e-6).to(dtype)
    for q, domain in ((quantize(m, 8, prune=0.2, protect=0.01), "linear"),
                      (quantize_second_moment(v, 8, protect=0.01), "log")):
        assert q is not None
        values = restore_values(q, domain)
        assert values.device.type == "cpu" and values.dtype == dtype
        assert torch.equal(q.uploaded("cpu").lookup(values).view(torch.uint8),
                           restore(q, domain).view(torch.uint8))
        assert q.uploaded("cpu") is q          # already there: no copy
    with pytest.raises(Exception, match="unknown optimizer-state domain"):
        restore_values(q, "cubic")


# ----------------------------------------------------------------------------- CUDA

@cuda
@pytest.mark.parametrize("via", ["repo", "tracker"])
def test_cuda_resumed_lossy_commit_in_a_fresh_process(tmp_path, via):  # pragma: no cover - no GPU in CI
    """The issue's crash: a CUDA state committed lossily in a new process on top of a lossy
    commit; restored bit-exactly on the CPU and on the device."""
    root, first, nxt = resume_history(tmp_path, "cuda", via)
    check_resumed(root, first, nxt)
    with Repo(root) as repo:
        on_dev = repo.read_state(nxt["commit"], map_location="cuda")
        assert all(t.is_cuda for t in flatten(on_dev).tensors.values())
        assert flat_bits(on_dev) == flat_bits(nxt["read"])
    # a third commit on top, CUDA state again, parent now a CUDA commit's
    again = worker(root, tmp_path / "again.pt", device="cuda", via=via, phase="next")
    check_resumed(root, nxt, again)


@cuda
def test_cuda_checkout_inside_a_side_stream_decodes_on_the_callers_device_and_stream(
        tmp_path, monkeypatch):  # pragma: no cover - no GPU in CI
    """The pool threads that decode for a checkout to "cuda" work on the caller's current
    device and stream (a new thread's are device 0 and the default stream)."""
    import mvc.repo.reader as reader

    root = lossy_repo(tmp_path / "r")
    with Repo(root) as repo:
        cid = repo.commit(adam_state(), "c")
        host = repo.read_state(cid, cache_levels=False)
        seen: list[tuple[int, int]] = []
        orig = reader._values

        def values(rec: Any, q: Any, device: Any = None) -> torch.Tensor:
            if device is not None:
                seen.append((torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream))
            return orig(rec, q, device)

        monkeypatch.setattr(reader, "_values", values)
        dev = torch.cuda.device_count() - 1
        side = torch.cuda.Stream(device=dev)
        with torch.cuda.device(dev), torch.cuda.stream(side):
            got = repo.read_state(cid, map_location="cuda", cache_levels=False)
            side.synchronize()
    assert seen and set(seen) == {(dev, side.cuda_stream)}
    assert all(t.device == torch.device("cuda", dev) for t in flatten(got).tensors.values())
    assert flat_bits(got) == flat_bits(host)


@cuda
def test_cuda_commit_inside_a_side_stream_stores_what_the_host_stores(
        tmp_path, monkeypatch):  # pragma: no cover - no GPU in CI
    """A commit made inside ``torch.cuda.stream(s)`` whose levels are written on `s` behind a
    sleep there, as the writer starts: the pool threads that bring each quantization's levels
    to the host queue on `s` too (mvc.native.parallel). On a new thread's default stream they
    would copy the levels before the caller's kernel had written them."""
    state = adam_state()
    with Repo(lossy_repo(tmp_path / "host")) as repo:
        want = records(repo, repo.commit(state, "c"))
    orig = pipeline.write
    late: list[str] = []

    def written_late(plan: Any, names: Any, **kw: Any) -> Any:
        torch.cuda._sleep(200_000_000)
        for name, q in plan.quantized.items():
            if q.levels.is_cuda:
                plan.quantized[name] = dataclasses.replace(q, levels=q.levels.clone())
                late.append(name)
        return orig(plan, names, **kw)

    monkeypatch.setattr(pipeline, "write", written_late)
    on_gpu = on_device(state, "cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side), Repo(lossy_repo(tmp_path / "dev")) as repo:
        got = records(repo, repo.commit(on_gpu, "c"))
    torch.cuda.synchronize()
    assert late
    same_records(got, want)


@cuda
def test_cuda_quantization_meets_a_host_parent():  # pragma: no cover - no GPU in CI
    _, q = quantized()
    qc = q.to("cuda")
    assert qc.levels.is_cuda and lossy.on_host(qc).levels.device.type == "cpu"
    assert lossy.common_device(qc, q) == lossy.HOST
    assert lossy.common_device(qc, qc).type == "cuda"
    assert lossy.same_quantization(qc, q) and lossy.same_quantization(q, qc)
    assert not lossy.same_quantization(changed(q).to("cuda"), q)
    assert lossy.step_cost(changed(q).to("cuda"), q) == lossy.step_cost(changed(q), q)
    cache = LevelCache()
    cache.put(("s", "w"), qc)
    hit = cache.get(("s", "w"))
    assert hit is not None and hit.levels.device.type == "cpu" and lossy.same_quantization(hit, q)


@cuda
def test_cuda_commit_encodes_against_host_and_device_parents(tmp_path):  # pragma: no cover - no GPU in CI
    root = lossy_repo(tmp_path / "r")
    w, _ = quantized(n=8192)
    with Repo(root) as repo:
        cid = repo.commit({"w": w.reshape(64, 128)}, "parent")
        sid = repo.read_commit(cid).snapshot
        prec = records(repo, cid)["w"]
        parent = repo.reader.read_quantized(sid, prec)
    new = changed(parent, 40)
    kw = dict(base_every=64, delta_max_ratio=1.0, chain_budget=8.0)
    want = enc_bytes(lossy.encode_for_commit(new, prec, sid, lambda s, r: parent, **kw))
    for nd in ("cpu", "cuda"):
        for pd in ("cpu", "cuda"):
            pq = parent.to(pd)
            got = lossy.encode_for_commit(new.to(nd), prec, sid, lambda s, r: pq, **kw)
            assert enc_bytes(got) == want, (nd, pd)
            assert lossy.encode_for_commit(parent.to(nd), prec, sid,
                                           lambda s, r: pq, **kw) is prec


@cuda
def test_cuda_warm_starts_and_moments_from_a_host_parent():  # pragma: no cover - no GPU in CI
    w, q = quantized(bins=16)
    init = q.centroids   # the parent's, on the host
    a = quantize(w.cuda(), 16, init=init)
    b = quantize(w.cuda(), 16, init=init.cuda())
    assert lossy.same_quantization(a, b)
    g = torch.Generator().manual_seed(5)
    state = {"optimizer/state/0/exp_avg": torch.randn(4096, generator=g) * 1e-3,
             "optimizer/state/0/exp_avg_sq": torch.rand(4096, generator=g) * 1e-6}
    host = quantize_optimizer_state(state)
    parent_init = {n: oq.q.centroids for n, oq in host.items()}   # host centroids, as read
    dev = quantize_optimizer_state({n: t.cuda() for n, t in state.items()}, init=parent_init)
    dev2 = quantize_optimizer_state({n: t.cuda() for n, t in state.items()},
                                    init={n: c.cuda() for n, c in parent_init.items()})
    assert set(dev) == set(host)
    for name in dev:
        assert lossy.same_quantization(dev[name].q, dev2[name].q), name


@cuda
def test_cuda_first_moment_bound_with_a_host_partner():  # pragma: no cover - no GPU in CI
    g = torch.Generator().manual_seed(3)
    m, v = torch.randn(3000, generator=g), torch.rand(3000, generator=g) * 1e-3
    m[:4], v[:4] = torch.tensor([0.0, -0.0, -1.0, 2.0]), 0.0
    for moment in ({"partner": "v", "ratio_bound": 2.0}, bound_meta("v", 2.0)):
        rec = type("Rec", (), {"meta": {"moment": moment}, "name": "m"})()
        host, dev, both = m.clone(), m.cuda(), m.cuda()
        _bound_first_moment(rec, host, {"v": v})  # type: ignore[arg-type]
        _bound_first_moment(rec, dev, {"v": v})  # type: ignore[arg-type]
        _bound_first_moment(rec, both, {"v": v.cuda()})  # type: ignore[arg-type]
        assert dev.is_cuda and same_bits(dev.cpu(), host) and same_bits(both.cpu(), host)


@cuda
def test_cuda_ieee_bound_is_the_hosts_over_every_float32():  # pragma: no cover - no GPU in CI
    """The GPU's route (float64 sqrt rounded once) against the host's native pass, bit for bit,
    over float32 patterns of every exponent, the subnormals and the edges, by four bounds."""
    from mvc.quant._kernels import moment_clamp
    from mvc.quant.moment_bound import torch_clamp

    gen = torch.Generator().manual_seed(4)
    exps = torch.arange(0, 256, dtype=torch.int64).repeat_interleave(1 << 14) << 23
    x = (exps | torch.randint(0, 1 << 23, (exps.numel(),), generator=gen)).to(torch.int32)
    v = torch.cat([x, torch.arange(0, 1 << 23, 13, dtype=torch.int32)]).view(torch.float32)
    m = torch.randn(v.numel(), generator=gen) * 10.0 ** torch.randint(-30, 30, (v.numel(),),
                                                                        generator=gen)
    for b in (0.5, 1.0, 3.7, 1e10):
        host, dev = m.clone(), m.cuda()
        moment_clamp(host, v, b)
        torch_clamp(dev, v.cuda(), b)
        assert same_bits(dev.cpu(), host), b


def commits_then_compaction(root: Path, device: str) -> None:
    """Three lossy commits of a state on `device` (a delta chain), then gc's compaction in the
    same process: its check compares re-encoded levels with what the process's level cache
    holds from the commits.  Every restore stays the same bits."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=g)
    with Repo(lossy_repo(root)) as repo:
        ids = []
        for i in range(3):
            w = w + 0.01 * torch.randn(w.shape, generator=g)
            ids.append(repo.commit({"w": w.to(device)}, f"c{i}"))
        assert records(repo, ids[-1])["w"].depth == 2
        cached = list(repo.reader.levels._items.values())
        assert cached and all(q.levels.device.type == "cpu" for q in cached)
        before = [flat_bits(repo.read_state(c)) for c in ids]
        assert flat_bits(repo.read_state(ids[-1], map_location=device)) == before[-1]
        assert repo.gc(max_chain=1).tensors_rebased > 0
        assert [flat_bits(repo.read_state(c)) for c in ids] == before
    with Repo(root) as repo:
        assert [flat_bits(repo.read_state(c)) for c in ids] == before


def test_commits_then_compaction_in_one_process(tmp_path):
    commits_then_compaction(tmp_path / "r", "cpu")


@cuda
def test_cuda_commits_then_compaction_in_one_process(tmp_path):  # pragma: no cover - no GPU in CI
    """A process that committed CUDA states keeps only host copies in its level cache, so
    its reads and gc's re-encoding check meet host parents."""
    commits_then_compaction(tmp_path / "r", "cuda")


# ----------------------------------------------------------------------------- CPU: a checkout's moments

def test_a_checkout_to_cuda_sends_moment_levels_except_an_earlier_commits(tmp_path, monkeypatch):
    """A commit's Adam moments have their levels looked up on the GPU like the weights (their
    bound takes the same bits on every device); an earlier commit's (tests/fixtures/repo_v1:
    no `sqrt` form in its records) are restored on the host, as they always were. The moves
    to CUDA are recorded, not made: this machine may have no GPU."""
    from locations import FIXTURES

    sent: list[int] = []
    orig = QuantizedTensor.uploaded

    def uploaded(self: QuantizedTensor, device: Any) -> QuantizedTensor:
        if torch.device(device).type != "cuda":
            return orig(self, device)
        sent.append(self.levels.numel())
        return self

    monkeypatch.setattr(QuantizedTensor, "uploaded", uploaded)
    old = tmp_path / "old"
    old.mkdir()
    shutil.copytree(FIXTURES / "repo_v1" / "mvc", old / ".mvc")
    new = lossy_repo(tmp_path / "new")
    with Repo(new) as repo:
        repo.commit(adam_state(), "c")
    for root, rev, ieee in ((old, "main", False), (new, "HEAD", True)):
        with Repo(root) as repo:
            cid = repo.resolve(rev)
            sid = repo.read_commit(cid).snapshot
            recs = repo.read_snapshot(sid).tensors
            quant = [r for r in recs if lossy.is_quantized(r)]
            moments = [r for r in quant if r.meta.get("moment")]
            assert moments and all(("sqrt" in r.meta["moment"]) == ieee for r in moments)
            on_host = {r.name for r in moments} | {r.meta["moment"]["partner"] for r in moments}
            sent.clear()
            got = repo.reader.read_all(sid, recs, device=torch.device("cuda"))
            want = [math.prod(r.shape) for r in quant if ieee or r.name not in on_host]
            assert sorted(sent) == sorted(want), root
            host = repo.reader.read_all(sid, recs)
            assert got.keys() == host.keys()
            assert all(same_bits(got[k], host[k]) for k in got)
