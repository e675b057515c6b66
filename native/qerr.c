/* Error sums for the config search; see qerr.h.  Each pass reads its inputs once and
 * keeps the six sums in registers: the search calls it once per new quantization of a
 * tensor, so it must cost no more than the assignment that produced the levels. */
#include "qerr.h"

#include <float.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
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

/* The second moment's sums in sqrt(v): d^2 and s^2 only, in four lanes (element i in lane
 * i % 4 up to the last multiple of 4, the tail apart), added ((l0 + l1) + (l2 + l3)) + tail.
 * The SSE2 loop and the scalar one do the same float64 operations per lane, so the same
 * bits on every build; lanes rather than one running sum because a single float64 chain
 * is bound by the add's latency (one value per ~4 cycles), not by memory. */
static inline float sqrt_of(float v) { return sqrtf(v < 0.0f ? 0.0f : v); }

#define QERR_SQRT_BODY(LT)                                                             \
    if (sums == NULL || n_table < 2 || (n > 0 && (v == NULL || levels == NULL ||       \
                                                  table == NULL)))                    \
        return -1;                                                                    \
    const int prot = n_table - 1;                                                     \
    int bad = 0;                                                                      \
    double ld[4] = {0, 0, 0, 0}, ls[4] = {0, 0, 0, 0};                                \
    const size_t n4 = n & ~(size_t)3;                                                 \
    size_t i = 0;                                                                     \
    SQRT_SSE2(LT)                                                                     \
    for (; i < n4; i += 4) {                                                          \
        for (int k = 0; k < 4; k++) {                                                 \
            const int lv = (int)levels[i + k];                                        \
            bad |= (lv < 0) | (lv >= n_table);                                        \
            const float sv = sqrt_of(v[i + k]);                                       \
            const float tv = (lv < 0 || lv >= n_table || lv == prot) ? sv : table[lv]; \
            const double d = (double)tv - (double)sv;                                 \
            ld[k] += d * d;                                                           \
            ls[k] += (double)sv * (double)sv;                                         \
        }                                                                             \
    }                                                                                 \
    double td = 0, ts = 0;                                                            \
    for (; i < n; i++) {                                                              \
        const int lv = (int)levels[i];                                                \
        bad |= (lv < 0) | (lv >= n_table);                                            \
        const float sv = sqrt_of(v[i]);                                               \
        const float tv = (lv < 0 || lv >= n_table || lv == prot) ? sv : table[lv];     \
        const double d = (double)tv - (double)sv;                                     \
        td += d * d;                                                                  \
        ts += (double)sv * (double)sv;                                                \
    }                                                                                 \
    sums[0] += ((ld[0] + ld[1]) + (ld[2] + ld[3])) + td;                              \
    sums[1] += ((ls[0] + ls[1]) + (ls[2] + ls[3])) + ts;                              \
    return bad ? -1 : 0;

#if defined(__SSE2__)
/* Four values a step: SQRTPS is the correctly rounded sqrtf, the selects are exact, and
 * CVTPS2PD, SUBPD, MULPD, ADDPD are the scalar loop's float64 operations lane for lane. */
#define SQRT_SSE2(LT)                                                                  \
    {                                                                                 \
        const __m128 zero = _mm_setzero_ps();                                         \
        __m128d d01 = _mm_setzero_pd(), d23 = _mm_setzero_pd();                       \
        __m128d s01 = _mm_setzero_pd(), s23 = _mm_setzero_pd();                       \
        for (; i < n4; i += 4) {                                                      \
            const __m128 vv = _mm_loadu_ps(v + i);                                    \
            /* v < 0 -> +0; NaN (the comparison false) kept, as sqrt_of does */       \
            const __m128 sv = _mm_sqrt_ps(_mm_andnot_ps(_mm_cmplt_ps(vv, zero), vv)); \
            float sl[4], tl[4];                                                       \
            _mm_storeu_ps(sl, sv);                                                    \
            for (int k = 0; k < 4; k++) {                                             \
                const int lv = (int)levels[i + k];                                    \
                bad |= (lv < 0) | (lv >= n_table);                                    \
                tl[k] = (lv < 0 || lv >= n_table || lv == prot) ? sl[k] : table[lv];  \
            }                                                                         \
            const __m128 tv = _mm_set_ps(tl[3], tl[2], tl[1], tl[0]);                 \
            const __m128d dlo = _mm_sub_pd(_mm_cvtps_pd(tv), _mm_cvtps_pd(sv));       \
            const __m128d dhi = _mm_sub_pd(_mm_cvtps_pd(_mm_movehl_ps(tv, tv)),       \
                                           _mm_cvtps_pd(_mm_movehl_ps(sv, sv)));      \
            const __m128d slo = _mm_cvtps_pd(sv);                                     \
            const __m128d shi = _mm_cvtps_pd(_mm_movehl_ps(sv, sv));                  \
            d01 = _mm_add_pd(d01, _mm_mul_pd(dlo, dlo));                              \
            d23 = _mm_add_pd(d23, _mm_mul_pd(dhi, dhi));                              \
            s01 = _mm_add_pd(s01, _mm_mul_pd(slo, slo));                              \
            s23 = _mm_add_pd(s23, _mm_mul_pd(shi, shi));                              \
        }                                                                             \
        _mm_storeu_pd(ld, d01); _mm_storeu_pd(ld + 2, d23);                           \
        _mm_storeu_pd(ls, s01); _mm_storeu_pd(ls + 2, s23);                           \
    }
#else
#define SQRT_SSE2(LT)
#endif

int mvc_qerr_sqrt_sums_u8(const float *v, const uint8_t *levels, size_t n, const float *table,
                          int n_table, double *sums)
{
    QERR_SQRT_BODY(uint8_t)
}

int mvc_qerr_sqrt_sums_i16(const float *v, const int16_t *levels, size_t n, const float *table,
                           int n_table, double *sums)
{
    QERR_SQRT_BODY(int16_t)
}

int64_t mvc_ratio_max_f32(const float *m, const float *v, size_t n, float *out)
{
    if (out == NULL || (n > 0 && (m == NULL || v == NULL))) return -1;
    float best = 0.0f;
    int64_t count = 0;
    size_t i = 0;
#if defined(__SSE2__)
    /* Four lanes at a time (SSE2 is x86-64's baseline).  An entry with v <= 0 (or NaN)
     * divides by sqrt(1) and offers 0, which never beats best (>= 0); MAXPS(offer, best)
     * is exactly `offer > best ? offer : best` per lane, NaN included; IEEE sqrt and
     * division round as the scalar ones do, and a max does not depend on its order: the
     * same bits as the scalar loop below, which GCC will not vectorize (sqrtf's errno).
     * Lane counts are summed per 2^20 values, far below their 32 bits. */
    {
        const __m128 zero = _mm_setzero_ps(), one = _mm_set1_ps(1.0f);
        const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
        __m128 bestv = zero;
        while (i + 4 <= n) {
            const size_t stop = n - i < ((size_t)1 << 20) ? n - ((n - i) & 3) : i + ((size_t)1 << 20);
            __m128i cnt = _mm_setzero_si128();
            for (; i < stop; i += 4) {
                const __m128 vv = _mm_loadu_ps(v + i);
                const __m128 pos = _mm_cmpgt_ps(vv, zero);
                const __m128 d = _mm_sqrt_ps(_mm_or_ps(_mm_and_ps(pos, vv), _mm_andnot_ps(pos, one)));
                const __m128 r = _mm_div_ps(_mm_and_ps(_mm_loadu_ps(m + i), absmask), d);
                bestv = _mm_max_ps(_mm_and_ps(pos, r), bestv);
                cnt = _mm_sub_epi32(cnt, _mm_castps_si128(pos)); /* each true lane is -1 */
            }
            uint32_t c4[4];
            _mm_storeu_si128((__m128i *)c4, cnt);
            count += (int64_t)c4[0] + c4[1] + c4[2] + c4[3];
        }
        float b4[4];
        _mm_storeu_ps(b4, bestv);
        for (int k = 0; k < 4; k++) best = b4[k] > best ? b4[k] : best;
    }
#endif
    for (; i < n; i++) {
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

int mvc_moment_clamp_f32(float *m, const float *v, size_t n, float bound)
{
    if ((n > 0 && (m == NULL || v == NULL)) || !(bound >= 0.0f)) return -1;
    size_t i = 0;
#if defined(__SSE2__)
    /* Four lanes at a time: SQRTPS and MULPS round as sqrtf and the scalar product do, and
     * the selects are exact, so the same bits as the scalar loop below (which GCC will not
     * vectorize: sqrtf's errno). */
    {
        const __m128 zero = _mm_setzero_ps(), b = _mm_set1_ps(bound);
        const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
        const __m128 signmask = _mm_castsi128_ps(_mm_set1_epi32((int)0x80000000u));
        for (; i + 4 <= n; i += 4) {
            const __m128 vv = _mm_loadu_ps(v + i);
            const __m128 x = _mm_and_ps(_mm_cmpgt_ps(vv, zero), vv);  /* v > 0 ? v : +0 */
            const __m128 lim = _mm_mul_ps(_mm_sqrt_ps(x), b);
            const __m128 mm = _mm_loadu_ps(m + i);
            const __m128 over = _mm_cmpgt_ps(_mm_and_ps(mm, absmask), lim);  /* NaN: false */
            /* lim's sign bit is clear where it binds (lim >= +0, or -0 with bound -0: then
             * every |m| > 0 binds and takes m's sign anyway) */
            const __m128 clamped = _mm_or_ps(_mm_andnot_ps(signmask, lim), _mm_and_ps(mm, signmask));
            _mm_storeu_ps(m + i, _mm_or_ps(_mm_and_ps(over, clamped), _mm_andnot_ps(over, mm)));
        }
    }
#endif
    for (; i < n; i++) {
        const float lim = sqrtf(v[i] > 0.0f ? v[i] : 0.0f) * bound;
        if (fabsf(m[i]) > lim) m[i] = copysignf(lim, m[i]);
    }
    return 0;
}

int mvc_scan_f32(const float *x, size_t n, int64_t *counts)
{
    if (counts == NULL || (n > 0 && x == NULL)) return -1;
    int64_t bad = 0, neg = 0, zero = 0, pos = 0;
    /* 32-bit counts over blocks that cannot overflow them, and finiteness as a comparison
     * (|v| <= FLT_MAX is false for inf and NaN, as !isfinite): the loop then vectorizes
     * (2.1 -> 0.8 ns a value), where int64 counters and isfinite kept it scalar. */
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
