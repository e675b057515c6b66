/* Segment coder of the lossless/1 tensor codec (see lossless.h).
 *
 * Plane 0 (exponents, or the low byte of integers) is a Huffman block, or a
 * rANS block where that is enough smaller (rans_permille): rANS is near the
 * entropy but slower to decode (~1.5x Huffman's time with AVX-512, ~4.5x in plain C),
 * so by default it is kept for peaked
 * distributions where whole-bit Huffman lengths waste most.  Plane 1 of f32/bf16/f64 is coded conditionally
 * on plane 0 (top mantissa bits are not uniform within a binade).  Every plane
 * falls back to raw; raw planes are merged straight from the input. */
#include <stdlib.h>
#include <string.h>
#include "status.h"
#include "lossless.h"
#include "byteplane.h"
#include "ctxhuf.h"
#include "huffman.h"
#include "rans.h"
#include "internal/huf_common.h"

#define RANS_MIN 4096
#define MAX_PLANES 16

static int conditional(int layout) {
    return layout == MVC_BP_F32 || layout == MVC_BP_BF16 || layout == MVC_BP_F64;
}

/* rANS output goes through a temporary buffer (its worst case is 1.5n), so
 * every plane needs only the raw-fallback bound in dst. */
static size_t plane_bound(size_t n) {
    size_t h = mvc_huf_bound(n, 1), c = mvc_ctxhuf_bound(n);
    return h > c ? h : c;
}

size_t mvc_ll_segment_bound(size_t n, int layout, int itemsize) {
    int k = mvc_bp_nplanes(layout, itemsize);
    return k < 0 ? 0 : 4 * (size_t)k + (size_t)k * plane_bound(n);
}

/* Plane 0: Huffman, or rANS when the histogram says it is clearly smaller.
 * One histogram serves both coders, and the Huffman block is only written
 * if it is the one kept: its exact size is known from the histogram. */
static int64_t encode_plane0(const uint8_t *p, size_t n, int is_float, int rans_permille,
                             uint8_t *dst) {
    uint32_t h[4][256];
    huf_plan8 P;
    huf_hist8(p, n, h);
    int r = huf_plan8_make((const uint32_t (*)[256])h, n, 1000, &P);
    if (r < 0) return r;
    if (!is_float || n < RANS_MIN || P.mode != MODE_HUF) return huf_plan8_emit(&P, p, n, dst);
    const int64_t hsize = (int64_t)P.size;
    uint64_t cnt[256];
    for (int v = 0; v < 256; v++) cnt[v] = (uint64_t)h[0][v] + h[1][v] + h[2][v] + h[3][v];
    int64_t est = rans_estimate_counts(cnt, n);
    if (est < 0 || est * 1000 >= hsize * rans_permille) return huf_plan8_emit(&P, p, n, dst);
    uint8_t *tmp = malloc(mvc_rans_bound(n));
    if (!tmp) return MVC_ERR_NOMEM;
    int64_t rl = rans_encode_counts(p, n, cnt, tmp, mvc_rans_bound(n));
    int64_t out;
    if (rl > 0 && rl < hsize) { memcpy(dst, tmp, (size_t)rl); out = rl; }
    else out = huf_plan8_emit(&P, p, n, dst);
    free(tmp);
    return out;
}

int64_t mvc_ll_encode_segment(const uint8_t *src, size_t n, int layout, int itemsize,
                              int mantissa_permille, int rans_permille, uint8_t *dst, size_t cap,
                              uint8_t *scratch) {
    const int k = mvc_bp_nplanes(layout, itemsize);
    if (k < 0 || n == 0 || n > MAX_BLOCK || cap < mvc_ll_segment_bound(n, layout, itemsize) ||
        mantissa_permille <= 0 || mantissa_permille > 1000 || rans_permille < 0 ||
        rans_permille > 1000)
        return MVC_ERR_ARG;
    uint8_t *planes[MAX_PLANES];
    for (int p = 0; p < k; p++) planes[p] = scratch + (size_t)p * n;
    int r = mvc_bp_split(src, n, layout, itemsize, planes, k);
    if (r) return r;
    const int is_float = layout != MVC_BP_BYTES;
    uint8_t *o = dst + 4 * (size_t)k;
    size_t left = cap - 4 * (size_t)k;
    for (int p = 0; p < k; p++) {
        int64_t len;
        if (p == 0) len = encode_plane0(planes[0], n, is_float, rans_permille, o);
        else if (p == 1 && conditional(layout))
            len = mvc_ctxhuf_encode(planes[0], planes[1], n, o, left, mantissa_permille);
        else len = mvc_huf_encode_block(planes[p], n, 1, o, left, is_float ? mantissa_permille : 1000);
        if (len < 0) return len;
        uint32_t l32 = (uint32_t)len;
        memcpy(dst + 4 * (size_t)p, &l32, 4);
        o += len; left -= (size_t)len;
    }
    return (int64_t)(o - dst);
}

int mvc_ll_decode_segment(const uint8_t *src, size_t len, size_t n, int layout, int itemsize,
                          uint8_t *dst, uint8_t *scratch) {
    const int k = mvc_bp_nplanes(layout, itemsize);
    if (k < 0 || n == 0 || n > MAX_BLOCK) return MVC_ERR_ARG;
    if (len < 4 * (size_t)k) return MVC_ERR_TRUNCATED;
    const uint8_t *p = src + 4 * (size_t)k, *end = src + len;
    uint8_t *planes[MAX_PLANES];
    for (int i = 0; i < k; i++) {
        uint32_t l;
        memcpy(&l, src + 4 * (size_t)i, 4);
        if (l == 0 || l > (size_t)(end - p)) return MVC_ERR_TRUNCATED;
        int r = MVC_OK;
        if (p[0] == MODE_RAW) { /* merge straight from the input */
            if (l != 1 + n) return MVC_ERR_TRUNCATED;
            planes[i] = (uint8_t *)(uintptr_t)(p + 1);
        } else {
            planes[i] = scratch + (size_t)i * n;
            if (i == 0) r = mvc_rans_decode(p, l, planes[0], n);
            else if (i == 1 && conditional(layout)) r = mvc_ctxhuf_decode(p, l, planes[0], planes[1], n);
            else r = mvc_huf_decode_block(p, l, planes[i], n, 1);
        }
        if (r) return r;
        p += l;
    }
    if (p != end) return MVC_ERR_TRUNCATED;
    return mvc_bp_merge(planes, k, n, layout, itemsize, dst);
}
