"""The store contract against the in-memory store."""
from __future__ import annotations

from mvc.store import MemoryStore, ObjectStore
from store_contract import StoreContract


class TestMemoryStore(StoreContract):
    def make_store(self) -> ObjectStore:
        return MemoryStore()
