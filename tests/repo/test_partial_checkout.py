"""Partial checkout (`--only`, `--weights-only`, `read_state(only=, weights_only=)`) and the
rule that `checkout -o FILE` writes a copy without moving HEAD (issue 19, items 4 and 6)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mvc.cli.main import main
from mvc.errors import UsageError
from mvc.quant import QuantConfig
from mvc.repo.repository import Repo
from mvc.state import flatten, prune

from checkpoints import assert_same, realistic_state


def trained(steps: int, seed: int = 0, width: int = 256) -> dict:
    """Model + Adam checkpoint: weights, both moments and the step of every parameter."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, width, generator=g)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": steps}


def counting(repo: Repo) -> dict:
    """Count the bytes every read from `repo`'s blob store returns, and the ids read."""
    blobs = repo.odb.blobs
    assert repo.reader.odb.blobs is blobs
    seen: dict = {"bytes": 0, "oids": set()}
    get, get_into = blobs.get, blobs.get_into

    def counted_get(oid: str) -> bytes:
        data = get(oid)
        seen["bytes"] += len(data)
        seen["oids"].add(oid)
        return data

    def counted_get_into(oid: str, out: memoryview) -> int:
        n = get_into(oid, out)
        seen["bytes"] += n
        seen["oids"].add(oid)
        return n

    blobs.get, blobs.get_into = counted_get, counted_get_into
    return seen


def bytes_read(path: Path, **kw) -> tuple[dict, dict]:
    """(bytes and ids read from the blob store, state) for a read of HEAD by a fresh
    process-like Repo (no warm caches)."""
    repo = Repo(path)
    try:
        seen = counting(repo)
        state = repo.read_state("HEAD", **kw)
        return seen, state
    finally:
        repo.close()


def model_adam_repo(root: Path, mode: str, optimizer: str = "compressed") -> Path:
    repo = Repo.init(root)
    repo.config.set("commit.mode", mode)
    repo.config.set("commit.optimizer", optimizer)
    repo.config.set("cache.levels_keep", 0)  # every read walks the store: bytes are comparable
    for steps in (3, 6):  # the second commit's quantized tensors are deltas (chains to walk)
        quant = QuantConfig(bins=16) if mode == "fixed" else None
        repo.commit(trained(steps), f"step {steps}", quant=quant)
    repo.close()
    return root


def optimizer_chunks(path: Path) -> set[str]:
    repo = Repo(path)
    try:
        return {oid for c in repo.log("HEAD") for rec in repo.read_snapshot(c.snapshot).tensors
                if rec.name.startswith("optimizer/") for oid in rec.chunks}
    finally:
        repo.close()


# Exact optimizer state (lossless commits, or `commit.optimizer exact`): the Adam moments are
# two thirds of the checkpoint, and a weights-only checkout reads about a third of the bytes.
@pytest.mark.parametrize("mode,optimizer", [("lossless", "compressed"), ("fixed", "exact")])
def test_weights_only_reads_at_most_40_percent_of_a_full_checkout(tmp_path, mode, optimizer):
    path = model_adam_repo(tmp_path / "r", mode, optimizer)
    full_seen, full = bytes_read(path)
    seen, weights = bytes_read(path, weights_only=True)
    ratio = seen["bytes"] / full_seen["bytes"]
    print(f"{mode}/{optimizer}: weights-only {seen['bytes']} B / full {full_seen['bytes']} B = {ratio:.1%}")
    assert ratio <= 0.40, (mode, seen["bytes"], full_seen["bytes"])
    assert not seen["oids"] & optimizer_chunks(path)
    # The same weights as the full restore (the chain walked), and no optimizer state at all.
    assert set(weights) == {"model", "epoch"} and weights["epoch"] == 6
    assert_same(full["model"], weights["model"])


def test_weights_only_skips_compressed_moments(tmp_path):
    # Compressed moments (the default policy) are already small -- m under a bit, v a few bits
    # per entry, ~40% of the stored bytes here -- so the saving is smaller, but not one
    # optimizer payload is read.
    path = model_adam_repo(tmp_path / "r", "fixed")
    opt = optimizer_chunks(path)
    full_seen, full = bytes_read(path)
    seen, weights = bytes_read(path, weights_only=True)
    print(f"fixed/compressed: weights-only {seen['bytes']} B / full {full_seen['bytes']} B "
          f"= {seen['bytes'] / full_seen['bytes']:.1%}")
    assert full_seen["oids"] & opt and not seen["oids"] & opt
    assert seen["bytes"] < 0.7 * full_seen["bytes"]
    assert_same(full["model"], weights["model"])


def test_first_moment_reads_its_second_moment_and_restores_bit_identically(tmp_path):
    path = model_adam_repo(tmp_path / "r", "fixed")
    _, full = bytes_read(path)
    names = {n for n in flatten(full).tensors if n.startswith("optimizer/state/0/")}
    assert {"optimizer/state/0/exp_avg", "optimizer/state/0/exp_avg_sq"} <= names
    _, part = bytes_read(path, only=["optimizer/state/0/exp_avg"])
    # exp_avg alone in the result, bounded by its (read, not returned) second moment exactly
    # as in the full restore.
    assert set(part) == {"optimizer", "epoch"}
    assert set(part["optimizer"]) == {"param_groups", "state"}
    assert set(part["optimizer"]["state"]) == {0} and set(part["optimizer"]["state"][0]) == {"exp_avg"}
    assert torch.equal(part["optimizer"]["state"][0]["exp_avg"], full["optimizer"]["state"][0]["exp_avg"])


def test_only_patterns_dotted_prefix_and_repeatable(repo):
    state = realistic_state(seed=0)
    repo.commit(state, "one")
    got = repo.read_state("HEAD", only=["model.mlp.*"])
    assert set(got["model"]) == {k for k in state["model"] if k.startswith("mlp.")}
    # Non-tensor leaves stay (small); containers left without tensors go.
    assert got["epoch"] == 3 and got["tags"] == state["tags"] and got["best"] == float("inf")
    assert "ema_bf16" not in got and "counts" not in got
    assert set(got["optimizer"]) == {"param_groups"} and set(got["rng"]) == {"python", "numpy"}
    got = repo.read_state("HEAD", only=["model", "counts"])
    assert_same(state["model"], got["model"])
    assert torch.equal(got["counts"], state["counts"])
    # The optimizer's param_groups and the scheduler (no tensors) are non-tensor leaves: kept.
    assert "state" not in got["optimizer"] and got["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    with pytest.raises(UsageError, match="no tensor"):
        repo.read_state("HEAD", only=["nothing.*"])


def test_weights_only_definition(repo):
    state = realistic_state(seed=0)
    # A raw optimizer state_dict under another key: its .../state/<i>/<key> tensors go too.
    state["opt_copy"] = state["optimizer"]
    repo.commit(state, "one")
    got = repo.read_state("HEAD", weights_only=True)
    assert "optimizer" not in got
    assert "state" not in got["opt_copy"] and got["opt_copy"]["param_groups"] == state["optimizer"]["param_groups"]
    assert_same(state["model"], got["model"])
    assert_same(state["ema_bf16"], got["ema_bf16"])
    assert_same(state["rng"], got["rng"]) and got["scheduler"] == state["scheduler"]
    # --only and --weights-only together: the intersection.
    both = repo.read_state("HEAD", weights_only=True, only=["model.*", "opt_copy"])
    assert set(both["model"]) == set(state["model"]) and "state" not in both["opt_copy"]


def test_prune_keeps_shared_storage_entries():
    # Tied weights: the head's weight is the embedding's storage, named by the first path.
    state = realistic_state(seed=0)
    flat = flatten(state)
    pruned = prune(flat.skeleton, only=["model/head.weight"])
    assert set(pruned["entries"]) == {"model/embed.weight"}


# ------------------------------------------------------------------ CLI


def run(cwd: Path, *args: str) -> int:
    return main(["-C", str(cwd), *args])


@pytest.fixture
def two(tmp_path):
    repo = Repo.init(tmp_path / "r")
    repo.config.set("commit.mode", "lossless")
    a = repo.commit(realistic_state(seed=0), "a")
    b = repo.commit(realistic_state(seed=1), "b")
    yield repo, a, b
    repo.close()


def test_checkout_o_never_moves_head(two, tmp_path):
    repo, a, b = two
    for rev in ("HEAD", "HEAD~1", a, "main"):
        assert run(repo.path, "checkout", rev, "-o", str(tmp_path / "copy.pt")) == 0
        assert repo.current_branch() == "main" and repo.head() == b, rev
    assert_same(realistic_state(seed=1), torch.load(tmp_path / "copy.pt", weights_only=False))


def test_checkout_without_o_moves_head(two):
    repo, a, _b = two
    repo.config.set("checkpoint.path", "ckpt.pt")
    assert run(repo.path, "checkout", "HEAD~1") == 0
    assert repo.current_branch() is None and repo.head() == a
    assert run(repo.path, "checkout", "main") == 0
    assert repo.current_branch() == "main"


def test_cli_weights_only_and_only(two, tmp_path, capsys):
    repo, _a, b = two
    assert run(repo.path, "checkout", "HEAD", "-o", str(tmp_path / "w.pt"), "--weights-only") == 0
    got = torch.load(tmp_path / "w.pt", weights_only=False)
    assert "optimizer" not in got and set(got["model"]) == set(realistic_state(seed=1)["model"])
    assert run(repo.path, "checkout", "HEAD", "-o", str(tmp_path / "m.pt"), "--only", "model.mlp.*",
               "--only", "counts") == 0
    got = torch.load(tmp_path / "m.pt", weights_only=False)
    assert set(got["model"]) == {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"} and "counts" in got
    assert repo.head() == b and repo.current_branch() == "main"
    capsys.readouterr()
    # A partial state is never the working checkpoint: -o is required.
    repo.config.set("checkpoint.path", "ckpt.pt")
    assert run(repo.path, "checkout", "HEAD", "--weights-only") == UsageError.exit_code
    assert "-o" in capsys.readouterr().err and not (repo.path / "ckpt.pt").exists()
    assert run(repo.path, "checkout", "HEAD", "-o", str(tmp_path / "n.pt"), "--only", "zzz") == UsageError.exit_code
