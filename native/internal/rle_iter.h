#ifndef MVC_RLE_ITER_H
#define MVC_RLE_ITER_H
/* Internal to the native coders: the RLE symbol-stream decoder of rle.c as an
 * iterator over runs, so a consumer (qdelta.c) can walk several streams
 * side by side without expanding them. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "../status.h"

/* Symbol alphabet of the fused coder.  Values are folded into [0, modulus)
 * around zero (v and modulus - v both small for small cyclic deltas) and
 * zigzagged to z, so the common deltas +1 and -1 mod B get small symbols.
 * A value token with z < ZJ and its run token share one joint symbol, because
 * after a change the next token is nearly always a run of zeros: coding the
 * pair costs one code instead of two. */
#define ZJ 64u                    /* z below this: joint (value, run class) symbol */
#define NCLS 44u                  /* run classes: 0: L=1, 1..15: L=2..16, 16..43: bitlen(L)=5..32 */
#define SYM_VAL (ZJ * NCLS)       /* value-only symbols SYM_VAL + z - ZJ, run symbol may follow */
#define SYM_ESC 65472u            /* value-only, z as 32 extra bits */
#define SYM_RUN (SYM_ESC + 1u)    /* run class c >= 1 after a value-only symbol: SYM_RUN + c - 1 */
#define SYM_LAST (SYM_RUN + NCLS - 2u)
#define RUN_MAX_SYM 0xffffffffu

typedef struct {
    const uint16_t *sym[2];
    size_t lim[2], at[2];
    const uint8_t *xp;     /* extra-bits stream */
    size_t xlen;
    uint64_t xpos;
    uint32_t modulus, v;
    int ctx, expect_run;
} rle_iter;

/* rle_iter_next: the next run: 1 with *value < modulus and *len >= 1, 0 when both
 * streams are exhausted, < 0 if the symbols are corrupt.  rle_iter_done (after
 * next() gave 0): MVC_OK if the extra bits were consumed exactly.  Inline: the
 * checkout hot loop calls next() once per run. */
/* Next `bits` (<= 32) bits; -1 past the end of the stream. */
static inline int64_t rle_get_bits(rle_iter *b, unsigned bits) {
    if (b->xpos + bits > (uint64_t)b->xlen * 8) return -1;
    size_t byte = (size_t)(b->xpos >> 3);
    uint64_t v = 0;
    if (byte + 8 <= b->xlen) memcpy(&v, b->xp + byte, 8);
    else for (size_t i = 0; byte + i < b->xlen; i++) v |= (uint64_t)b->xp[byte + i] << (8 * i);
    v >>= b->xpos & 7;
    b->xpos += bits;
    return (int64_t)(v & ((1ull << bits) - 1));
}

/* Run length of class c, reading its extra bits; 0 if the extras run out. */
static inline uint64_t rle_class_run(unsigned c, rle_iter *it) {
    if (c < 16) return (uint64_t)c + 1;
    unsigned bl = c - 16 + 5;
    int64_t low = rle_get_bits(it, bl - 1);
    return low < 0 ? 0 : ((1ull << (bl - 1)) | (uint64_t)low);
}

static inline void rle_iter_init(rle_iter *it, const uint16_t *sym0, size_t n0, const uint16_t *sym1,
                   size_t n1, const uint8_t *extra, size_t extralen, uint32_t modulus) {
    it->sym[0] = sym0; it->sym[1] = sym1;
    it->lim[0] = n0; it->lim[1] = n1;
    it->at[0] = it->at[1] = 0;
    it->xp = extra; it->xlen = extralen; it->xpos = 0;
    it->modulus = modulus; it->v = 0;
    it->ctx = 1; it->expect_run = 0;
}

static inline int rle_iter_next(rle_iter *it, uint32_t *value, uint64_t *len) {
    if (it->at[0] >= it->lim[0] && it->at[1] >= it->lim[1]) return 0;
    int ctx = it->ctx;
    if (it->at[ctx] >= it->lim[ctx]) return MVC_ERR_CORRUPT;
    uint32_t s = it->sym[ctx][it->at[ctx]++];
    uint64_t L;
    if (s >= SYM_RUN) {
        /* Continuation of the previous value-only symbol's run. */
        if (s > SYM_LAST || !it->expect_run) return MVC_ERR_CORRUPT;
        it->expect_run = 0;
        if (!(L = rle_class_run(s - SYM_RUN + 1, it)) || L < 2) return MVC_ERR_CORRUPT;
        *value = it->v; *len = L - 1;
        return 1;
    }
    int64_t z;
    if (s < SYM_VAL) {
        z = s / NCLS;
        if (!(L = rle_class_run(s % NCLS, it))) return MVC_ERR_CORRUPT;
        it->expect_run = 0;
    } else {
        z = s < SYM_ESC ? (int64_t)(s - SYM_VAL + ZJ) : rle_get_bits(it, 32);
        if (z < 0) return MVC_ERR_CORRUPT;
        L = 1;
        it->expect_run = 1;
    }
    if ((uint64_t)z >= it->modulus) return MVC_ERR_CORRUPT;
    it->v = (z & 1) ? it->modulus - (uint32_t)((z + 1) >> 1) : (uint32_t)(z >> 1);
    it->ctx = z != 0;
    *value = it->v; *len = L;
    return 1;
}

static inline int rle_iter_done(const rle_iter *it) {
    return ((it->xpos + 7) >> 3) == it->xlen ? MVC_OK : MVC_ERR_TRUNCATED;
}

#endif
