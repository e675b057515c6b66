#ifndef MVC_LMDBCHECK_H
#define MVC_LMDBCHECK_H
#include <stddef.h>
#include <stdint.h>
/* Structural checks of an LMDB 0.9 data file (data format 1, 64-bit little-endian builds) before
 * LMDB itself walks it.  LMDB trusts its pages: a damaged node offset, size or page number makes
 * it read past the end of the file (SIGBUS in the map), and a few impossible shapes trip its
 * assertions (abort).  These checks read only what LMDB would, each read bounded by the buffer
 * length given, so a hostile file is reported, never followed.
 *
 * mvc_lmdb_check_header: the two meta pages at the start of the file (`head`, the first
 * `head_len` bytes; 2 * 32 KiB is always enough).  MVC_OK when both are meta pages of format 1
 * with one valid page size, MVC_ERR_CORRUPT otherwise (a reason in `why`, NUL-terminated when
 * why_len > 0), MVC_ERR_TRUNCATED when head_len is shorter than two pages.  LMDB's own open
 * checks less: a zero page size divides by zero.
 *
 * mvc_lmdb_check: the snapshot committed by transaction `txnid` of the whole file `file`
 * (`file_len` bytes; UINT64_MAX: the newest meta, as LMDB picks it).  Walks the free, main and
 * every named database: each page number inside the file, reached once (no page shared by two
 * trees, no page both used and listed free), page headers of the expected kind and bounds, every
 * node, key and inline value inside its page (keys in any order), each big value's overflow pages
 * inside the file, free-list records well formed.  With `deep`, each big value's first overflow
 * page header is read too (its page count is what a write frees); that reads one page per big
 * value.  Returns MVC_OK, MVC_ERR_CORRUPT (reason in `why`), MVC_ERR_TRUNCATED (the file ends
 * inside its meta pages), MVC_ERR_NOMEM, MVC_ERR_ARG (NULL buffers), MVC_ERR_RANGE on a build
 * whose size_t is not 64 bits, or 1 when no meta page holds `txnid` or it changed while read (a
 * writer committed meanwhile: begin a new read transaction and check again). */
int mvc_lmdb_check_header(const uint8_t *head, size_t head_len, char *why, size_t why_len);
int mvc_lmdb_check(const uint8_t *file, size_t file_len, uint64_t txnid, int deep, char *why,
                   size_t why_len);
#endif
