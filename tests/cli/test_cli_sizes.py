"""Two sizes, labelled (issue 30 item 5): a commit's *encoded* size (its records' bytes, shared
chunks included) and the bytes it added to the store (*new in store*), named alike by the
commit line, `show`, `stats` and their `--json`."""
from __future__ import annotations

import json
import re

import torch

from helpers.cli_helpers import run

_SIZES = re.compile(r"([\d.]+ \w+) raw -> ([\d.]+ \w+) encoded \(([\d.]+)x\), ([\d.]+ \w+) new in store")


def _save(path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    torch.save({"w": torch.randn(128, 128, generator=g), "b": torch.randn(128, generator=g)}, path)


def _bytes(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}[unit]


def test_recommitting_a_file_is_labelled_encoded_vs_new_in_store(work):
    _save(work / "model.pt", 1)
    code, first, err = run(work, "commit", "-m", "one", "model.pt")
    assert code == 0, err
    code, again, err = run(work, "commit", "-m", "again", "model.pt", "--allow-empty")
    assert code == 0, err
    m1, m2 = _SIZES.search(first), _SIZES.search(again)
    assert m1 and m2, (first, again)
    # Same encoded size both times; the second adds only its commit and snapshot objects.
    assert m1.group(2) == m2.group(2) and m1.group(3) == m2.group(3)
    assert _bytes(m1.group(4)) >= _bytes(m1.group(2))
    assert m2.group(4).endswith(" B") and _bytes(m2.group(4)) < 2048

    # `show`: the same two figures in its summary, and in --json under their names.
    code, out, err = run(work, "show", "--stat")
    assert code == 0, err
    assert f"{m2.group(1)} raw -> {m2.group(2)} encoded ({m2.group(3)}x), {m2.group(4)} new in store" in out
    assert re.search(r"layer type .* raw .* encoded .* ratio", out)
    shown = json.loads(run(work, "show", "--json")[1])
    assert shown["new_bytes"] < 2048 < shown["encoded_bytes"] < shown["raw_bytes"]
    assert shown["encoded_bytes"] == sum(t["encoded_bytes"] for t in shown["tensors"])
    assert all(t["stored_bytes"] == t["encoded_bytes"] for t in shown["tensors"])  # old key kept

    # `stats`: a column each, and --json with the old keys (stored_bytes: new in store).
    code, out, err = run(work, "stats")
    assert code == 0, err
    assert re.search(r"raw +encoded +ratio +new in store", out), out
    rows = [line for line in out.splitlines() if re.match(r"[0-9a-f]{12}  (one|again) ", line)]
    assert len(rows) == 2 and rows[1].rstrip().endswith(m2.group(4)), out
    assert re.search(r"total: 2 commits, .* raw, .* encoded, .* new in store \([\d.]+x overall\)", out)
    stats = json.loads(run(work, "stats", "--json")[1])
    c1, c2 = stats["commits"]
    assert c2["stored_bytes"] == c2["new_bytes"] == shown["new_bytes"]
    assert c2["encoded_bytes"] == c1["encoded_bytes"] == shown["encoded_bytes"]
    assert c2["ratio"] == c2["raw_bytes"] / c2["stored_bytes"]
    assert c2["encoded_ratio"] == c2["raw_bytes"] / c2["encoded_bytes"]
    assert stats["new_bytes"] == stats["stored_bytes"] == c1["stored_bytes"] + c2["stored_bytes"]
    assert stats["encoded_bytes"] == 2 * c1["encoded_bytes"]


def test_a_changed_checkpoint_is_mostly_new_in_store(work):
    _save(work / "model.pt", 1)
    assert run(work, "commit", "-m", "one", "model.pt")[0] == 0
    _save(work / "model.pt", 2)
    code, out, err = run(work, "commit", "-m", "two", "model.pt")
    assert code == 0, err
    m = _SIZES.search(out)
    assert m and _bytes(m.group(4)) >= _bytes(m.group(2)), out
    shown = json.loads(run(work, "show", "--json")[1])
    stats = json.loads(run(work, "stats", "--json")[1])
    assert stats["commits"][1]["new_bytes"] == shown["new_bytes"]
