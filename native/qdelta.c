/* qdelta/1 level sections decoded and applied in one call (see qdelta.h).
 * With one Python call per group and stream, the interpreter took about a
 * third of every checkout step of a delta chain. */
#include <stdlib.h>
#include <string.h>
#include "status.h"
#include "groups.h"
#include "huffman.h"
#include "rle.h"
#include "internal/rle_iter.h"
#include "internal/qd_groups.h"
#include "internal/varint.h"
#include "qdelta.h"


int mvc_huf_decode_stream(const uint8_t *src, size_t len, void *dst, size_t n, int width) {
    if ((width != 1 && width != 2) || (len && !src) || (n && !dst)) return MVC_ERR_ARG;
    if (n == 0) return len == 0 ? MVC_OK : MVC_ERR_CORRUPT;
    const uint8_t *p = src, *end = src + len;
    uint64_t bs;
    int rc = varint_get(&p, end, 64, &bs);
    if (rc) return rc;
    if (bs < 1 || bs > mvc_huf_max_block()) return MVC_ERR_CORRUPT;
    size_t nblocks = (size_t)((n - 1) / bs + 1);
    /* Every block length takes >= 1 byte: refuse before looping over a huge count. */
    if (nblocks - 1 > (size_t)(end - p)) return MVC_ERR_TRUNCATED;
    const uint8_t *data = p;
    for (size_t i = 0; i + 1 < nblocks; i++) {
        uint64_t ln;
        if ((rc = varint_get(&data, end, 64, &ln))) return rc;
    }
    for (size_t i = 0; i < nblocks; i++) {
        uint64_t ln;
        if (i + 1 < nblocks) {
            if ((rc = varint_get(&p, end, 64, &ln))) return rc;
        } else {
            ln = (uint64_t)(end - data);
        }
        if (ln > (uint64_t)(end - data)) return MVC_ERR_TRUNCATED;
        size_t first = i * (size_t)bs, cnt = n - first < bs ? n - first : (size_t)bs;
        rc = mvc_huf_decode_block(data, (size_t)ln, (uint8_t *)dst + first * (size_t)width,
                                  cnt, width);
        if (rc < 0) return rc;
        data += ln;
    }
    return MVC_OK;
}

/* Parse an RLE+Huffman stream's header and decode its two symbol streams into
 * *sym (malloc'd, the caller frees it); `bound` caps the value count, which
 * caps the symbol count and so the allocation. */
int rlehuf_open(const uint8_t *src, size_t len, int kind, size_t bound, rle_iter *it,
                       uint16_t **sym_out) {
    const uint8_t *p = src, *end = src + len;
    uint64_t modulus, n0, n1, xlen, len0;
    int rc;
    *sym_out = NULL;
    if ((rc = varint_get(&p, end, 64, &modulus)) || (rc = varint_get(&p, end, 64, &n0))
        || (rc = varint_get(&p, end, 64, &n1)) || (rc = varint_get(&p, end, 64, &xlen))
        || (rc = varint_get(&p, end, 64, &len0)))
        return rc;
    size_t left = (size_t)(end - p);
    if (modulus < 1 || modulus > (kind == 1 ? 256u : 65536u)) return MVC_ERR_CORRUPT;
    /* Every symbol yields >= 1 value except run symbols, which follow a value. */
    if (n0 > 2 * (uint64_t)bound || n1 > 2 * (uint64_t)bound || n0 + n1 < 1
        || n0 + n1 > 2 * (uint64_t)bound || xlen > left || len0 > left - xlen)
        return MVC_ERR_CORRUPT;
    const uint8_t *extra = p, *body0 = p + xlen, *body1 = body0 + len0;
    uint16_t *sym = malloc(sizeof(uint16_t) * (size_t)(n0 + n1));
    if (!sym) return MVC_ERR_NOMEM;
    rc = mvc_huf_decode_stream(body0, (size_t)len0, sym, (size_t)n0, 2);
    if (rc == MVC_OK)
        rc = mvc_huf_decode_stream(body1, (size_t)(end - body1), sym + n0, (size_t)n1, 2);
    if (rc < 0) { free(sym); return rc; }
    rle_iter_init(it, sym, (size_t)n0, sym + n0, (size_t)n1, extra, (size_t)xlen,
                  (uint32_t)modulus);
    *sym_out = sym;
    return MVC_OK;
}

int mvc_rlehuf_decode_stream(const uint8_t *src, size_t len, int kind, void *dst, size_t n) {
    if ((kind != 1 && kind != 2) || (len && !src) || (n && !dst)) return MVC_ERR_ARG;
    if (n == 0) return len == 0 ? MVC_OK : MVC_ERR_CORRUPT;
    rle_iter it;
    uint16_t *sym;
    int rc = rlehuf_open(src, len, kind, n, &it, &sym);
    if (rc < 0) return rc;
    rc = mvc_rle_sym_decode(it.sym[0], it.lim[0], it.sym[1], it.lim[1], it.xp, it.xlen,
                            it.modulus, kind, dst, n);
    free(sym);
    return rc < 0 ? rc : MVC_OK;
}

int qd_sections_fit(const uint8_t *sec, size_t total, const uint64_t *sec_len, uint32_t nsec) {
    if (!sec_len || (total && !sec)) return MVC_ERR_ARG;
    uint64_t left = (uint64_t)total;
    for (uint32_t g = 0; g < nsec; g++) {
        if (sec_len[g] > left) return MVC_ERR_ARG; /* a section runs past the buffer */
        left -= sec_len[g];
    }
    return left == 0 ? MVC_OK : MVC_ERR_ARG;
}

int qd_groups_open(qd_groups *gs, const uint8_t *sec, const uint64_t *sec_len, uint32_t n_prev,
                   int width, size_t n) {
    memset(gs, 0, sizeof *gs);
    gs->n_prev = n_prev;
    gs->its = calloc(n_prev, sizeof *gs->its);
    gs->store = calloc(n_prev, sizeof *gs->store);
    gs->syms = calloc(n_prev, sizeof *gs->syms);
    if (!gs->its || !gs->store || !gs->syms) return MVC_ERR_NOMEM;
    const uint8_t *s = sec;
    for (uint32_t g = 0; g < n_prev; g++) {
        size_t ln = (size_t)sec_len[g];
        if (ln != 0) {
            int rc = rlehuf_open(s, ln, width, n, &gs->store[g], &gs->syms[g]);
            if (rc < 0) return rc;
            gs->its[g] = &gs->store[g];
            gs->symbols += gs->store[g].lim[0] + gs->store[g].lim[1];
        }
        s += ln;
    }
    return MVC_OK;
}

void qd_groups_close(qd_groups *gs) {
    if (gs->syms) for (uint32_t g = 0; g < gs->n_prev; g++) free(gs->syms[g]);
    free(gs->syms); free(gs->store); free(gs->its);
    memset(gs, 0, sizeof *gs);
}

int qd_groups_expand(qd_groups *gs, const int64_t *counts, int width, void *dst) {
    uint8_t *o = dst;
    size_t total = 0;
    for (uint32_t g = 0; g < gs->n_prev; g++) total += (size_t)counts[g] * (size_t)width;
    uint8_t *const end = o + total;
    for (uint32_t g = 0; g < gs->n_prev; g++) {
        size_t cnt = (size_t)counts[g];
        if (!gs->its[g]) {
            memset(o, 0, cnt * (size_t)width);
        } else {
            /* A local copy: the iterator state stays in registers across the stores. */
            rle_iter it = *gs->its[g];
            size_t at = 0;
            uint32_t v;
            uint64_t L;
            int r;
            while ((r = rle_iter_next(&it, &v, &L)) > 0) {
                if (L > cnt - at) return MVC_ERR_CORRUPT; /* stream longer than its group */
                uint8_t *q = o + at * (size_t)width;
                if (width == 1) {
                    /* Most runs are short: two word stores beat a memset call.  Bytes past
                     * the run belong to later runs or groups, written after it. */
                    if (L <= 16 && end - q >= 16) {
                        uint64_t pat = 0x0101010101010101ull * (uint8_t)v;
                        memcpy(q, &pat, 8); memcpy(q + 8, &pat, 8);
                    } else {
                        memset(q, (int)v, (size_t)L);
                    }
                } else {
                    for (size_t i = 0; i < L; i++) { uint16_t x = (uint16_t)v; memcpy(q + 2 * i, &x, 2); }
                }
                at += (size_t)L;
            }
            *gs->its[g] = it;
            if (r < 0) return r;
            if (at != cnt) return MVC_ERR_CORRUPT;
            if ((r = rle_iter_done(&it)) < 0) return r;
        }
        o += cnt * (size_t)width;
    }
    return MVC_OK;
}

int mvc_qdelta_levels(const void *parent, size_t n, int width, uint32_t n_prev,
                      uint32_t modulus, uint32_t n_cur, int grouped, int rle,
                      const uint8_t *sec, size_t sec_total, const uint64_t *sec_len,
                      uint32_t nsec, void *out, uint64_t *n_top) {
    if ((width != 1 && width != 2) || modulus == 0 || modulus > (width == 1 ? 256u : 65536u)
        || n_prev == 0 || n_prev > modulus || n_cur == 0 || n_cur > modulus || !n_top
        || nsec != (grouped ? n_prev : 1u) || (n && (!parent || !out))
        || qd_sections_fit(sec, sec_total, sec_len, nsec) != MVC_OK)
        return MVC_ERR_ARG;
    int64_t one = (int64_t)n, *counts = &one;
    int rc;
    if (grouped) {
        counts = malloc(sizeof(int64_t) * n_prev);
        if (!counts) return MVC_ERR_NOMEM;
        rc = mvc_grp_count(parent, n, width, n_prev, counts);
        if (rc < 0) { free(counts); return rc; }
    } else {
        /* The grouped path range checks the parent in mvc_grp_count. */
        for (size_t i = 0; i < n; i++) {
            uint32_t v = width == 1 ? ((const uint8_t *)parent)[i] : ((const uint16_t *)parent)[i];
            if (v >= n_prev) return MVC_ERR_RANGE;
        }
    }
    uint8_t *d = malloc(n ? n * (size_t)width : 1);
    if (!d) { if (grouped) free(counts); return MVC_ERR_NOMEM; }
    size_t at = 0;
    const uint8_t *s = sec;
    rc = MVC_OK;
    for (uint32_t g = 0; g < nsec && rc == MVC_OK; g++) {
        size_t cnt = (size_t)counts[g], ln = (size_t)sec_len[g];
        uint8_t *dst = d + at * (size_t)width;
        if (ln == 0) memset(dst, 0, cnt * (size_t)width);
        else if (cnt == 0) rc = MVC_ERR_CORRUPT; /* data for an empty group */
        else if (rle) rc = mvc_rlehuf_decode_stream(s, ln, width, dst, cnt);
        else rc = mvc_huf_decode_stream(s, ln, dst, cnt, width);
        at += cnt;
        s += ln;
    }
    if (rc == MVC_OK) {
        rc = mvc_grp_apply(parent, d, n, width, modulus, n_cur, grouped ? counts : NULL,
                           grouped ? n_prev : 0, out, n_top);
        /* Parent levels were range checked above: a range error here would be a bug. */
        if (rc == MVC_ERR_RANGE || rc == MVC_ERR_ARG) rc = MVC_ERR_INTERNAL;
    }
    free(d);
    if (grouped) free(counts);
    return rc < 0 ? rc : MVC_OK;
}
