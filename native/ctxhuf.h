#ifndef MVC_CTXHUF_H
#define MVC_CTXHUF_H
#include <stddef.h>
#include <stdint.h>
/* Context-conditional Huffman coding of one block of bytes: val[i] is coded
 * with the code of ctx[i]'s class.  The most frequent ctx values (up to 7)
 * each get their own class, all other values share class 0, so a mantissa
 * byte plane can be coded conditionally on the exponent plane without
 * reordering it.  Format: docs/native-formats.md. */

/* Output capacity mvc_ctxhuf_encode needs for n bytes. */
size_t mvc_ctxhuf_bound(size_t n);

/* Encode; stored raw unless smaller than (1 + n) * max_permille / 1000.
 * Returns bytes written or < 0. */
int64_t mvc_ctxhuf_encode(const uint8_t *ctx, const uint8_t *val, size_t n, uint8_t *dst,
                          size_t cap, int max_permille);

/* Decode a block of `len` bytes into val[0..n) given the same ctx[0..n).
 * Also accepts the plain block modes of huffman.h (width 1). */
int mvc_ctxhuf_decode(const uint8_t *src, size_t len, const uint8_t *ctx, uint8_t *val, size_t n);
#endif
