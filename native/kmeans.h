#ifndef MVC_KMEANS_H
#define MVC_KMEANS_H
/* Weighted 1-D k-means over a log histogram's buckets (Inshrinkerator Alg. 2 and 3): the
 * greedy k-means++ seeding and the Lloyd iterations of mvc/quant/kmeans.py, in C because a
 * search runs them once per tensor per trial (thousands of small calls whose numpy
 * overhead was most of a first commit's k-means time).  Every step is the float64
 * arithmetic the numpy version does, in the same order (sequential prefix sums,
 * first-index argmax, searchsorted right), so centres are bit-identical to it; the one
 * difference is the greedy step's potentials, summed here in index order where numpy's
 * dot leaves the order to the BLAS (it decides only between near-equal candidates).
 * Plain C over caller-owned buffers; no Python API. */
#include <stddef.h>
#include <stdint.h>

/* Greedy weighted k-means++ seeding over n >= 1 points `values` (ascending) with weights
 * > 0: centre 0 is drawn with probability proportional to the weights by draws[0]; centre
 * i >= 1 from `trials` candidates, candidate t drawn proportionally to weight x squared
 * distance to the nearest centre so far by draws[i * trials + t], the candidate leaving the
 * smallest weighted potential kept (ties: the lower t).  Stops early when every point is a
 * centre.  n_draws >= k * trials; out holds out_len >= k doubles, written in pick order.
 * Returns the number of centres (1..k), or a negative mvc_status on a bad argument or a
 * failed allocation. */
int64_t mvc_kmeanspp(const double *values, const double *weights, size_t n, int k, int trials,
                     const double *draws, size_t n_draws, double *out, size_t out_len);

/* Lloyd iterations from the k ascending `centres` (updated in place) over the n ascending
 * points `values` with weights > 0, to a fixed point of the cluster boundaries or
 * max_iters iterations: a point joins the nearest centre (the lower one on a midpoint),
 * each centre moves to its cluster's weighted mean (kept inside the cluster's hull), and
 * the centres of empty clusters move onto the worst-served points.  Returns the
 * iterations run (>= 0), or a negative mvc_status. */
int64_t mvc_lloyd_1d(const double *values, const double *weights, size_t n, double *centres,
                     size_t k, int max_iters);
#endif
