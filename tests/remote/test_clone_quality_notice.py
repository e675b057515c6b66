"""A clone does not carry the quality hook (config stays local), so it says so (issue 30 item 8),
on file:// and on moto's S3, through the CLI: `mvc clone` of a quantized history notes that
commits there will be lossless until a hook (or epsilon) is set, and the first lossless commit
on a quantized HEAD warns once, saying how; a lossless history, or a lossless commit asked for,
says nothing.
"""
from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import init_work, run
from remote_helpers import S3Server, s3_server  # noqa: F401 - the fixture

KINDS = ["file", "s3"]
NOTE = "the remote's commits are quantized; this clone has no quality hook"
WARNING = "is quantized, but this commit is stored losslessly"


def url_for(kind: str, tmp_path) -> str:
    return f"file://{tmp_path / 'remote'}" if kind == "file" else S3Server.shared().fresh_url()


def ok(cwd, *args) -> tuple[str, str]:
    code, out, err = run(cwd, *args)
    assert code == 0, (args, out, err)
    return out, err


def save(path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    torch.save({"w": torch.randn(64, 64, generator=g), "b": torch.zeros(64)}, path)


def quant_of(cwd) -> object:
    return json.loads(ok(cwd, "show", "--json", "HEAD")[0])["quant"]


def source(tmp_path, kind: str, lossy: bool) -> str:
    """A repository with one commit (quantized with a fixed config, or lossless), pushed."""
    src = tmp_path / "src"
    src.mkdir()
    config = {"commit.mode": "fixed", "commit.quant": '{"bins": 16}'} if lossy else {"commit.mode": "lossless"}
    init_work(src, config)
    save(src / "c.pt", 0)
    ok(src, "commit", "-m", "first", "c.pt")
    assert (quant_of(src) is not None) == lossy
    url = url_for(kind, tmp_path)
    ok(src, "remote", "add", "origin", url)
    ok(src, "push")
    return url


@pytest.mark.parametrize("kind", KINDS)
def test_clone_of_a_quantized_history_says_commits_here_are_lossless(kind, tmp_path):
    url = source(tmp_path, kind, lossy=True)
    out, _ = ok(tmp_path, "clone", url, "b")
    b = tmp_path / "b"
    assert NOTE in out and "mvc config quality.hook" in out and "quality.epsilon" in out
    # the first lossless commit on a quantized HEAD warns, once, with how to set it
    save(b / "c.pt", 1)
    out, err = ok(b, "commit", "-m", "in the clone", "c.pt")
    assert quant_of(b) is None
    assert err.count("mvc: warning:") == 1 and WARNING in err and "mvc config quality.hook" in err
    save(b / "c.pt", 2)
    _, err = ok(b, "commit", "-m", "again", "c.pt")
    assert WARNING not in err
    # what it says works: with a bound set, commits are lossy again
    ok(b, "config", "quality.epsilon", "0.2")
    save(b / "c.pt", 3)
    _, err = ok(b, "commit", "-m", "bounded", "c.pt")
    assert quant_of(b) is not None and WARNING not in err


@pytest.mark.parametrize("kind", KINDS)
def test_lossless_history_or_asked_lossless_says_nothing(kind, tmp_path):
    url = source(tmp_path, kind, lossy=False)
    out, _ = ok(tmp_path, "clone", url, "b")
    assert NOTE not in out
    b = tmp_path / "b"
    save(b / "c.pt", 1)
    _, err = ok(b, "commit", "-m", "lossless here too", "c.pt")
    assert WARNING not in err
    # a quantized HEAD, then a lossless commit asked for: no warning either
    ok(b, "config", "commit.mode", "fixed")
    ok(b, "config", "commit.quant", '{"bins": 16}')
    save(b / "c.pt", 2)
    ok(b, "commit", "-m", "quantized", "c.pt")
    assert quant_of(b) is not None
    save(b / "c.pt", 3)
    _, err = ok(b, "commit", "-m", "exact", "--lossless", "c.pt")
    assert quant_of(b) is None and WARNING not in err
