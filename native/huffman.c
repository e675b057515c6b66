/* Canonical, length-limited Huffman block coder (format: docs/native-formats.md).
 *
 * A block is split into 4 interleaved-decodable streams so the decoder's four
 * lookup chains overlap in the CPU.  Bits are packed LSB-first, so codes are
 * stored bit-reversed and the decoder indexes its table with the low bits of a
 * 64-bit window.  8-bit alphabets decode through a table whose entries hold up
 * to 4 symbols; every table here is built for a complete code (Kraft sum
 * exactly 1), so each index decodes to something and the hot loops need no
 * validity checks: corruption is caught by the exact end-of-stream check. */
#include <stdlib.h>
#include <string.h>
#include "status.h"
#include "huffman.h"
#include "internal/huf_common.h"

#define SLACK 24 /* a 64-bit store may run this far past the encoded size */

size_t mvc_huf_max_block(void) { return MAX_BLOCK; }
size_t mvc_huf_bound(size_t n, int width) { return 1 + n * (size_t)width + SLACK; }

/* ---- encoder ----------------------------------------------------------- */

/* enc entries: reversed code in bits 0..15, length in bits 24..31. */
#define PUT(v) do { uint32_t e_ = enc[v]; acc |= (uint64_t)(e_ & 0xffffu) << nb; nb += e_ >> 24; } while (0)
#define FLUSH() do { st64(o, acc); o += nb >> 3; acc >>= nb & ~7u; nb &= 7; } while (0)

static uint8_t *put_stream1(const uint8_t *s, size_t cnt, const uint32_t *enc, uint8_t *o) {
    uint64_t acc = 0; unsigned nb = 0; size_t i = 0;
    for (; i + 4 <= cnt; i += 4) { PUT(s[i]); PUT(s[i + 1]); PUT(s[i + 2]); PUT(s[i + 3]); FLUSH(); }
    for (; i < cnt; i++) { PUT(s[i]); FLUSH(); }
    if (nb) { st64(o, acc); o++; }
    return o;
}

static uint8_t *put_stream2(const uint8_t *s, size_t cnt, const uint32_t *enc, uint32_t lo, uint8_t *o) {
    uint64_t acc = 0; unsigned nb = 0; size_t i = 0;
    for (; i + 3 <= cnt; i += 3) {
        PUT(ld16(s + 2 * i) - lo); PUT(ld16(s + 2 * i + 2) - lo); PUT(ld16(s + 2 * i + 4) - lo); FLUSH();
    }
    for (; i < cnt; i++) { PUT(ld16(s + 2 * i) - lo); FLUSH(); }
    if (nb) { st64(o, acc); o++; }
    return o;
}

/* Per-stream histograms of a block of bytes, split into streams as the coder
 * splits it.  Two tables per stream, fed alternately: a run of one symbol
 * (an exponent plane is mostly a few values) would otherwise wait on the
 * previous increment of the same counter at every byte. */
void huf_hist8(const uint8_t *src, size_t n, uint32_t h[4][256]) {
    uint32_t a[4][256], b[4][256];
    memset(a, 0, sizeof a); memset(b, 0, sizeof b);
    if (n < MIN_SPLIT) {
        size_t i = 0;
        for (; i + 2 <= n; i += 2) { a[0][src[i]]++; b[0][src[i + 1]]++; }
        if (i < n) a[0][src[i]]++;
    } else {
        const size_t q = (n + 3) / 4, m = n - 3 * q; /* stream 3 is the shortest */
        const uint8_t *p0 = src, *p1 = src + q, *p2 = src + 2 * q, *p3 = src + 3 * q;
        size_t i = 0;
        for (; i + 2 <= m; i += 2) {
            a[0][p0[i]]++; a[1][p1[i]]++; a[2][p2[i]]++; a[3][p3[i]]++;
            b[0][p0[i + 1]]++; b[1][p1[i + 1]]++; b[2][p2[i + 1]]++; b[3][p3[i + 1]]++;
        }
        for (; i < m; i++) { a[0][p0[i]]++; a[1][p1[i]]++; a[2][p2[i]]++; a[3][p3[i]]++; }
        for (; i < q; i++) { a[0][p0[i]]++; a[1][p1[i]]++; a[2][p2[i]]++; }
    }
    for (int s = 0; s < 4; s++)
        for (int v = 0; v < 256; v++) h[s][v] = a[s][v] + b[s][v];
}

int huf_plan8_make(const uint32_t h[4][256], size_t n, int max_permille, huf_plan8 *P) {
    const int ns = n >= MIN_SPLIT ? 4 : 1;
    uint32_t cnt[256];
    int k = 0;
    for (int v = 0; v < 256; v++) {
        uint32_t t = h[0][v] + h[1][v] + h[2][v] + h[3][v];
        if (t) { P->sym[k] = (uint32_t)v; cnt[k] = t; k++; }
    }
    P->k = k;
    const size_t raw = 1 + n;
    if (k == 1) { P->mode = MODE_CONST; P->size = 2; return MVC_OK; }
    int r = huf_build_lengths(k, cnt, LMAX1, P->len);
    if (r < 0) return r;
    huf_canonical_codes(k, P->len, P->code);
    size_t tbl = huf_table_size(k, P->sym, P->len, 1, &P->dense);
    for (int v = 0; v < 256; v++) P->enc[v] = 0;
    for (int j = 0; j < k; j++) P->enc[P->sym[j]] = P->code[j] | ((uint32_t)P->len[j] << 24);
    size_t total = 1 + tbl + (ns == 4 ? 12 : 0);
    for (int s = 0; s < ns; s++) {
        uint64_t bits = 0;
        for (int j = 0; j < k; j++) bits += (uint64_t)h[s][P->sym[j]] * P->len[j];
        P->sbytes[s] = (size_t)((bits + 7) / 8);
        total += P->sbytes[s];
    }
    if ((uint64_t)total * 1000 >= (uint64_t)raw * (uint64_t)max_permille) {
        P->mode = MODE_RAW; P->size = raw;
    } else {
        P->mode = MODE_HUF; P->size = total;
    }
    return MVC_OK;
}

int64_t huf_plan8_emit(const huf_plan8 *P, const uint8_t *src, size_t n, uint8_t *dst) {
    if (P->mode == MODE_CONST) { dst[0] = MODE_CONST; dst[1] = src[0]; return 2; }
    if (P->mode == MODE_RAW) { dst[0] = MODE_RAW; memcpy(dst + 1, src, n); return (int64_t)(1 + n); }
    const int ns = n >= MIN_SPLIT ? 4 : 1;
    const size_t q = (n + (size_t)ns - 1) / (size_t)ns;
    uint8_t *o = dst;
    *o++ = MODE_HUF;
    o = huf_write_table(o, P->k, P->sym, P->len, 1, P->dense);
    if (ns == 4)
        for (int s = 0; s < 3; s++) { uint32_t b = (uint32_t)P->sbytes[s]; memcpy(o, &b, 4); o += 4; }
    for (int s = 0; s < ns; s++) {
        uint8_t *start = o;
        size_t cnt = ns == 4 ? (s < 3 ? q : n - 3 * q) : n;
        o = put_stream1(src + (size_t)s * q, cnt, P->enc, o);
        if ((size_t)(o - start) != P->sbytes[s]) return MVC_ERR_INTERNAL;
    }
    if ((size_t)(o - dst) != P->size) return MVC_ERR_INTERNAL;
    return (int64_t)(o - dst);
}

/* 16-bit symbols: a histogram over [lo, hi]; its array doubles as the encode table. */
static int64_t encode_block2(const uint8_t *src, size_t n, uint8_t *dst, int max_permille) {
    const int ns = n >= MIN_SPLIT ? 4 : 1;
    const size_t q = (n + (size_t)ns - 1) / (size_t)ns;
    size_t cnt_s[4] = {n, 0, 0, 0};
    if (ns == 4) { cnt_s[0] = cnt_s[1] = cnt_s[2] = q; cnt_s[3] = n - 3 * q; }
    uint32_t lo = 0xffff, hi = 0;
    for (size_t i = 0; i < n; i++) { uint32_t v = ld16(src + 2 * i); lo = v < lo ? v : lo; hi = v > hi ? v : hi; }
    const uint32_t span = hi - lo + 1;
    uint32_t *hist = calloc(span, sizeof *hist);
    if (!hist) return MVC_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) hist[ld16(src + 2 * i) - lo]++;
    int k = 0;
    for (uint32_t v = 0; v < span; v++) k += hist[v] != 0;

    int64_t ret;
    size_t raw = 1 + n * 2;
    if (k == 1) {
        dst[0] = MODE_CONST;
        memcpy(dst + 1, src, 2);
        ret = 3;
        goto done;
    }
    uint32_t *cnt = malloc((size_t)k * sizeof *cnt), *code = malloc((size_t)k * sizeof *code);
    uint32_t *sym = malloc((size_t)k * sizeof *sym);
    uint8_t *len = malloc((size_t)k);
    if (!cnt || !code || !sym || !len) { ret = MVC_ERR_NOMEM; goto done2; }
    for (uint32_t v = 0, j = 0; v < span; v++)
        if (hist[v]) { sym[j] = v + lo; cnt[j] = hist[v]; j++; }
    ret = huf_build_lengths(k, cnt, LMAX2, len);
    if (ret < 0) goto done2;
    huf_canonical_codes(k, len, code);

    /* Exact size, known before writing anything. */
    int use_dense;
    size_t tbl = huf_table_size(k, sym, len, 2, &use_dense);
    uint64_t bits[4] = {0, 0, 0, 0};
    /* Reuse hist as the dense encode table (its counts are in cnt[] now). */
    uint32_t *enc = hist;
    for (int j = 0; j < k; j++) enc[sym[j] - lo] = code[j] | ((uint32_t)len[j] << 24);
    for (int s = 0; s < ns; s++) {
        const uint8_t *p = src + 2 * (size_t)s * q;
        for (size_t i = 0; i < cnt_s[s]; i++) bits[s] += enc[ld16(p + 2 * i) - lo] >> 24;
    }
    size_t sbytes[4], total = 1 + tbl + (ns == 4 ? 12 : 0);
    for (int s = 0; s < ns; s++) { sbytes[s] = (size_t)((bits[s] + 7) / 8); total += sbytes[s]; }
    if ((uint64_t)total * 1000 >= (uint64_t)raw * (uint64_t)max_permille) {
        dst[0] = MODE_RAW;
        memcpy(dst + 1, src, n * 2);
        ret = (int64_t)raw;
        goto done2;
    }
    uint8_t *o = dst;
    *o++ = MODE_HUF;
    o = huf_write_table(o, k, sym, len, 2, use_dense);
    if (ns == 4)
        for (int s = 0; s < 3; s++) { uint32_t b = (uint32_t)sbytes[s]; memcpy(o, &b, 4); o += 4; }
    for (int s = 0; s < ns; s++) {
        uint8_t *start = o;
        o = put_stream2(src + 2 * (size_t)s * q, cnt_s[s], enc, lo, o);
        if ((size_t)(o - start) != sbytes[s]) { ret = MVC_ERR_INTERNAL; goto done2; }
    }
    ret = (int64_t)(o - dst);
    if ((size_t)ret != total) ret = MVC_ERR_INTERNAL;
done2:
    free(cnt); free(code); free(sym); free(len);
done:
    free(hist);
    return ret;
}

int64_t mvc_huf_encode_block(const void *src_, size_t n, int w, uint8_t *dst, size_t cap,
                             int max_permille) {
    const uint8_t *src = src_;
    if ((w != 1 && w != 2) || n > MAX_BLOCK || cap < mvc_huf_bound(n, w) ||
        max_permille <= 0 || max_permille > 1000)
        return MVC_ERR_ARG;
    if (n == 0) return 0;
    if (w == 2) return encode_block2(src, n, dst, max_permille);
    uint32_t h[4][256];
    huf_plan8 P;
    huf_hist8(src, n, h);
    int r = huf_plan8_make((const uint32_t (*)[256])h, n, max_permille, &P);
    if (r < 0) return r;
    return huf_plan8_emit(&P, src, n, dst);
}

/* ---- decoder ----------------------------------------------------------- */

/* 8-bit table entries: symbols in bytes 0..3, count in byte 4, total bits in
 * byte 5, first symbol's length in byte 6. */
static int tail1(bstream *b, const uint64_t *tab) {
    while (b->o < b->end) {
        uint64_t e = tab[peek(b) & MASK1];
        *b->o++ = (uint8_t)e;
        b->pos += (e >> 48) & 0xff;
    }
    return finished(b);
}

#define DEC1(x) do { uint64_t e_ = tab[w##x & MASK1]; st32(s[x].o, (uint32_t)e_); \
    s[x].o += (e_ >> 32) & 0xff; unsigned c_ = (e_ >> 40) & 0xff; w##x >>= c_; s[x].pos += c_; } while (0)
#define FITS1(x) ((s[x].pos >> 3) + 8 <= s[x].len && (size_t)(s[x].end - s[x].o) >= 20)
#define REFILL(x) uint64_t w##x = ld64(s[x].p + (s[x].pos >> 3)) >> (s[x].pos & 7)

static int decode_streams1(bstream *s, int ns, const uint64_t *tab) {
    if (ns == 4) {
        while (FITS1(0) && FITS1(1) && FITS1(2) && FITS1(3)) {
            REFILL(0); REFILL(1); REFILL(2); REFILL(3);
            DEC1(0); DEC1(1); DEC1(2); DEC1(3);
            DEC1(0); DEC1(1); DEC1(2); DEC1(3);
            DEC1(0); DEC1(1); DEC1(2); DEC1(3);
            DEC1(0); DEC1(1); DEC1(2); DEC1(3);
            DEC1(0); DEC1(1); DEC1(2); DEC1(3);
        }
    }
    for (int x = 0; x < ns; x++) { int r = tail1(&s[x], tab); if (r) return r; }
    return MVC_OK;
}

static int build_table1(int k, const uint32_t *sym, const uint8_t *len, const uint32_t *code,
                        uint64_t *tab) {
    uint16_t single[1u << LMAX1];
    for (int j = 0; j < k; j++)
        for (uint32_t x = code[j]; x <= MASK1; x += 1u << len[j])
            single[x] = (uint16_t)(sym[j] | ((uint32_t)len[j] << 8));
    for (uint32_t idx = 0; idx <= MASK1; idx++) {
        uint64_t syms = 0; unsigned cnt = 0, used = 0, first = single[idx] >> 8;
        while (cnt < 4) {
            uint16_t e = single[(idx >> used) & MASK1];
            unsigned l = e >> 8;
            if (used + l > LMAX1) break;
            syms |= (uint64_t)(e & 0xff) << (8 * cnt);
            cnt++; used += l;
        }
        tab[idx] = syms | ((uint64_t)cnt << 32) | ((uint64_t)used << 40) | ((uint64_t)first << 48);
    }
    return MVC_OK;
}

/* 16-bit alphabets: a direct table over the first TB2 bits, so building it
 * per block is cheap (a delta chain decodes dozens of small blocks per step)
 * and it stays in L1; the rare longer codes are resolved canonically. */
#define TB2 11

typedef struct {
    uint32_t first[LMAX2 + 2];  /* first canonical code of each length */
    uint32_t count[LMAX2 + 2];  /* codes of each length */
    uint32_t offset[LMAX2 + 2]; /* index of each length's first symbol in sorted[] */
    const uint32_t *sorted;     /* symbols by (length, symbol): canonical order */
} canon;

/* Entry (sym | len << 16) of the code at the bottom of window w, for codes
 * longer than the direct table; 0 (no code: impossible for the complete codes
 * huf_read_table admits) fails the stream's end check. */
static uint32_t canon_decode(uint64_t w, const canon *c) {
    uint32_t code = 0;
    for (unsigned l = 1; l <= LMAX2; l++) {
        code = (code << 1) | (uint32_t)((w >> (l - 1)) & 1);
        if (code >= c->first[l] && code - c->first[l] < c->count[l])
            return c->sorted[c->offset[l] + code - c->first[l]] | ((uint32_t)l << 16);
    }
    return 0;
}

static inline uint32_t entry2(uint64_t w, const uint32_t *tab, uint64_t mask, const canon *c) {
    uint32_t e = tab[w & mask];
    return __builtin_expect(e != 0, 1) ? e : canon_decode(w, c);
}

static int decode_streams2(bstream *s, int ns, const uint32_t *tab, unsigned tbits, const canon *c) {
    const uint64_t mask = ((uint64_t)1 << tbits) - 1;
    for (int x = 0; x < ns; x++) {
        bstream *b = &s[x];
        while ((b->pos >> 3) + 8 <= b->len && (size_t)(b->end - b->o) >= 6) {
            uint64_t wv = ld64(b->p + (b->pos >> 3)) >> (b->pos & 7);
            for (int r = 0; r < 3; r++) {
                uint32_t e = entry2(wv, tab, mask, c);
                if (!e) return MVC_ERR_CORRUPT;
                st16(b->o, (uint16_t)e); b->o += 2;
                wv >>= e >> 16; b->pos += e >> 16;
            }
        }
        while (b->o < b->end) {
            uint32_t e = entry2(peek(b), tab, mask, c);
            if (!e) return MVC_ERR_CORRUPT;
            st16(b->o, (uint16_t)e); b->o += 2;
            b->pos += e >> 16;
        }
        int r = finished(b);
        if (r) return r;
    }
    return MVC_OK;
}

/* The direct table and canonical tables of a 16-bit code; *tab and *sorted are malloc'd. */
static int build_table2(uint32_t k, const uint32_t *sym, const uint8_t *len, const uint32_t *code,
                        unsigned maxlen, uint32_t **tab_out, unsigned *tbits, canon *c,
                        uint32_t **sorted_out) {
    const unsigned tb = maxlen < TB2 ? maxlen : TB2;
    uint32_t *tab = calloc((size_t)1 << tb, sizeof *tab);
    uint32_t *sorted = maxlen > tb ? malloc(sizeof *sorted * k) : NULL;
    *tab_out = tab; *sorted_out = sorted; *tbits = tb;
    if (!tab || (maxlen > tb && !sorted)) return MVC_ERR_NOMEM;
    for (uint32_t j = 0; j < k; j++)
        if (len[j] <= tb)
            for (uint32_t x = code[j]; x < (1u << tb); x += 1u << len[j])
                tab[x] = sym[j] | ((uint32_t)len[j] << 16);
    memset(c, 0, sizeof *c);
    if (!sorted) return MVC_OK;
    for (uint32_t j = 0; j < k; j++) c->count[len[j]]++;
    uint32_t next = 0, at = 0;
    for (unsigned l = 1; l <= LMAX2; l++) {
        next = (next + c->count[l - 1]) << 1;
        c->first[l] = next;
        c->offset[l] = at;
        at += c->count[l];
    }
    uint32_t fill[LMAX2 + 2];
    memcpy(fill, c->offset, sizeof fill);
    for (uint32_t j = 0; j < k; j++) sorted[fill[len[j]]++] = sym[j]; /* sym[] ascending */
    c->sorted = sorted;
    return MVC_OK;
}

static int decode_huf(const uint8_t *p, const uint8_t *end, uint8_t *dst, size_t n, int w) {
    int r;
    /* Room for the table's symbols: the whole byte alphabet, or the count a
     * 16-bit table declares up front (its first varint). */
    uint32_t alpha = 256;
    if (w == 2) {
        const uint8_t *q = p;
        if ((r = varint_get32(&q, end, &alpha))) return r;
        if (alpha < 2 || alpha > 65536u) return MVC_ERR_CORRUPT;
    }
    uint32_t *sym = malloc(alpha * sizeof *sym), *code = malloc(alpha * sizeof *code);
    uint8_t *len = malloc(alpha);
    void *tab = NULL;
    uint32_t *sorted = NULL;
    if (!sym || !code || !len) { r = MVC_ERR_NOMEM; goto out; }
    int64_t kk = huf_read_table(&p, end, w, sym, len);
    if (kk < 0) { r = (int)kk; goto out; }
    uint32_t k = (uint32_t)kk;
    unsigned maxlen = 0;
    for (uint32_t j = 0; j < k; j++) maxlen = len[j] > maxlen ? len[j] : maxlen;
    huf_canonical_codes((int)k, len, code);

    const int ns = n >= MIN_SPLIT ? 4 : 1;
    const size_t q = (n + (size_t)ns - 1) / (size_t)ns;
    bstream s[4];
    size_t left;
    if (ns == 4 && end - p < 12) { r = MVC_ERR_TRUNCATED; goto out; }
    const uint8_t *sp = p + (ns == 4 ? 12 : 0);
    left = (size_t)(end - sp);
    for (int x = 0; x < ns; x++) {
        size_t sz = left;
        if (x < ns - 1) { uint32_t b; memcpy(&b, p + 4 * x, 4); sz = b; }
        if (sz > left) { r = MVC_ERR_TRUNCATED; goto out; }
        size_t cnt = ns == 4 ? (x < 3 ? q : n - 3 * q) : n;
        s[x].p = sp; s[x].len = sz; s[x].pos = 0;
        s[x].o = dst + (size_t)x * q * (size_t)w; s[x].end = s[x].o + cnt * (size_t)w;
        sp += sz; left -= sz;
    }
    if (w == 1) {
        tab = malloc(sizeof(uint64_t) << LMAX1);
        if (!tab) { r = MVC_ERR_NOMEM; goto out; }
        build_table1((int)k, sym, len, code, tab);
        r = decode_streams1(s, ns, tab);
    } else {
        canon c;
        unsigned tb;
        uint32_t *t2;
        r = build_table2(k, sym, len, code, maxlen, &t2, &tb, &c, &sorted);
        tab = t2;
        if (r == MVC_OK) r = decode_streams2(s, ns, t2, tb, &c);
    }
out:
    free(sym); free(code); free(len); free(tab); free(sorted);
    return r;
}

int mvc_huf_decode_block(const uint8_t *src, size_t len, void *dst, size_t n, int w) {
    if ((w != 1 && w != 2) || n > MAX_BLOCK) return MVC_ERR_ARG;
    if (n == 0) return len == 0 ? MVC_OK : MVC_ERR_CORRUPT;
    if (len == 0) return MVC_ERR_TRUNCATED;
    switch (src[0]) {
    case MODE_RAW:
        if (len != 1 + n * (size_t)w) return MVC_ERR_TRUNCATED;
        memcpy(dst, src + 1, n * (size_t)w);
        return MVC_OK;
    case MODE_CONST:
        if (len != 1 + (size_t)w) return MVC_ERR_TRUNCATED;
        if (w == 1) memset(dst, src[1], n);
        else for (size_t i = 0; i < n; i++) memcpy((uint8_t *)dst + 2 * i, src + 1, 2);
        return MVC_OK;
    case MODE_HUF:
        return decode_huf(src + 1, src + len, dst, n, w);
    default:
        return MVC_ERR_CORRUPT;
    }
}
