/* Quantizer kernels; see assign.h.  Inner loops are branch-free where the data decides
 * (comparisons against midpoints, signs, prune/protect classes): those branches would
 * mispredict on a large share of elements. */
#include "assign.h"
#include "internal/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal/qerr_sum.h"

#define ASSIGN_CHUNK 512
#define LINEAR_MAX_MIDS 16
#define SEARCH_MAX_PAD 32768

/* 0 = keep, 1 = prune, 2 = protect. */
static inline unsigned part_class(const mvc_partition_t *p, float v, size_t i)
{
    const float a = fabsf(v);
    const float s = p->sens ? p->sens[i] : 0.0f;
    const unsigned prot = (a > p->protect_mag_t) | (p->sens != NULL && s > p->protect_sens_t);
    const float imp = p->prune_on_sens ? s : a;
    const unsigned prune = (imp <= p->prune_t) & !prot;
    return prot * 2u + prune;
}

/* Few midpoints: count them with a comparison sweep the compiler can vectorize. */
static void count_linear(const float *x, size_t n, const float *mids, int n_mids, uint32_t *acc)
{
    for (size_t i = 0; i < n; i++) acc[i] = 0;
    for (int j = 0; j < n_mids; j++) {
        const float t = mids[j];
        for (size_t i = 0; i < n; i++) acc[i] += (uint32_t)(x[i] > t);
    }
}

/* Many midpoints: branchless binary search over a +inf padded power-of-two table,
 * eight independent searches interleaved to hide load latency. */
static void count_search(const float *x, size_t n, const float *tab, unsigned pad, uint32_t *acc)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned p0 = 0, p1 = 0, p2 = 0, p3 = 0, p4 = 0, p5 = 0, p6 = 0, p7 = 0;
        const float x0 = x[i], x1 = x[i + 1], x2 = x[i + 2], x3 = x[i + 3];
        const float x4 = x[i + 4], x5 = x[i + 5], x6 = x[i + 6], x7 = x[i + 7];
        for (unsigned s = pad >> 1; s; s >>= 1) {
            p0 += (tab[p0 + s - 1] < x0) ? s : 0;
            p1 += (tab[p1 + s - 1] < x1) ? s : 0;
            p2 += (tab[p2 + s - 1] < x2) ? s : 0;
            p3 += (tab[p3 + s - 1] < x3) ? s : 0;
            p4 += (tab[p4 + s - 1] < x4) ? s : 0;
            p5 += (tab[p5 + s - 1] < x5) ? s : 0;
            p6 += (tab[p6 + s - 1] < x6) ? s : 0;
            p7 += (tab[p7 + s - 1] < x7) ? s : 0;
        }
        acc[i] = p0; acc[i + 1] = p1; acc[i + 2] = p2; acc[i + 3] = p3;
        acc[i + 4] = p4; acc[i + 5] = p5; acc[i + 6] = p6; acc[i + 7] = p7;
    }
    for (; i < n; i++) {
        unsigned p = 0;
        const float v = x[i];
        for (unsigned s = pad >> 1; s; s >>= 1) p += (tab[p + s - 1] < v) ? s : 0;
        acc[i] = p;
    }
}

#if MVC_X86
/* count_linear and count_search, 16 elements at a time: the same counts (a comparison with a
 * NaN is false in both forms). */
__attribute__((target("avx512f,avx512bw")))
static void count_linear_avx512(const float *x, size_t n, const float *mids, int n_mids,
                                uint32_t *acc)
{
    const __m512i one = _mm512_set1_epi32(1);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        __m512i c = _mm512_setzero_si512();
        for (int j = 0; j < n_mids; j++)
            c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(v, _mm512_set1_ps(mids[j]), _CMP_GT_OQ),
                                      c, one);
        _mm512_storeu_si512((void *)(acc + i), c);
    }
    if (i < n) count_linear(x + i, n - i, mids, n_mids, acc + i);
}

__attribute__((target("avx512f,avx512bw")))
static void count_search_avx512(const float *x, size_t n, const float *tab, unsigned pad,
                                uint32_t *acc)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {  /* two searches interleaved: one's gather hides the other's */
        const __m512 va = _mm512_loadu_ps(x + i), vb = _mm512_loadu_ps(x + i + 16);
        __m512i pa = _mm512_setzero_si512(), pb = _mm512_setzero_si512();
        for (unsigned s = pad >> 1; s; s >>= 1) {
            const __m512i off = _mm512_set1_epi32((int)(s - 1)), step = _mm512_set1_epi32((int)s);
            const __m512 ta = _mm512_i32gather_ps(_mm512_add_epi32(pa, off), tab, 4);
            const __m512 tb = _mm512_i32gather_ps(_mm512_add_epi32(pb, off), tab, 4);
            pa = _mm512_mask_add_epi32(pa, _mm512_cmp_ps_mask(ta, va, _CMP_LT_OQ), pa, step);
            pb = _mm512_mask_add_epi32(pb, _mm512_cmp_ps_mask(tb, vb, _CMP_LT_OQ), pb, step);
        }
        _mm512_storeu_si512((void *)(acc + i), pa);
        _mm512_storeu_si512((void *)(acc + i + 16), pb);
    }
    if (i < n) count_search(x + i, n - i, tab, pad, acc + i);
}

/* count_linear, 8 elements at a time (a comparison's all-ones lanes are -1): the same counts
 * (a comparison with a NaN is false in both forms). */
__attribute__((target("avx2")))
static void count_linear_avx2(const float *x, size_t n, const float *mids, int n_mids,
                              uint32_t *acc)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        __m256i c = _mm256_setzero_si256();
        for (int j = 0; j < n_mids; j++)
            c = _mm256_sub_epi32(c, _mm256_castps_si256(
                _mm256_cmp_ps(v, _mm256_set1_ps(mids[j]), _CMP_GT_OQ)));
        _mm256_storeu_si256((__m256i *)(void *)(acc + i), c);
    }
    if (i < n) count_linear(x + i, n - i, mids, n_mids, acc + i);
}

/* count_search for up to 64 midpoints without gathers (slow on some AVX2 CPUs: measured
 * slower than the scalar search on an AMD EPYC): the padded table's every eighth entry in one
 * register; the pivots below x say which eight entries hold x's place (all before them are
 * below x, the eighth of them is not), and one compare with those eight finishes the count. */
__attribute__((target("avx2,popcnt")))
static void count_search_avx2(const float *x, size_t n, const float *tab, unsigned pad,
                              uint32_t *acc)
{
    if (pad < 8 || pad > 64) { count_search(x, n, tab, pad, acc); return; }
    float piv[8];
    for (unsigned j = 0; j < 8; j++) piv[j] = 8 * j + 7 < pad ? tab[8 * j + 7] : INFINITY;
    const __m256 p = _mm256_loadu_ps(piv);
    for (size_t i = 0; i < n; i++) {
        const __m256 v = _mm256_set1_ps(x[i]);
        const unsigned b = (unsigned)__builtin_popcount(
            (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(p, v, _CMP_LT_OQ)));
        const unsigned base = 8 * (b < pad / 8 ? b : pad / 8 - 1);
        const __m256 t = _mm256_loadu_ps(tab + base);
        acc[i] = base + (unsigned)__builtin_popcount(
            (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(t, v, _CMP_LT_OQ)));
    }
}
#endif

typedef void (*count_linear_fn)(const float *, size_t, const float *, int, uint32_t *);
typedef void (*count_search_fn)(const float *, size_t, const float *, unsigned, uint32_t *);

/* The widest forms this CPU runs (at most the SIMD cap). */
static void count_forms(count_linear_fn *lin, count_search_fn *search)
{
    *lin = count_linear;
    *search = count_search;
#if MVC_X86
    if (cpu_avx512()) { *lin = count_linear_avx512; *search = count_search_avx512; }
    else if (cpu_avx2()) { *lin = count_linear_avx2; *search = count_search_avx2; }
#endif
}

/* Shared driver for both output widths (exactly one of out8 / out16 is set). */
/* part_class over a chunk, levels replaced by k (pruned) / k + 1 (protected); returns the
 * protected count.  The sensitivity stream is tested once, outside the loops, so that each
 * loop is straight-line selects the compiler vectorizes (a conditional load per element
 * kept the per-element rule several times slower than the midpoint search itself). */
static int64_t apply_partition(const mvc_partition_t *p, const float *x, size_t off, size_t m,
                               int k, uint32_t *acc)
{
    const float pm = p->protect_mag_t, ps = p->protect_sens_t, pt = p->prune_t;
    const uint32_t kp = (uint32_t)k, kq = (uint32_t)k + 1u;
    uint32_t n_prot = 0;
    /* masks, not ternaries: a select on acc[i] is control flow to the vectorizer */
#define PART_SELECT(prot, imp)                                                         \
    do {                                                                               \
        const uint32_t mq = 0u - (prot);                                               \
        const uint32_t mp = (0u - (uint32_t)((imp) <= pt)) & ~mq;                      \
        acc[i] = (acc[i] & ~(mq | mp)) | (kq & mq) | (kp & mp);                        \
        n_prot += (prot);                                                              \
    } while (0)
    if (p->sens != NULL && p->prune_on_sens) {
        const float *sens = p->sens + off;
        for (size_t i = 0; i < m; i++) {
            const uint32_t prot = (uint32_t)(fabsf(x[i]) > pm) | (uint32_t)(sens[i] > ps);
            PART_SELECT(prot, sens[i]);
        }
    } else if (p->sens != NULL) {
        const float *sens = p->sens + off;
        for (size_t i = 0; i < m; i++) {
            const float a = fabsf(x[i]);
            const uint32_t prot = (uint32_t)(a > pm) | (uint32_t)(sens[i] > ps);
            PART_SELECT(prot, a);
        }
    } else if (p->prune_on_sens) {
        /* without a stream, a sensitivity importance is 0 (as part_class has it) */
        for (size_t i = 0; i < m; i++) {
            const uint32_t prot = (uint32_t)(fabsf(x[i]) > pm);
            PART_SELECT(prot, 0.0f);
        }
    } else {
        for (size_t i = 0; i < m; i++) {
            const float a = fabsf(x[i]);
            const uint32_t prot = (uint32_t)(a > pm);
            PART_SELECT(prot, a);
        }
    }
#undef PART_SELECT
    return (int64_t)n_prot;
}

/* The statistics of one chunk of assigned levels (see mvc_assign_stats_t), added to `acc`
 * in element order, as mvc_qerr_sums_* adds them (internal/qerr_sum.h). */
static void chunk_stats(const float *x, const uint32_t *acc_levels, size_t m, const float *table,
                        int prot, const float *w, qerr_acc *acc, int64_t *counts)
{
    qerr_acc a = *acc; /* a local copy: the count stores cannot alias it (registers) */
    for (size_t i = 0; i < m; i++) {
        const int lv = (int)acc_levels[i];
        counts[lv]++;
        qerr_add(&a, lv, x[i], table, prot, w != NULL ? w + i : NULL);
    }
    *acc = a;
}

static int assign_impl(const float *x, size_t n, const float *mids, int n_mids,
                       const mvc_partition_t *part_in, int k, const mvc_assign_stats_t *stats,
                       uint8_t *out8, int16_t *out16, int64_t *n_protected)
{
    uint32_t acc[ASSIGN_CHUNK];
    /* a local copy: stores through out8/out16 cannot alias it, so it stays in registers */
    mvc_partition_t local;
    const mvc_partition_t *part = NULL;
    if (part_in != NULL) { local = *part_in; part = &local; }
    int64_t protected_count = 0;
    if (n_mids < 0 || (n_mids > 0 && mids == NULL) || (n > 0 && x == NULL)) return -1;
    if (part != NULL && k < n_mids + 1) return -1;
    if (stats != NULL) {
        const int top = part != NULL ? k + 1 : n_mids;
        if (stats->table == NULL || stats->sums == NULL || stats->counts == NULL
            || stats->n_table <= top) return -1;
    }
    qerr_acc ssum = {0, 0, 0, 0, 0, 0};
    float *tab = NULL;
    unsigned pad = 1;
    const int linear = n_mids <= LINEAR_MAX_MIDS;
    count_linear_fn lin_form;
    count_search_fn search_form;
    count_forms(&lin_form, &search_form);
    if (!linear) {
        while (pad < (unsigned)n_mids + 1) pad <<= 1;
        tab = (float *)malloc(sizeof(float) * pad);
        if (tab == NULL) return -2;
        for (unsigned j = 0; j < pad; j++) tab[j] = j < (unsigned)n_mids ? mids[j] : INFINITY;
    }
    for (size_t i0 = 0; i0 < n; i0 += ASSIGN_CHUNK) {
        const size_t m = (n - i0) < ASSIGN_CHUNK ? (n - i0) : ASSIGN_CHUNK;
        if (linear) lin_form(x + i0, m, mids, n_mids, acc);
        else search_form(x + i0, m, tab, pad, acc);
        if (part != NULL) protected_count += apply_partition(part, x + i0, i0, m, k, acc);
        if (stats != NULL)
            chunk_stats(x + i0, acc, m, stats->table, stats->n_table - 1,
                        stats->w != NULL ? stats->w + i0 : NULL, &ssum, stats->counts);
        if (out8) for (size_t i = 0; i < m; i++) out8[i0 + i] = (uint8_t)acc[i];
        else for (size_t i = 0; i < m; i++) out16[i0 + i] = (int16_t)acc[i];
    }
    if (stats != NULL) qerr_flush(&ssum, stats->sums);
    free(tab);
    if (n_protected != NULL) *n_protected += protected_count;
    return 0;
}

int mvc_assign_f32_u8(const float *x, size_t n, const float *mids, int n_mids,
                      const mvc_partition_t *part, int k, const mvc_assign_stats_t *stats,
                      uint8_t *out, int64_t *n_protected)
{
    if (n_mids > 253 || (part != NULL && k > 254) || (n > 0 && out == NULL)) return -1;
    return assign_impl(x, n, mids, n_mids, part, k, stats, out, NULL, n_protected);
}

int mvc_assign_f32_i16(const float *x, size_t n, const float *mids, int n_mids,
                       const mvc_partition_t *part, int k, const mvc_assign_stats_t *stats,
                       int16_t *out, int64_t *n_protected)
{
    if (n_mids > 32765 || (part != NULL && k > 32766) || (n > 0 && out == NULL)) return -1;
    return assign_impl(x, n, mids, n_mids, part, k, stats, NULL, out, n_protected);
}

#define GATHER_BODY                                                         \
    if (n > 0 && (levels == NULL || src == NULL)) return -1;                \
    if (elem_size == 0 || (cap > 0 && out == NULL)) return -1;              \
    size_t w = 0;                                                           \
    const unsigned char *s = (const unsigned char *)src;                    \
    unsigned char *o = (unsigned char *)out;                                \
    for (size_t i = 0; i < n; i++) {                                        \
        if ((int)levels[i] == level) {                                      \
            if (w == cap) return -1;                                        \
            memcpy(o + w * elem_size, s + i * elem_size, elem_size);        \
            w++;                                                            \
        }                                                                   \
    }                                                                       \
    return (int64_t)w;

int64_t mvc_gather_level_u8(const uint8_t *levels, size_t n, int level, const void *src,
                            size_t elem_size, void *out, size_t cap)
{
    /* The gathered level (protected values) is rare: memchr's vectorized scan skips the
     * stretches between matches instead of comparing byte by byte. */
    if (n > 0 && (levels == NULL || src == NULL)) return -1;
    if (elem_size == 0 || (cap > 0 && out == NULL)) return -1;
    if (level < 0 || level > 255) return 0;
    size_t w = 0, i = 0;
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *o = (unsigned char *)out;
    while (i < n) {
        const uint8_t *hit = (const uint8_t *)memchr(levels + i, level, n - i);
        if (hit == NULL) break;
        i = (size_t)(hit - levels);
        if (w == cap) return -1;
        memcpy(o + w * elem_size, s + i * elem_size, elem_size);
        w++;
        i++;
    }
    return (int64_t)w;
}

int64_t mvc_gather_level_i16(const int16_t *levels, size_t n, int level, const void *src,
                             size_t elem_size, void *out, size_t cap)
{
    GATHER_BODY
}

/* log2 of a positive finite float from its bits: exponent plus a degree-5 fit of
 * log2(1 + t) (max error 1.5e-5, far below a bucket's width for any alpha >= 1e-3). */
static inline double fast_log2(uint32_t mag)
{
    int e = (int)(mag >> 23);
    uint32_t mant = mag & 0x7fffff;
    if (e == 0) { /* subnormal: normalise the mantissa by hand (rare) */
        int shift = 0;
        while (!(mant & 0x800000)) { mant <<= 1; shift++; }
        mant &= 0x7fffff;
        e = 1 - shift;
    }
    const double t = (double)mant * (1.0 / 8388608.0);
    const double p = 1.43909300e-05 + t * (1.44159208e+00 + t * (-7.07253434e-01 + t * (
        4.11561482e-01 + t * (-1.89832447e-01 + t * 4.39286278e-02))));
    return (double)(e - 127) + p;
}

int64_t mvc_loghist_f32(const float *x, size_t n, const mvc_partition_t *part_in,
                        const double *bounds, int n_bounds, double inv_log2_gamma,
                        int first_index, const int32_t *cells, size_t n_cells,
                        int cell_bits, int64_t *counts, int64_t *zero)
{
    mvc_partition_t local; /* see assign_impl: keeps the rule out of the aliasing analysis */
    const mvc_partition_t *part = NULL;
    if (part_in != NULL) { local = *part_in; part = &local; }
    if (n_bounds < 3 || bounds == NULL || counts == NULL || zero == NULL) return -1;
    if (n > 0 && x == NULL) return -1;
    if (cells == NULL || cell_bits < 0 || cell_bits > 23 || n_cells != ((size_t)255 << cell_bits))
        return -1;
    int64_t bad = 0, zeros = 0;
    const int last = n_bounds - 1;
    const int shift_bits = 23 - cell_bits;
    /* ceil(v) as a truncating cast of a shifted positive number; the shift keeps every
     * possible index (|v| < 1e6 for alpha >= 1e-3) positive. */
    const double shift = 1048576.0;
    const int base = 1048576 + first_index;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        const uint32_t mag = bits & 0x7fffffffu;
        if (mag >= 0x7f800000u) { bad++; continue; }
        if (part != NULL && part_class(part, x[i], i) != 0) continue;
        if (mag == 0) { zeros++; continue; }
        float fa;
        memcpy(&fa, &mag, sizeof fa);
        const double a = (double)fa;
        int j;
        if (mag >= 0x00800000u) {
            /* the cell's bucket, or the next one when a boundary lies inside the cell; the
             * clamp only keeps a wrong table inside the buffers */
            j = cells[mag >> shift_bits];
            j = j < 1 ? 1 : (j > last - 1 ? last - 1 : j);
            j += (a > bounds[j]);
        } else {
            const double v = fast_log2(mag) * inv_log2_gamma + shift;
            j = (int)v;
            j += (double)j < v; /* ceil */
            j -= base;
            j = j < 1 ? 1 : (j > last - 1 ? last - 1 : j);
            /* The seed is exact or one off (fast_log2's error is < 1% of a bucket), so one
             * branch-free nudge each way lands on the smallest j with a <= bounds[j]. */
            j += (a > bounds[j]);
            j -= (a <= bounds[j - 1]);
        }
        counts[j + (bits >> 31) * (size_t)n_bounds]++;
    }
    *zero += zeros;
    return bad;
}

/* Summed in element order, so a fixed split into blocks gives results that do not
 * depend on how many threads ran the blocks. */
#define LEVEL_SUMS_BODY                                             \
    if (n_levels < 1 || sums == NULL || counts == NULL) return -1;  \
    if (n > 0 && (x == NULL || levels == NULL)) return -1;          \
    for (size_t i = 0; i < n; i++) {                                \
        const int l = (int)levels[i];                               \
        if (l >= 0 && l < n_levels) {                               \
            sums[l] += (double)x[i];                                \
            counts[l]++;                                            \
        }                                                           \
    }                                                               \
    return 0;

int mvc_level_sums_u8(const float *x, const uint8_t *levels, size_t n, int n_levels,
                      double *sums, int64_t *counts)
{
    LEVEL_SUMS_BODY
}

int mvc_level_sums_i16(const float *x, const int16_t *levels, size_t n, int n_levels,
                       double *sums, int64_t *counts)
{
    LEVEL_SUMS_BODY
}

/* One loop per element size so the copies compile to plain moves. */
#define DEQUANT_LOOP(T)                                                     \
    do {                                                                    \
        const T *tab = (const T *)table;                                    \
        const T *prot = (const T *)protected_vals;                          \
        T *o = (T *)out;                                                    \
        for (size_t i = i0; i < n; i++) {                                   \
            const int l = (int)levels[i];                                   \
            if ((unsigned)l >= (unsigned)n_table) return -1;                \
            if (l == plevel) {                                              \
                if (p == n_protected) return -1;                            \
                o[i] = prot[p++];                                           \
            } else {                                                        \
                o[i] = tab[l];                                              \
            }                                                               \
        }                                                                   \
    } while (0)

/* `FAST` may decode a prefix first: it sets i0 (elements done) and p (protected used). */
#define DEQUANT_BODY(FAST)                                                  \
    if (n_table < 1 || table == NULL) return -1;                            \
    if (n > 0 && (levels == NULL || out == NULL)) return -1;                \
    if (n_protected > 0 && protected_vals == NULL) return -1;               \
    const int plevel = n_table - 1;                                         \
    size_t p = 0, i0 = 0;                                                   \
    FAST;                                                                   \
    switch (elem_size) {                                                    \
    case 2: DEQUANT_LOOP(uint16_t); break;                                  \
    case 4: DEQUANT_LOOP(uint32_t); break;                                  \
    case 8: DEQUANT_LOOP(uint64_t); break;                                  \
    default: return -1;                                                     \
    }                                                                       \
    return p == n_protected ? 0 : -1;

#if MVC_X86
/* Byte levels into 4-byte values, 16 at a time: a gather from the table, the protected
 * lanes filled from the protected values in order by an expanding load.  Stops before a
 * group with a level out of range or more protected lanes than values left; the scalar
 * loop then goes on from there and reports it. */
__attribute__((target("avx512f,avx512bw")))
static size_t dequant32_u8_avx512(const uint8_t *levels, size_t n, const uint32_t *tab, int n_table,
                                  const uint32_t *prot, size_t n_protected, size_t *pp, uint32_t *o)
{
    const __m512i lim = _mm512_set1_epi32(n_table), plv = _mm512_set1_epi32(n_table - 1);
    size_t i = 0, p = *pp;
    for (; i + 16 <= n; i += 16) {
        const __m512i l = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(levels + i)));
        if (_mm512_cmpge_epu32_mask(l, lim)) break;
        const __mmask16 k = _mm512_cmpeq_epi32_mask(l, plv);
        __m512i v = _mm512_i32gather_epi32(l, (const void *)tab, 4);
        if (k) {
            const size_t c = (size_t)__builtin_popcount((unsigned)k);
            if (n_protected - p < c) break;
            v = _mm512_mask_expandloadu_epi32(v, k, prot + p);
            p += c;
        }
        _mm512_storeu_si512((void *)(o + i), v);
    }
    *pp = p;
    return i;
}
#endif

/* Byte levels into 4-byte values take the AVX-512 prefix where the CPU has it. */
#if MVC_X86
#define DEQUANT_U8_FAST                                                     \
    if (elem_size == 4 && cpu_avx512())                                     \
        i0 = dequant32_u8_avx512(levels, n, (const uint32_t *)table, n_table, \
                                 (const uint32_t *)protected_vals, n_protected, &p, (uint32_t *)out)
#else
#define DEQUANT_U8_FAST (void)0
#endif

int mvc_dequant_u8(const uint8_t *levels, size_t n, const void *table, int n_table,
                   size_t elem_size, const void *protected_vals, size_t n_protected, void *out)
{
    DEQUANT_BODY(DEQUANT_U8_FAST)
}

int mvc_dequant_i16(const int16_t *levels, size_t n, const void *table, int n_table,
                    size_t elem_size, const void *protected_vals, size_t n_protected, void *out)
{
    DEQUANT_BODY((void)0)
}
