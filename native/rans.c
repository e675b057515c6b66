/* Interleaved static rANS (see rans.h), after Fabian Giesen's public-domain
 * rans64: state x in [L, L << 32), L = 2^31; symbol with frequency f and
 * cumulative start c: decode x' = f * (x >> 12) + (x & 4095) - c, then pull a
 * 32-bit word if x' < L.  The encoder runs backwards, divides by reciprocal
 * multiplication, and writes words from the end of its buffer. */
#include <stdlib.h>
#include <string.h>
#include "status.h"
#include "rans.h"
#include "huffman.h"
#include "internal/huf_common.h"

#define SCALE 12
#define TOTAL (1u << SCALE)
#define RL (1ull << 31)
#define NST 8

size_t mvc_rans_bound(size_t n) { return 1 + 2 + 256 * 3 + 8 * NST + n + n / 2 + 64; }

typedef struct { uint64_t x_max, rcp; uint32_t bias, cmpl; unsigned shift; } encsym;

static void encsym_init(encsym *s, uint32_t start, uint32_t freq) {
    s->x_max = ((RL >> SCALE) << 32) * freq;
    s->cmpl = TOTAL - freq;
    if (freq < 2) { s->rcp = ~0ull; s->shift = 0; s->bias = start + TOTAL - 1; return; }
    unsigned shift = 0;
    while (freq > (1u << shift)) shift++;
    uint64_t x0 = freq - 1, x1 = 1ull << (shift + 31);
    uint64_t t1 = x1 / freq;
    x0 += (x1 % freq) << 32;
    uint64_t t0 = x0 / freq;
    s->rcp = t0 + (t1 << 32);
    s->shift = shift - 1;
    s->bias = start;
}

static inline uint64_t mulhi64(uint64_t a, uint64_t b) {
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
}

/* Byte counts, four tables fed in turn (runs of one value do not serialize). */
static void rans_count(const uint8_t *src, size_t n, uint64_t *cnt) {
    uint32_t h[4][256];
    memset(h, 0, sizeof h);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) { h[0][src[i]]++; h[1][src[i + 1]]++; h[2][src[i + 2]]++; h[3][src[i + 3]]++; }
    for (; i < n; i++) h[0][src[i]]++;
    for (int v = 0; v < 256; v++) cnt[v] = (uint64_t)h[0][v] + h[1][v] + h[2][v] + h[3][v];
}

/* Normalize counts to frequencies summing to TOTAL, each present symbol >= 1. */
static void normalize(const uint64_t *cnt, uint64_t n, uint32_t *freq) {
    int64_t sum = 0;
    int top = 0;
    for (int v = 0; v < 256; v++) {
        freq[v] = 0;
        if (!cnt[v]) continue;
        uint64_t f = (cnt[v] * TOTAL + n / 2) / n;
        freq[v] = f ? (uint32_t)f : 1;
        sum += freq[v];
        if (cnt[v] > cnt[top]) top = v;
    }
    /* Settle the rounding error on the symbols that can best absorb it. */
    while (sum != TOTAL) {
        int best = -1;
        for (int v = 0; v < 256; v++) {
            if (!freq[v] || (sum > TOTAL && freq[v] == 1)) continue;
            if (best < 0 || freq[v] > freq[best]) best = v;
        }
        int64_t d = (int64_t)TOTAL - sum;
        int64_t room = sum > TOTAL ? -(int64_t)(freq[best] - 1) : d;
        int64_t step = sum > TOTAL ? (d > room ? d : room) : d;
        freq[best] = (uint32_t)((int64_t)freq[best] + step);
        sum += step;
    }
    (void)top;
}

static size_t table_size(const uint32_t *freq, int *k_out) {
    size_t s = 0; int k = 0, prev = 0;
    for (int v = 0; v < 256; v++)
        if (freq[v]) { s += varint_size((uint32_t)(v - prev)) + varint_size(freq[v] - 1); prev = v + 1; k++; }
    *k_out = k;
    return s + varint_size((uint32_t)k);
}

/* One backward encoding step of state x for symbol e; a word goes below *ptr
 * when x must shrink first.  Branch-free: the word is stored either way (the
 * caller guarantees room), and kept only if the state renormalizes. */
#define EPUT(x, sym) do { const encsym *e_ = &es[sym]; const int c_ = (x) >= e_->x_max; \
    const uint32_t w_ = (uint32_t)(x); memcpy(ptr - 4, &w_, 4); ptr -= 4 * c_; \
    (x) = c_ ? (x) >> 32 : (x); \
    (x) = (x) + e_->bias + (mulhi64((x), e_->rcp) >> e_->shift) * e_->cmpl; } while (0)

int64_t rans_encode_counts(const uint8_t *src, size_t n, const uint64_t *cnt, uint8_t *dst, size_t cap) {
    uint32_t freq[256];
    normalize(cnt, n, freq);
    int k;
    size_t tsize = table_size(freq, &k);
    if (k < 2) return MVC_ERR_ARG;
    encsym es[256];
    uint32_t acc = 0;
    for (int v = 0; v < 256; v++) { if (freq[v]) encsym_init(&es[v], acc, freq[v]); acc += freq[v]; }

    /* Words go backwards from the end of dst; moved behind the header after. */
    uint8_t *end = dst + cap, *ptr = end;
    uint8_t *floor_ = dst + 3 + tsize + 8 * NST;
    uint64_t x[NST];
    for (int s = 0; s < NST; s++) x[s] = RL;
    size_t i = n;
    /* The ragged end first (symbol i takes state i mod 8), then whole groups of
     * eight with the states in registers: the same words in the same order. */
    for (; i % NST; ) {
        i--;
        const encsym *e = &es[src[i]];
        uint64_t *xs = &x[i & (NST - 1)];
        if (*xs >= e->x_max) {
            if (ptr - floor_ < 4) return MVC_ERR_CAPACITY;
            uint32_t word = (uint32_t)*xs;
            ptr -= 4; memcpy(ptr, &word, 4); *xs >>= 32;
        }
        uint64_t q = mulhi64(*xs, e->rcp) >> e->shift;
        *xs = *xs + e->bias + q * e->cmpl;
    }
    uint64_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3], x4 = x[4], x5 = x[5], x6 = x[6], x7 = x[7];
    for (; i; i -= NST) {
        if (ptr - floor_ < 4 * NST) return MVC_ERR_CAPACITY; /* eight words at most */
        const uint8_t *g = src + i - NST;
        EPUT(x7, g[7]); EPUT(x6, g[6]); EPUT(x5, g[5]); EPUT(x4, g[4]);
        EPUT(x3, g[3]); EPUT(x2, g[2]); EPUT(x1, g[1]); EPUT(x0, g[0]);
    }
    x[0] = x0; x[1] = x1; x[2] = x2; x[3] = x3; x[4] = x4; x[5] = x5; x[6] = x6; x[7] = x7;
    size_t wbytes = (size_t)(end - ptr);
    uint8_t *o = dst;
    *o++ = MODE_RANS;
    o = varint_put(o, (uint32_t)k);
    for (int v = 0, prev = 0; v < 256; v++)
        if (freq[v]) { o = varint_put(o, (uint32_t)(v - prev)); o = varint_put(o, freq[v] - 1); prev = v + 1; }
    for (int s = 0; s < NST; s++) { memcpy(o, &x[s], 8); o += 8; }
    memmove(o, ptr, wbytes);
    return (int64_t)(o - dst) + (int64_t)wbytes;
}

int64_t mvc_rans_encode(const uint8_t *src, size_t n, uint8_t *dst, size_t cap) {
    if (n == 0 || n > MAX_BLOCK || cap < mvc_rans_bound(n)) return MVC_ERR_ARG;
    uint64_t cnt[256];
    rans_count(src, n, cnt);
    return rans_encode_counts(src, n, cnt, dst, cap);
}

/* log2 of x >= 1 without libm: y = (x-1)/(x+1) after scaling x into [1, 2). */
static double log2_of(double x) {
    int e = 0;
    while (x >= 2.0) { x *= 0.5; e++; }
    double y = (x - 1.0) / (x + 1.0), y2 = y * y, ln = 0, term = y;
    for (int k = 1; k <= 15; k += 2) { ln += term / k; term *= y2; }
    return e + 2.0 * ln / 0.69314718055994530942;
}

int64_t rans_estimate_counts(const uint64_t *cnt, size_t n) {
    uint32_t freq[256];
    normalize(cnt, n, freq);
    int k;
    size_t tsize = table_size(freq, &k);
    if (k < 2) return MVC_ERR_ARG;
    double bits = 0;
    for (int v = 0; v < 256; v++)
        if (cnt[v]) bits += (double)cnt[v] * (SCALE - log2_of((double)freq[v]));
    return (int64_t)(1 + tsize + 8 * NST + 4 * ((uint64_t)(bits / 32) + 1));
}

int64_t mvc_rans_estimate(const uint8_t *src, size_t n) {
    if (n == 0 || n > MAX_BLOCK) return MVC_ERR_ARG;
    uint64_t cnt[256];
    rans_count(src, n, cnt);
    return rans_estimate_counts(cnt, n);
}

int mvc_rans_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n) {
    if (n > MAX_BLOCK) return MVC_ERR_ARG;
    if (n == 0 || len == 0 || src[0] != MODE_RANS) return mvc_huf_decode_block(src, len, dst, n, 1);
    const uint8_t *p = src + 1, *end = src + len;
    uint32_t k, gap, fm1;
    int r = varint_get32(&p, end, &k);
    if (r) return r;
    if (k < 2 || k > 256) return MVC_ERR_CORRUPT;
    uint32_t freq[256] = {0};
    uint32_t total = 0;
    for (uint32_t j = 0, v = 0; j < k; j++) {
        if ((r = varint_get32(&p, end, &gap)) || (r = varint_get32(&p, end, &fm1))) return r;
        if (gap >= 256 || v + gap >= 256 || fm1 >= TOTAL) return MVC_ERR_CORRUPT;
        v += gap;
        freq[v] = fm1 + 1;
        total += freq[v];
        if (total > TOTAL) return MVC_ERR_CORRUPT;
        v++;
    }
    if (total != TOTAL) return MVC_ERR_CORRUPT;
    /* slot -> symbol | freq << 8 | (slot - start) << 20 */
    uint32_t *tab = malloc(sizeof(uint32_t) * TOTAL);
    if (!tab) return MVC_ERR_NOMEM;
    for (uint32_t v = 0, acc = 0; v < 256; v++) {
        for (uint32_t j = 0; j < freq[v]; j++) tab[acc + j] = v | (freq[v] << 8) | (j << 20);
        acc += freq[v];
    }
    if ((size_t)(end - p) < 8 * NST) { free(tab); return MVC_ERR_TRUNCATED; }
    uint64_t x0, x1, x2, x3, x4, x5, x6, x7;
    memcpy(&x0, p, 8); memcpy(&x1, p + 8, 8); memcpy(&x2, p + 16, 8); memcpy(&x3, p + 24, 8);
    memcpy(&x4, p + 32, 8); memcpy(&x5, p + 40, 8); memcpy(&x6, p + 48, 8); memcpy(&x7, p + 56, 8);
    p += 8 * NST;
    if (((size_t)(end - p)) % 4) { free(tab); return MVC_ERR_TRUNCATED; }
    const uint8_t *w = p;
    size_t i = 0;
    /* Fast path: eight symbols take at most eight words, so check once per
     * group.  (A branch-free form, every candidate word loaded and selected,
     * measured 20% slower here: it chains each state's word to the others'.) */
#define RSTEP(x, i) do { const uint32_t t_ = tab[x & (TOTAL - 1)]; dst[i] = (uint8_t)t_; \
        x = (uint64_t)((t_ >> 8) & 0xfff) * (x >> SCALE) + (t_ >> 20); \
        if (x < RL) { x = (x << 32) | ld32(w); w += 4; } } while (0)
    for (; i + NST <= n && (size_t)(end - w) >= 4 * NST; i += NST) {
        RSTEP(x0, i); RSTEP(x1, i + 1); RSTEP(x2, i + 2); RSTEP(x3, i + 3);
        RSTEP(x4, i + 4); RSTEP(x5, i + 5); RSTEP(x6, i + 6); RSTEP(x7, i + 7);
    }
#undef RSTEP
    uint64_t *xs[NST] = {&x0, &x1, &x2, &x3, &x4, &x5, &x6, &x7};
    for (; i < n; i++) {
        uint64_t x = *xs[i & (NST - 1)];
        uint32_t t = tab[x & (TOTAL - 1)];
        dst[i] = (uint8_t)t;
        x = (uint64_t)((t >> 8) & 0xfff) * (x >> SCALE) + (t >> 20);
        if (x < RL) {
            if ((size_t)(end - w) < 4) { free(tab); return MVC_ERR_TRUNCATED; }
            uint32_t u; memcpy(&u, w, 4); w += 4; x = (x << 32) | u;
        }
        *xs[i & (NST - 1)] = x;
    }
    free(tab);
    /* The encoder started every state at L: anything else means corruption. */
    if ((x0 ^ RL) | (x1 ^ RL) | (x2 ^ RL) | (x3 ^ RL) | (x4 ^ RL) | (x5 ^ RL) | (x6 ^ RL) | (x7 ^ RL))
        return MVC_ERR_CORRUPT;
    return w == end ? MVC_OK : MVC_ERR_TRUNCATED;
}
