/* Alg. 5 / 6 of Inshrinkerator as single counting-sort passes (see groups.h).
 * The numpy equivalent needs a stable argsort and an int64 permutation per
 * parameter; here the only extra memory is one offset per group. */
#include <stdlib.h>
#include <string.h>
#include "status.h"
#include "groups.h"

#define MAX_GROUPS 65536u

static int bad_width(int w) { return w != 1 && w != 2; }

#define COUNT_BODY(T)                                                      \
    do {                                                                   \
        const T *p = (const T *)parent;                                    \
        for (size_t i = 0; i < n; i++) {                                   \
            uint32_t g = p[i];                                             \
            if (g >= n_groups) return MVC_ERR_RANGE;                       \
            counts[g]++;                                                   \
        }                                                                  \
    } while (0)

/* Width 1: four interleaved histograms, so runs of one level do not serialize on a
 * single counter's store-to-load latency; the range check happens once at the end. */
static int count_u8(const uint8_t *p, size_t n, uint32_t n_groups, int64_t *counts) {
    uint64_t h[4][256];
    memset(h, 0, sizeof h);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h[0][p[i]]++;
        h[1][p[i + 1]]++;
        h[2][p[i + 2]]++;
        h[3][p[i + 3]]++;
    }
    for (; i < n; i++) h[0][p[i]]++;
    for (uint32_t g = 0; g < 256; g++) {
        uint64_t c = h[0][g] + h[1][g] + h[2][g] + h[3][g];
        if (g < n_groups) counts[g] = (int64_t)c;
        else if (c) return MVC_ERR_RANGE;
    }
    return MVC_OK;
}

int mvc_grp_count(const void *parent, size_t n, int width, uint32_t n_groups,
                  int64_t *counts) {
    if (bad_width(width) || n_groups == 0 || n_groups > MAX_GROUPS || !counts
        || (n && !parent))
        return MVC_ERR_ARG;
    memset(counts, 0, sizeof(int64_t) * n_groups);
    if (width == 1) return count_u8((const uint8_t *)parent, n, n_groups, counts);
    COUNT_BODY(uint16_t);
    return MVC_OK;
}

/* off[g] = start of group g (exclusive prefix sums of counts), off[n_groups + g] = its
 * end; counts must add up to n.  The ends bound every scatter / gather, so counts that
 * do not match the parent give MVC_ERR_ARG instead of an out-of-bounds access. */
static int offsets(const int64_t *counts, uint32_t n_groups, size_t n, size_t **out) {
    size_t *off = malloc(sizeof(size_t) * 2 * (size_t)n_groups);
    if (!off) return MVC_ERR_NOMEM;
    size_t acc = 0;
    for (uint32_t g = 0; g < n_groups; g++) {
        if (counts[g] < 0 || (uint64_t)counts[g] > n - acc) { free(off); return MVC_ERR_ARG; }
        off[g] = acc;
        acc += (size_t)counts[g];
        off[n_groups + g] = acc;
    }
    if (acc != n) { free(off); return MVC_ERR_ARG; }
    *out = off;
    return MVC_OK;
}

#define DELTA_BODY(T)                                                      \
    do {                                                                   \
        const T *p = (const T *)parent, *c = (const T *)cur;               \
        T *o = (T *)out;                                                   \
        for (size_t i = 0; i < n; i++) {                                   \
            uint32_t pv = p[i], cv = c[i];                                 \
            if (pv >= modulus || cv >= modulus) { rc = MVC_ERR_RANGE; break; } \
            uint32_t d = pv >= cv ? pv - cv : pv + modulus - cv;           \
            if (off) {                                                     \
                if (pv >= n_groups) { rc = MVC_ERR_RANGE; break; }         \
                if (off[pv] >= off[n_groups + pv]) { rc = MVC_ERR_ARG; break; } \
                o[off[pv]++] = (T)d;                                       \
            } else {                                                       \
                o[i] = (T)d;                                               \
            }                                                              \
        }                                                                  \
    } while (0)

int mvc_grp_delta(const void *parent, const void *cur, size_t n, int width,
                  uint32_t modulus, const int64_t *counts, uint32_t n_groups, void *out) {
    if (bad_width(width) || modulus == 0 || modulus > (width == 1 ? 256u : 65536u)
        || (n && (!parent || !cur || !out)))
        return MVC_ERR_ARG;
    size_t *off = NULL;
    int rc = MVC_OK;
    if (counts) {
        if (n_groups == 0 || n_groups > MAX_GROUPS) return MVC_ERR_ARG;
        rc = offsets(counts, n_groups, n, &off);
        if (rc != MVC_OK) return rc;
    }
    if (width == 1) DELTA_BODY(uint8_t);
    else DELTA_BODY(uint16_t);
    free(off);
    return rc;
}

#define APPLY_BODY(T)                                                      \
    do {                                                                   \
        const T *p = (const T *)parent, *dl = (const T *)delta;            \
        T *o = (T *)out;                                                   \
        for (size_t i = 0; i < n; i++) {                                   \
            uint32_t pv = p[i], d;                                         \
            if (pv >= modulus) { rc = MVC_ERR_RANGE; break; }              \
            if (off) {                                                     \
                if (pv >= n_groups) { rc = MVC_ERR_RANGE; break; }         \
                if (off[pv] >= off[n_groups + pv]) { rc = MVC_ERR_ARG; break; } \
                d = dl[off[pv]++];                                         \
            } else {                                                       \
                d = dl[i];                                                 \
            }                                                              \
            if (d >= modulus) { rc = MVC_ERR_CORRUPT; break; }             \
            uint32_t v = pv >= d ? pv - d : pv + modulus - d;              \
            if (v >= n_cur) { rc = MVC_ERR_CORRUPT; break; }               \
            top += (v == n_cur - 1);                                       \
            o[i] = (T)v;                                                   \
        }                                                                  \
    } while (0)

/* Width 1, grouped: the hot path of every checkout.  Cursor and end tables cover all
 * 256 byte values (levels >= n_groups get an empty range, so they fail the bounds
 * check), and the value checks accumulate into one flag tested after the loop. */
static int apply_u8_grouped(const uint8_t *p, const uint8_t *dl, size_t n, uint32_t modulus,
                            uint32_t n_cur, const size_t *off, uint32_t n_groups,
                            uint8_t *o, uint64_t *n_top) {
    size_t cur[256], end[256];
    for (uint32_t g = 0; g < 256; g++) {
        cur[g] = g < n_groups ? off[g] : 0;
        end[g] = g < n_groups ? off[n_groups + g] : 0;
    }
    uint32_t bad = 0, last = n_cur - 1;
    uint64_t top = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t pv = p[i];
        size_t k = cur[pv];
        if (k >= end[pv]) return pv >= n_groups ? MVC_ERR_RANGE : MVC_ERR_ARG;
        cur[pv] = k + 1;
        uint32_t d = dl[k];
        uint32_t v = pv - d + (pv < d ? modulus : 0u);
        bad |= (uint32_t)(d >= modulus) | (uint32_t)(v >= n_cur);
        top += (v == last);
        o[i] = (uint8_t)v;
    }
    *n_top = top;
    return bad ? MVC_ERR_CORRUPT : MVC_OK;
}

int mvc_grp_apply(const void *parent, const void *delta, size_t n, int width,
                  uint32_t modulus, uint32_t n_cur, const int64_t *counts, uint32_t n_groups,
                  void *out, uint64_t *n_top) {
    if (bad_width(width) || modulus == 0 || modulus > (width == 1 ? 256u : 65536u)
        || n_cur == 0 || n_cur > modulus || !n_top || (n && (!parent || !delta || !out)))
        return MVC_ERR_ARG;
    size_t *off = NULL;
    int rc = MVC_OK;
    uint64_t top = 0;
    if (counts) {
        if (n_groups == 0 || n_groups > MAX_GROUPS || n_groups > modulus) return MVC_ERR_ARG;
        rc = offsets(counts, n_groups, n, &off);
        if (rc != MVC_OK) return rc;
        if (width == 1) {
            rc = apply_u8_grouped(parent, delta, n, modulus, n_cur, off, n_groups, out, n_top);
            free(off);
            return rc;
        }
    }
    if (width == 1) APPLY_BODY(uint8_t);
    else APPLY_BODY(uint16_t);
    free(off);
    *n_top = top;
    return rc;
}

/* off[g] = starts[g], off[n_groups + g] = starts[g] + counts[g]: the segment's range of
 * group g in a stream of delta_n values.  counts must add up to n, the segment's length,
 * so a parent that does not match them overruns one range (MVC_ERR_ARG in the loops). */
static int part_offsets(const int64_t *counts, const int64_t *starts, uint32_t n_groups,
                        size_t n, size_t delta_n, size_t **out) {
    if (!counts || !starts || n_groups == 0 || n_groups > MAX_GROUPS) return MVC_ERR_ARG;
    size_t *off = malloc(sizeof(size_t) * 2 * (size_t)n_groups);
    if (!off) return MVC_ERR_NOMEM;
    size_t acc = 0;
    for (uint32_t g = 0; g < n_groups; g++) {
        int64_t c = counts[g], s = starts[g];
        if (c < 0 || s < 0 || (uint64_t)s > delta_n || (uint64_t)c > delta_n - (size_t)s
            || (uint64_t)c > n - acc) {
            free(off);
            return MVC_ERR_ARG;
        }
        off[g] = (size_t)s;
        off[n_groups + g] = (size_t)s + (size_t)c;
        acc += (size_t)c;
    }
    if (acc != n) { free(off); return MVC_ERR_ARG; }
    *out = off;
    return MVC_OK;
}

int mvc_grp_delta_part(const void *parent, const void *cur, size_t n, int width,
                       uint32_t modulus, const int64_t *counts, const int64_t *starts,
                       uint32_t n_groups, void *delta, size_t delta_n) {
    if (bad_width(width) || modulus == 0 || modulus > (width == 1 ? 256u : 65536u)
        || (n && (!parent || !cur || !delta)))
        return MVC_ERR_ARG;
    size_t *off = NULL;
    int rc = part_offsets(counts, starts, n_groups, n, delta_n, &off);
    if (rc != MVC_OK) return rc;
    void *out = delta;
    if (width == 1) DELTA_BODY(uint8_t);
    else DELTA_BODY(uint16_t);
    free(off);
    return rc;
}
