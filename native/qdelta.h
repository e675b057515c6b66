#ifndef MVC_QDELTA_H
#define MVC_QDELTA_H
/* Whole-section decoders for qdelta/1 level streams, so applying one tensor's
 * delta is a single native call instead of two Python-level decodes per group.
 * Stream formats: docs/native-formats.md ("Huffman stream", "RLE+Huffman
 * stream"); plain C over caller-owned buffers; status codes: status.h. */
#include <stddef.h>
#include <stdint.h>

/* A framed Huffman stream (mvc.native.huffman.encode) of exactly n symbols of
 * `width` bytes (1 or 2) into dst.  n == 0 requires len == 0. */
int mvc_huf_decode_stream(const uint8_t *src, size_t len, void *dst, size_t n, int width);

/* An RLE+Huffman stream (mvc.native.rle.encode_huffman) of exactly n values of
 * `kind` bytes (1 or 2) into dst. */
int mvc_rlehuf_decode_stream(const uint8_t *src, size_t len, int kind, void *dst, size_t n);

/* Levels of one qdelta/1 tensor from its parent's levels (Inshrinkerator Alg. 6).
 * parent, out: n levels of `width` bytes (1 or 2), parent[i] < n_prev.
 * sec: the level sections back to back, sec_total bytes in all, sec_len[j]
 * bytes each, nsec of them (the lengths must add up to sec_total exactly):
 * grouped != 0: one section per parent level (nsec == n_prev, the group's
 * deltas in group order); grouped == 0: one section of n deltas in original
 * order.  rle != 0: sections are RLE+Huffman streams, else Huffman streams;
 * an empty section stands for all-zero deltas.  out[i] = (parent[i] - D) mod
 * modulus, each < n_cur; *n_top = how many equal n_cur - 1.
 * MVC_ERR_RANGE: a parent level >= n_prev (wrong parent); MVC_ERR_CORRUPT /
 * MVC_ERR_TRUNCATED: the delta itself is bad; MVC_ERR_ARG: bad arguments
 * (section lengths that do not add up to sec_total among them). */
int mvc_qdelta_levels(const void *parent, size_t n, int width, uint32_t n_prev,
                      uint32_t modulus, uint32_t n_cur, int grouped, int rle,
                      const uint8_t *sec, size_t sec_total, const uint64_t *sec_len,
                      uint32_t nsec, void *out, uint64_t *n_top);
#endif
