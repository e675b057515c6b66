"""`open_store`: one factory opens every store from a location (a path, `memory:`, a URL)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from mvc.errors import UsageError
from mvc.repo import repository
from mvc.repo.repository import Repo
from mvc.store import (
    LmdbStore,
    MemoryStore,
    RemoteNotSupportedError,
    StoreExistsError,
    StoreNotFoundError,
    UnsupportedLocationError,
    open_store,
)


@pytest.mark.parametrize("as_str", [False, True])
def test_path_creates_then_opens_lmdb(tmp_path: Path, as_str: bool) -> None:
    where = tmp_path / ".mvc"
    loc = str(where) if as_str else where
    store = open_store(loc, create=True)
    assert isinstance(store, LmdbStore)
    oid = store.blobs.put(b"kept")
    store.close()
    with open_store(loc) as again:
        assert isinstance(again, LmdbStore) and again.blobs.get(oid) == b"kept"
    with pytest.raises(StoreExistsError):
        open_store(loc, create=True)


def test_path_without_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError) as ei:
        open_store(tmp_path / "nothing")
    assert ei.value.exit_code == 60
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreNotFoundError):
        open_store(tmp_path / "empty")
    assert os.listdir(tmp_path / "empty") == []  # opening leaves nothing behind


def test_memory_is_a_fresh_store_each_time() -> None:
    a, b = open_store("memory:"), open_store("memory:", create=True)
    assert isinstance(a, MemoryStore) and isinstance(b, MemoryStore) and a is not b
    oid = a.blobs.put(b"only in a")
    assert a.blobs.has(oid) and not b.blobs.has(oid)


@pytest.mark.parametrize("url", ["s3://bucket/prefix", "S3://bucket", "file:///srv/mvc-remote",
                                 "file://relative"])
@pytest.mark.parametrize("create", [False, True])
def test_remote_urls_are_not_repository_stores(url: str, create: bool, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RemoteNotSupportedError) as ei:
        open_store(url, create=create)
    err = ei.value
    assert isinstance(err, UnsupportedLocationError) and isinstance(err, UsageError)
    assert err.exit_code == 121
    assert "is a remote, not a repository store" in str(err) and url in str(err)
    assert os.listdir(tmp_path) == []  # never taken for a relative path


@pytest.mark.parametrize("loc", ["http://example.com/repo", "lmdb://x", "memory:elsewhere"])
def test_unknown_locations(loc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedLocationError) as ei:
        open_store(loc, create=True)
    assert not isinstance(ei.value, RemoteNotSupportedError)
    assert ei.value.exit_code == 120 and isinstance(ei.value, UsageError)
    assert os.listdir(tmp_path) == []


def test_repo_opens_its_store_through_the_factory(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, bool]] = []

    def spy(location, *, create=False):
        calls.append((os.fspath(location), create))
        return open_store(location, create=create)
    monkeypatch.setattr(repository, "open_store", spy)
    mvc_dir = str((tmp_path / "r" / ".mvc").resolve())
    Repo.init(tmp_path / "r").close()
    with Repo(tmp_path / "r") as repo:
        assert isinstance(repo.store, LmdbStore)
    assert calls == [(mvc_dir, True), (mvc_dir, False)]
