/* In-place delta-chain walker with block-count select (see chain.h). */
#include <stdlib.h>
#include <string.h>
#include "status.h"
#include "chain.h"
#include "groups.h"
#include "internal/qd_groups.h"

#define BLOCK 256u            /* levels per block: counts fit in uint16 */
#define WORDS (BLOCK / 8u)
#define NLEV 256u
#define DENSE_DIVISOR 8u      /* more than n / 8 symbols (~5% changed) in a step: one dense pass is cheaper */

struct mvc_chain {
    uint8_t *lv;              /* n levels, padded to whole blocks */
    uint8_t *tmp;             /* dense steps write here, then swap */
    size_t n, nblocks;
    uint16_t *cnt;            /* cnt[g * nblocks + b]: levels == g in block b, g < nlev */
    uint32_t nlev;            /* levels the count table covers (>= every level present) */
    int stale;                /* cnt does not describe lv: rebuilt before a sparse step needs it */
    uint8_t *delta;           /* dense steps expand their deltas here */
    uint64_t tot[NLEV];
    uint32_t *ev_pos;         /* one step's changes, applied after all are found */
    uint8_t *ev_val;
    size_t ev_cap;
    int broken;
};

static uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Rebuild the block counts; group-major, so a group's walk over blocks is sequential. */
static void recount(mvc_chain *c) {
    uint16_t h[NLEV];
    for (size_t b = 0; b < c->nblocks; b++) {
        memset(h, 0, sizeof h);
        size_t lo = b * BLOCK, hi = lo + BLOCK < c->n ? lo + BLOCK : c->n;
        for (size_t i = lo; i < hi; i++) h[c->lv[i]]++;
        for (uint32_t g = 0; g < c->nlev; g++) c->cnt[(size_t)g * c->nblocks + b] = h[g];
    }
    c->stale = 0;
}

/* Totals per level, after a dense step or at the start (the block counts wait:
 * a chain of dense steps never needs them). */
static int retotal(mvc_chain *c) {
    int64_t t[NLEV];
    int rc = mvc_grp_count(c->lv, c->n, 1, NLEV, t);
    if (rc < 0) return rc;
    for (uint32_t g = 0; g < NLEV; g++) c->tot[g] = (uint64_t)t[g];
    c->stale = 1;
    return MVC_OK;
}

/* Make the count table cover levels < nlev. */
static int cover(mvc_chain *c, uint32_t nlev) {
    if (nlev <= c->nlev && c->cnt) return MVC_OK;
    uint16_t *t = realloc(c->cnt, sizeof(uint16_t) * (size_t)nlev * (c->nblocks ? c->nblocks : 1));
    if (!t) return MVC_ERR_NOMEM;
    c->cnt = t;
    c->nlev = nlev;
    c->stale = 1;
    return MVC_OK;
}

mvc_chain *mvc_chain_new(const uint8_t *levels, size_t n) {
    if ((n && !levels) || n > UINT32_MAX) return NULL; /* changes are queued as uint32 positions */
    mvc_chain *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->n = n;
    c->nblocks = (n + BLOCK - 1) / BLOCK;
    size_t padded = c->nblocks * BLOCK + 8;
    c->lv = malloc(padded);
    c->tmp = malloc(padded);
    c->delta = malloc(padded);
    if (!c->lv || !c->tmp || !c->delta) { mvc_chain_free(c); return NULL; }
    /* Padding sits after every real level of the last block, so a select for
     * an occurrence that exists finds it before reaching the padding. */
    memset(c->lv, 0, padded);
    memset(c->tmp, 0, padded);
    if (n) memcpy(c->lv, levels, n);
    uint32_t top = 0;
    if (retotal(c) != MVC_OK) { mvc_chain_free(c); return NULL; }
    for (uint32_t g = 0; g < NLEV; g++) if (c->tot[g]) top = g;
    if (cover(c, top + 1) != MVC_OK) { mvc_chain_free(c); return NULL; }
    return c;
}

void mvc_chain_free(mvc_chain *c) {
    if (!c) return;
    free(c->lv); free(c->tmp); free(c->delta); free(c->cnt); free(c->ev_pos); free(c->ev_val);
    free(c);
}

int mvc_chain_levels(const mvc_chain *c, uint8_t *out, size_t n) {
    if (!c || c->broken || n != c->n || (n && !out)) return MVC_ERR_ARG;
    if (n) memcpy(out, c->lv, n);
    return MVC_OK;
}

/* High bit of each byte of w that equals the byte in pat (exact, no carries). */
static inline uint64_t eq_bytes(uint64_t w, uint64_t pat) {
    const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full;
    uint64_t x = w ^ pat;
    return ~(((x & lo7) + lo7) | x | lo7);
}

/* Set bytes of an eq_bytes mask (only high bits set): a multiply, where a
 * popcount builtin is a library call on baseline x86-64. */
static inline unsigned count_bytes(uint64_t m) {
    return (unsigned)(((m >> 7) * 0x0101010101010101ull) >> 56);
}

static int push_event(mvc_chain *c, size_t *ne, size_t pos, uint8_t v) {
    if (*ne == c->ev_cap) {
        size_t cap = c->ev_cap ? 2 * c->ev_cap : 4096;
        uint32_t *p = realloc(c->ev_pos, cap * sizeof *p);
        if (!p) return MVC_ERR_NOMEM;
        c->ev_pos = p;
        uint8_t *q = realloc(c->ev_val, cap);
        if (!q) return MVC_ERR_NOMEM;
        c->ev_val = q;
        c->ev_cap = cap;
    }
    c->ev_pos[*ne] = (uint32_t)pos;
    c->ev_val[*ne] = v;
    (*ne)++;
    return MVC_OK;
}

/* Find the positions of group g's changed members (its stream's nonzero runs),
 * by rank within the group, and queue their new levels. */
static int sparse_group(mvc_chain *c, rle_iter *it, uint32_t g, uint32_t modulus, uint32_t n_cur,
                        size_t *ne) {
    const uint16_t *cnt = c->cnt + (size_t)g * c->nblocks;
    const uint64_t pat = 0x0101010101010101ull * g;
    uint64_t rank = 0, total = c->tot[g];
    /* Select cursor: block b, word w inside it, members of g before that word. */
    size_t b = 0, w = 0;
    uint64_t before_b = 0, before_w = 0;
    uint32_t d;
    uint64_t L;
    int r;
    while ((r = rle_iter_next(it, &d, &L)) > 0) {
        if (L > total - rank) return MVC_ERR_CORRUPT; /* stream longer than the group */
        if (d == 0) { rank += L; continue; }
        if (d >= modulus) return MVC_ERR_CORRUPT;
        uint32_t v = g - d + (g < d ? modulus : 0u);
        if (v >= n_cur) return MVC_ERR_CORRUPT;
        for (uint64_t k = rank; k < rank + L; k++) {
            if (k >= before_b + cnt[b]) {
                before_b += cnt[b++];
                while (k >= before_b + cnt[b]) before_b += cnt[b++];
                w = 0;
                before_w = before_b;
            }
            const uint8_t *blk = c->lv + b * BLOCK;
            uint64_t m = eq_bytes(ld64(blk + 8 * w), pat);
            unsigned pc = count_bytes(m);
            while (k >= before_w + pc) {
                before_w += pc;
                if (++w >= WORDS) return MVC_ERR_INTERNAL; /* counts and levels disagree */
                m = eq_bytes(ld64(blk + 8 * w), pat);
                pc = count_bytes(m);
            }
            for (uint64_t j = k - before_w; j; j--) m &= m - 1;
            size_t pos = b * BLOCK + 8 * w + ((unsigned)__builtin_ctzll(m) >> 3);
            if ((r = push_event(c, ne, pos, (uint8_t)v)) < 0) return r;
        }
        rank += L;
    }
    if (r < 0) return r;
    if (rank != total) return MVC_ERR_CORRUPT; /* stream shorter than the group */
    return rle_iter_done(it);
}

static int step_sparse(mvc_chain *c, qd_groups *gs, uint32_t modulus, uint32_t n_cur) {
    size_t ne = 0;
    int rc;
    for (uint32_t g = 0; g < gs->n_prev; g++) {
        if (!gs->its[g]) continue;
        rle_iter it = *gs->its[g]; /* a local copy: its state can live in registers */
        rc = sparse_group(c, &it, g, modulus, n_cur, &ne);
        *gs->its[g] = it;
        if (rc < 0) return rc;
    }
    for (size_t e = 0; e < ne; e++) {
        size_t pos = c->ev_pos[e], b = pos / BLOCK;
        uint8_t old = c->lv[pos], v = c->ev_val[e];
        c->cnt[(size_t)old * c->nblocks + b]--;
        c->cnt[(size_t)v * c->nblocks + b]++;
        c->tot[old]--;
        c->tot[v]++;
        c->lv[pos] = v;
    }
    return MVC_OK;
}

int mvc_chain_step(mvc_chain *c, uint32_t n_prev, uint32_t modulus, uint32_t n_cur,
                   const uint8_t *sec, size_t sec_total, const uint64_t *sec_len, uint32_t nsec,
                   uint64_t *n_top) {
    if (!c || c->broken || modulus == 0 || modulus > NLEV || n_prev == 0 || n_prev > modulus
        || n_cur == 0 || n_cur > modulus || nsec != n_prev || !n_top
        || qd_sections_fit(sec, sec_total, sec_len, nsec) != MVC_OK)
        return MVC_ERR_ARG;
    for (uint32_t g = n_prev; g < NLEV; g++)
        if (c->tot[g]) return MVC_ERR_RANGE; /* not the levels this delta was made against */
    int rc = cover(c, n_prev > n_cur ? n_prev : n_cur);
    if (rc < 0) { c->broken = 1; return rc; }
    qd_groups gs;
    rc = qd_groups_open(&gs, sec, sec_len, n_prev, 1, c->n);
    if (rc == MVC_OK) {
        if (gs.symbols > c->n / DENSE_DIVISOR) {
            uint64_t top;
            int64_t counts[NLEV];
            for (uint32_t g = 0; g < n_prev; g++) counts[g] = (int64_t)c->tot[g];
            rc = qd_groups_expand(&gs, counts, 1, c->delta);
            if (rc == MVC_OK)
                rc = mvc_grp_apply(c->lv, c->delta, c->n, 1, modulus, n_cur, counts, n_prev,
                                   c->tmp, &top);
            if (rc == MVC_OK) {
                uint8_t *t = c->lv; c->lv = c->tmp; c->tmp = t;
                rc = retotal(c);
            }
        } else {
            if (c->stale) recount(c);
            rc = step_sparse(c, &gs, modulus, n_cur);
        }
    }
    qd_groups_close(&gs);
    if (rc == MVC_OK)
        for (uint32_t g = n_cur; g < NLEV; g++)
            if (c->tot[g]) rc = MVC_ERR_CORRUPT; /* a kept level the new count cannot hold */
    if (rc < 0) { c->broken = 1; return rc; }
    *n_top = c->tot[n_cur - 1];
    return MVC_OK;
}
