"""Hostile payloads: a clean typed error, and nothing left behind that crashes the process later.

A payload mutated after the fact and stored under its recomputed content hash
(with the codec's own checksum recomputed too) passes every id check, so only
the codecs stand between it and the caller.  Every outcome must be a tensor or
a `DataError` -- and the process must survive the next garbage collection.
Issue 12 (defect 3): the native bindings held cffi buffer exports on
memoryviews in local variables; an error's traceback kept those frames, the
error sat in a reference cycle, and when the collector cleared the cycle it
cleared the memoryview first (CPython's memoryview tp_clear drops its managed
buffer even while exported), so releasing the export afterwards wrote through
NULL: a segfault after a correct `CodecError`.

The repository-level runs happen in a subprocess that inherits this process's
environment (under native/run_sanitized_tests.sh: the sanitized build and its
LD_PRELOAD), so a crash fails the test instead of killing the test run.
"""
from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvc.codecs import delta_groups as dg
from mvc.codecs import quantized as qc
from mvc.codecs.base import CodecError, get_codec
from mvc.errors import DataError, InternalError
from mvc.native import huffman, rans, rle
from mvc.native.status import NativeDecodeError

HERE = Path(__file__).resolve().parent
QUANT = ("qbase/1", "qdelta/1")


# --------------------------------------------------------------------------- no export outlives an error

def _live_exports(exc: BaseException) -> list[str]:
    """Memoryviews reachable from the error's frames that still have a buffer exported.

    Exactly the objects that crash the collector when the error ends up in a
    reference cycle.  Those frames are dead, so their exports are then released
    here (cffi buffers first), which keeps a failing run from crashing later.
    """
    from mvc.native import ffi

    found, seen, frames = [], set(), []
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        e = e.__cause__ or e.__context__
    for frame in frames:
        for name, value in list(frame.f_locals.items()):
            if isinstance(value, memoryview):
                try:
                    value.release()
                except BufferError:
                    found.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}:{name}")
    if found:
        for frame in frames:
            for value in list(frame.f_locals.values()):
                if isinstance(value, ffi.CData):
                    try:
                        ffi.release(value)
                    except (TypeError, ValueError):
                        pass
    return found


def _fail_and_inspect(call: Callable[[memoryview], Any], payloads: list[bytes]) -> list[str]:
    """Feed every payload (as a memoryview) to `call`; the live exports any refusal left behind."""
    left, refused = [], 0
    for data in payloads:
        try:
            call(memoryview(bytearray(data)))
        except (CodecError, NativeDecodeError) as exc:  # codec or bare native decoder calls
            refused += 1
            left += _live_exports(exc)
    assert refused, "no payload was refused: the test lost its hostile input"
    return sorted(set(left))


def _garbage(valid: bytes, keep: int, seed: int, count: int = 48) -> list[bytes]:
    """Copies of `valid` with random bytes after its first `keep` ones replaced: from a few
    (headers stay readable, the native decoder meets the garbage) to all of them."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        b = bytearray(valid)
        if i % 4 == 3:
            b[keep:] = rng.randbytes(len(b) - keep)
        else:
            for _ in range(1 + i % 16):
                b[rng.randrange(keep, len(b))] = rng.randrange(256)
        out.append(bytes(b))
    return out


def _symbols(n: int, hi: int, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.minimum(rng.geometric(0.3, n) - 1, hi - 1).astype(dtype)


def _huffman_case():
    n = 20000
    enc = huffman.encode(_symbols(n, 200, np.uint8), block_bytes=4096)  # several blocks: the pool path
    return lambda mv: huffman.decode(mv, n, np.uint8), _garbage(enc, 16, 1)


def _rle_case():
    n = 20000
    vals = np.repeat(_symbols(n // 4, 5000, np.int32), 4)
    vals[::7] = 70000  # escapes: a non-empty extra-bits stream
    enc = rle.encode_huffman(vals)
    return lambda mv: rle.decode_huffman(mv, n), _garbage(enc, 16, 2)


def _rans_case():
    n = 5000
    enc = rans.encode(_symbols(n, 40, np.uint8))
    return lambda mv: rans.decode(mv, n), _garbage(enc, 1, 3)


def _levels_case(walker: bool):
    n, bins = 6000, 8 if walker else 300
    rng = np.random.default_rng(4)
    parent = rng.integers(0, bins + 2, n).astype(dg.delta_dtype(bins + 2))
    cur = parent.copy()
    cur[rng.integers(0, n, n // 10)] = rng.integers(0, bins + 2, n // 10)
    enc = qc.encode_delta(qc_tensor(cur, bins), torch.from_numpy(parent.astype(np.int64)), bins + 2)
    lengths = enc.meta["sections"][2:]
    body = b"".join(bytes(p) for p in enc.parts[2:])
    payloads = _garbage(body, 0, 5)
    if walker:
        def call(mv):
            with dg.ChainWalker(parent) as w:
                w.step(bins + 2, bins + 2, bins + 2, mv, lengths)
    else:
        def call(mv):
            dg.decode_levels(parent, bins + 2, bins + 2, bins + 2, grouped=True, rle=True,
                             sections=mv, lengths=lengths)
    return call, payloads


def _lossless_case():
    t = torch.randn(3000) * torch.logspace(-3, 3, 3000)
    codec = get_codec("lossless/1")
    enc = codec.encode(t)
    data = b"".join(bytes(p) for p in enc.parts)
    return (lambda mv: codec.decode(enc.meta, mv, t.dtype, tuple(t.shape)),
            _garbage(data, 16, 6))  # 16: the segment header (4 planes' lengths)


def qc_tensor(levels: np.ndarray, bins: int):
    from mvc.quant import QuantizedTensor, level_dtype

    cent = torch.linspace(-1, 1, bins)
    n_prot = int(np.count_nonzero(levels == bins + 1))
    lv = torch.from_numpy(levels.astype(np.int64)).to(level_dtype(bins))
    return QuantizedTensor.from_parts(lv, cent, torch.randn(n_prot), torch.float32, bins)


CASES = {
    "huffman": _huffman_case,
    "rle+huffman": _rle_case,
    "rans": _rans_case,
    "qdelta levels (16-bit)": lambda: _levels_case(walker=False),
    "qdelta chain walker": lambda: _levels_case(walker=True),
    "lossless": _lossless_case,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_buffer_export_outlives_a_decode_error(case):
    """After a decoder refuses its input, no frame the error keeps alive still exports a buffer."""
    call, payloads = CASES[case]()
    left = _fail_and_inspect(call, payloads)
    assert not left, f"{case}: buffer exports left alive by the error path: {left}"


def test_raw_tensor_pins_its_bytearray():
    """A raw-decoded tensor views the payload; the payload cannot be resized (moved) under it."""
    buf = bytearray(np.arange(8, dtype=np.float32).tobytes())
    t = get_codec("raw/1").decode({}, buf, torch.float32, (8,))
    with pytest.raises(BufferError):
        buf.extend(bytes(1 << 20))
    assert t.tolist() == list(range(8))


def test_chain_walker_close_is_final():
    walker = dg.ChainWalker(np.zeros(100, dtype=np.uint8))
    walker.close()
    walker.close()  # idempotent: freed once
    with pytest.raises(InternalError):
        walker.levels()


def test_pmap_never_returns_while_a_task_runs(monkeypatch):
    """A refused submission (a pool shut down at exit) still waits for the tasks already running:
    they write into buffers the caller frees as soon as it sees the error."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from mvc.native import parallel

    done = threading.Event()

    def slow(x):
        time.sleep(0.2)
        done.set()
        return x

    class Refusing(ThreadPoolExecutor):
        calls = 0

        def submit(self, fn, *args, **kwargs):
            Refusing.calls += 1
            if Refusing.calls > 1:
                raise RuntimeError("cannot schedule new futures after interpreter shutdown")
            return super().submit(fn, *args, **kwargs)

    pool = Refusing(max_workers=2)
    monkeypatch.setattr(parallel, "get_pool", lambda: pool)
    monkeypatch.setattr(parallel, "worker_count", lambda: 2)
    with pytest.raises(RuntimeError):
        parallel.pmap(slow, [1, 2, 3])
    assert done.is_set()
    pool.shutdown()


# --------------------------------------------------------------------------- a repository with every codec

def build_history(root: Path):
    """A repository with every codec in its two commits: (repo, [c1, c2]).

    `layer.weight` is 8-bin (its deltas take the chain walker), `embed.weight`
    300-bin (16-bit levels, the general delta decoder); both have protected
    values; `bias` is raw and `head.bias` lossless.
    """
    from mvc.quant import QuantConfig
    from mvc.repo.repository import Repo

    repo = Repo.init(root)
    repo.config.set("commit.base_every", 100)
    repo.config.set("commit.chain_budget", 0)
    g = torch.Generator().manual_seed(0)
    state = {"layer.weight": torch.randn(64, 64, generator=g) * 0.05,
             "embed.weight": torch.randn(128, 32, generator=g) * 0.02,
             "head.bias": torch.randn(300, generator=g),
             "bias": torch.randn(7, generator=g)}
    cfg = QuantConfig(bins=8, embedding_bins=300, protect=0.01, prune=0.1)
    ids = []
    for t in range(2):
        # a few parameters move: small deltas, so the second commit stores them as deltas
        state = {k: v + 0.003 * torch.randn(v.shape, generator=g)
                 * (torch.rand(v.shape, generator=g) < 0.05) for k, v in state.items()}
        ids.append(repo.commit(state, f"step {t}", quant=cfg))
    return repo, ids


def records(repo, cid: str) -> dict[str, Any]:
    return {r.name: r for r in repo.read_snapshot(repo.read_commit(cid).snapshot).tensors}


def hostile_commit(repo, cid: str, name: str, payload: bytes, meta: dict | None = None) -> str:
    """A copy of commit `cid` whose tensor `name` is stored as `payload`, every hash recomputed.

    The payload is stored under its own content id and, for quantized codecs,
    its meta checksum is recomputed: the only thing wrong is what the bytes say.
    The commit is tagged so fsck walks it.
    """
    from mvc.repo.objects import Snapshot
    from mvc.store.base import ANY, RefUpdate

    commit = repo.read_commit(cid)
    snap = repo.read_snapshot(commit.snapshot)
    recs = []
    for rec in snap.tensors:
        if rec.name == name:
            m = dict(rec.meta if meta is None else meta)
            if rec.codec in QUANT:
                m["xxh3"] = xxhash.xxh3_64(payload).hexdigest()
            rec = replace(rec, chunks=[repo.store.blobs.put(payload)], stored_bytes=len(payload), meta=m)
        recs.append(rec)
    sid = repo.store.blobs.put(Snapshot(tensors=recs, skeleton=snap.skeleton).encode())
    hid = repo.store.blobs.put(replace(commit, snapshot=sid).encode())
    repo.store.refs.update_refs([RefUpdate(f"refs/tags/hostile-{hid[:12]}", ANY, hid)], "hostile payload")
    return hid


def public_reads(repo, hid: str, other: str) -> list[str]:
    """read_state, diff and fsck over a hostile commit; returns the errors seen (all `DataError`).

    Each error is put in a reference cycle, as a caller's error handling
    easily does, and collected before the next read.
    """
    seen = []
    for what, fn in (("read_state", lambda: repo.read_state(hid)),
                     ("diff", lambda: repo.diff(other, hid)),
                     ("fsck", lambda: repo.fsck())):
        try:
            fn()
        except DataError as exc:
            exc.cycle = exc  # type: ignore[attr-defined]
            seen.append(f"{what}: {type(exc).__name__}")
            if what == "fsck":
                raise AssertionError(f"fsck raised instead of reporting: {exc!r}") from None
            del exc
        gc.collect()
    return seen


# --------------------------------------------------------------------------- run in a subprocess

def run_isolated(tmp_path: Path, func: str, *args: Any, timeout: int = 600) -> str:
    """Call `func(*args)` of this module in a fresh interpreter; a crash fails the test."""
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); "
            f"import test_hostile_payloads as m; m.{func}(*{args!r})")
    cmd = [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-c", code]
    proc = subprocess.run(cmd, check=False, cwd=tmp_path, env=dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{func}{args!r} exited with {proc.returncode} (negative: killed by that signal)\n"
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-12000:]}")
    return proc.stdout


def garbage_sections_then_gc(root: str, rounds: int) -> None:
    """Issue 12 defect 3, as reported: garbage qdelta level sections, CodecError, then gc."""
    repo, (_, c2) = build_history(Path(root))
    gc.freeze()  # only what the reads create is collected: collections take ms, not 0.3 s
    recs = records(repo, c2)
    rng = random.Random(0)
    for i in range(rounds):
        for name in ("embed.weight", "layer.weight"):
            rec = recs[name]
            assert rec.codec == "qdelta/1"
            payload = bytearray(b"".join(repo.store.blobs.get(c) for c in rec.chunks))
            start = sum(rec.meta["sections"][:2])
            payload[start:] = rng.randbytes(len(payload) - start)
            hid = hostile_commit(repo, c2, name, bytes(payload))
            try:
                repo.read_state(hid)
            except CodecError as exc:
                exc.cycle = exc  # type: ignore[attr-defined]
                del exc
            else:
                raise AssertionError(f"round {i}: garbage {name} sections restored without error")
            gc.collect()
    repo.close()
    print("survived", rounds, "rounds")


def test_garbage_qdelta_sections_raise_then_gc_survives(tmp_path):
    out = run_isolated(tmp_path, "garbage_sections_then_gc", str(tmp_path / "r"), 8)
    assert "survived 8 rounds" in out


def _mutate(data, payload: bytes, sections: list[int] | None) -> tuple[bytes, list[int] | None]:
    """A hypothesis-chosen mutation of `payload`; the quantized codecs' section list kept consistent."""
    rng = random.Random(data.draw(st.integers(0, 2**32), "seed"))
    b = bytearray(payload)
    kind = data.draw(st.sampled_from(["flips", "section", "tail", "resize"]), "kind")
    if kind == "flips" or not b:
        for _ in range(data.draw(st.integers(1, 16), "flips")):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == "section":
        spans, pos = [], 0
        for n in sections or [len(b)]:
            spans.append((pos, pos + n))
            pos += n
        spans = [s for s in spans if s[1] > s[0]] or [(0, len(b))]
        a, e = spans[data.draw(st.integers(0, len(spans) - 1), "section")]
        b[a:e] = rng.randbytes(e - a)
    elif kind == "tail":
        a = rng.randrange(len(b))
        b[a:] = rng.randbytes(len(b) - a)
    else:
        delta = data.draw(st.integers(-16, 16).filter(bool), "resize")
        if delta > 0:
            b += rng.randbytes(delta)
        else:
            del b[max(0, len(b) + delta):]
        if sections:  # the last section absorbs the change, so the decoders see it
            sections = list(sections)
            sections[-1] = max(0, sections[-1] + len(b) - len(payload))
            if sum(sections) != len(b):
                sections = None
    return bytes(b), sections


TARGETS = {"raw/1": [("bias", 1)], "lossless/1": [("head.bias", 1)],
           "qbase/1": [("embed.weight", 0), ("layer.weight", 0)],
           "qdelta/1": [("embed.weight", 1), ("layer.weight", 1)]}


def _fuzz_codec(repo, ids: list[str], codec: str, examples: int) -> dict[str, int]:
    """Hypothesis-chosen mutations of `codec`'s payloads, each read back; outcome counts."""
    seen_here: dict[str, int] = {}

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one(data):
        name, which = data.draw(st.sampled_from(TARGETS[codec]), "tensor")
        cid, other = ids[which], ids[1 - which]
        rec = records(repo, cid)[name]
        assert rec.codec == codec, (name, rec.codec)
        payload = b"".join(repo.store.blobs.get(c) for c in rec.chunks)
        sections = rec.meta.get("sections") if codec in QUANT else None
        mutated, new_sections = _mutate(data, payload, sections)
        meta = dict(rec.meta)
        if new_sections is not None:
            meta["sections"] = new_sections
        hid = hostile_commit(repo, cid, name, mutated, meta)
        for seen in public_reads(repo, hid, other) or ["ok"]:
            seen_here[seen] = seen_here.get(seen, 0) + 1

    one()
    return seen_here


def fuzz_codecs(root: str, examples: int) -> None:
    """Random mutations of valid payloads of every codec through the public read paths;
    prints the outcomes seen per codec (JSON)."""
    repo, ids = build_history(Path(root))
    gc.freeze()  # only what the reads create is collected: collections take ms, not 0.3 s
    outcomes = {codec: _fuzz_codec(repo, ids, codec, examples) for codec in TARGETS}
    repo.close()
    gc.collect()
    print(json.dumps(outcomes, sort_keys=True))


def test_hostile_payloads_through_public_reads(tmp_path):
    """read_state / diff / fsck on mutated payloads of every codec: a tensor or a DataError,
    and the collection after each survives."""
    out = run_isolated(tmp_path, "fuzz_codecs", str(tmp_path / "r"), 25)
    outcomes = json.loads(out.strip().splitlines()[-1])
    assert set(outcomes) == set(TARGETS)
    for codec, seen in outcomes.items():
        if codec != "raw/1":  # raw bytes have no structure to break but their length
            assert any(k != "ok" for k in seen), f"{codec}: no mutation was ever refused: {seen}"
