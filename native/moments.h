#ifndef MVC_MOMENTS_H
#define MVC_MOMENTS_H
/* Optimizer-moment compaction in one pass: the log-domain second moment quantizes
 * log(v) of its positive entries only, then spreads their levels back.  Plain C over
 * caller-owned buffers; no Python API. */
#include <stddef.h>
#include <stdint.h>

/* For every i < n with v[i] > 0, in index order: out[j++] = (float)log((double)v[i]).
 * Returns the number written, or -1 on a bad argument or when more than cap entries are
 * positive (nothing past out[cap - 1] is written). */
int64_t mvc_log_positive_f32(const float *v, size_t n, float *out, size_t cap);

/* out[i] = sub[j++] where v[i] > 0 (in index order), else fill.  Returns the number of
 * sub entries used, or -1 on a bad argument or when sub holds fewer than needed. */
int64_t mvc_expand_positive_u8(const float *v, size_t n, const uint8_t *sub, size_t n_sub,
                               uint8_t fill, uint8_t *out);
int64_t mvc_expand_positive_i16(const float *v, size_t n, const int16_t *sub, size_t n_sub,
                                int16_t fill, int16_t *out);
/* First moments: entry i is kept when m[i] != 0 and, with weight levels wlev (wsize 1:
 * uint8, 2: int16; NULL: no weights), wlev[i] != wpruned (joint pruning).
 * mvc_compact_moment_f32 writes the kept m[i] to out in index order and returns their
 * number (out may be NULL with cap 0: count only), or -1 on a bad argument or when more
 * than cap are kept. */
int64_t mvc_compact_moment_f32(const float *m, size_t n, const void *wlev, int wsize,
                               int wpruned, float *out, size_t cap);
/* out[i] = sub[j++] for kept entries (as above), else fill.  Returns the number of sub
 * entries used, or -1 on a bad argument or when sub holds fewer than needed. */
int64_t mvc_expand_moment_u8(const float *m, size_t n, const void *wlev, int wsize,
                             int wpruned, const uint8_t *sub, size_t n_sub, uint8_t fill,
                             uint8_t *out);
int64_t mvc_expand_moment_i16(const float *m, size_t n, const void *wlev, int wsize,
                              int wpruned, const int16_t *sub, size_t n_sub, int16_t fill,
                              int16_t *out);
#endif
