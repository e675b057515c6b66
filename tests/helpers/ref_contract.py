"""The ref parts' contracts (`RefStoreTests`, `TransactionalRefTests`): see store_contract."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mvc.errors import UsageError
from mvc.store import (
    ANY,
    InvalidRefError,
    RefConflictError,
    RefStore,
    RefUpdate,
    StoreClosedError,
    TransactionalRefStore,
    require_transactional,
)

from store_fixture import A, B, C, StoreFixture


def assert_main_head_and_tag(refs: Any) -> None:
    """The refs both creation tests make: HEAD -> main at A, tag v1 at B."""
    assert refs.read_ref("HEAD") == "ref: refs/heads/main"
    assert refs.read_ref("refs/heads/main") == A
    assert list(refs.iter_refs()) == [
        ("HEAD", "ref: refs/heads/main"), ("refs/heads/main", A), ("refs/tags/v1", B)]
    assert list(refs.iter_refs("refs/heads/")) == [("refs/heads/main", A)]
    assert list(refs.iter_refs("refs/nothing/")) == []


class RefStoreTests(StoreFixture):
    """`RefStore`: refs moved one compare-and-swap at a time (`update_ref`), and the reflog."""

    def test_is_a_ref_store(self) -> None:
        assert isinstance(self.refs, RefStore)

    def test_refs_create_read_iterate(self) -> None:
        assert self.refs.read_ref("HEAD") is None
        self.refs.update_ref("refs/heads/main", None, A, "init")
        self.refs.update_ref("HEAD", None, "ref: refs/heads/main", "init")
        self.refs.update_ref("refs/tags/v1", None, B, "init")
        assert_main_head_and_tag(self.refs)

    def test_ref_compare_and_swap(self) -> None:
        self.refs.update_ref("refs/heads/main", None, A, "c1")
        with pytest.raises(RefConflictError) as ei:
            self.refs.update_ref("refs/heads/main", None, B, "dup create")
        assert ei.value.name == "refs/heads/main" and "refs/heads/main" in str(ei.value)
        assert ei.value.exit_code == 11 and ei.value.actual == A
        with pytest.raises(RefConflictError):
            self.refs.update_ref("refs/heads/main", B, C, "stale")
        self.refs.update_ref("refs/heads/main", A, B, "ff")
        assert self.refs.read_ref("refs/heads/main") == B
        self.refs.update_ref("refs/heads/main", ANY, C, "force")
        assert self.refs.read_ref("refs/heads/main") == C
        self.refs.update_ref("refs/heads/other", ANY, A, "force create")
        assert self.refs.read_ref("refs/heads/other") == A

    def test_ref_delete(self) -> None:
        self.refs.update_ref("refs/tags/t", None, A, "tag")
        with pytest.raises(RefConflictError):
            self.refs.update_ref("refs/tags/t", B, None, "bad delete")
        self.refs.update_ref("refs/tags/t", A, None, "delete")
        assert self.refs.read_ref("refs/tags/t") is None
        assert list(self.refs.iter_refs()) == []
        # deleting a missing ref with old=None is a no-op that still logs
        self.refs.update_ref("refs/tags/t", None, None, "noop")
        assert [e.reason for e in self.refs.reflog("refs/tags/t")] == ["tag", "delete", "noop"]

    @pytest.mark.parametrize("name", ["", " HEAD", "a\nb", "a\x00b", "x" * 401])
    def test_invalid_ref_name(self, name: str) -> None:
        with pytest.raises(InvalidRefError) as ei:
            self.refs.update_ref(name, None, A, "bad")
        assert isinstance(ei.value, UsageError)

    @pytest.mark.parametrize("value", ["", "abc", "A" * 32, "ref: ", "ref:x", "ref: a\nb"])
    def test_invalid_ref_value(self, value: str) -> None:
        with pytest.raises(InvalidRefError):
            self.refs.update_ref("refs/heads/x", None, value, "bad")
        assert self.refs.read_ref("refs/heads/x") is None

    # -------------------------------------------------------------- reflog
    def test_reflog_order_and_content(self) -> None:
        t0 = time.time()
        self.refs.update_ref("refs/heads/main", None, A, "commit: one")
        self.refs.update_ref("refs/heads/main", A, B, "commit: two")
        self.refs.update_ref("refs/heads/main", B, C, "reset: back")
        log = self.refs.reflog("refs/heads/main")
        assert [(e.old, e.new, e.reason) for e in log] == [
            (None, A, "commit: one"), (A, B, "commit: two"), (B, C, "reset: back")]
        times = [e.time for e in log]
        assert times == sorted(times) and t0 - 1 <= times[0] <= time.time() + 1
        assert all(isinstance(t, float) for t in times)

    def test_reflog_names_and_prefix_isolation(self) -> None:
        names = ["refs/heads/a", "refs/heads/a/b", "refs/heads/ab", "HEAD"]
        for n in names:
            self.refs.update_ref(n, None, A, f"create {n}")
        self.refs.update_ref("refs/heads/a", A, B, "move a")
        assert self.refs.reflog_names() == sorted(names)
        assert [e.reason for e in self.refs.reflog("refs/heads/a")] == [
            "create refs/heads/a", "move a"]
        assert len(self.refs.reflog("refs/heads/a/b")) == 1
        assert len(self.refs.reflog("refs/heads/ab")) == 1
        assert self.refs.reflog("refs/heads/zzz") == []
        self.refs.delete_reflog("refs/heads/a")
        self.refs.delete_reflog("refs/heads/never")
        assert self.refs.reflog("refs/heads/a") == []
        assert self.refs.reflog_names() == sorted(set(names) - {"refs/heads/a"})
        assert len(self.refs.reflog("refs/heads/a/b")) == 1
        # the log restarts cleanly after deletion
        self.refs.update_ref("refs/heads/a", B, C, "after")
        assert [e.reason for e in self.refs.reflog("refs/heads/a")] == ["after"]

    def test_reflog_long(self) -> None:
        prev = None
        for i in range(150):
            new = f"{i:032x}"
            self.refs.update_ref("HEAD", prev, new, f"step {i}")
            prev = new
        log = self.refs.reflog("HEAD")
        assert [e.reason for e in log] == [f"step {i}" for i in range(150)]

    # ------------------------------------------------------ concurrency
    def test_concurrent_ref_cas(self) -> None:
        """Threads racing CAS on one ref: each successful move is logged exactly once."""
        self.refs.update_ref("refs/heads/main", None, f"{0:032x}", "init")
        wins = [0]
        guard = threading.Lock()

        def racer() -> None:
            for _ in range(30):
                cur = self.refs.read_ref("refs/heads/main")
                nxt = f"{int(cur, 16) + 1:032x}"
                try:
                    self.refs.update_ref("refs/heads/main", cur, nxt, "inc")
                    with guard:
                        wins[0] += 1
                except RefConflictError:
                    pass
        threads = [threading.Thread(target=racer) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert int(self.refs.read_ref("refs/heads/main"), 16) == wins[0]
        assert len(self.refs.reflog("refs/heads/main")) == wins[0] + 1

    # ---------------------------------------------------------- lifecycle
    def test_use_after_close_refs(self) -> None:
        store = self.make_store()
        refs = self.refs_of(store)
        refs.update_ref("HEAD", None, A, "c")
        store.close()
        store.close()
        with pytest.raises(StoreClosedError):
            refs.read_ref("HEAD")


class TransactionalRefTests(StoreFixture):
    """`TransactionalRefStore`: several compare-and-swaps in one transaction (`update_refs`)."""

    def test_is_transactional(self) -> None:
        assert isinstance(self.refs, TransactionalRefStore)
        assert require_transactional(self.refs, "a test") is self.refs

    def test_batch_creates_refs(self) -> None:
        assert self.refs.read_ref("HEAD") is None
        self.refs.update_refs([RefUpdate("refs/heads/main", None, A),
                                RefUpdate("HEAD", None, "ref: refs/heads/main"),
                                RefUpdate("refs/tags/v1", None, B)], "init")
        assert_main_head_and_tag(self.refs)

    def test_batch_is_atomic(self) -> None:
        self.refs.update_refs([RefUpdate("refs/heads/a", None, A)], "a")
        with pytest.raises(RefConflictError) as ei:
            self.refs.update_refs([RefUpdate("refs/heads/a", A, B),
                                    RefUpdate("refs/heads/new", None, B),
                                    RefUpdate("refs/heads/a", C, A)], "bad batch")
        assert ei.value.name == "refs/heads/a"
        assert self.refs.read_ref("refs/heads/a") == A
        assert self.refs.read_ref("refs/heads/new") is None
        assert len(self.refs.reflog("refs/heads/a")) == 1
        assert self.refs.reflog("refs/heads/new") == []

    def test_batch_updates_apply_in_order(self) -> None:
        self.refs.update_refs([RefUpdate("r", None, A), RefUpdate("r", A, B)], "two steps")
        assert self.refs.read_ref("r") == B
        assert [(e.old, e.new) for e in self.refs.reflog("r")] == [(None, A), (A, B)]

    def test_invalid_update_in_batch_changes_nothing(self) -> None:
        with pytest.raises(InvalidRefError):
            self.refs.update_refs([RefUpdate("refs/heads/ok", None, A),
                                    RefUpdate("refs/heads/bad", None, "not a value")], "bad")
        assert self.refs.read_ref("refs/heads/ok") is None
        assert self.refs.reflog("refs/heads/ok") == []
