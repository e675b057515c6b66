#ifndef MVC_HEAP_H
#define MVC_HEAP_H
#include <stddef.h>
/* Hand the C heap's free pages back to the operating system (glibc's malloc_trim(0)): memory a
 * commit's temporaries used and freed that the allocator would otherwise keep in its arenas.
 * Returns 1 when pages were released, 0 when none were or the C library has no such call. */
int mvc_heap_trim(void);

/* Fix glibc malloc's thresholds (mallopt M_MMAP_THRESHOLD and M_TRIM_THRESHOLD): blocks of at
 * least mmap_threshold bytes are mapped on their own, and an arena's free top above
 * trim_threshold bytes goes back to the OS when a free reaches it.  Left dynamic, glibc raises
 * the trim threshold to twice the largest freed mapping (64 MiB on 64-bit), so every thread that
 * ever allocated keeps up to that much of its arena resident: a thread pool's arenas hold it
 * after the work is done.  Returns 1 when both were set, 0 when the C library has no such
 * settings or refused a value, MVC_ERR_ARG when either is 0 or above INT_MAX (mallopt's range). */
int mvc_heap_bound(size_t mmap_threshold, size_t trim_threshold);

/* Unmap from this process the pages of a read-only shared file mapping that hold [p, p + n)
 * (madvise MADV_DONTNEED over the whole pages around it): the file's pages stay in the page
 * cache and a later read faults them back in with the same contents, but this process's
 * resident set no longer carries them.  For values read from the LMDB map, which stay mapped
 * (and counted in RSS) after they were hashed or copied.  Only for such mappings: on private
 * or anonymous memory it would discard data.  Returns MVC_OK (also when n is 0 or the system
 * has no madvise), MVC_ERR_ARG when p + n overflows or p is NULL with n > 0, MVC_ERR_INTERNAL
 * when madvise refused the range. */
int mvc_release_mapped(const void *p, size_t n);
#endif
