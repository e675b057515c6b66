#ifndef MVC_ASSIGN_H
#define MVC_ASSIGN_H
/* Quantizer hot loops: nearest-centroid assignment, the DDSketch log histogram and
 * per-level sums.  Plain C over caller-owned buffers; no Python API. */
#include <stddef.h>
#include <stdint.h>

/* Prune / protect rule applied element by element (Inshrinkerator §4.2).  Element i is
 * protected if |x[i]| > protect_mag_t or (sens != NULL and sens[i] > protect_sens_t),
 * else pruned if importance <= prune_t (importance = sens[i] if prune_on_sens, else
 * |x[i]|), else kept.  Disable a rule with +inf (protect) or a negative prune_t. */
typedef struct {
    const float *sens;
    float prune_t;
    float protect_mag_t;
    float protect_sens_t;
    int prune_on_sens;
} mvc_partition_t;

/* Optional statistics of an assignment, gathered in the same pass (what the config search
 * reads off a quantization): with l the level assigned and d = table[l] - x[i] (0 at the
 * last table entry, the protected level), sums[0..5] += (d^2, x^2, |x| d^2, |x| x^2,
 * |w| d^2, |w| x^2) summed in float64 in element order (the last two 0 without w), exactly
 * as mvc_qerr_sums_* over the same elements, and counts[l]++.  n_table must exceed every
 * level the call can assign (k + 1 with a partition, else n_mids). */
typedef struct {
    const float *table;
    int n_table;
    const float *w;
    double *sums;
    int64_t *counts;
} mvc_assign_stats_t;

/* out[i] = number of mids[j] strictly below x[i] (== torch.bucketize(x, mids, right=False)).
 * mids sorted ascending; n_mids <= 253 for u8, <= 32765 for i16.  With part != NULL,
 * pruned elements get level k and protected ones k + 1 instead (k <= 254 for u8,
 * <= 32766 for i16), and *n_protected (if not NULL) is increased by the number of
 * protected elements.  `stats` (may be NULL): see above.  Returns 0, -1 on a bad argument,
 * -2 when out of memory. */
int mvc_assign_f32_u8(const float *x, size_t n, const float *mids, int n_mids,
                      const mvc_partition_t *part, int k, const mvc_assign_stats_t *stats,
                      uint8_t *out, int64_t *n_protected);
int mvc_assign_f32_i16(const float *x, size_t n, const float *mids, int n_mids,
                       const mvc_partition_t *part, int k, const mvc_assign_stats_t *stats,
                       int16_t *out, int64_t *n_protected);

/* Copy src[i] (elem_size bytes each) to out, in index order, for every i with
 * levels[i] == level; at most cap elements.  Returns the number copied, or -1 on a bad
 * argument or when more than cap elements match. */
int64_t mvc_gather_level_u8(const uint8_t *levels, size_t n, int level, const void *src,
                            size_t elem_size, void *out, size_t cap);
int64_t mvc_gather_level_i16(const int16_t *levels, size_t n, int level, const void *src,
                             size_t elem_size, void *out, size_t cap);

/* Log-bucket histogram: for every finite non-zero x[i] (kept by part, if given), the
 * bucket j is the smallest index with |x[i]| <= bounds[j], where bounds[j] =
 * gamma^(first_index + j) (ascending, spanning the float32 range with one spare entry
 * each side, inv_log2_gamma = 1 / log2(gamma), gamma >= 1.002).  counts[j] counts
 * positive values, counts[n_bounds + j] negative ones, *zero the zeros; all are added
 * to.  Normal values find their bucket through `cells` (n_cells == 255 << cell_bits): cell
 * c = (bits of |x|) >> (23 - cell_bits) holds the bucket of the smallest float32 in it,
 * and a cell is narrower than a bucket (2^-cell_bits < gamma - 1), so one comparison
 * settles the rest; subnormals take a bit-level log2 seed.  Returns the number of
 * non-finite elements (skipped), or -1 on a bad argument. */
int64_t mvc_loghist_f32(const float *x, size_t n, const mvc_partition_t *part,
                        const double *bounds, int n_bounds, double inv_log2_gamma,
                        int first_index, const int32_t *cells, size_t n_cells,
                        int cell_bits, int64_t *counts, int64_t *zero);

/* sums[l] += x[i] and counts[l]++ for every i with 0 <= levels[i] < n_levels (in index
 * order).  Returns 0, or -1 on a bad argument. */
int mvc_level_sums_u8(const float *x, const uint8_t *levels, size_t n, int n_levels,
                      double *sums, int64_t *counts);
int mvc_level_sums_i16(const float *x, const int16_t *levels, size_t n, int n_levels,
                       double *sums, int64_t *counts);
/* Dequantize: out[i] = table[levels[i]] for elements of elem_size (2, 4 or 8) bytes, except
 * level n_table - 1 (protected), which takes the next of the n_protected values in
 * protected_vals.  Returns 0, or -1 when a level is out of range, the protected count
 * does not match or an argument is bad. */
int mvc_dequant_u8(const uint8_t *levels, size_t n, const void *table, int n_table,
                   size_t elem_size, const void *protected_vals, size_t n_protected, void *out);
int mvc_dequant_i16(const int16_t *levels, size_t n, const void *table, int n_table,
                    size_t elem_size, const void *protected_vals, size_t n_protected, void *out);
#endif
