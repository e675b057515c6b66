#ifndef MVC_GROUPS_H
#define MVC_GROUPS_H
/* Quantization-aware delta rearrangement (Inshrinkerator Alg. 5 and 6), fused with
 * the cyclic delta D = (parent - cur) mod modulus, as O(n) counting-sort passes.
 * Level and delta arrays share one element width: 1 (uint8) or 2 (uint16 LE).
 * Plain C over caller-owned buffers; no Python API.  Status codes: status.h. */
#include <stddef.h>
#include <stdint.h>

/* counts[g] = number of parent[i] == g, for g < n_groups (counts is overwritten).
 * MVC_ERR_RANGE if some parent[i] >= n_groups. */
int mvc_grp_count(const void *parent, size_t n, int width, uint32_t n_groups,
                  int64_t *counts);

/* out = (parent - cur) mod modulus, stably partitioned by parent level when counts is
 * not NULL (counts from mvc_grp_count over the same parent), in original order when
 * it is NULL.  Every parent[i] must be < n_groups and < modulus, every cur[i] < modulus
 * (else MVC_ERR_RANGE; out is then partly written); counts that do not match the parent
 * give MVC_ERR_ARG. */
int mvc_grp_delta(const void *parent, const void *cur, size_t n, int width,
                  uint32_t modulus, const int64_t *counts, uint32_t n_groups, void *out);

/* Inverse: out[i] = (parent[i] - d) mod modulus where d is the next value of parent[i]'s
 * group in `delta` (counts not NULL) or delta[i] (counts NULL).  Every result must be
 * < n_cur and every delta value < modulus, else MVC_ERR_CORRUPT; MVC_ERR_RANGE for a
 * parent level >= n_groups or >= modulus, MVC_ERR_ARG for counts that do not match
 * the parent.  *n_top = number of results == n_cur - 1. */
int mvc_grp_apply(const void *parent, const void *delta, size_t n, int width,
                  uint32_t modulus, uint32_t n_cur, const int64_t *counts, uint32_t n_groups,
                  void *out, uint64_t *n_top);

/* One segment of mvc_grp_delta, for running a tensor's segments in parallel: `starts`
 * and `counts` give, for each group g, this segment's range of group g in the whole
 * tensor's grouped stream `delta` (delta_n values): [starts[g], starts[g] + counts[g]).
 * `counts` are the segment's own (mvc_grp_count over its parent levels); segments given
 * disjoint ranges fill the stream exactly as one mvc_grp_delta call over the tensor does.
 * Element checks and status codes as mvc_grp_delta; a range outside delta_n, or counts
 * that do not add up to n or do not match the parent, give MVC_ERR_ARG. */
int mvc_grp_delta_part(const void *parent, const void *cur, size_t n, int width,
                       uint32_t modulus, const int64_t *counts, const int64_t *starts,
                       uint32_t n_groups, void *delta, size_t delta_n);
#endif
