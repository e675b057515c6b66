"""Repository configuration: values are checked when set and when read; the file is parsed once."""
from __future__ import annotations

import json

import pytest

from mvc.repo.config import Config, ConfigError


@pytest.mark.parametrize("key, value", [
    ("commit.mode", "turbo"),
    ("commit.optimizer", "sometimes"),
    ("commit.lossless_codec", "nosuch/1"),
    ("checkpoint.format", "onnx"),
    ("quality.epsilon", "-1"),
    ("quality.epsilon", "0"),
    ("core.lock_timeout", "-3"),
    ("commit.chunk_mib", "0"),
    ("commit.chunk_mib", "4096"),   # 2^32-byte chunks: one more byte than an LMDB value holds
    ("cache.levels_keep", "-1"),
])
def test_invalid_values_are_refused_when_set(tmp_path, key, value):
    cfg = Config(tmp_path / "config.json")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        cfg.set(key, value)
    assert not (tmp_path / "config.json").exists()


def test_an_unknown_lossless_codec_in_the_file_is_an_error_not_a_fallback(tmp_path, repo):
    # Written by hand (or an older mvc): the commit must refuse, not silently store raw.
    path = repo.mvc_dir / "config.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data["commit.lossless_codec"] = "nosuch/1"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="commit.lossless_codec"):
        repo.commit({"w": __import__("torch").zeros(100)}, "m")
    assert repo.head() is None


def test_the_file_is_parsed_once_until_it_changes(tmp_path, monkeypatch):
    cfg = Config(tmp_path / "config.json")
    cfg.set("commit.mode", "fixed")
    loads = []
    real = json.load
    monkeypatch.setattr(json, "load", lambda fh: loads.append(1) or real(fh))
    for _ in range(12):
        assert cfg.get("commit.mode") == "fixed"
    assert loads == []  # set() left the parsed file behind
    # Another process edits the file: the next lookup sees it.
    (tmp_path / "config.json").write_text(json.dumps({"commit.mode": "lossless",
                                                      "gc.max_chain": 3}))
    assert cfg.get("commit.mode") == "lossless" and cfg.get("gc.max_chain") == 3
    assert len(loads) == 1
