#ifndef MVC_CPU_H
#define MVC_CPU_H
/* Internal: which SIMD forms the kernels that have them may run (rans_kernels.c,
 * byteplane.c).  Every kernel keeps a plain C form that gives the same bytes; the
 * SIMD ones are compiled with per-function target attributes, so the build needs
 * no -m flags.  The level (and the cap tests set) lives in simd.c. */
#include "../simd.h"
/* -DMVC_NO_SIMD builds the plain C forms only (what a CPU other than x86 gets). */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) \
    && !defined(MVC_NO_SIMD)
#define MVC_X86 1
#include <immintrin.h>
#else
#define MVC_X86 0
#endif
static inline int cpu_avx2(void) { return mvc_simd_level() >= 2; }
static inline int cpu_avx512(void) { return mvc_simd_level() >= 3; }
#endif
