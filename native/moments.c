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
