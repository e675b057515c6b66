#include "lmdbcheck.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

/* LMDB 0.9's on-disk layout (lib/mdb.c, 64-bit): a page header of 16 bytes (pgno u64, pad u16,
 * flags u16, lower u16, upper u16; an overflow page has a u32 page count where lower/upper are),
 * then the u16 node offsets; a node is lo u16, hi u16, flags u16, ksize u16, key, data.  The
 * meta sits after the header of pages 0 and 1.  Every field is read with memcpy: LMDB only
 * promises 2-byte alignment. */
enum {
    PAGEHDRSZ = 16,
    NODESIZE = 8,
    P_BRANCH = 0x01,
    P_LEAF = 0x02,
    P_OVERFLOW = 0x04,
    P_META = 0x08,
    F_BIGDATA = 0x01,
    F_SUBDATA = 0x02,
    MDB_MAGIC = 0xBEEFC0DE,
    DATA_VERSION = 1,
    MIN_PAGESIZE = 512,
    MAX_PAGESIZE = 0x8000,
    MAX_KEYSIZE = 511,
    CURSOR_STACK = 32, /* LMDB's deepest tree */
    DB_SIZE = 48,      /* sizeof(MDB_db) */
    META_SIZE = 136,   /* sizeof(MDB_meta) */
    NUM_METAS = 2,
    CHANGED = 1,
};
#define P_INVALID UINT64_MAX
#define MAX_PGNO (((uint64_t)1 << 48) - 1) /* a branch node holds 48 bits of page number */

typedef struct {
    uint16_t flags, depth;
    uint64_t root;
} db_rec;

typedef struct {
    const uint8_t *f;
    uint64_t npages; /* whole pages in the file */
    uint64_t psize;
    uint64_t last_pg;
    uint64_t txnid;
    uint8_t *seen; /* one bit per page of the file */
    int deep;
    char *why;
    size_t why_len;
} walker;

static uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int fail(char *why, size_t why_len, const char *fmt, ...) {
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return MVC_ERR_CORRUPT;
}
#define FAIL(w, ...) fail((w)->why, (w)->why_len, __VA_ARGS__)

static db_rec read_db(const uint8_t *p) {
    db_rec d;
    d.flags = rd16(p + 4);
    d.depth = rd16(p + 6);
    d.root = rd64(p + 40);
    return d;
}

/* Meta page `i` of `head` (at least (i + 1) * psize bytes): flags, magic, version. */
static int check_meta_page(const uint8_t *page, int i, char *why, size_t why_len) {
    const uint8_t *m = page + PAGEHDRSZ;
    if (!(rd16(page + 10) & P_META))
        return fail(why, why_len, "page %d is not a meta page (flags 0x%x)", i, rd16(page + 10));
    if (rd32(m) != MDB_MAGIC) return fail(why, why_len, "meta page %d has no LMDB magic", i);
    if (rd32(m + 4) != DATA_VERSION)
        return fail(why, why_len, "meta page %d has data format %u, not LMDB 0.9's %d", i,
                    rd32(m + 4), DATA_VERSION);
    return MVC_OK;
}

/* The page size of meta page 0 (the free database's md_pad), or 0 when it is no valid size. */
static uint64_t page_size_of(const uint8_t *page) {
    uint32_t ps = rd32(page + PAGEHDRSZ + 24);
    if (ps < MIN_PAGESIZE || ps > MAX_PAGESIZE || (ps & (ps - 1))) return 0;
    return ps;
}

int mvc_lmdb_check_header(const uint8_t *head, size_t head_len, char *why, size_t why_len) {
    if (why && why_len) why[0] = '\0';
    if (head == NULL) return MVC_ERR_ARG;
    if (head_len < PAGEHDRSZ + META_SIZE) return MVC_ERR_TRUNCATED;
    int rc = check_meta_page(head, 0, why, why_len);
    if (rc) return rc;
    uint64_t ps = page_size_of(head);
    if (!ps) return fail(why, why_len, "meta page 0 has an invalid page size %u",
                         rd32(head + PAGEHDRSZ + 24));
    if (head_len < ps + PAGEHDRSZ + META_SIZE) return MVC_ERR_TRUNCATED;
    rc = check_meta_page(head + ps, 1, why, why_len);
    if (rc) return rc;
    if (page_size_of(head + ps) != ps)
        return fail(why, why_len, "the meta pages disagree on the page size (%u and %u)",
                    rd32(head + PAGEHDRSZ + 24), rd32(head + ps + PAGEHDRSZ + 24));
    return MVC_OK;
}

/* Mark page `pg` reached; 0, or an error if it is outside the file or reached before. */
static int mark(walker *w, uint64_t pg, const char *what) {
    if (pg < NUM_METAS || pg >= w->npages)
        return FAIL(w, "%s page %llu is outside the file (%llu pages)", what,
                    (unsigned long long)pg, (unsigned long long)w->npages);
    if (w->seen[pg >> 3] & (1u << (pg & 7)))
        return FAIL(w, "%s page %llu is reached twice", what, (unsigned long long)pg);
    w->seen[pg >> 3] |= (uint8_t)(1u << (pg & 7));
    return MVC_OK;
}

typedef enum { DB_FREE, DB_MAIN, DB_NAMED } db_kind;

static int walk_db(walker *w, db_rec d, db_kind kind, const char *name);

/* A big value of `size` bytes from overflow page `pg`: its pages inside the file, each reached
 * once. */
static int check_overflow(walker *w, uint64_t pg, uint64_t size) {
    uint64_t n = (PAGEHDRSZ - 1 + size) / w->psize + 1;
    if (pg < NUM_METAS || pg > MAX_PGNO || n > w->npages || pg > w->npages - n)
        return FAIL(w, "a value of %llu bytes on overflow page %llu runs past the file",
                    (unsigned long long)size, (unsigned long long)pg);
    if (w->deep) {
        const uint8_t *p = w->f + pg * w->psize;
        uint32_t pages = rd32(p + 12);
        if (rd64(p) != pg || rd16(p + 10) != P_OVERFLOW)
            return FAIL(w, "overflow page %llu has a wrong header", (unsigned long long)pg);
        if (pages < n || pages > w->npages - pg)
            return FAIL(w, "overflow page %llu claims %u pages", (unsigned long long)pg, pages);
        n = pages;
    }
    for (uint64_t i = 0; i < n; i++) {
        int rc = mark(w, pg + i, "overflow");
        if (rc) return rc;
    }
    return MVC_OK;
}

/* A free-list record (an MDB_IDL: count, then that many page numbers, descending): each page
 * up to the last one in use and listed once, never one a database uses. */
static int check_idl(walker *w, const uint8_t *data, uint64_t size) {
    if (size < 8 || size % 8) return FAIL(w, "a free-list record has %llu bytes", (unsigned long long)size);
    uint64_t count = rd64(data);
    if (count != size / 8 - 1)
        return FAIL(w, "a free-list record of %llu bytes counts %llu pages",
                    (unsigned long long)size, (unsigned long long)count);
    uint64_t prev = UINT64_MAX;
    for (uint64_t i = 1; i <= count; i++) {
        uint64_t pg = rd64(data + 8 * i);
        if (pg < NUM_METAS || pg > w->last_pg || pg >= prev)
            return FAIL(w, "free-list entry %llu is out of range or order", (unsigned long long)pg);
        prev = pg;
        /* the file may end before free pages at its end: only those inside it are tracked */
        if (pg < w->npages) {
            int rc = mark(w, pg, "free");
            if (rc) return rc;
        }
    }
    return MVC_OK;
}

static int walk_page(walker *w, uint64_t pg, unsigned level, unsigned depth, db_kind kind) {
    int rc = mark(w, pg, "tree");
    if (rc) return rc;
    const uint8_t *p = w->f + pg * w->psize;
    int branch = level < depth;
    uint16_t flags = rd16(p + 10), lower = rd16(p + 12), upper = rd16(p + 14);
    if (rd64(p) != pg) return FAIL(w, "page %llu holds page number %llu", (unsigned long long)pg,
                                   (unsigned long long)rd64(p));
    if (flags != (branch ? P_BRANCH : P_LEAF))
        return FAIL(w, "page %llu has flags 0x%x at level %u of %u", (unsigned long long)pg,
                    flags, level, depth);
    if (lower < PAGEHDRSZ || lower > upper || upper > w->psize || (lower - PAGEHDRSZ) % 2)
        return FAIL(w, "page %llu has free space bounds %u..%u", (unsigned long long)pg, lower,
                    upper);
    unsigned n = (lower - PAGEHDRSZ) / 2;
    /* LMDB asserts two keys in a branch page outside the free database (ITS#8336) */
    if (n < (branch ? (kind == DB_FREE ? 1u : 2u) : 1u))
        return FAIL(w, "page %llu has %u keys", (unsigned long long)pg, n);
    for (unsigned i = 0; i < n; i++) {
        uint16_t off = rd16(p + PAGEHDRSZ + 2 * i);
        if (off < upper || off % 2 || off > w->psize - NODESIZE)
            return FAIL(w, "node %u of page %llu is at offset %u", i, (unsigned long long)pg, off);
        const uint8_t *node = p + off;
        uint16_t ksize = rd16(node + 6), nflags = rd16(node + 4);
        uint64_t end = (uint64_t)off + NODESIZE + ksize;
        if (end > w->psize || ksize > MAX_KEYSIZE)
            return FAIL(w, "node %u of page %llu has a %u-byte key", i, (unsigned long long)pg, ksize);
        const uint8_t *key = node + NODESIZE;
        /* The free database's keys are transaction ids, which LMDB reads as 8 bytes.  Key
         * order is not checked: out of order, LMDB's searches miss keys (which fsck reports),
         * but every read stays inside its page, and refusing the whole store for one damaged
         * ref name would lose access to everything else in it. */
        if (kind == DB_FREE && !(branch && i == 0) && ksize != 8)
            return FAIL(w, "node %u of page %llu has a %u-byte key", i, (unsigned long long)pg, ksize);
        if (branch) {
            uint64_t child = rd16(node) | (uint64_t)rd16(node + 2) << 16 | (uint64_t)nflags << 32;
            rc = walk_page(w, child, level + 1, depth, kind);
            if (rc) return rc;
            continue;
        }
        uint64_t dsz = rd16(node) | (uint64_t)rd16(node + 2) << 16;
        const uint8_t *data = key + ksize;
        if (nflags == F_BIGDATA) {
            if (end + 8 > w->psize)
                return FAIL(w, "node %u of page %llu has no room for its overflow page number", i,
                            (unsigned long long)pg);
            uint64_t ov = rd64(data);
            rc = check_overflow(w, ov, dsz);
            if (rc) return rc;
            if (kind == DB_FREE) {
                rc = check_idl(w, w->f + ov * w->psize + PAGEHDRSZ, dsz);
                if (rc) return rc;
            }
            continue;
        }
        if (end + dsz > w->psize)
            return FAIL(w, "node %u of page %llu has a %llu-byte value past its page", i,
                        (unsigned long long)pg, (unsigned long long)dsz);
        if (nflags == F_SUBDATA && kind == DB_MAIN) {
            if (dsz != DB_SIZE)
                return FAIL(w, "the record of a named database on page %llu has %llu bytes",
                            (unsigned long long)pg, (unsigned long long)dsz);
            rc = walk_db(w, read_db(data), DB_NAMED, "a named");
            if (rc) return rc;
        } else if (nflags != 0) {
            /* mvc's databases hold no duplicates, and only the main one names others */
            return FAIL(w, "node %u of page %llu has flags 0x%x", i, (unsigned long long)pg, nflags);
        } else if (kind == DB_FREE) {
            rc = check_idl(w, data, dsz);
            if (rc) return rc;
        }
    }
    return MVC_OK;
}

static int walk_db(walker *w, db_rec d, db_kind kind, const char *name) {
    /* mvc opens its databases with no flags (no dupsort, integer or reverse keys); the free
     * database's word holds the environment's flags instead */
    if (kind != DB_FREE && d.flags != 0)
        return FAIL(w, "%s database has flags 0x%x", name, d.flags);
    if (d.root == P_INVALID) {
        if (d.depth != 0) return FAIL(w, "%s database is empty at depth %u", name, d.depth);
        return MVC_OK;
    }
    if (d.depth < 1 || d.depth > CURSOR_STACK)
        return FAIL(w, "%s database has depth %u", name, d.depth);
    return walk_page(w, d.root, 1, d.depth, kind);
}

int mvc_lmdb_check(const uint8_t *file, size_t file_len, uint64_t txnid, int deep, char *why,
                   size_t why_len) {
    if (why && why_len) why[0] = '\0';
    if (file == NULL) return MVC_ERR_ARG;
    if (sizeof(size_t) != 8) return MVC_ERR_RANGE;
    int rc = mvc_lmdb_check_header(file, file_len, why, why_len);
    if (rc) return rc;
    walker w = {.f = file, .psize = page_size_of(file), .deep = deep, .why = why,
                .why_len = why_len};
    w.npages = file_len / w.psize;
    const uint8_t *metas[NUM_METAS] = {file + PAGEHDRSZ, file + w.psize + PAGEHDRSZ};
    /* LMDB reads the newer meta, the first one on a tie */
    int pick = txnid == UINT64_MAX ? rd64(metas[0] + 128) < rd64(metas[1] + 128)
               : rd64(metas[0] + 128) == txnid ? 0
               : rd64(metas[1] + 128) == txnid ? 1
                                               : -1;
    if (pick < 0) return CHANGED;
    /* A writer two commits on rewrites this meta page: copy it, then see that it still holds
     * the same transaction (the tree pages of that snapshot stay put while it is read). */
    uint8_t meta[META_SIZE];
    memcpy(meta, metas[pick], META_SIZE);
    w.txnid = rd64(meta + 128);
    if (rd64(metas[pick] + 128) != w.txnid || (txnid != UINT64_MAX && w.txnid != txnid))
        return CHANGED;
    w.last_pg = rd64(meta + 120);
    if (w.last_pg < NUM_METAS - 1 || w.last_pg > MAX_PGNO)
        return FAIL(&w, "the meta page names %llu as its last page", (unsigned long long)w.last_pg);
    w.seen = calloc(w.npages / 8 + 1, 1);
    if (!w.seen) return MVC_ERR_NOMEM;
    rc = walk_db(&w, read_db(meta + 24), DB_FREE, "the free");
    if (!rc) rc = walk_db(&w, read_db(meta + 24 + DB_SIZE), DB_MAIN, "the main");
    free(w.seen);
    return rc;
}
