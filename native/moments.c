/* See moments.h.  Replaces mask, masked select, float64 copy, log and float32 copy (and
 * the scatter back) of torch with one pass each way. */
#include "moments.h"

#include <math.h>
#include <string.h>

#include "internal/cpu.h"

/* log of 256 values at a time: positives compacted into a block, then their logs.  Where AVX2
 * runs, the block's logs come from a polynomial (below) that the compiler vectorizes (3.9-5.3
 * ns a value against 6.1-10.9 with libm's log, whose calls do not vectorize); the bits are
 * libm's either way. */
#define LOG_BLOCK 256

/* ln 2 split so that e * LN2_HI is exact for any float32 exponent (LN2_HI has 32 bits). */
#define LN2_HI 0x1.62e42feep-1
#define LN2_LO 0x1.a39ef35793c76p-33
/* Double ulps around a float32 rounding midpoint within which the polynomial's answer is not
 * trusted: its error is a few ulps (below), so a value farther than this from a midpoint rounds
 * to the float libm's log gives (libm's log is within 1 ulp of ln x).  About 1 block in 1000
 * has such a value and is redone with libm. */
#define LOG_MARGIN 1024

static void log_exact(const float *in, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = (float)log((double)in[i]);
}

#if MVC_X86
/* (float)log((double)in[i]) for positive finite normal floats, or nonzero where a value of the
 * block is not one, or its log lies within LOG_MARGIN double ulps of a float32 midpoint (the
 * caller then takes the block from log_exact).  x = 2^e m, m in [sqrt(1/2), sqrt(2)),
 * ln x = e ln 2 + 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.1716: the series to s^19 leaves
 * less than 2^-55 of |s|, and m - 1 and m + 1 are exact; the rest is a few roundings.  Checked
 * against libm for every positive float32, once (docs/development.md, SIMD code paths). */
__attribute__((target("avx2")))
static uint32_t log_block_avx2(const float *in, float *out, size_t n)
{
    uint32_t odd = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &in[i], sizeof b);
        const uint32_t mb = b & 0x7fffffu;
        const uint32_t up = (uint32_t)(mb >= 0x3504f4u);  /* m >= sqrt(2): halve it */
        const uint32_t mbits = mb | (up ? 0x3f000000u : 0x3f800000u);
        float mf;
        memcpy(&mf, &mbits, sizeof mf);
        const double ed = (double)((int32_t)(b >> 23) - 127 + (int32_t)up);
        const double f = (double)mf - 1.0;
        const double s = f / (2.0 + f);
        const double z = s * s;
        double p = 1.0 / 19;
        p = p * z + 1.0 / 17; p = p * z + 1.0 / 15; p = p * z + 1.0 / 13;
        p = p * z + 1.0 / 11; p = p * z + 1.0 / 9; p = p * z + 1.0 / 7;
        p = p * z + 1.0 / 5; p = p * z + 1.0 / 3;
        const double y = ed * LN2_HI + (ed * LN2_LO + 2.0 * s * (z * p) + 2.0 * s);
        out[i] = (float)y;
        uint64_t yb;
        memcpy(&yb, &y, sizeof yb);
        const int64_t off = (int64_t)(yb & 0x1fffffffu) - 0x10000000;  /* from the midpoint */
        odd |= (uint32_t)((off < 0 ? -off : off) <= LOG_MARGIN);
        odd |= (uint32_t)((b >> 23) - 1u >= 254u);  /* subnormal or inf */
    }
    return odd;
}
#endif

int64_t mvc_log_positive_f32(const float *v, size_t n, float *out, size_t cap)
{
    if (n > 0 && v == NULL) return -1;
    if (cap > 0 && out == NULL) return -1;
#if MVC_X86
    const int fast = cpu_avx2();
#endif
    float block[LOG_BLOCK];
    size_t j = 0;
    for (size_t a = 0; a < n; a += LOG_BLOCK) {
        const size_t end = n - a < LOG_BLOCK ? n : a + LOG_BLOCK;
        size_t k = 0;
        for (size_t i = a; i < end; i++) {
            const float x = v[i];
            if (x > 0.0f) block[k++] = x;
        }
        if (k > cap - j) return -1;
#if MVC_X86
        if (!fast || log_block_avx2(block, out + j, k))
            log_exact(block, out + j, k);
#else
        log_exact(block, out + j, k);
#endif
        j += k;
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
