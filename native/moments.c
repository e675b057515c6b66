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

static inline int moment_kept(const float *m, const void *wlev, int wsize, int wpruned,
                              size_t i)
{
    if (m[i] == 0.0f) return 0;
    if (wlev == NULL) return 1;
    const int w = wsize == 1 ? (int)((const uint8_t *)wlev)[i] : (int)((const int16_t *)wlev)[i];
    return w != wpruned;
}

int64_t mvc_compact_moment_f32(const float *m, size_t n, const void *wlev, int wsize,
                               int wpruned, float *out, size_t cap)
{
    if ((n > 0 && m == NULL) || (wlev != NULL && wsize != 1 && wsize != 2)) return -1;
    if (cap > 0 && out == NULL) return -1;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (moment_kept(m, wlev, wsize, wpruned, i)) {
            if (out != NULL) {
                if (j >= cap) return -1;
                out[j] = m[i];
            }
            j++;
        }
    }
    return (int64_t)j;
}

#define EXPAND_MOMENT_BODY                                                             \
    if ((n > 0 && (m == NULL || out == NULL)) || (n_sub > 0 && sub == NULL)            \
        || (wlev != NULL && wsize != 1 && wsize != 2))                                 \
        return -1;                                                                     \
    size_t j = 0;                                                                      \
    for (size_t i = 0; i < n; i++) {                                                   \
        if (moment_kept(m, wlev, wsize, wpruned, i)) {                                 \
            if (j >= n_sub) return -1;                                                 \
            out[i] = sub[j++];                                                         \
        } else {                                                                       \
            out[i] = fill;                                                             \
        }                                                                              \
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
