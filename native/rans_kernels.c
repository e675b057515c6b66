/* Decode loops of rANS mode 5 (see internal/rans_kernels.h).  Each group of
 * R32_LANES symbols gives symbol i to state i mod R32_LANES; the states that
 * fall below L then take the next 16-bit words in lane order.  The SIMD
 * kernels do exactly that: a gather for the slot lookups, and an expand of the
 * next words into the lanes that renormalize. */
#include <string.h>
#include "internal/huf_common.h"
#include "internal/rans_kernels.h"
#include "internal/cpu.h"
#include "internal/expand_lut.h"

static size_t groups_scalar(uint32_t *x, const uint32_t *tab, const uint8_t **wp,
                            const uint8_t *end, uint8_t *dst, size_t n) {
    const uint8_t *w = *wp;
    size_t i = 0;
    for (; i + R32_LANES <= n && (size_t)(end - w) >= 2 * R32_LANES; i += R32_LANES)
        for (int j = 0; j < R32_LANES; j++) {
            uint32_t s = x[j];
            const uint32_t t = tab[s & 4095];
            dst[i + j] = (uint8_t)t;
            s = ((t >> 8) & 0xfff) * (s >> 12) + (t >> 20);
            /* Branch-free: a 16-bit word is due about every sixth symbol, at random. */
            const uint32_t c = s < R32_L, m = 0u - c, r = (s << 16) | ld16(w);
            s = (s & ~m) | (r & m); /* a mask, not ?: which compilers turn back into a branch */
            w += 2 * c;
            x[j] = s;
        }
    *wp = w;
    return i;
}

#if MVC_X86
__attribute__((target("avx512f,avx512bw")))
static size_t groups_avx512(uint32_t *x, const uint32_t *tab, const uint8_t **wp,
                            const uint8_t *end, uint8_t *dst, size_t n) {
    const __m512i slot = _mm512_set1_epi32(4095), low = _mm512_set1_epi32((int)R32_L);
    __m512i a = _mm512_loadu_si512(x), b = _mm512_loadu_si512(x + 16);
    const uint8_t *w = *wp;
    size_t i = 0;
    /* Two independent vectors of states, so one's gather overlaps the other's arithmetic. */
#define R32_STEP512(v, off) do { \
        const __m512i t_ = _mm512_i32gather_epi32(_mm512_and_si512(v, slot), (const void *)tab, 4); \
        _mm_storeu_si128((__m128i *)(dst + i + (off)), _mm512_cvtepi32_epi8(t_)); \
        v = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_and_si512(_mm512_srli_epi32(t_, 8), slot), \
                                                _mm512_srli_epi32(v, 12)), \
                             _mm512_srli_epi32(t_, 20)); \
        const __mmask16 k_ = _mm512_cmplt_epu32_mask(v, low); \
        const __m512i w_ = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)w)); \
        v = _mm512_mask_or_epi32(v, k_, _mm512_slli_epi32(v, 16), _mm512_maskz_expand_epi32(k_, w_)); \
        w += 2 * (size_t)__builtin_popcount((unsigned)k_); \
    } while (0)
    for (; i + R32_LANES <= n && (size_t)(end - w) >= 2 * R32_LANES; i += R32_LANES) {
        R32_STEP512(a, 0);
        R32_STEP512(b, 16);
    }
#undef R32_STEP512
    _mm512_storeu_si512(x, a);
    _mm512_storeu_si512(x + 16, b);
    *wp = w;
    return i;
}

__attribute__((target("avx2")))
static size_t groups_avx2(uint32_t *x, const uint32_t *tab, const uint8_t **wp,
                          const uint8_t *end, uint8_t *dst, size_t n) {
    const __m256i slot = _mm256_set1_epi32(4095), zero = _mm256_setzero_si256();
    /* Byte 0 of each 32-bit lane to the front of its 128-bit half, then both halves together. */
    const __m256i lowbytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                              0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i halves = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    __m256i v0 = _mm256_loadu_si256((const __m256i *)x), v1 = _mm256_loadu_si256((const __m256i *)(x + 8));
    __m256i v2 = _mm256_loadu_si256((const __m256i *)(x + 16)), v3 = _mm256_loadu_si256((const __m256i *)(x + 24));
    const uint8_t *w = *wp;
    size_t i = 0;
#define R32_STEP256(v, off) do { \
        const __m256i t_ = _mm256_i32gather_epi32((const int *)tab, _mm256_and_si256(v, slot), 4); \
        const __m256i s_ = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(t_, lowbytes), halves); \
        _mm_storel_epi64((__m128i *)(dst + i + (off)), _mm256_castsi256_si128(s_)); \
        v = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(t_, 8), slot), \
                                                _mm256_srli_epi32(v, 12)), \
                             _mm256_srli_epi32(t_, 20)); \
        const __m256i c_ = _mm256_cmpeq_epi32(_mm256_srli_epi32(v, 16), zero); \
        const int m_ = _mm256_movemask_ps(_mm256_castsi256_ps(c_)); \
        const __m256i w_ = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w)); \
        const __m256i e_ = _mm256_permutevar8x32_epi32( \
            w_, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)EXPAND8[m_]))); \
        v = _mm256_blendv_epi8(v, _mm256_or_si256(_mm256_slli_epi32(v, 16), e_), c_); \
        w += 2 * (size_t)__builtin_popcount((unsigned)m_); \
    } while (0)
    for (; i + R32_LANES <= n && (size_t)(end - w) >= 2 * R32_LANES; i += R32_LANES) {
        R32_STEP256(v0, 0);
        R32_STEP256(v1, 8);
        R32_STEP256(v2, 16);
        R32_STEP256(v3, 24);
    }
#undef R32_STEP256
    _mm256_storeu_si256((__m256i *)x, v0);
    _mm256_storeu_si256((__m256i *)(x + 8), v1);
    _mm256_storeu_si256((__m256i *)(x + 16), v2);
    _mm256_storeu_si256((__m256i *)(x + 24), v3);
    *wp = w;
    return i;
}
#endif

unsigned r32_supported(void) {
    unsigned s = 1u << R32_SCALAR;
#if MVC_X86
    if (cpu_avx2()) s |= 1u << R32_AVX2;
    if (cpu_avx512()) s |= 1u << R32_AVX512;
#endif
    return s;
}

size_t r32_decode_groups(int kernel, uint32_t *x, const uint32_t *tab, const uint8_t **wp,
                         const uint8_t *end, uint8_t *dst, size_t n) {
#if MVC_X86
    const unsigned have = r32_supported();
    if (kernel == R32_AUTO) kernel = (have >> R32_AVX512) & 1 ? R32_AVX512 : (have >> R32_AVX2) & 1 ? R32_AVX2 : R32_SCALAR;
    if (kernel == R32_AVX512) return groups_avx512(x, tab, wp, end, dst, n);
    if (kernel == R32_AVX2) return groups_avx2(x, tab, wp, end, dst, n);
#else
    (void)kernel;
#endif
    return groups_scalar(x, tab, wp, end, dst, n);
}
