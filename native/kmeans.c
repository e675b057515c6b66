/* Weighted 1-D k-means (see kmeans.h): the arithmetic of mvc/quant/kmeans.py's numpy code,
 * step for step, so that centres come out bit-identical to it. */
#include "kmeans.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

/* numpy's float order: NaN after everything. */
static int less(double a, double b) {
    return a < b || (b != b && a == a);
}

/* numpy.searchsorted(a, v, side="right") (a ascending in numpy's order). */
static size_t upper_bound(const double *a, size_t n, double v) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (less(v, a[mid])) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* numpy.argmax: the first index of the largest value, or of the first NaN. */
static size_t argmax(const double *a, size_t n) {
    size_t best = 0;
    if (a[0] != a[0]) return 0;
    for (size_t j = 1; j < n; j++) {
        if (a[j] != a[j]) return j;
        if (a[j] > a[best]) best = j;
    }
    return best;
}

/* numpy.cumsum: out[0] = a[0], out[j] = out[j - 1] + a[j]. */
static void prefix(const double *a, size_t n, double *out) {
    double acc = a[0];
    out[0] = acc;
    for (size_t j = 1; j < n; j++) {
        acc += a[j];
        out[j] = acc;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int64_t mvc_kmeanspp(const double *values, const double *weights, size_t n, int k, int trials,
                     const double *draws, size_t n_draws, double *out, size_t out_len) {
    if (!values || !weights || !draws || !out || n == 0 || k < 1 || trials < 1)
        return MVC_ERR_ARG;
    size_t K = (size_t)k, T = (size_t)trials;
    if (out_len < K || K > SIZE_MAX / T || n_draws < K * T) return MVC_ERR_ARG;
    if (n > SIZE_MAX / sizeof(double) / (T + 3)) return MVC_ERR_ARG;
    double *d2 = malloc(n * sizeof(double)), *p = malloc(n * sizeof(double));
    double *cs = malloc(n * sizeof(double)), *cands = malloc(T * n * sizeof(double));
    size_t *idx = malloc(T * sizeof(size_t));
    double *pots = malloc(T * sizeof(double));
    int64_t count = MVC_ERR_NOMEM;
    if (!d2 || !p || !cs || !cands || !idx || !pots) goto done;

    /* centre 0: drawn proportionally to the weights (kmeans.py `_sample`) */
    prefix(weights, n, cs);
    size_t j0 = upper_bound(cs, n, draws[0] * cs[n - 1]);
    if (j0 >= n || weights[j0] <= 0) j0 = argmax(weights, n);
    out[0] = values[j0];
    count = 1;
    for (size_t j = 0; j < n; j++) {
        double d = values[j] - out[0];
        d2[j] = d * d;
    }
    for (size_t i = 1; i < K; i++) {
        int positive = 0;
        for (size_t j = 0; j < n; j++) {
            p[j] = d2[j] * weights[j];
            positive |= p[j] > 0;
        }
        if (!positive) break;      /* every point is a centre (p.sum() > 0 fails) */
        prefix(p, n, cs);
        int bad = 0;
        for (size_t t = 0; t < T; t++) {
            size_t at = upper_bound(cs, n, draws[i * T + t] * cs[n - 1]);
            if (at >= n || p[at] <= 0) {
                bad = 1;
                at = SIZE_MAX;
            }
            idx[t] = at;
        }
        if (bad) {
            size_t heaviest = argmax(p, n);
            for (size_t t = 0; t < T; t++)
                if (idx[t] == SIZE_MAX) idx[t] = heaviest;
        }
        size_t best = 0;
        for (size_t t = 0; t < T; t++) {
            double c = values[idx[t]], pot = 0.0, *row = cands + t * n;
            for (size_t j = 0; j < n; j++) {
                double d = values[j] - c;
                d *= d;
                row[j] = d2[j] < d ? d2[j] : d;
                pot += row[j] * weights[j];
            }
            pots[t] = pot;
            if (pots[t] < pots[best]) best = t;
        }
        out[count++] = values[idx[best]];
        memcpy(d2, cands + best * n, n * sizeof(double));
    }
done:
    free(d2); free(p); free(cs); free(cands); free(idx); free(pots);
    return count;
}

/* kmeans.py `_reseed_empty`: each empty cluster's centre (in index order) moves onto the
 * point with the largest weighted squared error, which that point then no longer has. */
static void reseed_empty(const double *values, const double *weights, size_t n,
                         double *centres, size_t k, const size_t *edges, const char *empty,
                         double *err) {
    for (size_t c = 0; c < k; c++)
        for (size_t j = edges[c]; j < edges[c + 1]; j++) {
            double d = values[j] - centres[c];
            err[j] = weights[j] * (d * d);
        }
    for (size_t c = 0; c < k; c++) {
        if (!empty[c]) continue;
        size_t i = argmax(err, n);
        if (err[i] <= 0) break;
        centres[c] = values[i];
        for (size_t j = 0; j < n; j++) {
            double d = values[j] - values[i], e = weights[j] * (d * d);
            if (e < err[j]) err[j] = e;
        }
    }
}

int64_t mvc_lloyd_1d(const double *values, const double *weights, size_t n, double *centres,
                     size_t k, int max_iters) {
    if (!values || !weights || !centres || n == 0 || k == 0 || max_iters < 0)
        return MVC_ERR_ARG;
    if (n >= SIZE_MAX / sizeof(double) / 4 || k >= SIZE_MAX / sizeof(size_t) / 2)
        return MVC_ERR_ARG;
    double *cw = malloc((n + 1) * sizeof(double)), *cwx = malloc((n + 1) * sizeof(double));
    double *wx = malloc(n * sizeof(double)), *err = malloc(n * sizeof(double));
    size_t *edges = malloc((k + 1) * sizeof(size_t)), *prev = malloc((k + 1) * sizeof(size_t));
    char *empty = malloc(k);
    int64_t it = MVC_ERR_NOMEM;
    if (!cw || !cwx || !wx || !err || !edges || !prev || !empty) goto done;
    cw[0] = cwx[0] = 0.0;
    prefix(weights, n, cw + 1);
    for (size_t j = 0; j < n; j++) wx[j] = weights[j] * values[j];
    prefix(wx, n, cwx + 1);
    int have_prev = 0;
    for (it = 0; it < max_iters; it++) {
        /* a point on a midpoint joins the lower cluster (searchsorted right) */
        edges[0] = 0;
        for (size_t c = 0; c + 1 < k; c++)
            edges[c + 1] = upper_bound(values, n, (centres[c] + centres[c + 1]) * 0.5);
        edges[k] = n;
        if (have_prev && memcmp(edges, prev, (k + 1) * sizeof(size_t)) == 0) break;
        memcpy(prev, edges, (k + 1) * sizeof(size_t));
        have_prev = 1;
        int any_empty = 0;
        for (size_t c = 0; c < k; c++) {
            double sw = cw[edges[c + 1]] - cw[edges[c]];
            double swx = cwx[edges[c + 1]] - cwx[edges[c]];
            empty[c] = !(sw > 0);
            if (empty[c]) {
                any_empty = 1;
                continue;
            }
            /* kept inside the cluster's hull despite prefix-sum cancellation (np.clip) */
            double lo = values[edges[c] < n - 1 ? edges[c] : n - 1];
            double hi = values[edges[c + 1] > 0 ? edges[c + 1] - 1 : 0];
            double x = swx / sw;
            x = x > lo ? x : lo;
            centres[c] = x < hi ? x : hi;
        }
        if (any_empty) reseed_empty(values, weights, n, centres, k, edges, empty, err);
        qsort(centres, k, sizeof(double), cmp_double);
    }
done:
    free(cw); free(cwx); free(wx); free(err); free(edges); free(prev); free(empty);
    return it;
}
