#ifndef MVC_RANS_H
#define MVC_RANS_H
#include <stddef.h>
#include <stdint.h>
/* Static-model rANS coding of one block of bytes: 32 interleaved 32-bit
 * states, 16-bit renormalization words, 12-bit frequencies (block mode 5).
 * Within ~0.1% of the order-0 entropy where Huffman's whole-bit code lengths
 * lose a few percent on skewed planes such as float exponents; the small
 * states decode with SIMD gathers where the CPU has them.  Mode 4 (eight
 * 64-bit states, 32-bit words), written before mode 5, is still decoded.
 * Both share the block namespace of huffman.h.  Format: docs/native-formats.md. */

/* Output capacity mvc_rans_encode needs for n bytes. */
size_t mvc_rans_bound(size_t n);

/* rANS-code n >= 1 bytes (at least two distinct values); returns bytes written or < 0. */
int64_t mvc_rans_encode(const uint8_t *src, size_t n, uint8_t *dst, size_t cap);

/* Size mvc_rans_encode would produce for these n bytes (within a few bytes),
 * from their histogram alone; < 0 if it would refuse them. */
int64_t mvc_rans_estimate(const uint8_t *src, size_t n);

/* Decode a block of exactly len bytes into n bytes; also accepts every
 * 8-bit block mode of huffman.h.  Returns 0 or < 0.  A mode-5 block written by
 * the encoder before its exact quotient (one that never decoded) is recovered
 * when the old encoder, run on what the search finds, writes it byte for byte
 * and no other input gives the same block. */
int mvc_rans_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n);

/* Bit (1 << k) for each mode-5 decode kernel k this CPU runs: 1 scalar,
 * 2 AVX2, 3 AVX-512 (0 is "the fastest"). */
unsigned mvc_rans_kernels(void);

/* mvc_rans_decode with mode-5 groups decoded by kernel k (as above); every
 * kernel gives the same result.  MVC_ERR_ARG for a kernel this CPU lacks. */
int mvc_rans_decode_with(const uint8_t *src, size_t len, uint8_t *dst, size_t n, int kernel);

/* out[0]: mode-5 blocks of the old encoder this process recovered so far (see
 * mvc_rans_decode); out[1]: those it could not, because two inputs give that block. */
void mvc_rans_recovery_counts(uint64_t *out);
#endif
