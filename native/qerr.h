#ifndef MVC_QERR_H
#define MVC_QERR_H
/* One-pass error sums of a quantization and of Adam's moment ratio: what the config
 * search's proxy metric, its per-tensor guard rail and the first-moment bound read.
 * Plain C over caller-owned buffers; no Python API. */
#include <stddef.h>
#include <stdint.h>

/* For i < n, with d[i] = table[levels[i]] - x[i] (0 when levels[i] == n_table - 1, the
 * protected level, whose value is exact), all in double:
 *   sums[0] += d^2          sums[1] += x^2
 *   sums[2] += |x| d^2      sums[3] += |x| x^2
 *   sums[4] += |w| d^2      sums[5] += |w| x^2     (only when w != NULL)
 * in index order.  table holds n_table >= 2 float32 values (the centroids rounded to the
 * tensor's dtype, then 0 for the pruned level, then anything for the protected one).
 * Returns 0, or -1 on a bad argument or a level >= n_table (sums are then partial). */
int mvc_qerr_sums_u8(const float *x, const uint8_t *levels, size_t n, const float *table,
                     int n_table, const float *w, double *sums);
int mvc_qerr_sums_i16(const float *x, const int16_t *levels, size_t n, const float *table,
                      int n_table, const float *w, double *sums);

/* A second moment's error in sqrt(v), Adam's denominator, with no float32 copy of sqrt(v):
 * with s = sqrtf(v[i] < 0 ? 0 : v[i]) (correctly rounded, NaN kept) and d = table[levels[i]]
 * - s (0 at the protected level n_table - 1), in double:
 *   sums[0] += sum d^2      sums[1] += sum s^2
 * (sums[2..5] untouched), summed in four lanes by i % 4, the lanes added pairwise, then
 * the n % 4 tail: the same bits on every build.  Returns 0, or -1 on a bad argument or a
 * level >= n_table (sums are then partial). */
int mvc_qerr_sqrt_sums_u8(const float *v, const uint8_t *levels, size_t n, const float *table,
                          int n_table, double *sums);
int mvc_qerr_sqrt_sums_i16(const float *v, const int16_t *levels, size_t n, const float *table,
                           int n_table, double *sums);

/* The largest |m[i]| / sqrt(v[i]) over the i with v[i] > 0, computed in float32 (one
 * rounding for the square root, one for the division), into *out; 0 when no v[i] > 0.
 * Returns the number of such i, or -1 on a bad argument. */
int64_t mvc_ratio_max_f32(const float *m, const float *v, size_t n, float *out);

/* The first-moment bound's clamp (mvc.quant.moment_bound, form "ieee"), in place: for i < n,
 * with limit = sqrtf(v[i] > 0 ? v[i] : 0) * bound (the correctly rounded float32 sqrt, one
 * rounding for the product; v NaN counts as 0), m[i] = copysignf(limit, m[i]) where
 * fabsf(m[i]) > limit; every other m[i] keeps its bits (signed zeros and NaN included).
 * Returns 0, or -1 on a bad argument (a NULL buffer with n > 0, a negative or NaN bound). */
int mvc_moment_clamp_f32(float *m, const float *v, size_t n, float bound);

/* One scan of float32 x: counts[0] += non-finite (NaN, +-Inf), counts[1] += x < 0 (-Inf
 * included), counts[2] += zeros (+-0), counts[3] += x > 0 (+Inf included); NaN counts
 * only as non-finite.  Returns 0, or -1 on a bad argument. */
int mvc_scan_f32(const float *x, size_t n, int64_t *counts);
#endif
