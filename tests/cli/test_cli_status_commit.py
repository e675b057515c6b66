"""`mvc status` after HEAD moves without the file being written, and what `mvc commit` prints."""
from __future__ import annotations

import re

import pytest
import torch
from cli_helpers import init_work, run


@pytest.fixture
def work(tmp_path):
    """A working directory in the default commit mode (not the shared lossless `work`)."""
    return init_work(tmp_path, {"checkpoint.path": "model.pt"})


def _save(path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    torch.save({"w": torch.randn(128, 64, generator=g)}, path)


def test_status_after_switch_does_not_call_an_untouched_file_modified(work):
    _save(work / "model.pt", 1)
    assert run(work, "commit", "-m", "e1")[0] == 0
    _save(work / "model.pt", 2)
    assert run(work, "commit", "-m", "e2")[0] == 0
    code, _, err = run(work, "checkout", "HEAD~1")
    assert code == 0, err
    assert "unchanged since HEAD" in run(work, "status")[1]
    assert run(work, "switch", "main")[0] == 0
    out = run(work, "status")[1]
    assert "modified" not in out
    assert "unchanged since" in out and "not HEAD" in out and "mvc checkout HEAD" in out
    # Writing HEAD's checkpoint brings it back to "unchanged since HEAD" ...
    assert run(work, "checkout", "HEAD")[0] == 0
    assert "unchanged since HEAD" in run(work, "status")[1]
    # ... and a real edit is still reported.
    _save(work / "model.pt", 3)
    assert "modified (not committed)" in run(work, "status")[1]


def test_status_after_switch_to_a_branch_at_the_same_commit(work):
    _save(work / "model.pt", 1)
    assert run(work, "commit", "-m", "e1")[0] == 0
    assert run(work, "switch", "-c", "exp")[0] == 0
    assert "unchanged since HEAD" in run(work, "status")[1]


# Groups: message, raw, encoded, ratio, how it was stored (the bytes new in store are checked
# in tests/cli/test_cli_sizes.py).
_LINE = re.compile(r"^\[main [0-9a-f]{12}\] (.*?)  ([\d.]+ \w+) raw -> ([\d.]+ \w+) encoded "
                   r"\(([\d.]+x)\), [\d.]+ \w+ new in store; (.*)$")


def test_commit_line_lossless(work):
    _save(work / "model.pt", 1)
    code, out, err = run(work, "commit", "-m", "e1", "--lossless")
    assert code == 0, err
    m = _LINE.match(out.strip())
    assert m, out
    assert m.group(1) == "e1" and m.group(2) == "32.0 KiB" and m.group(5) == "lossless"


def test_commit_line_lossy_names_bins_prune_and_gate(work):
    _save(work / "model.pt", 1)
    code, out, err = run(work, "commit", "-m", "e1", "--epsilon", "0.05")
    assert code == 0, err
    m = _LINE.match(out.strip())
    assert m, out
    how = m.group(5)
    assert re.match(r"lossy: \d+ bins, prune [\d.]+, gate proxy rel-L2 [\d.e-]+ \(bound 0.05\)$",
                    how), how
    assert float(m.group(4)[:-1]) > 1.5


def test_commit_without_a_hook_is_lossless_and_says_lossy_is_opt_in(work):
    _save(work / "model.pt", 1)
    code, out, err = run(work, "commit", "-m", "e1")
    assert code == 0, err
    m = _LINE.match(out.strip())
    assert m, out
    assert m.group(5) == "lossless (no quality.hook: lossy commits are opt-in; see docs/quality.md)"
    code, out, err = run(work, "commit", "-m", "e2", "--lossless", "--allow-empty")
    assert code == 0 and _LINE.match(out.strip()).group(5) == "lossless", out


def test_commit_line_says_when_no_configuration_was_feasible(work):
    _save(work / "model.pt", 1)
    code, out, err = run(work, "commit", "-m", "e1", "--epsilon", "0.000001")
    assert code == 0, err
    m = _LINE.match(out.strip())
    assert m, out
    assert m.group(5) == "lossless: no feasible configuration"


def test_commit_line_with_a_metric_gate(work):
    (work / "qhook.py").write_text(
        "import torch\n"
        "def loss(state):\n"
        "    return float(state['w'].float().pow(2).mean()) + 1.0\n")
    assert run(work, "config", "quality.hook", "qhook:loss")[0] == 0
    _save(work / "model.pt", 1)
    code, out, err = run(work, "commit", "-m", "e1", "--epsilon", "0.05")
    assert code == 0, err
    m = _LINE.match(out.strip())
    assert m, out
    assert re.match(r"lossy: \d+ bins, prune [\d.]+, gate quality [+-][\d.]+% \(bound 5.00%\)$",
                    m.group(5)), m.group(5)
