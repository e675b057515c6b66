#ifndef MVC_QD_GROUPS_H
#define MVC_QD_GROUPS_H
/* Internal to the native coders: the per-group RLE+Huffman streams of one
 * qdelta/1 tensor, opened as run iterators (qdelta.c), shared with the chain
 * walker (chain.c). */
#include <stddef.h>
#include <stdint.h>
#include "rle_iter.h"

typedef struct {
    uint32_t n_prev;
    rle_iter **its;    /* per group: its stream, NULL if the section is empty (all zeros) */
    rle_iter *store;
    uint16_t **syms;
    uint64_t symbols;  /* symbols over all streams: a bound on the runs */
} qd_groups;

/* Parse an RLE+Huffman stream's header and decode its symbol streams into *sym
 * (malloc'd; the caller frees it); `bound` caps the value count. */
int rlehuf_open(const uint8_t *src, size_t len, int kind, size_t bound, rle_iter *it,
                uint16_t **sym);
/* MVC_OK when nsec section lengths add up to exactly `total` bytes at `sec`
 * (checked without overflow), else MVC_ERR_ARG: every entry point taking
 * per-section lengths checks them against its buffer's size first. */
int qd_sections_fit(const uint8_t *sec, size_t total, const uint64_t *sec_len, uint32_t nsec);
/* Open the n_prev group sections (sec_len[g] bytes each, back to back, checked
 * by qd_sections_fit); empty
 * sections are endless zero runs.  Call qd_groups_close even on failure. */
int qd_groups_open(qd_groups *gs, const uint8_t *sec, const uint64_t *sec_len, uint32_t n_prev,
                   int width, size_t n);
void qd_groups_close(qd_groups *gs);
/* Expand every group's deltas into dst in group order (counts[g] values of
 * `width` bytes each; groups without a stream are zeros); each stream must
 * hold exactly its group's count. */
int qd_groups_expand(qd_groups *gs, const int64_t *counts, int width, void *dst);
#endif
