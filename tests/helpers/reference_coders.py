"""Slow, obviously-correct Python references for the native coders.

They follow docs/native-formats.md independently of the C code, so a test
that decodes native output with them checks the documented format as well
as the round trip.  Keep inputs small: these run bit by bit.
"""
from __future__ import annotations

import heapq
from collections import Counter

import numpy as np

LMAX = {1: 11, 2: 16}
MIN_SPLIT = 64


class RefError(ValueError):
    """The reference decoder rejected its input."""


# ---- varints ------------------------------------------------------------

def varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise RefError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


# ---- Huffman --------------------------------------------------------------

def optimal_code_cost(counts: list[int]) -> tuple[int, int]:
    """(total bits, max code length) of an unrestricted Huffman code for `counts`."""
    if len(counts) < 2:
        return 0, 0
    heap = [(c, i, 0) for i, c in enumerate(counts)]
    depth = {i: 0 for i in range(len(counts))}
    members = {i: [i] for i in range(len(counts))}
    heapq.heapify(heap)
    nxt = len(counts)
    while len(heap) > 1:
        c1, i1, _ = heapq.heappop(heap)
        c2, i2, _ = heapq.heappop(heap)
        members[nxt] = members.pop(i1) + members.pop(i2)
        for leaf in members[nxt]:
            depth[leaf] += 1
        heapq.heappush(heap, (c1 + c2, nxt, 0))
        nxt += 1
    return sum(counts[i] * depth[i] for i in depth), max(depth.values())


def parse_huf_table(block: bytes, width: int) -> tuple[list[int], list[int], int]:
    """(symbols, code lengths, position after the table) of a Huffman-mode block."""
    k, pos = varint(block, 1)
    if k == 0 and width == 1:  # dense: lo, span - 1, one length nibble per symbol (0 = absent)
        lo, span = block[pos], block[pos + 1] + 1
        pos += 2
        nib = block[pos:pos + (span + 1) // 2]
        if len(nib) < (span + 1) // 2 or lo + span > 256:
            raise RefError("bad dense table")
        pairs = [(lo + x, (nib[x // 2] >> (4 * (x & 1))) & 15) for x in range(span)]
        pairs = [(s, ln) for s, ln in pairs if ln]
        return [s for s, _ in pairs], [ln for _, ln in pairs], pos + (span + 1) // 2
    syms, prev = [], 0
    for _ in range(k):
        gap, pos = varint(block, pos)
        syms.append(prev + gap)
        prev = syms[-1] + 1
    if prev > 1 << (8 * width):
        raise RefError("symbol out of range")
    nib = block[pos:pos + (k + 1) // 2]
    if len(nib) < (k + 1) // 2:
        raise RefError("truncated lengths")
    lens = [((nib[j // 2] >> (4 * (j & 1))) & 15) + 1 for j in range(k)]
    return syms, lens, pos + (k + 1) // 2


def canonical_codes(syms: list[int], lens: list[int]) -> dict[tuple[int, int], int]:
    """(length, code) -> symbol, codes assigned deflate-style (by length, then symbol)."""
    table, code, prev_len = {}, 0, 0
    for length, sym in sorted(zip(lens, syms)):
        code <<= length - prev_len
        table[(length, code)] = sym
        code += 1
        prev_len = length
    return table


def huf_decode_block(block: bytes, n: int, width: int) -> np.ndarray:
    """Decode one native Huffman block (mode byte first) of n symbols."""
    dtype = np.uint8 if width == 1 else np.dtype("<u2")
    if n == 0:
        if block:
            raise RefError("data for an empty block")
        return np.zeros(0, dtype)
    mode = block[0]
    if mode == 0:
        if len(block) != 1 + n * width:
            raise RefError("raw block length")
        return np.frombuffer(block[1:], dtype).copy()
    if mode == 1:
        if len(block) != 1 + width:
            raise RefError("const block length")
        return np.full(n, np.frombuffer(block[1:], dtype)[0], dtype)
    if mode != 2:
        raise RefError("bad mode")
    syms, lens, pos = parse_huf_table(block, width)
    if sum(2.0 ** -l for l in lens) != 1.0 or max(lens) > LMAX[width]:
        raise RefError("incomplete or over-long code")
    table = canonical_codes(syms, lens)
    ns = 4 if n >= MIN_SPLIT else 1
    q = -(-n // ns)
    counts = [q, q, q, n - 3 * q] if ns == 4 else [n]
    sizes = [int.from_bytes(block[pos + 4 * i:pos + 4 * i + 4], "little") for i in range(ns - 1)]
    pos += 4 * (ns - 1)
    sizes.append(len(block) - pos - sum(sizes))
    out = []
    for cnt, size in zip(counts, sizes):
        stream = block[pos:pos + size]
        pos += size
        bitpos = 0
        for _ in range(cnt):
            code = length = 0
            while (length, code) not in table:
                if length >= LMAX[width] or bitpos >= 8 * len(stream):
                    raise RefError("bad code")
                code = (code << 1) | ((stream[bitpos >> 3] >> (bitpos & 7)) & 1)
                bitpos += 1
                length += 1
            out.append(table[(length, code)])
        if (bitpos + 7) // 8 != len(stream):
            raise RefError("stream length")
    return np.array(out, dtype=dtype)


def huf_decode(data: bytes, n: int, width: int) -> np.ndarray:
    """Decode an `mvc.native.huffman.encode` stream."""
    if n == 0:
        return huf_decode_block(data, 0, width)
    bs, pos = varint(data, 0)
    nblocks = -(-n // bs)
    lengths = []
    for _ in range(nblocks - 1):
        ln, pos = varint(data, pos)
        lengths.append(ln)
    lengths.append(len(data) - pos - sum(lengths))
    parts = []
    for i, ln in enumerate(lengths):
        parts.append(huf_decode_block(data[pos:pos + ln], min(bs, n - i * bs), width))
        pos += ln
    return np.concatenate(parts)


# ---- run-length coding -----------------------------------------------------

def runs(values: np.ndarray) -> list[tuple[int, int]]:
    """Maximal (value, length) runs."""
    out: list[tuple[int, int]] = []
    for v in values.tolist():
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out


def rle_encode(values: np.ndarray) -> np.ndarray:
    """Inshrinkerator section 6: -v per run, then L only when L > 1."""
    tokens = []
    for v, n in runs(values):
        tokens.append(-v)
        if n > 1:
            tokens.append(n)
    return np.array(tokens, dtype=np.int32)


def rle_decode(tokens: np.ndarray, n: int) -> np.ndarray:
    out: list[int] = []
    for t in tokens.tolist():
        if t <= 0:
            out.append(-t)
        else:
            out.extend([out[-1]] * (t - 1))
    if len(out) != n:
        raise RefError("length")
    return np.array(out, dtype=np.int64)


# ---- quantization-aware delta rearrangement (Inshrinkerator Alg. 5 and 6) -----
# Plain numpy (a stable argsort) against which the fused native passes of
# mvc.codecs.delta_groups are checked.

def _same_length(a: np.ndarray, b: np.ndarray) -> None:
    if a.size != b.size:
        raise RefError(f"level streams differ in length: {a.size} vs {b.size}")


def delta_dtype(modulus: int) -> np.dtype:
    return np.dtype(np.uint8 if modulus <= 1 << 8 else np.uint16)


def cyclic_delta(prev: np.ndarray, cur: np.ndarray, modulus: int) -> np.ndarray:
    """D = (prev - cur) mod `modulus`, as the narrowest unsigned dtype."""
    _same_length(prev, cur)
    d = prev.astype(np.int32) - cur.astype(np.int32)
    np.remainder(d, modulus, out=d)
    return d.astype(delta_dtype(modulus))


def apply_cyclic_delta(prev: np.ndarray, delta: np.ndarray, modulus: int) -> np.ndarray:
    """Inverse of `cyclic_delta`: cur = (prev - D) mod `modulus`, as int32."""
    _same_length(prev, delta)
    cur = prev.astype(np.int32) - delta.astype(np.int32)
    np.remainder(cur, modulus, out=cur)
    return cur


def _order(parent: np.ndarray) -> np.ndarray:
    # Stable: within a group parameters keep their original (C) order, which
    # is what lets the decoder rebuild the same permutation from the parent.
    return np.argsort(parent.reshape(-1), kind="stable")


def split_by_parent(values: np.ndarray, parent: np.ndarray, n_groups: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 5: (values in group order, counts per group)."""
    flat = values.reshape(-1)
    _same_length(flat, parent.reshape(-1))
    counts = np.bincount(parent.reshape(-1), minlength=n_groups)[:n_groups].astype(np.int64)
    return flat[_order(parent)], counts


def merge_by_parent(grouped: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Alg. 6: the inverse of `split_by_parent`, rebuilt from the parent alone."""
    flat_parent = parent.reshape(-1)
    _same_length(grouped, flat_parent)
    out = np.empty_like(grouped)
    out[_order(flat_parent)] = grouped
    return out


ZJ, NCLS, SYM_ESC = 64, 44, 65472
SYM_VAL, SYM_RUN = ZJ * NCLS, SYM_ESC + 1


def _class_run(c: int, bits: BitReader) -> int:
    if c < 16:
        return c + 1
    bl = c - 16 + 5
    return (1 << (bl - 1)) | bits.read(bl - 1)


class BitReader:
    """LSB-first bit reader."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, k: int) -> int:
        v = 0
        for i in range(k):
            if self.pos >= 8 * len(self.data):
                raise RefError("extra bits exhausted")
            v |= ((self.data[self.pos >> 3] >> (self.pos & 7)) & 1) << i
            self.pos += 1
        return v


def rle_huffman_decode(data: bytes, n: int) -> np.ndarray:
    """Decode an `mvc.native.rle.encode_huffman` stream (format in docs/native-formats.md)."""
    if n == 0:
        return np.zeros(0, np.int64)
    m, pos = varint(data, 0)
    n0, pos = varint(data, pos)
    n1, pos = varint(data, pos)
    xlen, pos = varint(data, pos)
    len0, pos = varint(data, pos)
    bits = BitReader(data[pos:pos + xlen])
    pos += xlen
    streams = [list(huf_decode(data[pos:pos + len0], n0, 2)), list(huf_decode(data[pos + len0:], n1, 2))]
    at, ctx, out = [0, 0], 1, []
    while at[0] < n0 or at[1] < n1:
        s = int(streams[ctx][at[ctx]])
        at[ctx] += 1
        if s >= SYM_RUN:
            out.extend([out[-1]] * (_class_run(s - SYM_RUN + 1, bits) - 1))
            continue
        if s < SYM_VAL:
            z, run = s // NCLS, _class_run(s % NCLS, bits)
        else:
            z, run = (s - SYM_VAL + ZJ if s < SYM_ESC else bits.read(32)), 1
        v = m - (z + 1) // 2 if z & 1 else z // 2
        ctx = int(z != 0)
        out.extend([v] * run)
    if len(out) != n:
        raise RefError("length")
    return np.array(out, dtype=np.int64)


# ---- byte planes -------------------------------------------------------------

_FLOAT_BITS = {1: 16, 2: 16, 3: 32, 4: 64}  # layout -> element bits


def split_planes(raw: bytes, layout: int, itemsize: int) -> np.ndarray:
    """(planes, n) uint8: floats rotated left one bit, most significant byte first."""
    b = np.frombuffer(raw, np.uint8).reshape(-1, itemsize)
    if layout == 0:
        return np.ascontiguousarray(b.T)
    bits = _FLOAT_BITS[layout]
    udt = {16: "<u2", 32: "<u4", 64: "<u8"}[bits]
    x = b.copy().view(udt).reshape(-1).astype(np.uint64)
    mask = (1 << bits) - 1
    rot = ((x << np.uint64(1)) | (x >> np.uint64(bits - 1))) & np.uint64(mask)
    return np.stack([((rot >> np.uint64(bits - 8 * (p + 1))) & np.uint64(0xFF)).astype(np.uint8)
                     for p in range(itemsize)])


def merge_planes(planes: np.ndarray, layout: int, itemsize: int) -> bytes:
    """Inverse of `split_planes`."""
    if layout == 0:
        return np.ascontiguousarray(planes.T).tobytes()
    bits = _FLOAT_BITS[layout]
    rot = np.zeros(planes.shape[1], np.uint64)
    for p in range(itemsize):
        rot |= planes[p].astype(np.uint64) << np.uint64(bits - 8 * (p + 1))
    mask = np.uint64((1 << bits) - 1)
    x = ((rot >> np.uint64(1)) | (rot << np.uint64(bits - 1))) & mask
    udt = {16: "<u2", 32: "<u4", 64: "<u8"}[bits]
    return x.astype(udt).tobytes()


#: rANS block layouts by mode byte: (states, state bytes, word bytes, lower bound L).
RANS_MODES = {4: (8, 8, 4, 1 << 31), 5: (32, 4, 2, 1 << 16)}


def rans_decode_block(block: bytes, n: int) -> np.ndarray:
    """Decode a rANS block (mode 4 or 5), or any plain 8-bit block, of n symbols."""
    if not block or block[0] not in RANS_MODES:
        return huf_decode_block(block, n, 1)
    nst, sbytes, wbytes, low = RANS_MODES[block[0]]
    k, pos = varint(block, 1)
    freq = [0] * 256
    v = 0
    for _ in range(k):
        gap, pos = varint(block, pos)
        fm1, pos = varint(block, pos)
        v += gap
        freq[v] = fm1 + 1
        v += 1
    if sum(freq) != 4096:
        raise RefError("frequencies do not sum to 4096")
    start = [sum(freq[:s]) for s in range(256)]
    slot_sym = [s for s in range(256) for _ in range(freq[s])]
    states = [int.from_bytes(block[pos + sbytes * i:pos + sbytes * (i + 1)], "little") for i in range(nst)]
    pos += nst * sbytes
    if any(x < low for x in states):
        raise RefError("a state starts below L")
    out = []
    for i in range(n):
        x = states[i % nst]
        s = slot_sym[x & 4095]
        out.append(s)
        x = freq[s] * (x >> 12) + (x & 4095) - start[s]
        if x < low:
            if pos + wbytes > len(block):
                raise RefError("words exhausted")
            x = (x << (8 * wbytes)) | int.from_bytes(block[pos:pos + wbytes], "little")
            pos += wbytes
        states[i % nst] = x
    if pos != len(block) or any(x != low for x in states):
        raise RefError("rANS block does not end cleanly")
    return np.array(out, dtype=np.uint8)


def rans_normalize(counts: list[int]) -> list[int]:
    """native/rans.c's `normalize`: frequencies summing to 4096, every present symbol >= 1."""
    n = sum(counts)
    freq = [0 if not c else max(1, (c * 4096 + n // 2) // n) for c in counts]
    total = sum(freq)
    while total != 4096:
        best = -1
        for v in range(256):
            if not freq[v] or (total > 4096 and freq[v] == 1):
                continue
            if best < 0 or freq[v] > freq[best]:
                best = v
        d = 4096 - total
        step = max(d, -(freq[best] - 1)) if total > 4096 else d
        freq[best] += step
        total += step
    return freq


def _put_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def rans_encode_legacy(data: np.ndarray) -> bytes:
    """A mode-5 block as the encoder before the exact quotient wrote it: x / f by ryg_rans's
    32-bit reciprocal, one too high for some states of frequencies above 2896 (then the block
    does not decode exactly; `mvc_rans_decode` recovers it). A group's 32 lanes step together
    as numpy vectors; its renormalization words go out in the encoder's lane order."""
    data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    n, lanes = data.size, 32
    freq = rans_normalize(np.bincount(data, minlength=256).tolist())
    f = np.array(freq, dtype=np.uint64)
    start = np.concatenate([[0], np.cumsum(freq)[:-1]]).astype(np.uint64)
    rcp = np.zeros(256, np.uint64)
    shift = np.zeros(256, np.uint64)
    bias = start.copy()
    for v, fv in enumerate(freq):
        if fv == 1:   # quotient x - 1, and the bias makes up for it
            rcp[v], shift[v], bias[v] = 0xFFFFFFFF, 32, start[v] + 4095
        elif fv:
            sh = (fv - 1).bit_length()
            rcp[v], shift[v] = ((1 << (sh + 31)) + fv - 1) // fv, sh - 1 + 32
    x_max = (np.uint64(16) << np.uint64(16)) * f
    x = np.full(lanes, 1 << 16, np.uint64)
    # The encoder emits a group's words lanes high to low, writing backwards from the end of its
    # buffer: read forwards, each group's words are in lane order, the groups in data order.
    words: list[np.ndarray] = []
    for g in range(-(-n // lanes) - 1, -1, -1):
        syms = data[g * lanes:(g + 1) * lanes]
        live = slice(0, syms.size)   # the last group may be short
        xs, v = x[live], syms
        out = xs >= x_max[v]
        words.append((xs[out] & np.uint64(0xFFFF)).astype(np.uint16))
        xs = np.where(out, xs >> np.uint64(16), xs)
        q = (xs * rcp[v]) >> shift[v]   # xs < 2^32, rcp < 2^32: no overflow
        x[live] = (xs + bias[v] + q * (np.uint64(4096) - f[v])) & np.uint64(0xFFFFFFFF)
    k = sum(1 for fv in freq if fv)
    head = bytearray([5]) + _put_varint(k)
    prev = 0
    for v, fv in enumerate(freq):
        if fv:
            head += _put_varint(v - prev) + _put_varint(fv - 1)
            prev = v + 1
    head += x.astype("<u4").tobytes()
    return bytes(head) + np.concatenate(words[::-1]).astype("<u2").tobytes()


def ctx_decode_block(block: bytes, ctx: np.ndarray) -> np.ndarray:
    """Decode a context-conditional block (mode 3, or any plain 8-bit block) given its context bytes."""
    n = ctx.size
    if not block or block[0] != 3:
        return huf_decode_block(block, n, 1)
    nk = block[1]
    keys = list(block[2:2 + nk])
    if len(set(keys)) != nk or nk > 7:
        raise RefError("bad keys")
    pos = 2 + nk
    tables = []
    for _ in range(nk + 1):
        if block[pos] == 1:  # flat: every byte value, 8 bits
            tables.append({(8, v): v for v in range(256)})
            pos += 1
        else:
            # parse_huf_table reads a table that follows a mode byte
            syms, lens, used = parse_huf_table(block[pos - 1:], 1)
            tables.append(canonical_codes(syms, lens))
            pos += used - 1
    cls = np.zeros(256, np.int64)
    for j, k in enumerate(keys):
        cls[k] = j + 1
    ns = 4 if n >= MIN_SPLIT else 1
    q = -(-n // ns)
    counts = [q, q, q, n - 3 * q] if ns == 4 else [n]
    sizes = [int.from_bytes(block[pos + 4 * i:pos + 4 * i + 4], "little") for i in range(ns - 1)]
    pos += 4 * (ns - 1)
    sizes.append(len(block) - pos - sum(sizes))
    out, start = [], 0
    for cnt, size in zip(counts, sizes):
        stream = block[pos:pos + size]
        pos += size
        bitpos = 0
        for i in range(start, start + cnt):
            table = tables[cls[ctx[i]]]
            code = length = 0
            while (length, code) not in table:
                if length >= LMAX[1] or bitpos >= 8 * len(stream):
                    raise RefError("bad code")
                code = (code << 1) | ((stream[bitpos >> 3] >> (bitpos & 7)) & 1)
                bitpos += 1
                length += 1
            out.append(table[(length, code)])
        start += cnt
        if (bitpos + 7) // 8 != len(stream):
            raise RefError("stream length")
    return np.array(out, dtype=np.uint8)


def entropy_bits(values: np.ndarray) -> float:
    """Order-0 entropy of `values` in bits (total, not per symbol)."""
    counts = np.array(list(Counter(values.tolist()).values()), dtype=np.float64)
    p = counts / counts.sum()
    return float(-(counts * np.log2(p)).sum())
