/* Interleaved static rANS (see rans.h), after Fabian Giesen's public-domain
 * rans_word: 32 states x in [L, L << 16), L = 2^16; symbol with frequency f and
 * cumulative start c: decode x' = f * (x >> 12) + (x & 4095) - c, then pull a
 * 16-bit word if x' < L.  Small states in many lanes decode with SIMD gathers
 * (rans_kernels.c).  The encoder runs backwards, divides by reciprocal
 * multiplication, and writes words from the end of its buffer.  Mode 4 (eight
 * 64-bit states, 32-bit words) is decoded for blocks written before mode 5. */
#include <stdlib.h>
#include <string.h>
#include "status.h"
#include "rans.h"
#include "huffman.h"
#include "internal/huf_common.h"
#include "internal/rans_kernels.h"

#define SCALE 12
#define TOTAL (1u << SCALE)
#define RL (1ull << 31) /* mode 4 */
#define NST 8          /* mode 4 */
#define NL R32_LANES

size_t mvc_rans_bound(size_t n) { return 1 + 2 + 256 * 3 + 4 * NL + n + n / 2 + 64; }

typedef struct { uint64_t m; uint32_t x_max, start, cmpl, one; } encsym;

/* x / freq for a state x < 2^32, exactly. ryg_rans's 32-bit reciprocal (rcp and shift) is exact
 * only for x < 2^31, and these states reach 2^20 * freq: a frequency above 2896 with an
 * unlucky rounding of its reciprocal then wrote a step the decoder cannot invert (a block that
 * never decodes). Lemire's M = 2^64 / freq rounded up gives the exact quotient of every 32-bit
 * x as the high half of M * x (freq 1: M would wrap, the quotient is x itself). */
static inline uint32_t enc_quot(const encsym *e, uint32_t x) {
#ifdef __SIZEOF_INT128__
    return (uint32_t)(((unsigned __int128)e->m * x) >> 64) + x * e->one;
#else
    return e->one ? x : (uint32_t)(x / (uint32_t)(TOTAL - e->cmpl));
#endif
}

/* ryg_rans's RansEncSymbolInit for 16-bit words: x_max is the largest state that stays below
 * L << 16 after encoding. */
static void encsym_init(encsym *s, uint32_t start, uint32_t freq) {
    s->x_max = ((R32_L >> SCALE) << 16) * freq;
    s->cmpl = TOTAL - freq;
    s->start = start;
    s->one = freq == 1;
    s->m = freq == 1 ? 0 : UINT64_MAX / freq + 1;
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
    st16(ptr - 2, (uint16_t)(x)); ptr -= 2 * c_; (x) = c_ ? (x) >> 16 : (x); \
    (x) = (x) + e_->start + enc_quot(e_, (x)) * e_->cmpl; } while (0)

int64_t rans_encode_counts(const uint8_t *src, size_t n, const uint64_t *cnt, uint8_t *dst, size_t cap) {
    uint32_t freq[256];
    normalize(cnt, n, freq);
    int k;
    size_t tsize = table_size(freq, &k);
    if (k < 2) return MVC_ERR_ARG;
    encsym es[256];
    uint32_t acc = 0;
    for (int v = 0; v < 256; v++) { if (freq[v]) encsym_init(&es[v], acc, freq[v]); acc += freq[v]; }

    /* Words go backwards from the end of dst; moved behind the header after.
     * Symbol i takes state i mod NL; the decoder reads a group's words in lane
     * order, so the encoder visits groups, and lanes within them, backwards. */
    uint8_t *end = dst + cap, *ptr = end;
    uint8_t *floor_ = dst + 3 + tsize + 4 * NL;
    uint32_t x[NL];
    for (int s = 0; s < NL; s++) x[s] = R32_L;
    size_t i = n;
    if (i % NL && ptr - floor_ < 2 * NL) return MVC_ERR_CAPACITY;
    for (; i % NL; ) { i--; EPUT(x[i % NL], src[i]); }
    for (; i; i -= NL) {
        if (ptr - floor_ < 2 * NL) return MVC_ERR_CAPACITY; /* NL words at most */
        const uint8_t *g = src + i - NL;
        for (int s = NL - 1; s >= 0; s--) EPUT(x[s], g[s]);
    }
    size_t wbytes = (size_t)(end - ptr);
    uint8_t *o = dst;
    *o++ = MODE_RANS32;
    o = varint_put(o, (uint32_t)k);
    for (int v = 0, prev = 0; v < 256; v++)
        if (freq[v]) { o = varint_put(o, (uint32_t)(v - prev)); o = varint_put(o, freq[v] - 1); prev = v + 1; }
    for (int s = 0; s < NL; s++) { st32(o, x[s]); o += 4; }
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
    return (int64_t)(1 + tsize + 4 * NL + 2 * ((uint64_t)(bits / 16) + 1));
}

int64_t mvc_rans_estimate(const uint8_t *src, size_t n) {
    if (n == 0 || n > MAX_BLOCK) return MVC_ERR_ARG;
    uint64_t cnt[256];
    rans_count(src, n, cnt);
    return rans_estimate_counts(cnt, n);
}

/* The frequency table of modes 4 and 5, as a slot -> symbol | freq << 8 |
 * (slot - start) << 20 lookup of TOTAL entries (malloc'd into *tab_out). */
static int read_table(const uint8_t **pp, const uint8_t *end, uint32_t **tab_out) {
    uint32_t k, gap, fm1;
    int r = varint_get32(pp, end, &k);
    if (r) return r;
    if (k < 2 || k > 256) return MVC_ERR_CORRUPT;
    uint32_t freq[256] = {0};
    uint32_t total = 0;
    for (uint32_t j = 0, v = 0; j < k; j++) {
        if ((r = varint_get32(pp, end, &gap)) || (r = varint_get32(pp, end, &fm1))) return r;
        if (gap >= 256 || v + gap >= 256 || fm1 >= TOTAL) return MVC_ERR_CORRUPT;
        v += gap;
        freq[v] = fm1 + 1;
        total += freq[v];
        if (total > TOTAL) return MVC_ERR_CORRUPT;
        v++;
    }
    if (total != TOTAL) return MVC_ERR_CORRUPT;
    uint32_t *tab = malloc(sizeof(uint32_t) * TOTAL);
    if (!tab) return MVC_ERR_NOMEM;
    for (uint32_t v = 0, acc = 0; v < 256; v++) {
        for (uint32_t j = 0; j < freq[v]; j++) tab[acc + j] = v | (freq[v] << 8) | (j << 20);
        acc += freq[v];
    }
    *tab_out = tab;
    return MVC_OK;
}

/* Mode 4: eight 64-bit states, 32-bit words (blocks written before mode 5). */
static int decode_mode4(const uint8_t *p, const uint8_t *end, const uint32_t *tab, uint8_t *dst, size_t n) {
    if ((size_t)(end - p) < 8 * NST) return MVC_ERR_TRUNCATED;
    uint64_t x0, x1, x2, x3, x4, x5, x6, x7;
    memcpy(&x0, p, 8); memcpy(&x1, p + 8, 8); memcpy(&x2, p + 16, 8); memcpy(&x3, p + 24, 8);
    memcpy(&x4, p + 32, 8); memcpy(&x5, p + 40, 8); memcpy(&x6, p + 48, 8); memcpy(&x7, p + 56, 8);
    p += 8 * NST;
    if (((size_t)(end - p)) % 4) return MVC_ERR_TRUNCATED;
    const uint8_t *w = p;
    size_t i = 0;
    /* Eight symbols take at most eight words, so check once per group. */
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
            if ((size_t)(end - w) < 4) return MVC_ERR_TRUNCATED;
            x = (x << 32) | ld32(w); w += 4;
        }
        *xs[i & (NST - 1)] = x;
    }
    /* The encoder started every state at L: anything else means corruption. */
    if ((x0 ^ RL) | (x1 ^ RL) | (x2 ^ RL) | (x3 ^ RL) | (x4 ^ RL) | (x5 ^ RL) | (x6 ^ RL) | (x7 ^ RL))
        return MVC_ERR_CORRUPT;
    return w == end ? MVC_OK : MVC_ERR_TRUNCATED;
}

/* Mode 5: NL 32-bit states, 16-bit words; whole groups in a SIMD kernel. */
static int decode_mode5(const uint8_t *p, const uint8_t *end, const uint32_t *tab, uint8_t *dst,
                        size_t n, int kernel) {
    if ((size_t)(end - p) < 4 * NL) return MVC_ERR_TRUNCATED;
    uint32_t x[NL];
    for (int s = 0; s < NL; s++) x[s] = ld32(p + 4 * s);
    p += 4 * NL;
    if (((size_t)(end - p)) % 2) return MVC_ERR_TRUNCATED;
    const uint8_t *w = p;
    /* A state below L would read words out of lane order (and x >> 12 loses
     * bits above 2^32 never): corrupt either way. */
    for (int s = 0; s < NL; s++) if (x[s] < R32_L) return MVC_ERR_CORRUPT;
    size_t i = r32_decode_groups(kernel, x, tab, &w, end, dst, n);
    for (; i < n; i++) {
        uint32_t s = x[i % NL];
        const uint32_t t = tab[s & (TOTAL - 1)];
        dst[i] = (uint8_t)t;
        s = ((t >> 8) & 0xfff) * (s >> SCALE) + (t >> 20);
        if (s < R32_L) {
            if ((size_t)(end - w) < 2) return MVC_ERR_TRUNCATED;
            s = (s << 16) | ld16(w); w += 2;
        }
        x[i % NL] = s;
    }
    uint32_t bad = 0;
    for (int s = 0; s < NL; s++) bad |= x[s] ^ R32_L;
    if (bad) return MVC_ERR_CORRUPT;
    return w == end ? MVC_OK : MVC_ERR_TRUNCATED;
}

unsigned mvc_rans_kernels(void) { return r32_supported(); }

/* ---- mode-5 blocks of the encoder before the exact quotient ------------
 * That encoder divided by ryg_rans's 32-bit reciprocal (rcp, shift), exact only for states below
 * 2^31. For a symbol d of frequency f > 2896 (at most one per block) a state x = Q f - 1 whose
 * quotient came out as Q instead of Q - 1 (a "bad" Q) was written as Q M + start_d - 1: the slot
 * just below d's range, where the exact decoder reads the symbol before d. Such a block never
 * decodes, but the data is there: at a slot start_d - 1 whose Q is bad, the step is either that
 * symbol's (remainder f_p - 1) or d's bad one. The search below takes the first and comes back for
 * the second; a path dies where it meets a step the old encoder could not have written (d's last
 * slot with a bad Q + 1) or a stream that does not end exactly where every state is L. What it
 * finds is accepted only if the old encoder, run again on it, writes the block byte for byte, and
only if it is the one input that does: that encoder could write two inputs as one block. */

static uint64_t recovery_counts[2];   /* recovered, ambiguous */

void mvc_rans_recovery_counts(uint64_t *out) {
    out[0] = __atomic_load_n(&recovery_counts[0], __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&recovery_counts[1], __ATOMIC_RELAXED);
}

typedef struct { uint64_t rcp; uint32_t shift; } oldrcp;

static oldrcp old_reciprocal(uint32_t freq) {
    uint32_t shift = 0;
    while (freq > (1u << shift)) shift++;
    oldrcp o = { ((1ull << (shift + 31)) + freq - 1) / freq, shift - 1 + 32 };
    return o;
}

/* The old encoder's quotient for state x (< 2^32) and a frequency >= 2. */
static inline uint32_t old_quot(oldrcp o, uint32_t x) { return (uint32_t)(((uint64_t)x * o.rcp) >> o.shift); }

/* Whether the old encoder wrote x = q f - 1 (q < 2^20) with quotient q, one too high. */
static inline int bad_q(oldrcp o, uint32_t f, uint64_t q) {
    if (q == 0 || q >= (1u << 20)) return 0;
    return old_quot(o, (uint32_t)(q * f - 1)) == q;
}

/* The old encoder's block for src, compared with blk: 1 when identical. */
static int old_encoder_wrote(const uint8_t *src, size_t n, const uint8_t *blk, size_t len) {
    uint64_t cnt[256];
    uint32_t freq[256], start[256];
    rans_count(src, n, cnt);
    normalize(cnt, n, freq);
    int k;
    size_t tsize = table_size(freq, &k);
    size_t hdr = 1 + tsize + 4 * NL;
    if (k < 2 || len < hdr || (len - hdr) % 2) return 0;
    oldrcp o[256];
    for (uint32_t v = 0, acc = 0; v < 256; v++) {
        start[v] = acc;
        if (freq[v] >= 2) o[v] = old_reciprocal(freq[v]);
        acc += freq[v];
    }
    size_t wlen = len - hdr;
    const uint8_t *words = blk + hdr;   /* the old block's words: compared as they are written */
    size_t wpos = wlen;
    uint32_t x[NL];
    for (int s = 0; s < NL; s++) x[s] = R32_L;
    for (size_t i = n; i-- > 0;) {
        uint32_t *xs = &x[i % NL];
        const uint32_t v = src[i], f = freq[v];
        if (*xs >= ((R32_L >> SCALE) << 16) * f) {
            if (wpos < 2 || ld16(words + wpos - 2) != (uint16_t)*xs) return 0;
            wpos -= 2;
            *xs >>= 16;
        }
        const uint32_t q = f >= 2 ? old_quot(o[v], *xs) : *xs;
        *xs = *xs + start[v] + q * (TOTAL - f);
    }
    if (wpos != 0 || blk[0] != MODE_RANS32) return 0;
    uint8_t head[1 + 2 + 256 * 3], *h = head;   /* the table as the encoder writes it */
    h = varint_put(h, (uint32_t)k);
    for (int v = 0, prev = 0; v < 256; v++)
        if (freq[v]) { h = varint_put(h, (uint32_t)(v - prev)); h = varint_put(h, freq[v] - 1); prev = v + 1; }
    if ((size_t)(h - head) != tsize || memcmp(head, blk + 1, tsize)) return 0;
    for (int s = 0; s < NL; s++) if (ld32(blk + 1 + tsize + 4 * s) != x[s]) return 0;
    return 1;
}

typedef struct { size_t i; const uint8_t *w; uint32_t x[NL]; uint32_t alt; } branch;

/* A decoded state y into *x, pulling the next word when y < L; 0 when none is left. */
static inline int renorm(uint32_t y, const uint8_t **w, const uint8_t *end, uint32_t *x) {
    if (y < R32_L) {
        if ((size_t)(end - *w) < 2) return 0;
        y = (y << 16) | ld16(*w);
        *w += 2;
    }
    *x = y;
    return 1;
}

/* Search for the data the old encoder wrote as this mode-5 block (see above). */
static int recover_mode5(const uint8_t *blk, const uint8_t *p, const uint8_t *end, const uint32_t *tab,
                         uint8_t *dst, size_t n) {
    if ((size_t)(end - p) < 4 * NL || ((size_t)(end - p - 4 * NL)) % 2) return MVC_ERR_CORRUPT;
    uint32_t d = 256, fd = 0, sd = 0;
    for (uint32_t slot = 0; slot < TOTAL;) {
        const uint32_t t = tab[slot], f = (t >> 8) & 0xfff;
        if (f > 2896) { d = t & 0xff; fd = f; sd = slot; }
        slot += f;
    }
    if (d == 256) return MVC_ERR_CORRUPT;
    const oldrcp od = old_reciprocal(fd);
    /* rcp f = 2^s + e: the quotient of q f - 1 comes out q when q e >= rcp, for some q < 2^20
     * only at 383 frequencies (the lowest 2964); any other block is simply corrupt. */
    if (((1ull << 20) - 1) * (od.rcp * fd - (1ull << od.shift)) < od.rcp) return MVC_ERR_CORRUPT;
    const uint32_t below = (sd + TOTAL - 1) & (TOTAL - 1), last = sd + fd - 1;
    uint32_t x[NL];
    for (int s = 0; s < NL; s++) if ((x[s] = ld32(p + 4 * s)) < R32_L) return MVC_ERR_CORRUPT;
    const uint8_t *w = p + 4 * NL;
    size_t cap = 64, top = 0, i = 0;
    branch *stack = malloc(cap * sizeof *stack);
    if (!stack) return MVC_ERR_NOMEM;
    uint8_t *first = malloc(n ? n : 1);
    if (!first) { free(stack); return MVC_ERR_NOMEM; }
    uint64_t budget = 64 * (uint64_t)n + (1u << 20);
    int found = 0, complete = 0, r = MVC_ERR_CORRUPT;
    for (;;) {
        int dead = 0;
        if (i == n) {
            uint32_t bad = 0;
            for (int s = 0; s < NL; s++) bad |= x[s] ^ R32_L;
            if (!bad && w == end && old_encoder_wrote(dst, n, blk, (size_t)(end - blk))) {
                /* Keep searching: that encoder could write two inputs as one block (a bad step
                 * of d and the step of the symbol below it meet in one state), and then the
                 * block does not say which it was. */
                if (++found > 1) break;
                memcpy(first, dst, n);
            }
            dead = 1;
        } else if (budget-- == 0) {
            break;
        } else {
            uint32_t *xs = &x[i % NL];
            const uint32_t s = *xs, slot = s & (TOTAL - 1), t = tab[slot];
            if ((t & 0xff) == d && slot == last && bad_q(od, fd, (uint64_t)(s >> SCALE) + 1)) {
                dead = 1;   /* the old encoder never wrote this state for d */
            } else {
                if (slot == below && (t & 0xff) != d) {
                    const uint64_t q = ((uint64_t)s + 1 - sd) >> SCALE;
                    if (bad_q(od, fd, q)) {   /* or d's bad step: come back for it */
                        if (top == cap) {
                            branch *more = cap > SIZE_MAX / 2 / sizeof *stack ? NULL
                                         : realloc(stack, 2 * cap * sizeof *stack);
                            if (!more) { r = MVC_ERR_NOMEM; break; }
                            stack = more; cap *= 2;
                        }
                        branch *b = &stack[top++];
                        b->i = i; b->w = w; b->alt = (uint32_t)(q * fd - 1);
                        memcpy(b->x, x, sizeof x);
                    }
                }
                dst[i] = (uint8_t)t;
                dead = !renorm(((t >> 8) & 0xfff) * (s >> SCALE) + (t >> 20), &w, end, xs);
                i++;
            }
        }
        if (!dead) continue;
        for (;;) {   /* back to the latest step not yet tried as d's (dead too if words run out) */
            if (top == 0) { complete = 1; goto done; }
            const branch *b = &stack[--top];
            i = b->i; w = b->w;
            memcpy(x, b->x, sizeof x);
            dst[i] = (uint8_t)d;
            if (renorm(b->alt, &w, end, &x[i % NL])) { i++; break; }
        }
    }
done:
    /* Only a whole search that found exactly one input is an answer. */
    if (r == MVC_ERR_CORRUPT && found == 1 && complete) {
        memcpy(dst, first, n);
        r = MVC_OK;
        __atomic_fetch_add(&recovery_counts[0], 1, __ATOMIC_RELAXED);
    } else if (found > 1) {
        __atomic_fetch_add(&recovery_counts[1], 1, __ATOMIC_RELAXED);
        r = MVC_ERR_AMBIGUOUS;
    }
    free(first);
    free(stack);
    return r;
}

int mvc_rans_decode_with(const uint8_t *src, size_t len, uint8_t *dst, size_t n, int kernel) {
    if (n > MAX_BLOCK || kernel < R32_AUTO || kernel > R32_AVX512) return MVC_ERR_ARG;
    if (kernel != R32_AUTO && !((r32_supported() >> kernel) & 1)) return MVC_ERR_ARG;
    if (n == 0 || len == 0 || (src[0] != MODE_RANS && src[0] != MODE_RANS32))
        return mvc_huf_decode_block(src, len, dst, n, 1);
    const uint8_t *p = src + 1, *end = src + len;
    uint32_t *tab = NULL;
    int r = read_table(&p, end, &tab);
    if (r) return r;
    r = src[0] == MODE_RANS ? decode_mode4(p, end, tab, dst, n) : decode_mode5(p, end, tab, dst, n, kernel);
    if (r && r != MVC_ERR_NOMEM && src[0] == MODE_RANS32) {
        int rr = recover_mode5(src, p, end, tab, dst, n);
        if (rr == MVC_OK || rr == MVC_ERR_NOMEM || rr == MVC_ERR_AMBIGUOUS) r = rr;
    }
    free(tab);
    return r;
}

int mvc_rans_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n) {
    return mvc_rans_decode_with(src, len, dst, n, R32_AUTO);
}
