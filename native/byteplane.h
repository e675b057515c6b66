#ifndef MVC_BYTEPLANE_H
#define MVC_BYTEPLANE_H
#include <stddef.h>
#include <stdint.h>
/* Byte-plane split and merge.  Float layouts rotate each element left by one
 * bit (sign to the bottom) so plane 0, the most significant byte, holds the
 * exponent: fp32/bf16 exactly their 8 exponent bits, fp16 its 5 exponent bits
 * and top 3 mantissa bits, fp64 its top 8 exponent bits.  Planes follow in
 * decreasing significance.  MVC_BP_BYTES is a plain byte transpose of
 * `itemsize`-byte elements (plane p = byte p).  Format: docs/native-formats.md. */
enum mvc_bp_layout {
    MVC_BP_BYTES = 0,
    MVC_BP_F16 = 1,
    MVC_BP_BF16 = 2,
    MVC_BP_F32 = 3,
    MVC_BP_F64 = 4
};

/* Number of planes (bytes per element) of a layout; < 0 if invalid. */
int mvc_bp_nplanes(int layout, int itemsize);

/* Split n elements at src into planes[0..nplanes-1], n bytes each.  `nplanes`
 * is the length of the caller's pointer table: MVC_ERR_ARG unless it is the
 * layout's plane count. */
int mvc_bp_split(const uint8_t *src, size_t n, int layout, int itemsize, uint8_t **planes,
                 int nplanes);

/* Inverse of mvc_bp_split: interleave the planes back into n elements at dst. */
int mvc_bp_merge(uint8_t **planes, int nplanes, size_t n, int layout, int itemsize, uint8_t *dst);

#endif
