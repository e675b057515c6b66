/* Context-conditional Huffman block coder (see ctxhuf.h).  Same bit layout
 * as huffman.c (4 streams, LSB-first, bit-reversed canonical codes); each
 * symbol's table is picked by the class of its context byte. */
#include <stdlib.h>
#include <string.h>
#include "status.h"
#include "ctxhuf.h"
#include "huffman.h"
#include "internal/huf_common.h"

#define MAXK 7       /* keyed classes; class 0 takes every other context */
#define NCLS (MAXK + 1)
#define FLAT 1       /* table tag: all 256 symbols, 8 bits each (k == 1 is never a real table) */

size_t mvc_ctxhuf_bound(size_t n) { return 1 + n + 24; }

static uint8_t rev8(uint32_t v) {
    v = ((v & 0xf0) >> 4) | ((v & 0x0f) << 4);
    v = ((v & 0xcc) >> 2) | ((v & 0x33) << 2);
    return (uint8_t)(((v & 0xaa) >> 1) | ((v & 0x55) << 1));
}

typedef struct {
    uint32_t h[4][NCLS][256]; /* per stream, per class histograms */
    uint32_t enc[NCLS][256];  /* reversed code | length << 24 */
    uint32_t sym[256], cnt[256], code[256];
    uint8_t len[256];
} enc_work;

/* Choose the keyed contexts: most frequent first, ties by value. */
static int pick_keys(const uint8_t *ctx, size_t n, uint8_t *keys, uint8_t *cmap) {
    uint32_t hc[256] = {0};
    for (size_t i = 0; i < n; i += 16) hc[ctx[i]]++; /* a sample: keys are stored, any choice decodes */
    int k = 0;
    memset(cmap, 0, 256);
    while (k < MAXK) {
        int best = -1;
        for (int v = 0; v < 256; v++)
            if (hc[v] && !cmap[v] && (best < 0 || hc[v] > hc[best])) best = v;
        if (best < 0) break;
        keys[k] = (uint8_t)best;
        cmap[best] = (uint8_t)(++k);
    }
    return k;
}

/* Build class c's code; returns its table size in bytes (FLAT: 1). */
static size_t class_code(enc_work *W, int c, uint8_t *tbl_out, int *flat) {
    uint32_t tot[256];
    int k = 0;
    uint64_t count = 0;
    for (int v = 0; v < 256; v++) {
        tot[v] = W->h[0][c][v] + W->h[1][c][v] + W->h[2][c][v] + W->h[3][c][v];
        count += tot[v];
    }
    for (int v = 0; v < 256; v++)
        if (tot[v]) { W->sym[k] = (uint32_t)v; W->cnt[k] = tot[v]; k++; }
    *flat = 1;
    for (int v = 0; v < 256; v++) W->enc[c][v] = rev8((uint32_t)v) | (8u << 24);
    if (k == 0) return 1;
    if (k == 1) { /* one symbol: pair it with a neighbour so the code has two leaves */
        uint32_t other = W->sym[0] ^ 1u;
        if (other < W->sym[0]) { W->sym[1] = W->sym[0]; W->cnt[1] = W->cnt[0]; W->sym[0] = other; W->cnt[0] = 0; }
        else { W->sym[1] = other; W->cnt[1] = 0; }
        k = 2;
    }
    if (huf_build_lengths(k, W->cnt, LMAX1, W->len) < 0) return 1;
    uint64_t bits = 0;
    for (int j = 0; j < k; j++) bits += (uint64_t)W->cnt[j] * W->len[j];
    int dense;
    size_t tsize = huf_table_size(k, W->sym, W->len, 1, &dense);
    if (bits + 8 * tsize >= 8 * count + 8) return 1;
    *flat = 0;
    huf_canonical_codes(k, W->len, W->code);
    for (int j = 0; j < k; j++) W->enc[c][W->sym[j]] = W->code[j] | ((uint32_t)W->len[j] << 24);
    huf_write_table(tbl_out, k, W->sym, W->len, 1, dense);
    return tsize;
}

#define CPUT(i) do { uint32_t e_ = enc[cmap[ctx[i]]][val[i]]; \
    acc |= (uint64_t)(e_ & 0xffffu) << nb; nb += e_ >> 24; } while (0)
#define CFLUSH() do { st64(o, acc); o += nb >> 3; acc >>= nb & ~7u; nb &= 7; } while (0)

static uint8_t *put_ctx_stream(const uint8_t *ctx, const uint8_t *val, size_t cnt, const uint8_t *cmap,
                               const uint32_t (*enc)[256], uint8_t *o) {
    uint64_t acc = 0; unsigned nb = 0;
    size_t i = 0;
    /* 4 codes of <= 11 bits fit the 64-bit accumulator: flush without a branch. */
    for (; i + 4 <= cnt; i += 4) { CPUT(i); CPUT(i + 1); CPUT(i + 2); CPUT(i + 3); CFLUSH(); }
    for (; i < cnt; i++) { CPUT(i); CFLUSH(); }
    if (nb) { st64(o, acc); o++; }
    return o;
}

/* Estimate from every 16th symbol whether conditional coding can meet the
 * size limit: mantissa planes usually cannot, and then the full histograms
 * and code construction are skipped.  Uses W->h[0] as scratch. */
static int worth_trying(enc_work *W, const uint8_t *ctx, const uint8_t *val, size_t n,
                        const uint8_t *cmap, int nk, int max_permille) {
    if (n < 4096) return 1;
    memset(W->h[0], 0, sizeof W->h[0]);
    for (size_t i = 0; i < n; i += 16) W->h[0][cmap[ctx[i]]][val[i]]++;
    uint64_t bits = 0, sample = 0;
    for (int c = 0; c <= nk; c++) {
        int k = 0;
        uint64_t count = 0;
        for (int v = 0; v < 256; v++)
            if (W->h[0][c][v]) { W->sym[k] = (uint32_t)v; W->cnt[k++] = W->h[0][c][v]; count += W->h[0][c][v]; }
        sample += count;
        if (k < 2 || huf_build_lengths(k, W->cnt, LMAX1, W->len) < 0) { bits += count * (k < 2 ? 1 : 8); continue; }
        uint64_t cb = 0;
        for (int j = 0; j < k; j++) cb += (uint64_t)W->cnt[j] * W->len[j];
        cb += 131 * 8 / 16; /* a dense table, in sample units */
        bits += cb < 8 * count ? cb : 8 * count;
    }
    /* A code fitted to the sample it is measured on looks a little better
     * than it is: demand another 0.5% before paying for the full pass. */
    return bits * 1000 < 8 * sample * (uint64_t)(max_permille - 5);
}

int64_t mvc_ctxhuf_encode(const uint8_t *ctx, const uint8_t *val, size_t n, uint8_t *dst,
                          size_t cap, int max_permille) {
    if (n > MAX_BLOCK || cap < mvc_ctxhuf_bound(n) || max_permille <= 0 || max_permille > 1000)
        return MVC_ERR_ARG;
    if (n == 0) return 0;
    enc_work *W = calloc(1, sizeof *W);
    uint8_t *tables = malloc(NCLS * 160);
    if (!W || !tables) { free(W); free(tables); return MVC_ERR_NOMEM; }
    uint8_t keys[MAXK], cmap[256];
    const int nk = pick_keys(ctx, n, keys, cmap);
    if (!worth_trying(W, ctx, val, n, cmap, nk, max_permille)) {
        free(W); free(tables);
        dst[0] = MODE_RAW;
        memcpy(dst + 1, val, n);
        return (int64_t)(1 + n);
    }
    memset(W->h, 0, sizeof W->h);
    const int ns = n >= MIN_SPLIT ? 4 : 1;
    const size_t q = (n + (size_t)ns - 1) / (size_t)ns;
    size_t cnt_s[4] = {n, 0, 0, 0};
    if (ns == 4) { cnt_s[0] = cnt_s[1] = cnt_s[2] = q; cnt_s[3] = n - 3 * q; }
    if (ns == 4) { /* the four streams in step: four independent counter chains */
        const uint8_t *c0 = ctx, *c1 = ctx + q, *c2 = ctx + 2 * q, *c3 = ctx + 3 * q;
        const uint8_t *v0 = val, *v1 = val + q, *v2 = val + 2 * q, *v3 = val + 3 * q;
        size_t i = 0;
        for (; i < cnt_s[3]; i++) {
            W->h[0][cmap[c0[i]]][v0[i]]++; W->h[1][cmap[c1[i]]][v1[i]]++;
            W->h[2][cmap[c2[i]]][v2[i]]++; W->h[3][cmap[c3[i]]][v3[i]]++;
        }
        for (; i < q; i++) {
            W->h[0][cmap[c0[i]]][v0[i]]++; W->h[1][cmap[c1[i]]][v1[i]]++; W->h[2][cmap[c2[i]]][v2[i]]++;
        }
    } else {
        for (size_t i = 0; i < n; i++) W->h[0][cmap[ctx[i]]][val[i]]++;
    }
    size_t tsize[NCLS], total = 2 + (size_t)nk + (ns == 4 ? 12 : 0);
    int flat[NCLS], any_coded = 0;
    for (int c = 0; c <= nk; c++) {
        tsize[c] = class_code(W, c, tables + 160 * c, &flat[c]);
        total += tsize[c];
        any_coded |= !flat[c];
    }
    uint64_t bits[4] = {0, 0, 0, 0};
    for (int s = 0; s < ns; s++)
        for (int c = 0; c <= nk; c++)
            for (int v = 0; v < 256; v++) bits[s] += (uint64_t)W->h[s][c][v] * (W->enc[c][v] >> 24);
    size_t sbytes[4];
    for (int s = 0; s < ns; s++) { sbytes[s] = (size_t)((bits[s] + 7) / 8); total += sbytes[s]; }
    int64_t ret;
    if (!any_coded || (uint64_t)total * 1000 >= (uint64_t)(1 + n) * (uint64_t)max_permille) {
        /* A plain block, planned from the class histograms summed (no second pass). */
        uint32_t h1[4][256];
        huf_plan8 *P = malloc(sizeof *P);
        if (!P) { ret = MVC_ERR_NOMEM; goto out; }
        for (int s = 0; s < 4; s++)
            for (int v = 0; v < 256; v++) {
                uint32_t t = 0;
                for (int c = 0; c <= nk; c++) t += W->h[s][c][v];
                h1[s][v] = t;
            }
        ret = huf_plan8_make((const uint32_t (*)[256])h1, n, max_permille, P);
        if (ret == MVC_OK) ret = huf_plan8_emit(P, val, n, dst);
        free(P);
        goto out;
    }
    uint8_t *o = dst;
    *o++ = MODE_CTX;
    *o++ = (uint8_t)nk;
    memcpy(o, keys, (size_t)nk); o += nk;
    for (int c = 0; c <= nk; c++) {
        if (flat[c]) *o++ = FLAT;
        else { memcpy(o, tables + 160 * c, tsize[c]); o += tsize[c]; }
    }
    if (ns == 4)
        for (int s = 0; s < 3; s++) { uint32_t b = (uint32_t)sbytes[s]; memcpy(o, &b, 4); o += 4; }
    for (int s = 0; s < ns; s++) {
        uint8_t *start = o;
        o = put_ctx_stream(ctx + (size_t)s * q, val + (size_t)s * q, cnt_s[s], cmap,
                           (const uint32_t (*)[256])W->enc, o);
        if ((size_t)(o - start) != sbytes[s]) { ret = MVC_ERR_INTERNAL; goto out; }
    }
    ret = (int64_t)(o - dst);
    if ((size_t)ret != total) ret = MVC_ERR_INTERNAL;
out:
    free(W); free(tables);
    return ret;
}

/* ---- decoder ----------------------------------------------------------- */

/* tab[c][idx]: symbol | length << 8, for every 11-bit window idx. */
static int read_class(const uint8_t **p, const uint8_t *end, uint16_t *tab) {
    if (*p >= end) return MVC_ERR_TRUNCATED;
    if (**p == FLAT) {
        (*p)++;
        for (uint32_t x = 0; x <= MASK1; x++) tab[x] = (uint16_t)(rev8(x & 0xff) | (8u << 8));
        return MVC_OK;
    }
    uint32_t sym[256], code[256];
    uint8_t len[256];
    int64_t k = huf_read_table(p, end, 1, sym, len);
    if (k < 0) return (int)k;
    huf_canonical_codes((int)k, len, code);
    for (int64_t j = 0; j < k; j++)
        for (uint32_t x = code[j]; x <= MASK1; x += 1u << len[j])
            tab[x] = (uint16_t)(sym[j] | ((uint32_t)len[j] << 8));
    return MVC_OK;
}

/* base[v]: the table of context byte v's class, so a lookup is two loads. */
#define CDEC(x, at) do { uint16_t e_ = base[ctx[at]][(w##x >> b##x) & MASK1]; \
    val[at] = (uint8_t)e_; b##x += e_ >> 8; } while (0)

int mvc_ctxhuf_decode(const uint8_t *src, size_t len, const uint8_t *ctx, uint8_t *val, size_t n) {
    if (n > MAX_BLOCK) return MVC_ERR_ARG;
    if (n == 0 || len == 0 || src[0] != MODE_CTX) return mvc_huf_decode_block(src, len, val, n, 1);
    const uint8_t *p = src + 1, *end = src + len;
    if (end - p < 1) return MVC_ERR_TRUNCATED;
    const int nk = *p++;
    if (nk > MAXK) return MVC_ERR_CORRUPT;
    if (end - p < nk) return MVC_ERR_TRUNCATED;
    uint8_t cmap[256] = {0};
    for (int j = 0; j < nk; j++) {
        if (cmap[p[j]]) return MVC_ERR_CORRUPT;
        cmap[p[j]] = (uint8_t)(j + 1);
    }
    p += nk;
    uint16_t *tab = malloc(sizeof(uint16_t) * NCLS * (MASK1 + 1));
    if (!tab) return MVC_ERR_NOMEM;
    int r = MVC_OK;
    for (int c = 0; c <= nk && !r; c++) r = read_class(&p, end, tab + (size_t)c * (MASK1 + 1));
    if (r) { free(tab); return r; }

    const int ns = n >= MIN_SPLIT ? 4 : 1;
    const size_t q = (n + (size_t)ns - 1) / (size_t)ns;
    bstream s[4];
    if (ns == 4 && end - p < 12) { free(tab); return MVC_ERR_TRUNCATED; }
    const uint8_t *sp = p + (ns == 4 ? 12 : 0);
    size_t left = (size_t)(end - sp);
    for (int x = 0; x < ns; x++) {
        size_t sz = left;
        if (x < ns - 1) { uint32_t b; memcpy(&b, p + 4 * x, 4); sz = b; }
        if (sz > left) { free(tab); return MVC_ERR_TRUNCATED; }
        size_t cnt = ns == 4 ? (x < 3 ? q : n - 3 * q) : n;
        s[x].p = sp; s[x].len = sz; s[x].pos = 0;
        s[x].o = val + (size_t)x * q; s[x].end = s[x].o + cnt;
        sp += sz; left -= sz;
    }
    const uint16_t *base[256];
    for (int v = 0; v < 256; v++) base[v] = tab + (size_t)cmap[v] * (MASK1 + 1);
    size_t done[4] = {0, 0, 0, 0};
    if (ns == 4) {
        /* All four streams advance in lockstep here, so one index serves
         * them all and each stream keeps just its window and bit offset in
         * registers: fewer live values, no spills in the hot loop. */
        const size_t last = n - 3 * q; /* stream 3 is the shortest */
        const uint8_t *p0 = s[0].p, *p1 = s[1].p, *p2 = s[2].p, *p3 = s[3].p;
        uint64_t pos0 = 0, pos1 = 0, pos2 = 0, pos3 = 0;
        size_t i = 0;
        while (i + 5 <= last && (pos0 >> 3) + 8 <= s[0].len && (pos1 >> 3) + 8 <= s[1].len &&
               (pos2 >> 3) + 8 <= s[2].len && (pos3 >> 3) + 8 <= s[3].len) {
            const uint64_t w0 = ld64(p0 + (pos0 >> 3)), w1 = ld64(p1 + (pos1 >> 3));
            const uint64_t w2 = ld64(p2 + (pos2 >> 3)), w3 = ld64(p3 + (pos3 >> 3));
            unsigned b0 = pos0 & 7, b1 = pos1 & 7, b2 = pos2 & 7, b3 = pos3 & 7;
            for (int r5 = 0; r5 < 5; r5++, i++) {
                CDEC(0, i); CDEC(1, q + i); CDEC(2, 2 * q + i); CDEC(3, 3 * q + i);
            }
            pos0 = (pos0 & ~(uint64_t)7) + b0; pos1 = (pos1 & ~(uint64_t)7) + b1;
            pos2 = (pos2 & ~(uint64_t)7) + b2; pos3 = (pos3 & ~(uint64_t)7) + b3;
        }
        s[0].pos = pos0; s[1].pos = pos1; s[2].pos = pos2; s[3].pos = pos3;
        done[0] = done[1] = done[2] = done[3] = i;
    }
    for (int x = 0; x < ns && !r; x++) {
        const uint8_t *cx = ctx + (size_t)x * q;
        size_t cnt = (size_t)(s[x].end - s[x].o);
        for (size_t i = done[x]; i < cnt; i++) {
            uint16_t e = base[cx[i]][peek(&s[x]) & MASK1];
            s[x].o[i] = (uint8_t)e;
            s[x].pos += e >> 8;
        }
        r = finished(&s[x]);
    }
    free(tab);
    return r;
}
