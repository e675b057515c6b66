#ifndef MVC_HEAP_H
#define MVC_HEAP_H
#include <stddef.h>
/* Hand the C heap's free pages back to the operating system (glibc's malloc_trim(0)): memory a
 * commit's temporaries used and freed that the allocator would otherwise keep in its arenas.
 * Returns 1 when pages were released, 0 when none were or the C library has no such call. */
int mvc_heap_trim(void);

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
