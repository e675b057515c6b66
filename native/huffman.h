#ifndef MVC_HUFFMAN_H
#define MVC_HUFFMAN_H
#include <stddef.h>
#include <stdint.h>
/* Canonical, length-limited Huffman coding of one block of 8-bit (width 1)
 * or 16-bit little-endian (width 2) symbols.  Block format: docs/native-formats.md.
 * A block holds at most mvc_huf_max_block() symbols; its symbol count is not
 * stored, the caller passes it to the decoder. */

/* Largest symbol count one block may hold. */
size_t mvc_huf_max_block(void);

/* Output capacity encode_block needs for n symbols of `width` bytes. */
size_t mvc_huf_bound(size_t n, int width);

/* Encode n symbols from src into dst (cap >= mvc_huf_bound).  The block is
 * Huffman coded only if that makes it smaller than raw_size * max_permille / 1000
 * (1000: any saving); otherwise it is stored raw.  Returns bytes written or < 0. */
int64_t mvc_huf_encode_block(const void *src, size_t n, int width, uint8_t *dst,
                             size_t cap, int max_permille);

/* Decode a block of exactly `len` bytes into n symbols at dst.
 * Returns 0, or < 0 if the block is corrupt or truncated. */
int mvc_huf_decode_block(const uint8_t *src, size_t len, void *dst, size_t n, int width);
#endif
