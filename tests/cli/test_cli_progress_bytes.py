"""Progress by bytes, with a rate (issue 30 item 11): `checkout` reports writing the file as
the bytes go out, `push` as each upload lands (not once per 256 MiB batch), and the bar shows
a rate even when a phase moves in a few big steps."""
from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch

from mvc.progress import Progress
from mvc.remote.transfer import push
from mvc.repo.repository import Repo
from mvc.store.objstore import open_remote
from terminal import run_on_pipe, run_on_pty

N_TENSORS = 6
TENSOR_NUMEL = 1 << 19  # 2 MiB of float32: each encoded chunk is stored loose, one upload each


class Recorder(Progress):
    """Keeps every phase and every advance (from any thread)."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, int | None]] = []
        self.steps: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self._current = ""

    def phase(self, description: str, *, total_bytes: int | None = None,
              total_items: int | None = None, unit: str = "tensors") -> None:
        self.phases.append((description, total_bytes))
        self._current = description
        self.steps[description] = []

    def advance(self, nbytes: int = 0, items: int = 0) -> None:
        with self._lock:
            self.steps[self._current].append(nbytes)

    def end(self) -> None:
        pass


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    torch.save({f"layer{i}.weight": torch.randn(TENSOR_NUMEL, generator=g) for i in range(N_TENSORS)},
               tmp_path / "ck.pt")
    with Repo.init(tmp_path) as repo:
        repo.config.set("commit.mode", "lossless")
    assert run_on_pipe(tmp_path, "commit", "-m", "c1", "ck.pt", columns=160)[0] == 0
    return tmp_path


def test_checkout_shows_the_file_being_written_with_a_rate(repo_dir: Path) -> None:
    rc, out, term = run_on_pty(repo_dir, "checkout", "HEAD", "-o", "copy.pt", columns=160)
    assert rc == 0 and out.startswith("Wrote "), term
    assert "reading" in term and "writing copy.pt" in term, term
    writing = term[term.index("writing copy.pt"):]
    assert "12.0 MiB" in writing and re.search(r"[\d.]+ [KMG]?i?B/s", writing), writing


def test_push_shows_bytes_and_a_rate_on_a_terminal(repo_dir: Path, tmp_path_factory) -> None:
    remote = tmp_path_factory.mktemp("remote")
    assert run_on_pipe(repo_dir, "remote", "add", "origin", remote.as_uri(), columns=160)[0] == 0
    rc, out, term = run_on_pty(repo_dir, "push", "origin", "main", columns=160)
    assert rc == 0, out + term
    assert "pushing to" in term and re.search(r"[\d.]+ [KMG]?i?B/s", term), term


def test_push_reports_each_upload_as_it_lands(repo_dir: Path, tmp_path_factory) -> None:
    remote_dir = tmp_path_factory.mktemp("remote")
    rec = Recorder()
    with Repo(repo_dir) as repo:
        target = open_remote(remote_dir.as_uri())
        try:
            push(repo.odb, target, {"refs/heads/main": repo.head()}, progress=rec)
        finally:
            target.close()
    name = next(d for d, _ in rec.phases if d.startswith("pushing to"))
    total = dict(rec.phases)[name]
    steps = [n for n in rec.steps[name] if n]
    # One step per tensor's loose chunk (and one for the small objects), not one per batch.
    assert len(steps) >= N_TENSORS and sum(steps) == total, (steps, total)
    # The walk before it counts the objects it finds.
    assert len(rec.steps["finding objects to send"]) > N_TENSORS


def test_api_checkout_write_reports_bytes(repo_dir: Path) -> None:
    from mvc.io.files import save_checkpoint

    rec = Recorder()
    with Repo(repo_dir) as repo:
        state = repo.read_state("HEAD")
    save_checkpoint(state, repo_dir / "api.pt", progress=rec)
    (name, total), = rec.phases
    assert name == "writing api.pt" and total == N_TENSORS * TENSOR_NUMEL * 4
    assert len(rec.steps[name]) > 1 and sum(rec.steps[name]) == (repo_dir / "api.pt").stat().st_size


def test_rate_shows_after_a_single_step() -> None:
    """rich measures speed from two updates or more: a phase done in one big step (one
    upload batch, one tensor) shows its average rate instead of nothing."""
    from types import SimpleNamespace

    from mvc.cli.progress import _rate_column

    column = _rate_column()
    one_step = SimpleNamespace(finished_speed=None, speed=None, completed=3 << 20, elapsed=2.0,
                               fields={"unit": "B"})
    assert column.render(one_step).plain == "1.5 MiB/s"
    not_started = SimpleNamespace(finished_speed=None, speed=None, completed=0, elapsed=0.5,
                                  fields={"unit": "B"})
    assert column.render(not_started).plain == ""
