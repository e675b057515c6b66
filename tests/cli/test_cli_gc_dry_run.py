"""`gc --dry-run` reports what the run does (issue 30 item 9): the same objects removed and
written, tensors re-encoded, commits pruned -- the re-basing of kept commits' deltas and the
compaction of deep chains included -- and gc says when `--shrink` would pay."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from helpers.cli_helpers import init_work, run
from mvc import Repo

_QUANT = '{"bins": 16, "prune": 0.1, "protect": 0.005}'


@pytest.fixture
def lossy(tmp_path):
    """A repository of 8 lossy commits, each tensor a delta on the previous commit's."""
    (tmp_path / "repo").mkdir()
    work = init_work(tmp_path / "repo", {"commit.mode": "fixed", "commit.quant": _QUANT})
    g = torch.Generator().manual_seed(0)
    w = {f"layer{i}.weight": torch.randn(128, 128, generator=g) for i in range(3)}
    for step in range(8):
        w = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in w.items()}
        torch.save({"model": w}, work / "model.pt")
        code, out, err = run(work, "commit", "-m", f"step {step}", "--step", str(step), "model.pt")
        assert code == 0, err
    return work


def _figures(out: str) -> dict:
    """The numbers gc prints, whether it would do them or did them."""
    found: dict = {}
    m = re.search(r"gc: (?:would prune|pruned) (\d+) commits", out)
    found["pruned"] = m and int(m.group(1))
    m = re.search(r"gc: (?:would re-encode|re-encoded) (\d+) tensors of kept commits", out)
    found["rebased"] = m and int(m.group(1))
    m = re.search(r"gc: (?:would re-encode|re-encoded) (\d+) tensors in (\d+) snapshots as bases "
                  r"\(chain depth (\d+) -> (\d+)\)", out)
    found["compacted"] = m and m.groups()
    m = re.search(r"gc: (?:would remove|removed) (\d+) objects, ([\d.]+ \w+)"
                  r"(?:; (?:would write|wrote) (\d+) objects, ([\d.]+ \w+) \(the re-encodings\))?; "
                  r"(\d+) reachable objects kept", out)
    assert m, out
    found["removed"], found["written"], found["kept"] = m.group(1, 2), m.group(3, 4), m.group(5)
    return found


def _state(work) -> tuple:
    """What the repository holds: as the CLI shows it, and every object id, ref and reflog."""
    log = run(work, "log", "--json")[1]
    stats = json.loads(run(work, "stats", "--json")[1])
    with Repo(work) as repo:
        refs = repo.store.refs
        stored = (list(repo.store.blobs.iter_ids()), list(refs.iter_refs("")),
                  {name: refs.reflog(name) for name in refs.reflog_names()})
    return log, stats["object_bytes"], stats["unreachable_objects"], stored


@pytest.mark.parametrize("args", [
    ["--keep-last", "3"],                      # retention: re-bases the kept commits' deltas
    ["--keep-last", "3", "--keep-every", "4"],
    ["--max-chain", "2"],                      # compaction of chains deeper than 2
    ["--keep-last", "2", "--max-chain", "1"],  # both
])
def test_dry_run_reports_what_the_run_does(lossy, tmp_path, args):
    twin = tmp_path / "twin"
    shutil.copytree(lossy, twin)
    before = _state(lossy)
    code, dry, err = run(lossy, "gc", "--dry-run", *args)
    assert code == 0, err
    assert _state(lossy) == before  # the dry run changed nothing
    code, real, err = run(lossy, "gc", *args)
    assert code == 0, err
    assert _figures(dry) == _figures(real), (dry, real)
    figures = _figures(real)
    assert figures["written"] != (None, None)  # something was re-encoded, and counted
    assert figures["rebased"] or figures["compacted"]
    # The run on an untouched copy of the repository does the same: the dry run did not
    # warm up or leave anything the run then reused.
    assert _figures(run(twin, "gc", *args)[1]) == figures
    code, out, err = run(lossy, "fsck")
    assert code == 0, out + err
    code, out, err = run(lossy, "checkout", "HEAD", "-o", "head.pt")
    assert code == 0, err


def test_gc_says_when_shrink_pays(lossy):
    code, out, err = run(lossy, "gc", "--keep-last", "2")
    assert code == 0, err
    m = re.search(r"gc: store file ([\d.]+ \w+), ([\d.]+ \w+) of it free \(later commits reuse it\)"
                  r"(; `mvc gc --shrink` gives it back to the file system)?", out)
    assert m and m.group(3), out  # most of a small repository's file is freed: shrinking pays
    code, out, err = run(lossy, "gc", "--shrink")
    assert code == 0, err
    sizes = re.search(r"gc: store file ([\d.]+ \w+) -> ([\d.]+ \w+)", out)
    assert sizes and sizes.group(1) != sizes.group(2), out
    code, out, err = run(lossy, "gc")
    assert code == 0 and "--shrink" not in out, out  # nothing left worth shrinking
