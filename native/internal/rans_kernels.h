#ifndef MVC_RANS_KERNELS_H
#define MVC_RANS_KERNELS_H
/* Internal to rans.c: the decode loops of rANS mode 5 (32 interleaved 32-bit
 * states, 16-bit words), one per instruction set.  Every kernel decodes the
 * same symbols and consumes the same words as the scalar one; they differ in
 * speed only. */
#include <stddef.h>
#include <stdint.h>

#define R32_LANES 32
#define R32_L (1u << 16)

enum { R32_AUTO = 0, R32_SCALAR = 1, R32_AVX2 = 2, R32_AVX512 = 3 };

/* Bit (1 << kernel) set for each kernel this CPU can run (the scalar one always). */
unsigned r32_supported(void);

/* Decode whole groups of R32_LANES symbols from dst[0] on while at least
 * 2 * R32_LANES word bytes are left; tab maps slot -> symbol | freq << 8 |
 * (slot - start) << 20.  Updates x[] and *wp; returns the symbols decoded (a
 * multiple of R32_LANES, at most n).  The caller finishes the rest. */
size_t r32_decode_groups(int kernel, uint32_t *x, const uint32_t *tab, const uint8_t **wp,
                         const uint8_t *end, uint8_t *dst, size_t n);
#endif
