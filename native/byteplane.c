/* Byte-plane split/merge for the lossless float codec (see byteplane.h). */
#include <string.h>
#include "status.h"
#include "byteplane.h"
#include "internal/cpu.h"

#define MAX_ITEMSIZE 16

int mvc_bp_nplanes(int layout, int itemsize) {
    switch (layout) {
    case MVC_BP_BYTES: return (itemsize >= 1 && itemsize <= MAX_ITEMSIZE) ? itemsize : MVC_ERR_ARG;
    case MVC_BP_F16: case MVC_BP_BF16: return itemsize == 2 ? 2 : MVC_ERR_ARG;
    case MVC_BP_F32: return itemsize == 4 ? 4 : MVC_ERR_ARG;
    case MVC_BP_F64: return itemsize == 8 ? 8 : MVC_ERR_ARG;
    default: return MVC_ERR_ARG;
    }
}

static void split16(const uint8_t *src, size_t n, uint8_t *restrict p0, uint8_t *restrict p1) {
    for (size_t i = 0; i < n; i++) {
        uint16_t x; memcpy(&x, src + 2 * i, 2);
        x = (uint16_t)((x << 1) | (x >> 15));
        p0[i] = (uint8_t)(x >> 8); p1[i] = (uint8_t)x;
    }
}
static void merge16(const uint8_t *restrict p0, const uint8_t *restrict p1, size_t n, uint8_t *dst) {
    for (size_t i = 0; i < n; i++) {
        uint16_t x = (uint16_t)((p0[i] << 8) | p1[i]);
        x = (uint16_t)((x >> 1) | (x << 15));
        memcpy(dst + 2 * i, &x, 2);
    }
}
static void split32(const uint8_t *src, size_t n, uint8_t *restrict p0, uint8_t *restrict p1,
                    uint8_t *restrict p2, uint8_t *restrict p3) {
    for (size_t i = 0; i < n; i++) {
        uint32_t x; memcpy(&x, src + 4 * i, 4);
        x = (x << 1) | (x >> 31);
        p0[i] = (uint8_t)(x >> 24); p1[i] = (uint8_t)(x >> 16); p2[i] = (uint8_t)(x >> 8); p3[i] = (uint8_t)x;
    }
}
static void merge32(const uint8_t *restrict p0, const uint8_t *restrict p1, const uint8_t *restrict p2,
                    const uint8_t *restrict p3, size_t n, uint8_t *dst) {
    for (size_t i = 0; i < n; i++) {
        uint32_t x = ((uint32_t)p0[i] << 24) | ((uint32_t)p1[i] << 16) | ((uint32_t)p2[i] << 8) | p3[i];
        x = (x >> 1) | (x << 31);
        memcpy(dst + 4 * i, &x, 4);
    }
}
#if MVC_X86
/* The same merges with SIMD: whole vectors of elements built from zero-extended
 * plane bytes, stored at cache-line-aligned addresses (the head is done by the
 * scalar loop).  Streaming stores were measured too: 3x faster into memory
 * already faulted in, but 1.8x slower into fresh pages, which is what a decoded
 * tensor is written to.  dst must be element-aligned (the scalar loops take any). */
__attribute__((target("avx512f,avx512bw")))
static size_t merge32_avx512(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                             const uint8_t *p3, size_t n, uint8_t *dst) {
    size_t i = 0;
    while (i < n && ((uintptr_t)(dst + 4 * i) & 63)) i++;
    merge32(p0, p1, p2, p3, i, dst);
    for (; i + 16 <= n; i += 16) {
#define LD(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((p) + i)))
        __m512i x = _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(LD(p0), 24), _mm512_slli_epi32(LD(p1), 16)),
                                    _mm512_or_si512(_mm512_slli_epi32(LD(p2), 8), LD(p3)));
#undef LD
        _mm512_storeu_si512((void *)(dst + 4 * i), _mm512_ror_epi32(x, 1));
    }
    return i;
}

__attribute__((target("avx2")))
static size_t merge32_avx2(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                           const uint8_t *p3, size_t n, uint8_t *dst) {
    size_t i = 0;
    while (i < n && ((uintptr_t)(dst + 4 * i) & 31)) i++;
    merge32(p0, p1, p2, p3, i, dst);
    for (; i + 8 <= n; i += 8) {
#define LD(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((p) + i)))
        __m256i x = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(LD(p0), 24), _mm256_slli_epi32(LD(p1), 16)),
                                    _mm256_or_si256(_mm256_slli_epi32(LD(p2), 8), LD(p3)));
#undef LD
        x = _mm256_or_si256(_mm256_srli_epi32(x, 1), _mm256_slli_epi32(x, 31));
        _mm256_storeu_si256((__m256i *)(dst + 4 * i), x);
    }
    return i;
}

__attribute__((target("avx512f,avx512bw")))
static size_t merge16_avx512(const uint8_t *p0, const uint8_t *p1, size_t n, uint8_t *dst) {
    size_t i = 0;
    while (i < n && ((uintptr_t)(dst + 2 * i) & 63)) i++;
    merge16(p0, p1, i, dst);
    for (; i + 32 <= n; i += 32) {
        __m512i x = _mm512_or_si512(
            _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p0 + i))), 8),
            _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p1 + i))));
        x = _mm512_or_si512(_mm512_srli_epi16(x, 1), _mm512_slli_epi16(x, 15));
        _mm512_storeu_si512((void *)(dst + 2 * i), x);
    }
    return i;
}
#endif

/* merge32 / merge16 by the fastest form this CPU runs. */
static void merge32_any(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3,
                        size_t n, uint8_t *dst) {
    size_t i = 0;
#if MVC_X86
    if (!((uintptr_t)dst & 3)) {
        if (cpu_avx512()) i = merge32_avx512(p0, p1, p2, p3, n, dst);
        else if (cpu_avx2()) i = merge32_avx2(p0, p1, p2, p3, n, dst);
    }
#endif
    merge32(p0 + i, p1 + i, p2 + i, p3 + i, n - i, dst + 4 * i);
}

static void merge16_any(const uint8_t *p0, const uint8_t *p1, size_t n, uint8_t *dst) {
    size_t i = 0;
#if MVC_X86
    if (!((uintptr_t)dst & 1) && cpu_avx512()) i = merge16_avx512(p0, p1, n, dst);
#endif
    merge16(p0 + i, p1 + i, n - i, dst + 2 * i);
}

static void split64(const uint8_t *src, size_t n, uint8_t **pl) {
    for (size_t i = 0; i < n; i++) {
        uint64_t x; memcpy(&x, src + 8 * i, 8);
        x = (x << 1) | (x >> 63);
        for (int b = 0; b < 8; b++) pl[b][i] = (uint8_t)(x >> (56 - 8 * b));
    }
}
static void merge64(uint8_t **pl, size_t n, uint8_t *dst) {
    for (size_t i = 0; i < n; i++) {
        uint64_t x = 0;
        for (int b = 0; b < 8; b++) x |= (uint64_t)pl[b][i] << (56 - 8 * b);
        x = (x >> 1) | (x << 63);
        memcpy(dst + 8 * i, &x, 8);
    }
}

/* The plane count of the layout if the caller's table has that many non-NULL planes. */
static int table_planes(uint8_t **pl, int count, size_t n, int layout, int itemsize) {
    int np = mvc_bp_nplanes(layout, itemsize);
    if (np < 0) return np;
    if (count != np || !pl) return MVC_ERR_ARG;
    for (int b = 0; b < np && n; b++)
        if (!pl[b]) return MVC_ERR_ARG;
    return np;
}

/* The split reads its input once, usually straight from memory (a tensor
 * nobody touched since it was written), and its many output streams seem to
 * keep the hardware prefetcher from running ahead: on a 2-core VM a cold
 * fp32 split ran at a quarter of its in-cache speed.  So it works in 1 KiB
 * chunks and asks for the input PREFETCH bytes ahead of each. */
#define CHUNK 1024
#define PREFETCH 8192

static void split_chunk(const uint8_t *src, size_t n, int layout, int np, uint8_t **pl, size_t at) {
    switch (layout) {
    case MVC_BP_F16: case MVC_BP_BF16: split16(src, n, pl[0] + at, pl[1] + at); break;
    case MVC_BP_F32: split32(src, n, pl[0] + at, pl[1] + at, pl[2] + at, pl[3] + at); break;
    case MVC_BP_F64: {
        uint8_t *q[8];
        for (int b = 0; b < 8; b++) q[b] = pl[b] + at;
        split64(src, n, q);
        break;
    }
    default:
        if (np == 1) { memcpy(pl[0] + at, src, n); break; }
        for (int b = 0; b < np; b++) {
            uint8_t *p = pl[b] + at;
            for (size_t i = 0; i < n; i++) p[i] = src[i * (size_t)np + (size_t)b];
        }
    }
}

int mvc_bp_split(const uint8_t *src, size_t n, int layout, int itemsize, uint8_t **pl,
                 int count) {
    int np = table_planes(pl, count, n, layout, itemsize);
    if (np < 0) return np;
    if (n && !src) return MVC_ERR_ARG;
    const size_t step = CHUNK / (size_t)itemsize ? CHUNK / (size_t)itemsize : 1;
    for (size_t i = 0; i < n; i += step) {
        const size_t m = n - i < step ? n - i : step;
        /* A prefetch past the end of the buffer is harmless (it never faults);
         * the address is formed as an integer so no pointer leaves its object. */
        const uintptr_t ahead = (uintptr_t)src + i * (size_t)itemsize + PREFETCH;
        for (size_t b = 0; b < CHUNK; b += 64) __builtin_prefetch((const void *)(ahead + b));
        split_chunk(src + i * (size_t)itemsize, m, layout, np, pl, i);
    }
    return MVC_OK;
}

int mvc_bp_merge(uint8_t **pl, int count, size_t n, int layout, int itemsize, uint8_t *dst) {
    int np = table_planes(pl, count, n, layout, itemsize);
    if (np < 0) return np;
    if (n && !dst) return MVC_ERR_ARG;
    switch (layout) {
    case MVC_BP_F16: case MVC_BP_BF16: merge16_any(pl[0], pl[1], n, dst); break;
    case MVC_BP_F32: merge32_any(pl[0], pl[1], pl[2], pl[3], n, dst); break;
    case MVC_BP_F64: merge64(pl, n, dst); break;
    default:
        if (np == 1) { memcpy(dst, pl[0], n); break; }
        for (int b = 0; b < np; b++) {
            const uint8_t *p = pl[b];
            for (size_t i = 0; i < n; i++) dst[i * (size_t)np + (size_t)b] = p[i];
        }
    }
    return MVC_OK;
}

