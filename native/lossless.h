#ifndef MVC_LOSSLESS_H
#define MVC_LOSSLESS_H
#include <stddef.h>
#include <stdint.h>
/* One segment of the lossless/1 tensor codec in a single call: byte-plane
 * split, then per plane the best of the block coders (huffman.h, ctxhuf.h,
 * rans.h), and the inverse.  The segment layout is in docs/native-formats.md.
 * `layout` and `itemsize` are those of byteplane.h. */

/* Output capacity mvc_ll_encode_segment needs for n elements. */
size_t mvc_ll_segment_bound(size_t n, int layout, int itemsize);

/* Encode n elements at src.  Mantissa planes (planes >= 1 of float layouts)
 * are coded only when that shrinks them to mantissa_permille / 1000; the
 * exponent plane becomes rANS instead of Huffman when that shrinks it to
 * rans_permille / 1000 of the Huffman block.  scratch holds n * itemsize
 * bytes.  Returns bytes written or < 0. */
int64_t mvc_ll_encode_segment(const uint8_t *src, size_t n, int layout, int itemsize,
                              int mantissa_permille, int rans_permille, uint8_t *dst, size_t cap,
                              uint8_t *scratch);

/* Decode one segment of exactly len bytes into n elements at dst; scratch
 * holds n * itemsize bytes.  Returns 0 or < 0. */
int mvc_ll_decode_segment(const uint8_t *src, size_t len, size_t n, int layout, int itemsize,
                          uint8_t *dst, uint8_t *scratch);
#endif
