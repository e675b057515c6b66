/* SIMD level detection and its cap (see simd.h and internal/cpu.h). */
#include "simd.h"
#include "internal/cpu.h"

/* Relaxed atomics: the level is read by every decoding thread, the cap set by tests. */
static int detected = -1;
static int cap = 3;

static int detect(void) {
    int have = 0;
#if MVC_X86
    __builtin_cpu_init(); /* idempotent; required if this ever runs before constructors */
    /* libgcc / compiler-rt also check that the OS saves the wider registers. */
    if (__builtin_cpu_supports("avx2")) have = 2;
    if (have && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) have = 3;
#endif
    return have;
}

int mvc_simd_cpu(void) {
    int have = __atomic_load_n(&detected, __ATOMIC_RELAXED);
    if (have < 0) {
        have = detect();
        __atomic_store_n(&detected, have, __ATOMIC_RELAXED);
    }
    return have;
}

int mvc_simd_level(void) {
    const int have = mvc_simd_cpu(), c = __atomic_load_n(&cap, __ATOMIC_RELAXED);
    return have < c ? have : c;
}

int mvc_simd_cap(int level) {
    if (level != 0 && level != 2 && level != 3) return -1;
    return __atomic_exchange_n(&cap, level, __ATOMIC_RELAXED);
}
