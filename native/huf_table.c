/* Huffman code construction and code-table serialization, shared by the
 * plain block coder (huffman.c) and the context coder (ctxhuf.c). */
#include <stdlib.h>
#include <string.h>
#include "status.h"
#include "internal/huf_common.h"

/* Shell sort (Ciura's gaps): no comparator calls, and fast for the few
 * hundred keys of a byte alphabet, which qsort spends most of its time on. */
static void sort_u64(uint64_t *a, size_t n) {
    static const size_t gaps[] = {57401, 25511, 11341, 5040, 2240, 997, 443, 198, 88, 41, 19, 9, 4, 1};
    for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
        const size_t gap = gaps[g];
        for (size_t i = gap; i < n; i++) {
            uint64_t v = a[i];
            size_t j = i;
            for (; j >= gap && a[j - gap] > v; j -= gap) a[j] = a[j - gap];
            a[j] = v;
        }
    }
}

/* Moffat & Katajainen's in-place minimum-redundancy code: A holds k >= 2
 * non-decreasing weights on entry and the code lengths on exit. */
static void min_redundancy(uint32_t *A, int k) {
    int root = 0, leaf = 2, next, avbl, used, dpth;
    A[0] += A[1];
    for (next = 1; next < k - 1; next++) {
        if (leaf >= k || A[root] < A[leaf]) { A[next] = A[root]; A[root++] = (uint32_t)next; }
        else A[next] = A[leaf++];
        if (leaf >= k || (root < next && A[root] < A[leaf])) { A[next] += A[root]; A[root++] = (uint32_t)next; }
        else A[next] += A[leaf++];
    }
    A[k - 2] = 0;
    for (next = k - 3; next >= 0; next--) A[next] = A[A[next]] + 1;
    avbl = 1; used = dpth = 0; root = k - 2; next = k - 1;
    while (avbl > 0) {
        while (root >= 0 && (int)A[root] == dpth) { used++; root--; }
        while (avbl > used) { A[next--] = (uint32_t)dpth; avbl--; }
        avbl = 2 * used; dpth++; used = 0;
    }
}

/* Code lengths (<= lmax) for k >= 2 symbols with counts cnt[]; len[] is
 * parallel to cnt[].  Lengths over the limit are folded back the way deflate
 * encoders do it, keeping the code complete. */
int huf_build_lengths(int k, const uint32_t *cnt, int lmax, uint8_t *len) {
    if (k < 2) return MVC_ERR_ARG;
    uint64_t *key = malloc((size_t)k * sizeof *key);
    uint32_t *A = malloc((size_t)k * sizeof *A);
    uint32_t num[LMAX2 + 2] = {0};
    if (!key || !A) { free(key); free(A); return MVC_ERR_NOMEM; }
    for (int j = 0; j < k; j++) key[j] = ((uint64_t)cnt[j] << 17) | (uint64_t)j;
    sort_u64(key, (size_t)k);
    for (int i = 0; i < k; i++) A[i] = cnt[key[i] & 0x1ffff];
    min_redundancy(A, k);
    for (int i = 0; i < k; i++) num[A[i] > (uint32_t)lmax ? (uint32_t)lmax : A[i]]++;
    uint64_t total = 0;
    for (int l = 1; l <= lmax; l++) total += (uint64_t)num[l] << (lmax - l);
    while (total != ((uint64_t)1 << lmax)) {
        num[lmax]--;
        for (int l = lmax - 1; l > 0; l--)
            if (num[l]) { num[l]--; num[l + 1] += 2; break; }
        total--;
    }
    int i = k - 1; /* most frequent symbols take the shortest codes */
    for (int l = 1; l <= lmax; l++)
        for (uint32_t c = num[l]; c; c--) len[key[i--] & 0x1ffff] = (uint8_t)l;
    free(key); free(A);
    return MVC_OK;
}

static uint32_t reverse_bits(uint32_t c, int len) {
    uint32_t r = 0;
    for (int i = 0; i < len; i++) { r = (r << 1) | (c & 1); c >>= 1; }
    return r;
}

/* Canonical codes (deflate order: by length, then symbol), bit-reversed. */
void huf_canonical_codes(int k, const uint8_t *len, uint32_t *code) {
    uint32_t bl[LMAX2 + 2] = {0}, next[LMAX2 + 2] = {0};
    for (int j = 0; j < k; j++) bl[len[j]]++;
    bl[0] = 0;
    for (int l = 1; l <= LMAX2 + 1; l++) next[l] = (next[l - 1] + bl[l - 1]) << 1;
    for (int j = 0; j < k; j++) code[j] = reverse_bits(next[len[j]]++, len[j]);
}


/* Serialized size of a code table; *dense says which form is smaller. */
size_t huf_table_size(int k, const uint32_t *sym, const uint8_t *len, int w, int *dense) {
    (void)len;
    size_t sparse = varint_size((uint32_t)k) + ((size_t)k + 1) / 2;
    for (int j = 0; j < k; j++) sparse += varint_size(sym[j] - (j ? sym[j - 1] + 1 : 0));
    /* Dense tables (a length nibble for every symbol of a range) suit 8-bit
     * planes that use most byte values, such as mantissa bytes. */
    const uint32_t span = sym[k - 1] - sym[0] + 1;
    const size_t dsize = 3 + (span + 1) / 2;
    *dense = w == 1 && dsize < sparse;
    return *dense ? dsize : sparse;
}

uint8_t *huf_write_table(uint8_t *o, int k, const uint32_t *sym, const uint8_t *len, int w, int dense) {
    (void)w;
    if (dense) {
        const uint32_t span = sym[k - 1] - sym[0] + 1;
        *o++ = 0; /* k == 0 flags a dense table */
        *o++ = (uint8_t)sym[0];
        *o++ = (uint8_t)(span - 1);
        memset(o, 0, (span + 1) / 2);
        for (int j = 0; j < k; j++) {
            uint32_t x = sym[j] - sym[0];
            o[x / 2] |= (uint8_t)(len[j] << (4 * (x & 1)));
        }
        return o + (span + 1) / 2;
    }
    o = varint_put(o, (uint32_t)k);
    for (int j = 0; j < k; j++) o = varint_put(o, sym[j] - (j ? sym[j - 1] + 1 : 0));
    for (int j = 0; j < k; j += 2)
        *o++ = (uint8_t)((len[j] - 1) | (j + 1 < k ? (len[j + 1] - 1) << 4 : 0));
    return o;
}

/* Parse a code table into sym[]/len[] (room for 256 or 65536 entries);
 * returns the symbol count or < 0.  Checks the code is complete. */
int64_t huf_read_table(const uint8_t **pp, const uint8_t *end, int w, uint32_t *sym, uint8_t *len) {
    const uint8_t *p = *pp;
    const uint32_t alpha = w == 1 ? 256u : 65536u;
    const int lmax = w == 1 ? LMAX1 : LMAX2;
    uint32_t k, gap;
    int r = varint_get32(&p, end, &k);
    if (r) return r;
    if (k == 0 && w == 1) { /* dense: lo, span - 1, a nibble per symbol */
        if (end - p < 2) return MVC_ERR_TRUNCATED;
        uint32_t lo = p[0], span = (uint32_t)p[1] + 1;
        p += 2;
        if (lo + span > alpha) return MVC_ERR_CORRUPT;
        if ((size_t)(end - p) < (span + 1) / 2) return MVC_ERR_TRUNCATED;
        for (uint32_t x = 0; x < span; x++) {
            uint8_t l = (p[x / 2] >> (4 * (x & 1))) & 15;
            if (l) { sym[k] = lo + x; len[k] = l; k++; }
        }
        p += (span + 1) / 2;
    } else {
        if (k > alpha) return MVC_ERR_CORRUPT;
        for (uint32_t j = 0, prev = 0; j < k; j++) {
            if ((r = varint_get32(&p, end, &gap))) return r;
            if (gap >= alpha || prev + gap >= alpha) return MVC_ERR_CORRUPT;
            sym[j] = prev + gap; prev = sym[j] + 1;
        }
        if ((size_t)(end - p) < (k + 1) / 2) return MVC_ERR_TRUNCATED;
        for (uint32_t j = 0; j < k; j++) len[j] = (uint8_t)(((p[j / 2] >> (4 * (j & 1))) & 15) + 1);
        p += (k + 1) / 2;
    }
    if (k < 2) return MVC_ERR_CORRUPT;
    uint64_t kraft = 0;
    for (uint32_t j = 0; j < k; j++) {
        if (len[j] > lmax) return MVC_ERR_CORRUPT;
        kraft += (uint64_t)1 << (lmax - len[j]);
    }
    if (kraft != ((uint64_t)1 << lmax)) return MVC_ERR_CORRUPT;
    *pp = p;
    return (int64_t)k;
}

