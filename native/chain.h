#ifndef MVC_CHAIN_H
#define MVC_CHAIN_H
/* Walking a delta chain (qdelta/1, grouped RLE+Huffman, 8-bit levels) from a
 * base in place.  Each step changes few levels late in training, but finding
 * *which* parameter the r-th member of group g is needs a select over the
 * current levels; a per-block count of every level turns that into a walk
 * over block counts plus a scan of one 256-level block, so a step costs
 * O(blocks + changes) instead of O(n).  Steps with many changes use one
 * dense pass instead.  Plain C; status codes: status.h. */
#include <stddef.h>
#include <stdint.h>

typedef struct mvc_chain mvc_chain;

/* A walker over a copy of n 8-bit levels (the chain's base); NULL if out of
 * memory or n > UINT32_MAX. */
mvc_chain *mvc_chain_new(const uint8_t *levels, size_t n);
void mvc_chain_free(mvc_chain *c);

/* Apply one delta step in place (arguments as mvc_qdelta_levels with grouped
 * RLE+Huffman sections: nsec == n_prev, modulus <= 256, the section lengths
 * adding up to sec_total).  *n_top = levels equal to n_cur - 1 afterwards.
 * MVC_ERR_ARG (bad arguments) leaves the walker as it was; any other failure
 * leaves it unusable (every later call fails). */
int mvc_chain_step(mvc_chain *c, uint32_t n_prev, uint32_t modulus, uint32_t n_cur,
                   const uint8_t *sec, size_t sec_total, const uint64_t *sec_len, uint32_t nsec,
                   uint64_t *n_top);

/* Copy the current n levels out. */
int mvc_chain_levels(const mvc_chain *c, uint8_t *out, size_t n);
#endif
