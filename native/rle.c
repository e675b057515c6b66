/* Sign-trick run-length coding (Inshrinkerator section 6) and its 16-bit
 * symbol form for Huffman coding (format: docs/native-formats.md). */
#include <string.h>
#include "status.h"
#include "rle.h"
#include "internal/rle_iter.h"

#define INLINE static inline __attribute__((always_inline))


INLINE uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
INLINE void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

INLINE uint32_t ldv(const uint8_t *p, int w) {
    if (w == 1) return *p;
    if (w == 2) { uint16_t v; memcpy(&v, p, 2); return v; }
    uint32_t v; memcpy(&v, p, 4); return v;
}
INLINE void stv(uint8_t *p, int w, uint32_t v) {
    if (w == 1) *p = (uint8_t)v;
    else if (w == 2) { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); }
    else memcpy(p, &v, 4);
}

/* First index after i whose value differs from src[i] (or n).  Eight bytes at a time, and
 * where they differ the first differing element is found from the lowest set bit of their
 * XOR: most runs of a delta stream are short, and an element-by-element tail loop would
 * mispredict its exit on nearly every one. */
INLINE size_t run_end(const uint8_t *src, size_t n, int w, size_t i) {
    const uint32_t v = ldv(src + i * (size_t)w, w);
    const uint64_t pat = w == 1 ? v * 0x0101010101010101ull
                       : w == 2 ? v * 0x0001000100010001ull : (uint64_t)v * 0x0000000100000001ull;
    const size_t per = 8 / (size_t)w;
    size_t j = i + 1;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; j + per <= n; j += per) {
        const uint64_t x = ld64(src + j * (size_t)w) ^ pat;
        if (x) return j + (size_t)__builtin_ctzll(x) / (8u * (unsigned)w);
    }
#else
    while (j + per <= n && ld64(src + j * (size_t)w) == pat) j += per;
#endif
    while (j < n && ldv(src + j * (size_t)w, w) == v) j++;
    return j;
}

static void fill(uint8_t *dst, int w, size_t at, size_t count, uint32_t v) {
    if (w == 1) { memset(dst + at, (int)v, count); return; }
    for (size_t i = 0; i < count; i++) stv(dst + (at + i) * (size_t)w, w, v);
}

static int valid_kind(int w) { return w == 1 || w == 2 || w == 4; }
static uint64_t kind_limit(int w) { return w == 1 ? 256u : w == 2 ? 65536u : 0x80000000u; }

/* ---- plain int32 tokens ------------------------------------------------ */

INLINE int64_t rle_encode_w(const uint8_t *src, size_t n, int w, int32_t *dst, size_t cap) {
    size_t t = 0;
    for (size_t i = 0; i < n;) {
        size_t j = run_end(src, n, w, i);
        uint32_t v = ldv(src + i * (size_t)w, w);
        if (w == 4 && v > 0x7fffffffu) return MVC_ERR_RANGE;
        for (size_t left = j - i; left;) {
            size_t chunk = left < 0x7fffffffu ? left : 0x7fffffffu;
            if (cap - t < 1 + (chunk > 1)) return MVC_ERR_CAPACITY;
            dst[t++] = -(int32_t)v;
            if (chunk > 1) dst[t++] = (int32_t)chunk;
            left -= chunk;
        }
        i = j;
    }
    return (int64_t)t;
}

int64_t mvc_rle_encode(const void *src, size_t n, int kind, int32_t *dst, size_t cap) {
    if (!valid_kind(kind)) return MVC_ERR_ARG;
    if (kind == 1) return rle_encode_w(src, n, 1, dst, cap);
    if (kind == 2) return rle_encode_w(src, n, 2, dst, cap);
    return rle_encode_w(src, n, 4, dst, cap);
}

int mvc_rle_decode(const int32_t *tok, size_t ntok, int kind, void *dst_, size_t n) {
    uint8_t *dst = dst_;
    if (!valid_kind(kind)) return MVC_ERR_ARG;
    const uint64_t lim = kind_limit(kind);
    size_t o = 0;
    int have = 0;
    uint32_t v = 0;
    for (size_t t = 0; t < ntok; t++) {
        int32_t x = tok[t];
        if (x <= 0) {
            if (x == INT32_MIN || (uint64_t)(-(int64_t)x) >= lim || o >= n) return MVC_ERR_CORRUPT;
            v = (uint32_t)(-x);
            stv(dst + o * (size_t)kind, kind, v);
            o++; have = 1;
        } else {
            if (!have || x < 2 || n - o < (size_t)x - 1) return MVC_ERR_CORRUPT;
            fill(dst, kind, o, (size_t)x - 1, v);
            o += (size_t)x - 1; have = 0;
        }
    }
    return o == n ? MVC_OK : MVC_ERR_TRUNCATED;
}

/* ---- symbol form ------------------------------------------------------- */

INLINE int sym_scan_w(const uint8_t *src, size_t n, int w, uint64_t *counts) {
    uint64_t ntok = 0, maxv = 0;
    for (size_t i = 0; i < n;) {
        size_t j = run_end(src, n, w, i);
        uint32_t v = ldv(src + i * (size_t)w, w);
        if (w == 4 && v > 0x7fffffffu) return MVC_ERR_RANGE;
        maxv = v > maxv ? v : maxv;
        for (uint64_t left = j - i; left;) {
            uint64_t chunk = left < RUN_MAX_SYM ? left : RUN_MAX_SYM;
            ntok += 1 + (chunk > 1);
            left -= chunk;
        }
        i = j;
    }
    counts[0] = ntok; counts[1] = maxv;
    return MVC_OK;
}

int mvc_rle_sym_scan(const void *src, size_t n, int kind, uint64_t *counts) {
    if (!valid_kind(kind)) return MVC_ERR_ARG;
    if (kind == 1) return sym_scan_w(src, n, 1, counts);
    if (kind == 2) return sym_scan_w(src, n, 2, counts);
    return sym_scan_w(src, n, 4, counts);
}

typedef struct { uint8_t *o, *end; uint64_t acc; unsigned nb; } bitw;

/* Append `bits` (<= 32) low bits of x; flushes whole bytes. */
INLINE int put_bits(bitw *b, uint64_t x, unsigned bits) {
    b->acc |= x << b->nb; b->nb += bits;
    if ((size_t)(b->end - b->o) < 8) return MVC_ERR_CAPACITY;
    st64(b->o, b->acc);
    b->o += b->nb >> 3; b->acc = (b->nb >= 64) ? 0 : b->acc >> (b->nb & ~7u); b->nb &= 7;
    return MVC_OK;
}

INLINE unsigned bitlen(uint64_t x) { return 64u - (unsigned)__builtin_clzll(x); }

/* Run class of L >= 1 and how many extra bits it needs. */
INLINE unsigned run_class(uint64_t L, unsigned *xbits) {
    if (L <= 16) { *xbits = 0; return (unsigned)L - 1; }
    unsigned bl = bitlen(L);
    *xbits = bl - 1;
    return 16 + bl - 5;
}

/* Symbols go to one of two streams by context: ctx 0 after a value token
 * with z == 0 (the next value is then a change), ctx 1 otherwise (the next
 * token is most likely a run of zeros).  Coding the two with their own
 * tables saves the ~1 bit per symbol a shared table spends telling them apart. */
INLINE int sym_encode_w(const uint8_t *src, size_t n, int w, uint32_t m, uint16_t *const *sym,
                        size_t symcap, bitw *bw, uint64_t *nsym) {
    size_t cnt[2] = {0, 0};
    int ctx = 1;
    for (size_t i = 0; i < n;) {
        size_t j = run_end(src, n, w, i);
        uint32_t v = ldv(src + i * (size_t)w, w);
        if (v >= m) return MVC_ERR_RANGE;
        uint32_t z = (v < m - v) ? 2 * v : 2 * (m - v) - 1; /* zigzag of the centred value */
        for (uint64_t left = j - i; left;) {
            uint64_t L = left < RUN_MAX_SYM ? left : RUN_MAX_SYM;
            unsigned xb, c = run_class(L, &xb);
            /* A value-only symbol's run symbol is read after the context
             * switched to "after a nonzero value": it goes to stream 1. */
            size_t need0 = ctx == 0, need1 = (size_t)(ctx == 1) + (z >= ZJ && c);
            if (symcap - cnt[0] < need0 || symcap - cnt[1] < need1) return MVC_ERR_CAPACITY;
            if (z < ZJ) sym[ctx][cnt[ctx]++] = (uint16_t)(z * NCLS + c);
            else if (z - ZJ < SYM_ESC - SYM_VAL) sym[ctx][cnt[ctx]++] = (uint16_t)(SYM_VAL + z - ZJ);
            else { sym[ctx][cnt[ctx]++] = SYM_ESC; if (put_bits(bw, z, 32)) return MVC_ERR_CAPACITY; }
            ctx = z != 0;
            if (z >= ZJ && c) sym[1][cnt[1]++] = (uint16_t)(SYM_RUN + c - 1);
            if (xb && put_bits(bw, L & ((1ull << xb) - 1), xb)) return MVC_ERR_CAPACITY;
            left -= L;
        }
        i = j;
    }
    nsym[0] = cnt[0]; nsym[1] = cnt[1];
    return MVC_OK;
}

int mvc_rle_sym_encode(const void *src, size_t n, int kind, uint32_t modulus, uint16_t *sym0,
                       uint16_t *sym1, size_t symcap, uint8_t *extra, size_t extracap,
                       uint64_t *counts) {
    if (!valid_kind(kind) || modulus == 0 || modulus > kind_limit(kind)) return MVC_ERR_ARG;
    bitw bw = {extra, extra + extracap, 0, 0};
    uint64_t nsym[2] = {0, 0};
    uint16_t *const sym[2] = {sym0, sym1};
    int r = kind == 1 ? sym_encode_w(src, n, 1, modulus, sym, symcap, &bw, nsym)
          : kind == 2 ? sym_encode_w(src, n, 2, modulus, sym, symcap, &bw, nsym)
                      : sym_encode_w(src, n, 4, modulus, sym, symcap, &bw, nsym);
    if (r) return r;
    if (bw.nb) { if (bw.o >= bw.end) return MVC_ERR_CAPACITY; *bw.o++ = (uint8_t)bw.acc; }
    counts[0] = nsym[0];
    counts[1] = nsym[1];
    counts[2] = (uint64_t)(bw.o - extra);
    return MVC_OK;
}

int mvc_rle_sym_decode(const uint16_t *sym0, size_t n0, const uint16_t *sym1, size_t n1,
                       const uint8_t *extra, size_t extralen, uint32_t modulus, int kind,
                       void *dst_, size_t n) {
    uint8_t *dst = dst_;
    if (!valid_kind(kind)) return MVC_ERR_ARG;
    if (modulus == 0 || modulus > kind_limit(kind)) return MVC_ERR_CORRUPT;
    rle_iter it;
    rle_iter_init(&it, sym0, n0, sym1, n1, extra, extralen, modulus);
    size_t o = 0;
    uint32_t v;
    uint64_t L;
    int r;
    while ((r = rle_iter_next(&it, &v, &L)) > 0) {
        if (n - o < L) return MVC_ERR_CORRUPT;
        fill(dst, kind, o, (size_t)L, v);
        o += (size_t)L;
    }
    if (r < 0) return r;
    if (o != n || rle_iter_done(&it) != MVC_OK) return MVC_ERR_TRUNCATED;
    return MVC_OK;
}
