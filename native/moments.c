/* See moments.h.  Replaces mask, masked select, float64 copy, log and float32 copy (and
 * the scatter back) of torch with one pass each way. */
#include "moments.h"

#include <math.h>

int64_t mvc_log_positive_f32(const float *v, size_t n, float *out, size_t cap)
{
    if (n > 0 && v == NULL) return -1;
    if (cap > 0 && out == NULL) return -1;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        const float x = v[i];
        if (x > 0.0f) {
            if (j >= cap) return -1;
            out[j++] = (float)log((double)x);
        }
    }
    return (int64_t)j;
}

/* A second moment's entries are nearly all positive (runs of zeros where rows were never
 * touched): the branch below predicts well, and measured faster than a blend. */
#define EXPAND_BODY                                                                    \
    if ((n > 0 && (v == NULL || out == NULL)) || (n_sub > 0 && sub == NULL)) return -1; \
    size_t j = 0;                                                                      \
    for (size_t i = 0; i < n; i++) {                                                   \
        if (v[i] > 0.0f) {                                                             \
            if (j >= n_sub) return -1;                                                 \
            out[i] = sub[j++];                                                         \
        } else {                                                                       \
            out[i] = fill;                                                             \
        }                                                                              \
    }                                                                                  \
    return (int64_t)j;

int64_t mvc_expand_positive_u8(const float *v, size_t n, const uint8_t *sub, size_t n_sub,
                               uint8_t fill, uint8_t *out)
{
    EXPAND_BODY
}

int64_t mvc_expand_positive_i16(const float *v, size_t n, const int16_t *sub, size_t n_sub,
                                int16_t fill, int16_t *out)
{
    EXPAND_BODY
}

/* Entry i of a first moment is kept: m[i] != 0 and, with weight levels, not pruned with
 * its weight.  One loop per weight-level width, so the test is a few compares.  Which
 * entries are kept is data (a fifth of them at random, with the weights' pruning), so the
 * loops below are branch-free: a branch on it mispredicted often (compaction 4.6 -> 2.5 ns
 * a value, expansion 2.5 -> 1.9); the read or write it selects is made either way within
 * the buffers' bounds and kept, or overwritten by the next entry. */
#define KEPT_NONE(i) ((size_t)(m[i] != 0.0f))
#define KEPT_U8(i) ((size_t)(m[i] != 0.0f) & (size_t)((int)((const uint8_t *)wlev)[i] != wpruned))
#define KEPT_I16(i) ((size_t)(m[i] != 0.0f) & (size_t)((int)((const int16_t *)wlev)[i] != wpruned))

#define COMPACT_LOOP(KEPT)                                                             \
    if (out == NULL) {                                                                 \
        for (size_t i = 0; i < n; i++) j += KEPT(i);                                   \
    } else {                                                                           \
        for (size_t i = 0; i < n; i++) {                                               \
            const size_t k = KEPT(i);                                                  \
            if (j < cap) out[j] = m[i];                                                \
            else if (k) return -1;                                                     \
            j += k;                                                                    \
        }                                                                              \
    }

int64_t mvc_compact_moment_f32(const float *m, size_t n, const void *wlev, int wsize,
                               int wpruned, float *out, size_t cap)
{
    if ((n > 0 && m == NULL) || (wlev != NULL && wsize != 1 && wsize != 2)) return -1;
    if (cap > 0 && out == NULL) return -1;
    size_t j = 0;
    if (wlev == NULL) {
        COMPACT_LOOP(KEPT_NONE)
    } else if (wsize == 1) {
        COMPACT_LOOP(KEPT_U8)
    } else {
        COMPACT_LOOP(KEPT_I16)
    }
    return (int64_t)j;
}

#define EXPAND_LOOP(KEPT)                                                              \
    if (n_sub == 0) { /* nothing to read: every entry must be the fill */              \
        for (size_t i = 0; i < n; i++) {                                               \
            if (KEPT(i)) return -1;                                                    \
            out[i] = fill;                                                             \
        }                                                                              \
        return 0;                                                                      \
    }                                                                                  \
    for (size_t i = 0; i < n; i++) {                                                   \
        const size_t k = KEPT(i);                                                      \
        if (k && j >= n_sub) return -1;                                                \
        const size_t at = j < n_sub ? j : n_sub - 1;                                   \
        const __typeof__(fill) s = sub[at]; /* read either way: a blend, not a branch */ \
        out[i] = k ? s : fill;                                                         \
        j += k;                                                                        \
    }

#define EXPAND_MOMENT_BODY                                                             \
    if ((n > 0 && (m == NULL || out == NULL)) || (n_sub > 0 && sub == NULL)            \
        || (wlev != NULL && wsize != 1 && wsize != 2))                                 \
        return -1;                                                                     \
    size_t j = 0;                                                                      \
    if (wlev == NULL) {                                                                \
        EXPAND_LOOP(KEPT_NONE)                                                         \
    } else if (wsize == 1) {                                                           \
        EXPAND_LOOP(KEPT_U8)                                                           \
    } else {                                                                           \
        EXPAND_LOOP(KEPT_I16)                                                          \
    }                                                                                  \
    return (int64_t)j;

int64_t mvc_expand_moment_u8(const float *m, size_t n, const void *wlev, int wsize,
                             int wpruned, const uint8_t *sub, size_t n_sub, uint8_t fill,
                             uint8_t *out)
{
    EXPAND_MOMENT_BODY
}

int64_t mvc_expand_moment_i16(const float *m, size_t n, const void *wlev, int wsize,
                              int wpruned, const int16_t *sub, size_t n_sub, int16_t fill,
                              int16_t *out)
{
    EXPAND_MOMENT_BODY
}
