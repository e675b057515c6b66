"""Progress bars (issue 19 item 1): drawn on a terminal only, never on a pipe or with --quiet;
the Python API reports to a `progress=` object only when one is given."""
from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch

from mvc.repo.repository import Repo
from terminal import run_on_pipe, run_on_pty

N_TENSORS = 24
TENSOR_NUMEL = 1 << 18  # 1 MiB of float32 each: a 24 MiB checkpoint, lossless in well under a second


def _checkpoint(path: Path) -> int:
    g = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(TENSOR_NUMEL, generator=g) for i in range(N_TENSORS)}
    torch.save(state, path)
    return sum(t.numel() * t.element_size() for t in state.values())


@pytest.fixture()
def repo_dir(tmp_path: Path) -> Path:
    Repo.init(tmp_path).close()
    _checkpoint(tmp_path / "ck.pt")
    return tmp_path


def test_commit_on_a_terminal_draws_bytes_tensors_rate_and_eta(repo_dir: Path) -> None:
    rc, out, term = run_on_pty(repo_dir, "commit", "-m", "big", "--lossless", "ck.pt")
    assert rc == 0, term
    assert out.startswith("[main ")
    # The write phase: bytes of the total, tensors of the total, a rate and the time left.
    assert "writing" in term
    assert "24.0 MiB" in term and f"/{N_TENSORS} tensors" in term, term
    assert f"{N_TENSORS}/{N_TENSORS} tensors" in term
    assert "ETA" in term and "/s" in term


def test_nothing_extra_on_a_pipe_and_none_with_quiet(repo_dir: Path) -> None:
    rc, out, err = run_on_pipe(repo_dir, "commit", "-m", "big", "--lossless", "ck.pt")
    assert rc == 0 and err == ""
    assert out.count("\n") == 1 and out.startswith("[main ")
    rc, out, term = run_on_pty(repo_dir, "checkout", "HEAD", "-o", "copy.pt", "--quiet")
    assert rc == 0 and term == "" and out.startswith("Wrote ")
    rc, out, term = run_on_pty(repo_dir, "fsck")
    assert rc == 0 and "verifying objects" in term and "checking history" in term
    assert out.endswith(": ok\n")
    rc, out, term = run_on_pty(repo_dir, "gc", "-q")
    assert rc == 0 and term == ""


@pytest.mark.slow
def test_a_400_mb_checkpoint_shows_a_live_bar_on_a_terminal_and_nothing_on_a_pipe(
        tmp_path: Path) -> None:
    # The size: long enough that the bar is redrawn while tensors are written.
    n, numel = 96, 1 << 20   # 96 tensors of 4 MiB: 402.7 MB
    g = torch.Generator().manual_seed(1)
    torch.save({f"block{i}.weight": torch.randn(numel, generator=g) for i in range(n)},
               tmp_path / "big.pt")
    Repo.init(tmp_path).close()
    rc, out, term = run_on_pty(tmp_path, "commit", "-m", "400 MB", "--lossless", "big.pt")
    assert rc == 0 and out.startswith("[main "), term
    assert "384.0 MiB" in term and f"{n}/{n} tensors" in term and "ETA" in term, term[-2000:]
    partial = {int(k) for k in re.findall(rf"\b(\d+)/{n} tensors", term)}
    assert any(0 < k < n for k in partial), sorted(partial)  # redrawn part-way, not only at the end
    rc, out, err = run_on_pipe(tmp_path, "checkout", "HEAD", "-o", "copy.pt")
    assert rc == 0 and err == "" and out.startswith("Wrote ")
    assert (tmp_path / "copy.pt").stat().st_size >= n * numel * 4


class Recorder:
    """A `mvc.progress.Progress` that keeps what it heard."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, int | None, int | None]] = []
        self.done: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self._current = ""

    def phase(self, description: str, *, total_bytes: int | None = None,
              total_items: int | None = None, unit: str = "tensors") -> None:
        self.phases.append((description, total_bytes, total_items))
        self._current = description
        self.done[description] = [0, 0]

    def advance(self, nbytes: int = 0, items: int = 0) -> None:
        with self._lock:
            d = self.done[self._current]
            d[0] += nbytes
            d[1] += items

    def end(self) -> None:
        pass


def test_the_api_reports_only_when_asked(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    raw = _checkpoint(tmp_path / "ck.pt")
    state = torch.load(tmp_path / "ck.pt")
    with Repo.init(tmp_path) as repo:
        repo.commit(state, "quiet by default", lossless=True)
        assert capfd.readouterr() == ("", "")
        rec = Recorder()
        repo.commit({k: v + 1 for k, v in state.items()}, "reported", lossless=True, progress=rec)
        assert ("writing", raw, N_TENSORS) in rec.phases
        assert rec.done["writing"] == [raw, N_TENSORS]
        rec = Recorder()
        repo.checkout("HEAD~1", move_head=False, progress=rec)
        assert rec.done["reading"] == [raw, N_TENSORS]
        rec = Recorder()
        repo.fsck(progress=rec)
        assert rec.done["checking history"][1] == 2
        assert rec.done["verifying objects"][1] == rec.phases[0][2]
        rec = Recorder()
        repo.gc(progress=rec)
        assert capfd.readouterr() == ("", "")


def test_a_search_reports_each_trial(tmp_path: Path) -> None:
    """A lossy commit's search (the refined one included) counts its trials in a phase of its
    own, so a long search on a terminal shows it is moving."""
    _checkpoint(tmp_path / "ck.pt")
    state = torch.load(tmp_path / "ck.pt")
    with Repo.init(tmp_path) as repo:
        rec = Recorder()
        cid = repo.commit(state, "searched", quality=lambda s: 1.0, epsilon=0.01, progress=rec)
        trials = repo.read_commit(cid).quality["trials"]
        assert [p[0] for p in rec.phases[:2]] == ["choosing storage",
                                                  "searching quantization configs"]
        assert rec.done["searching quantization configs"] == [0, len(trials)] and trials
        assert "writing" in rec.done
