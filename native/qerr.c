/* Error sums for the config search; see qerr.h.  Each pass reads its inputs once and
 * keeps the six sums in registers: the search calls it once per new quantization of a
 * tensor, so it must cost no more than the assignment that produced the levels. */
#include "qerr.h"

#include <float.h>
#include <math.h>

#include "internal/qerr_sum.h"

#define QERR_BODY                                                                      \
    if (sums == NULL || n_table < 2 || (n > 0 && (x == NULL || levels == NULL ||       \
                                                  table == NULL)))                    \
        return -1;                                                                    \
    qerr_acc acc = {0, 0, 0, 0, 0, 0};                                                \
    const int prot = n_table - 1;                                                     \
    int bad = 0;                                                                      \
    for (size_t i = 0; i < n; i++) {                                                  \
        const int lv = (int)levels[i];                                                \
        bad |= (lv < 0) | (lv >= n_table);                                            \
        const int idx = (lv < 0 || lv >= n_table) ? prot : lv;                        \
        qerr_add(&acc, idx, x[i], table, prot, w != NULL ? w + i : NULL);             \
    }                                                                                 \
    qerr_flush(&acc, sums);                                                           \
    return bad ? -1 : 0;

int mvc_qerr_sums_u8(const float *x, const uint8_t *levels, size_t n, const float *table,
                     int n_table, const float *w, double *sums)
{
    QERR_BODY
}

int mvc_qerr_sums_i16(const float *x, const int16_t *levels, size_t n, const float *table,
                      int n_table, const float *w, double *sums)
{
    QERR_BODY
}

int64_t mvc_ratio_max_f32(const float *m, const float *v, size_t n, float *out)
{
    if (out == NULL || (n > 0 && (m == NULL || v == NULL))) return -1;
    float best = 0.0f;
    int64_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] > 0.0f) {
            const float r = fabsf(m[i]) / sqrtf(v[i]);
            /* NaN never wins a comparison: a NaN ratio (m NaN) is skipped, as torch's max
             * would instead propagate it -- callers check finiteness first. */
            best = r > best ? r : best;
            count++;
        }
    }
    *out = best;
    return count;
}

int mvc_scan_f32(const float *x, size_t n, int64_t *counts)
{
    if (counts == NULL || (n > 0 && x == NULL)) return -1;
    int64_t bad = 0, neg = 0, zero = 0, pos = 0;
    /* 32-bit counts over blocks that cannot overflow them, and finiteness as a comparison
     * (|v| <= FLT_MAX is false for inf and NaN, as !isfinite): the loop then vectorizes
     * (2.1 -> 0.3 ns a value), where int64 counters and isfinite kept it scalar. */
    for (size_t i = 0; i < n;) {
        const size_t m = n - i < ((size_t)1 << 20) ? n - i : ((size_t)1 << 20);
        const float *b = x + i;
        uint32_t cb = 0, cn = 0, cz = 0, cp = 0;
        for (size_t j = 0; j < m; j++) {
            const float v = b[j];
            cb += !(fabsf(v) <= FLT_MAX);
            cn += v < 0.0f;
            cz += v == 0.0f;
            cp += v > 0.0f;
        }
        bad += cb; neg += cn; zero += cz; pos += cp;
        i += m;
    }
    counts[0] += bad; counts[1] += neg; counts[2] += zero; counts[3] += pos;
    return 0;
}
