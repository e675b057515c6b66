"""Random single-byte flips anywhere under `.mvc/` are detected or harmless, never silent.

A small lossy repository (weights and Adam moments, delta chains, a branch and a tag, the
level cache) is damaged one byte at a time — the LMDB data file, its lock file, the level
cache, the config — and also by swapping one commit's level-cache entry in for another's.
A child process (tests/helpers/corruption_worker.py) then runs fsck and restores every commit.
Every outcome must be "detected" (fsck or a typed read error) or "harmless" (the same
bits as before); a silently different tensor, an untyped exception, a crash or a hang
fails the test.
"""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from locations import HELPERS

from mvc.quant import QuantConfig
from mvc.repo.repository import Repo

WORKER = HELPERS / "corruption_worker.py"
TRIAL_TIMEOUT_S = 60


def _build(root: Path) -> dict[str, object]:
    """The pristine repository; returns commit id -> the state it restores."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 80), torch.nn.ReLU(), torch.nn.Linear(80, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    repo = Repo.init(root)
    repo.config.set("cache.levels_keep", 4)
    cids = []
    for i, bins in enumerate((16, 16, 8, 16)):
        for _ in range(5):
            x = torch.randn(16, 64, generator=g)
            loss = (model(x) - x[:, :8]).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": i}
        cids.append(repo.commit(state, f"epoch {i}", step=i, quant=QuantConfig(bins=bins, prune=0.1)))
        if i == 1:
            repo.branch("side", cids[-1])
            repo.tag("v1", cids[-1])
    expected = {cid: repo.read_state(cid) for cid in cids}
    repo.close()
    return expected


class Worker:
    """One child process fed many damaged repositories; restarted after a crash or hang."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def run(self, directory: Path, expected: Path) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, str(WORKER)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True,
                                         cwd=str(HELPERS))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"dir": str(directory), "expected": str(expected)}) + "\n")
        self.proc.stdin.flush()
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=TRIAL_TIMEOUT_S):
            self.proc.kill()
            self.proc = None
            return {"hang": True}
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            self.proc = None
            return {"died": rc}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)


def _targets(mvc_dir: Path) -> tuple[Path, list[Path]]:
    files = sorted(p for p in mvc_dir.rglob("*") if p.is_file() and p.stat().st_size > 0)
    data = next(p for p in files if p.name == "data.mdb")
    return data, [p for p in files if p != data]


def _verdict(result: dict, what: str) -> str:
    """'harmless', 'detected', or a failure message."""
    for bad in ("crash", "hang", "died"):
        if bad in result:
            return f"{what}: {bad}: {result[bad]}"
    if "open" in result:
        return "detected"  # the repository refused to open with a typed error
    reads = result["reads"]
    silent = [c for c, r in reads.items() if r == "different"]
    if silent:
        return f"{what}: silently different restore of {silent} (fsck: {result['fsck']})"
    if all(r == "same" for r in reads.values()) and result["fsck"] == "ok":
        return "harmless"
    return "detected"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine") / "repo"
    expected = _build(root)
    path = root.parent / "expected.pt"
    torch.save(expected, path)
    return root, path, list(expected)


def _sweep(pristine, tmp_path, trials: int, seed: int) -> None:
    root, expected, cids = pristine
    rng = random.Random(seed)
    worker = Worker()
    outcomes: dict[str, int] = {"harmless": 0, "detected": 0}
    failures = []
    try:
        for trial in range(trials):
            work = tmp_path / f"t{trial}"
            shutil.copytree(root, work)
            data, others = _targets(work / ".mvc")
            # Half the flips land in the LMDB file (objects, refs, reflog, meta); the rest are
            # spread over the small files, so each of them is hit many times.
            target = data if rng.random() < 0.5 else rng.choice(others)
            raw = bytearray(target.read_bytes())
            at = rng.randrange(len(raw))
            raw[at] ^= rng.randrange(1, 256)
            target.write_bytes(bytes(raw))
            what = f"flip of byte {at} in {target.relative_to(work)}"
            verdict = _verdict(worker.run(work, expected), what)
            if verdict in outcomes:
                outcomes[verdict] += 1
            else:
                failures.append(verdict)
            shutil.rmtree(work)
    finally:
        worker.close()
    assert not failures, "\n".join(failures)
    assert outcomes["detected"] > 0  # the sweep did damage something
    print(f"corruption sweep: {trials} flips, {outcomes}")


def test_random_byte_flips_are_detected_or_harmless(pristine, tmp_path):
    _sweep(pristine, tmp_path, trials=60, seed=1)


@pytest.mark.slow
def test_random_byte_flips_long_sweep(pristine, tmp_path):
    _sweep(pristine, tmp_path, trials=400, seed=2)


def test_a_cache_entry_swapped_in_from_another_commit_is_a_miss(pristine, tmp_path):
    root, expected, cids = pristine
    work = tmp_path / "swap"
    shutil.copytree(root, work)
    entries = sorted((work / ".mvc" / "cache" / "levels").glob("*.levels"))
    assert len(entries) >= 2
    # Every entry takes the place of every other one in turn.
    worker = Worker()
    try:
        for src in entries:
            for dst in entries:
                if src == dst:
                    continue
                trial = tmp_path / f"swap-{src.stem[:6]}-{dst.stem[:6]}"
                shutil.copytree(work, trial)
                shutil.copyfile(src, trial / ".mvc" / "cache" / "levels" / dst.name)
                result = worker.run(trial, expected)
                assert _verdict(result, "swap") in ("harmless", "detected"), result
                assert all(r == "same" for r in result["reads"].values()), result
                shutil.rmtree(trial)
    finally:
        worker.close()
