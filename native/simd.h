#ifndef MVC_SIMD_H
#define MVC_SIMD_H
/* Which SIMD forms of the native kernels run (rANS decode, byte-plane merge):
 * 0 plain C, 2 AVX2, 3 AVX-512, whichever the CPU and OS support.  Every form
 * gives the same bytes; the cap lets tests run each one on any machine. */

/* The SIMD level this CPU and OS support (0, 2 or 3), whatever the cap. */
int mvc_simd_cpu(void);

/* The SIMD level the kernels use now: the CPU's, at most the cap. */
int mvc_simd_level(void);

/* Cap the level (0, 2 or 3; process-wide, for tests and benchmarks: not to be
 * changed while other threads decode); returns the previous cap, or -1 for a
 * level outside those. */
int mvc_simd_cap(int level);
#endif
