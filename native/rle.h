#ifndef MVC_RLE_H
#define MVC_RLE_H
#include <stddef.h>
#include <stdint.h>
/* Run-length coding of non-negative integer streams (level deltas) in the
 * sign-trick form of Inshrinkerator section 6, plus the 16-bit symbol form
 * the fused RLE+Huffman coder entropy-codes.  `kind` is the element width in
 * bytes: 1 (uint8), 2 (uint16) or 4 (int32, values must be >= 0).
 * Formats: docs/native-formats.md. */

/* Tokens: value v as -v (<= 0), followed by its run length L only if L > 1.
 * Returns the token count (<= n) or < 0. */
int64_t mvc_rle_encode(const void *src, size_t n, int kind, int32_t *dst, size_t cap);

/* Inverse of mvc_rle_encode; the tokens must expand to exactly n values. */
int mvc_rle_decode(const int32_t *tok, size_t ntok, int kind, void *dst, size_t n);

/* Symbol form.  counts[0] = symbols the stream needs at most, counts[1] = max value. */
int mvc_rle_sym_scan(const void *src, size_t n, int kind, uint64_t *counts);

/* Write the symbols into two context streams (each with room for counts[0]
 * of mvc_rle_sym_scan) and the extra-bits stream; modulus is max value + 1.
 * counts[0], counts[1] = symbols written to sym0, sym1; counts[2] = extra bytes.
 * extracap >= 4 * (scan bound) + 8 always suffices. */
int mvc_rle_sym_encode(const void *src, size_t n, int kind, uint32_t modulus, uint16_t *sym0,
                       uint16_t *sym1, size_t symcap, uint8_t *extra, size_t extracap,
                       uint64_t *counts);

/* Expand the two symbol streams + extra bits into exactly n values of `kind`. */
int mvc_rle_sym_decode(const uint16_t *sym0, size_t n0, const uint16_t *sym1, size_t n1,
                       const uint8_t *extra, size_t extralen, uint32_t modulus, int kind,
                       void *dst, size_t n);
#endif
