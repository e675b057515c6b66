#ifndef MVC_QERR_SUM_H
#define MVC_QERR_SUM_H
/* Internal to the native kernels: one element's terms of the six error sums, shared by
 * mvc_qerr_sums_* (qerr.c) and the assignment's statistics (assign.c), which must give the
 * same bits.  With d = table[lv] - x (0 at the protected level `prot`):
 *     s0 += d^2, s1 += x^2, s2 += |x| d^2, s3 += |x| x^2, s4 += |w| d^2, s5 += |w| x^2
 * in float64, in this order (w NULL: s4, s5 untouched).  Callers keep a qerr_acc in a local
 * variable, so the compiler holds its six sums in registers. */
#include <math.h>

typedef struct {
    double s0, s1, s2, s3, s4, s5;
} qerr_acc;

static inline void qerr_add(qerr_acc *a, int lv, float x, const float *table, int prot,
                            const float *w)
{
    const double xv = (double)x;
    const double d = (lv == prot) ? 0.0 : (double)table[lv] - xv;
    const double dd = d * d, xx = xv * xv, ax = fabs(xv);
    a->s0 += dd;
    a->s1 += xx;
    a->s2 += ax * dd;
    a->s3 += ax * xx;
    if (w != NULL) {
        const double aw = fabs((double)*w);
        a->s4 += aw * dd;
        a->s5 += aw * xx;
    }
}

static inline void qerr_flush(const qerr_acc *a, double *sums)
{
    sums[0] += a->s0; sums[1] += a->s1; sums[2] += a->s2; sums[3] += a->s3;
    sums[4] += a->s4; sums[5] += a->s5;
}
#endif
