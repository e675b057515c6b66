#ifndef MVC_RANS_H
#define MVC_RANS_H
#include <stddef.h>
#include <stdint.h>
/* Static-model rANS coding of one block of bytes: eight interleaved 64-bit
 * states, 32-bit renormalization words, 12-bit frequencies.  Within ~0.1% of
 * the order-0 entropy where Huffman's whole-bit code lengths lose a few
 * percent on skewed planes such as float exponents.  The block starts with
 * mode byte 4, so it shares the block namespace of huffman.h.
 * Format: docs/native-formats.md. */

/* Output capacity mvc_rans_encode needs for n bytes. */
size_t mvc_rans_bound(size_t n);

/* rANS-code n >= 1 bytes (at least two distinct values); returns bytes written or < 0. */
int64_t mvc_rans_encode(const uint8_t *src, size_t n, uint8_t *dst, size_t cap);

/* Size mvc_rans_encode would produce for these n bytes (within a few bytes),
 * from their histogram alone; < 0 if it would refuse them. */
int64_t mvc_rans_estimate(const uint8_t *src, size_t n);

/* Decode a block of exactly len bytes into n bytes; also accepts every
 * 8-bit block mode of huffman.h.  Returns 0 or < 0. */
int mvc_rans_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n);
#endif
