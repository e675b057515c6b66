"""A plain Python reading of LMDB 0.9's page layout: the reference for native/lmdbcheck.c.

`check(file, txnid, deep)` answers what `mvc_lmdb_check` must ("ok", "changed" or "corrupt"),
written for clarity, not speed; `nodes(file)` lists the snapshot's nodes with their offsets, so
tests can damage one field of a chosen node.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

PAGEHDRSZ, NODESIZE, DB_SIZE, META_SIZE = 16, 8, 48, 136
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 1, 2, 4, 8
F_BIGDATA, F_SUBDATA = 1, 2
P_INVALID = (1 << 64) - 1
MAX_PGNO = (1 << 48) - 1


class Corrupt(Exception):
    pass


def u16(b: bytes, at: int) -> int:
    return struct.unpack_from("<H", b, at)[0]


def u32(b: bytes, at: int) -> int:
    return struct.unpack_from("<I", b, at)[0]


def u64(b: bytes, at: int) -> int:
    return struct.unpack_from("<Q", b, at)[0]


def page_size(b: bytes, page_at: int) -> int | None:
    ps = u32(b, page_at + PAGEHDRSZ + 24)
    return ps if 512 <= ps <= 32768 and ps & (ps - 1) == 0 else None


def check_header(b: bytes) -> str:
    """'ok', 'truncated' or 'corrupt' for the two meta pages at the start of `b`."""
    if len(b) < PAGEHDRSZ + META_SIZE:
        return "truncated"

    def meta_ok(at: int) -> bool:
        return bool(u16(b, at + 10) & P_META) and u32(b, at + 16) == 0xBEEFC0DE and u32(b, at + 20) == 1

    if not meta_ok(0) or page_size(b, 0) is None:
        return "corrupt"
    ps = page_size(b, 0)
    assert ps is not None
    if len(b) < ps + PAGEHDRSZ + META_SIZE:
        return "truncated"
    if not meta_ok(ps) or page_size(b, ps) != ps:
        return "corrupt"
    return "ok"


@dataclass
class Node:
    """One node of the snapshot: where it is and what it holds."""

    db: str          # "free", "main" or "named"
    page: int
    offset: int      # of the node within the file
    branch: bool
    flags: int
    key: bytes
    size: int        # data size (leaf) / child page (branch)


class Walker:
    def __init__(self, b: bytes, txnid: int | None, deep: bool) -> None:
        self.b, self.deep = b, deep
        self.ps = page_size(b, 0)
        assert self.ps
        self.npages = len(b) // self.ps
        m0, m1 = u64(b, PAGEHDRSZ + 128), u64(b, self.ps + PAGEHDRSZ + 128)
        if txnid is None:
            pick = 1 if m0 < m1 else 0
        elif m0 == txnid:
            pick = 0
        elif m1 == txnid:
            pick = 1
        else:
            raise LookupError
        self.meta = pick * self.ps + PAGEHDRSZ
        self.last_pg = u64(b, self.meta + 120)
        self.seen: set[int] = set()
        self.nodes: list[Node] = []

    def mark(self, pg: int) -> None:
        if pg < 2 or pg >= self.npages or pg in self.seen:
            raise Corrupt(pg)
        self.seen.add(pg)

    def run(self) -> None:
        if self.last_pg < 1 or self.last_pg > MAX_PGNO:
            raise Corrupt("last page")
        self.db(self.meta + 24, "free")
        self.db(self.meta + 24 + DB_SIZE, "main")

    def db(self, at: int, kind: str) -> None:
        flags, depth, root = u16(self.b, at + 4), u16(self.b, at + 6), u64(self.b, at + 40)
        if kind != "free" and flags:
            raise Corrupt("db flags")
        if root == P_INVALID:
            if depth:
                raise Corrupt("empty db depth")
            return
        if not 1 <= depth <= 32:
            raise Corrupt("depth")
        self.page(root, 1, depth, kind)

    def idl(self, at: int, size: int) -> None:
        if size < 8 or size % 8 or u64(self.b, at) != size // 8 - 1:
            raise Corrupt("idl size")
        ids = [u64(self.b, at + 8 * i) for i in range(1, size // 8)]
        if ids != sorted(set(ids), reverse=True) or any(not 2 <= p <= self.last_pg for p in ids):
            raise Corrupt("idl order")
        for p in ids:
            if p < self.npages:
                self.mark(p)

    def overflow(self, pg: int, size: int) -> None:
        n = (PAGEHDRSZ - 1 + size) // self.ps + 1
        if pg < 2 or pg > MAX_PGNO or pg + n > self.npages:
            raise Corrupt("overflow range")
        if self.deep:
            at = pg * self.ps
            pages = u32(self.b, at + 12)
            if u64(self.b, at) != pg or u16(self.b, at + 10) != P_OVERFLOW or not n <= pages <= self.npages - pg:
                raise Corrupt("overflow header")
            n = pages
        for p in range(pg, pg + n):
            self.mark(p)

    def page(self, pg: int, level: int, depth: int, kind: str) -> None:
        self.mark(pg)
        b, ps, at = self.b, self.ps, pg * self.ps
        branch = level < depth
        flags, lower, upper = u16(b, at + 10), u16(b, at + 12), u16(b, at + 14)
        if u64(b, at) != pg or flags != (P_BRANCH if branch else P_LEAF):
            raise Corrupt("page header")
        if not PAGEHDRSZ <= lower <= upper <= ps or (lower - PAGEHDRSZ) % 2:
            raise Corrupt("bounds")
        n = (lower - PAGEHDRSZ) // 2
        if n < (1 if kind == "free" or not branch else 2):
            raise Corrupt("keys")
        for i in range(n):
            off = u16(b, at + PAGEHDRSZ + 2 * i)
            if off < upper or off % 2 or off > ps - NODESIZE:
                raise Corrupt("node offset")
            node = at + off
            nflags, ksize = u16(b, node + 4), u16(b, node + 6)
            end = off + NODESIZE + ksize
            if end > ps or ksize > 511:
                raise Corrupt("key size")
            key = b[node + NODESIZE:node + NODESIZE + ksize]
            if kind == "free" and not (branch and i == 0) and ksize != 8:
                raise Corrupt("key size")  # (keys in any order: see native/lmdbcheck.c)
            lo_hi = u16(b, node) | u16(b, node + 2) << 16
            if branch:
                child = lo_hi | nflags << 32
                self.nodes.append(Node(kind, pg, node, True, 0, key, child))
                self.page(child, level + 1, depth, kind)
                continue
            self.nodes.append(Node(kind, pg, node, False, nflags, key, lo_hi))
            data = node + NODESIZE + ksize
            if nflags == F_BIGDATA:
                if end + 8 > ps:
                    raise Corrupt("big data pgno")
                ov = u64(b, data)
                self.overflow(ov, lo_hi)
                if kind == "free":
                    self.idl(ov * ps + PAGEHDRSZ, lo_hi)
                continue
            if end + lo_hi > ps:
                raise Corrupt("inline data")
            if nflags == F_SUBDATA and kind == "main":
                if lo_hi != DB_SIZE:
                    raise Corrupt("subdb size")
                self.db(data, "named")
            elif nflags:
                raise Corrupt("node flags")
            elif kind == "free":
                self.idl(data, lo_hi)


def check(b: bytes, txnid: int | None = None, deep: bool = False) -> str:
    """'ok', 'changed', 'truncated' or 'corrupt', as `mvc_lmdb_check` must answer."""
    head = check_header(b)
    if head != "ok":
        return head
    try:
        walker = Walker(b, txnid, deep)
    except LookupError:
        return "changed"
    try:
        walker.run()
    except Corrupt:
        return "corrupt"
    return "ok"


def nodes(b: bytes) -> list[Node]:
    """Every node of the newest snapshot of the (sound) file `b`."""
    walker = Walker(b, None, False)
    walker.run()
    return walker.nodes
