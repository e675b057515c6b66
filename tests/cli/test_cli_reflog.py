"""`mvc reflog [REF]` and `REF@{n}` revisions."""
from __future__ import annotations

import json
import re

import pytest
import torch
from cli_helpers import run

from mvc.repo.repository import Repo
from mvc.repo.revparse import UnknownRevisionError


@pytest.fixture
def work(work):
    """The shared lossless working directory, with `model.pt` as its checkpoint path."""
    assert run(work, "config", "checkpoint.path", "model.pt")[0] == 0
    return work


def _commit(work, msg: str, value: float) -> str:
    torch.save({"w": torch.full((8,), value)}, work / "model.pt")
    code, _, err = run(work, "commit", "-m", msg)
    assert code == 0, err
    return Repo.discover(work).head()


def test_reflog_lists_head_moves_newest_first_and_resolves(work):
    a = _commit(work, "e1", 1.0)
    b = _commit(work, "e2", 2.0)
    assert run(work, "checkout", "HEAD~1")[0] == 0
    assert run(work, "switch", "main")[0] == 0
    c = _commit(work, "e3", 3.0)
    code, out, err = run(work, "reflog")
    assert code == 0, err
    lines = out.splitlines()
    expected = [(c, "commit: e3"), (b, "switch: to main"), (a, "checkout: moving to HEAD~1"),
                (b, "commit: e2"), (a, "commit: e1")]
    assert len(lines) == len(expected), out
    for i, (line, (oid, reason)) in enumerate(zip(lines, expected)):
        assert re.match(rf"^{oid[:12]} HEAD@\{{{i}\}}: {re.escape(reason)}  "
                        r"\(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)$", line), line
    repo = Repo.discover(work)
    for i, (oid, _) in enumerate(expected):
        assert repo.resolve(f"HEAD@{{{i}}}") == oid
    assert repo.resolve("HEAD@{0}") == repo.head()
    assert repo.resolve("@{1}") == b
    assert repo.resolve("HEAD@{1}~1") == a
    with pytest.raises(UnknownRevisionError, match="only 5 entries"):
        repo.resolve("HEAD@{5}")


def test_branch_reflog_and_json(work):
    a = _commit(work, "e1", 1.0)
    b = _commit(work, "e2", 2.0)
    code, out, err = run(work, "reflog", "main", "--json")
    assert code == 0, err
    entries = json.loads(out)
    assert [e["id"] for e in entries] == [b, a]
    assert [e["selector"] for e in entries] == ["main@{0}", "main@{1}"]
    assert entries[0]["reason"] == "commit: e2" and entries[0]["time"].endswith("+00:00")
    assert run(work, "reflog", "main", "-n", "1")[1].count("\n") == 1
    repo = Repo.discover(work)
    assert repo.resolve("main@{1}") == repo.resolve("refs/heads/main@{1}") == a
    # A reflog revision detaches, as in git: it names a past value, not the branch.
    code, out, err = run(work, "checkout", "main@{1}")
    assert code == 0, err
    assert Repo.discover(work).current_branch() is None and Repo.discover(work).head() == a
    assert run(work, "show", "main@{1}")[1].startswith(f"commit {a}")


def test_reflog_errors_and_escaping(work):
    _commit(work, "e1\x1b[31m", 1.0)
    code, out, _ = run(work, "reflog")
    assert code == 0 and "\x1b" not in out and "^[[31m" in out
    code, _, err = run(work, "reflog", "nosuch")
    assert code == 4 and "no branch or tag" in err
    code, _, err = run(work, "show", "main@{7}")
    assert code == 4 and "only 1 entries" in err
