"""The remote stores (`mvc.store.objstore`) through the store contract suite: file:// and s3://
(moto's S3 server on 127.0.0.1, started by the `s3` fixture of `remote_helpers`)."""
from __future__ import annotations

import shutil
import tempfile

import pytest
from remote_helpers import S3Server, s3_server  # noqa: F401 - the fixture
from store_contract import BlobStoreTests, RefStoreTests, blob

from mvc.store import RefConflictError, RefStore
from mvc.store.objstore import (
    PACK_MAX_OBJECT,
    BadRemoteUrlError,
    RemoteBlobStore,
    RemoteMissingError,
    open_remote,
)
from mvc.store.objstore.local import FileStorage
from mvc.store.objstore.refs import RemoteRefStore


class _FileDir:
    def make_dir(self) -> str:
        # every store a test made, not only the fixture's (the lifecycle tests make another)
        self._dirs = getattr(self, "_dirs", [])
        self._dirs.append(tempfile.mkdtemp(prefix="mvc-remote-"))
        return self._dirs[-1]

    def cleanup_store(self, store) -> None:
        store.close()
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)


class TestFileBlobs(_FileDir, BlobStoreTests):
    def make_store(self) -> RemoteBlobStore:
        return RemoteBlobStore(FileStorage(self.make_dir()))


class TestFileRefs(_FileDir, RefStoreTests):
    def make_store(self) -> RemoteRefStore:
        return RemoteRefStore(FileStorage(self.make_dir()))


class TestS3Blobs(BlobStoreTests):
    def make_store(self) -> RemoteBlobStore:
        return open_remote(S3Server.shared().fresh_url()).blobs


class TestS3Refs(RefStoreTests):
    def make_store(self) -> RefStore:
        return open_remote(S3Server.shared().fresh_url()).refs


# ------------------------------------------------------------------ beyond the contract
def test_put_many_packs_small_objects(tmp_path) -> None:
    storage = FileStorage(str(tmp_path / "r"))
    store = RemoteBlobStore(storage)
    small = [blob(100, s) for s in range(500)]
    big = blob(PACK_MAX_OBJECT + 5, 99)
    ids = store.put_many([*small, big])
    keys = [k for k, _ in storage.list("")]
    assert len([k for k in keys if k.startswith("packs/")]) == 2  # one pack and its index
    assert len([k for k in keys if k.startswith("objects/")]) == 1  # the big one, loose
    fresh = RemoteBlobStore(FileStorage(str(tmp_path / "r")))
    assert [fresh.get(i) for i in ids] == [*small, big]
    assert dict(fresh.get_many(ids[:10])) == dict(zip(ids[:10], small[:10]))
    # deleting packed objects rewrites the pack without them
    assert fresh.delete(ids[:3]) == 300
    assert not fresh.has(ids[0]) and fresh.get(ids[3]) == small[3]
    assert RemoteBlobStore(FileStorage(str(tmp_path / "r"))).known_ids() == set(ids[3:])


def test_killed_pack_upload_is_ignored(tmp_path) -> None:
    storage = FileStorage(str(tmp_path / "r"))
    storage.put("packs/deadbeef.pack", b"half a pack")  # its index never came
    store = RemoteBlobStore(storage)
    assert store.known_ids() == set()


def test_racing_ref_writers_over_two_stores(tmp_path) -> None:
    a = RemoteRefStore(FileStorage(str(tmp_path / "r")))
    b = RemoteRefStore(FileStorage(str(tmp_path / "r")))
    a.update_ref("refs/heads/main", None, "1" * 32, "one")
    a.update_ref("refs/heads/main", "1" * 32, "2" * 32, "a wins")
    with pytest.raises(RefConflictError):
        b.update_ref("refs/heads/main", "1" * 32, "3" * 32, "b loses")
    assert b.read_ref("refs/heads/main") == "2" * 32


def test_bad_urls() -> None:
    for url in ("file://host/x", "file:relative", "s3://A_B/x", "gs://b/x"):
        with pytest.raises(BadRemoteUrlError):
            open_remote(url)


def test_missing_bucket(s3_server) -> None:  # noqa: F811
    remote = open_remote("s3://no-such-bucket-here/x")
    with pytest.raises(RemoteMissingError) as ei:
        remote.refs.read_ref("refs/heads/main")
    assert ei.value.exit_code == 141


def test_credentials_from_the_aws_config_files(s3_server, tmp_path, monkeypatch) -> None:  # noqa: F811
    pytest.importorskip("boto3")
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = fromfile\naws_secret_access_key = fromfile\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    remote = open_remote(s3_server.fresh_url())
    oid = remote.blobs.put(b"signed with the file's keys")
    assert remote.blobs.get(oid) == b"signed with the file's keys"
    assert s3_server.stats()["last_key"] == "fromfile"
