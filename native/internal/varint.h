#ifndef MVC_VARINT_H
#define MVC_VARINT_H
/* Internal to the native coders: the one LEB128 varint reader and writer of the
 * stream formats (docs/native-formats.md), with the rules of mvc.native._varint:
 * a varint read as `bits` wide (32 for code tables and rANS headers, 64 for
 * stream headers) takes at most ceil(bits / 7) bytes and sets no bit at or
 * above `bits`; anything wider is corrupt, so a value never wraps. */
#include <stddef.h>
#include <stdint.h>
#include "status.h"

static inline int varint_get(const uint8_t **pp, const uint8_t *end, unsigned bits, uint64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (unsigned shift = 0; shift < bits; shift += 7) {
        if (p >= end) return MVC_ERR_TRUNCATED;
        uint8_t b = *p++;
        if (bits - shift < 7 && (b >> (bits - shift))) return MVC_ERR_CORRUPT; /* too wide */
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) { *pp = p; *out = v; return MVC_OK; }
    }
    return MVC_ERR_CORRUPT;
}

static inline int varint_get32(const uint8_t **pp, const uint8_t *end, uint32_t *out) {
    uint64_t v;
    int r = varint_get(pp, end, 32, &v);
    if (r == MVC_OK) *out = (uint32_t)v;
    return r;
}

static inline size_t varint_size(uint64_t v) {
    size_t s = 1;
    while (v >= 0x80) { v >>= 7; s++; }
    return s;
}

static inline uint8_t *varint_put(uint8_t *p, uint64_t v) {
    while (v >= 0x80) { *p++ = (uint8_t)(v | 0x80); v >>= 7; }
    *p++ = (uint8_t)v;
    return p;
}
#endif
