#ifndef MVC_HUF_COMMON_H
#define MVC_HUF_COMMON_H
/* Internal to the native coders (not part of the cffi interface: it lives
 * outside the top-level native headers on purpose). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "varint.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "mvc's native coders assume a little-endian host"
#endif

#define MAX_BLOCK ((size_t)1 << 24)
#define LMAX1 11 /* length limit for 8-bit alphabets = decode table bits */
#define LMAX2 16 /* length limit for 16-bit alphabets */
#define MASK1 ((1u << LMAX1) - 1)
#define MIN_SPLIT 64 /* blocks shorter than this use one stream */

enum { MODE_RAW = 0, MODE_CONST = 1, MODE_HUF = 2, MODE_CTX = 3, MODE_RANS = 4, MODE_RANS32 = 5 };

static inline uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline void st16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* Code lengths (<= lmax) for k >= 2 symbols with counts cnt[]; len[] parallel. */
int huf_build_lengths(int k, const uint32_t *cnt, int lmax, uint8_t *len);
/* Canonical codes (deflate order: by length, then symbol), bit-reversed. */
void huf_canonical_codes(int k, const uint8_t *len, uint32_t *code);
/* Serialized size of the table of k symbols (ascending sym[]); sets *dense. */
size_t huf_table_size(int k, const uint32_t *sym, const uint8_t *len, int w, int *dense);
uint8_t *huf_write_table(uint8_t *o, int k, const uint32_t *sym, const uint8_t *len, int w, int dense);
/* Parse a table into sym[]/len[] (room for the whole alphabet); returns k or < 0.
 * Rejects incomplete codes and lengths over the limit. */
int64_t huf_read_table(const uint8_t **pp, const uint8_t *end, int w, uint32_t *sym, uint8_t *len);

/* An 8-bit Huffman block worked out before it is written (huffman.c), so a
 * caller can weigh its exact size against another coder's first. */
typedef struct {
    int mode;             /* MODE_RAW, MODE_CONST or MODE_HUF */
    size_t size;          /* exact block size in bytes */
    int k, dense;         /* symbols in the code; table form */
    uint32_t sym[256], code[256], enc[256];
    uint8_t len[256];
    size_t sbytes[4];     /* stream sizes */
} huf_plan8;

/* Histograms h[s][v] of the block's streams (one stream: h[1..3] are zero). */
void huf_hist8(const uint8_t *src, size_t n, uint32_t h[4][256]);
/* The block mvc_huf_encode_block(src, n, 1, ..., max_permille) writes, from
 * huf_hist8's histograms of src; 0 or < 0. */
int huf_plan8_make(const uint32_t h[4][256], size_t n, int max_permille, huf_plan8 *P);
/* Write the planned block of src to dst (room for mvc_huf_bound(n, 1)); its size or < 0. */
int64_t huf_plan8_emit(const huf_plan8 *P, const uint8_t *src, size_t n, uint8_t *dst);

/* rans.c from byte counts cnt[256] of the n bytes at src (no histogram pass):
 * mvc_rans_encode's output (cap >= mvc_rans_bound(n)) and mvc_rans_estimate's size. */
int64_t rans_encode_counts(const uint8_t *src, size_t n, const uint64_t *cnt, uint8_t *dst, size_t cap);
int64_t rans_estimate_counts(const uint64_t *cnt, size_t n);

/* A bit stream being decoded: LSB-first, bytes past len read as zero. */
typedef struct {
    const uint8_t *p; size_t len; uint64_t pos; uint8_t *o, *end;
} bstream;

/* 64-bit window at the bit position; bytes past the stream read as zero. */
static inline uint64_t peek(const bstream *b) {
    size_t byte = (size_t)(b->pos >> 3);
    uint64_t v = 0;
    if (byte + 8 <= b->len) v = ld64(b->p + byte);
    else for (size_t i = 0; byte + i < b->len; i++) v |= (uint64_t)b->p[byte + i] << (8 * i);
    return v >> (b->pos & 7);
}

static inline int finished(const bstream *b) {
    return ((b->pos + 7) >> 3) == b->len ? MVC_OK : MVC_ERR_CORRUPT;
}


#endif
