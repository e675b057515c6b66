/* SIMD level detection and its cap (see simd.h and internal/cpu.h). */
#include "simd.h"
#include "internal/cpu.h"

static int cap = 3;

int mvc_simd_level(void) {
    int have = 0;
#if MVC_X86
    /* libgcc / compiler-rt also check that the OS saves the wider registers. */
    if (__builtin_cpu_supports("avx2")) have = 2;
    if (have && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) have = 3;
#endif
    return have < cap ? have : cap;
}

int mvc_simd_cap(int level) {
    if (level != 0 && level != 2 && level != 3) return -1;
    int prev = cap;
    cap = level;
    return prev;
}
