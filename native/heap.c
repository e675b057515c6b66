#include "heap.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h> /* defines __GLIBC__ on glibc, before it is tested below */
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "status.h"

int mvc_heap_trim(void) {
#if defined(__GLIBC__)
    return malloc_trim(0) ? 1 : 0;
#else
    return 0;
#endif
}

int mvc_heap_bound(size_t mmap_threshold, size_t trim_threshold) {
    if (mmap_threshold == 0 || trim_threshold == 0 || mmap_threshold > (size_t)INT_MAX
        || trim_threshold > (size_t)INT_MAX)
        return MVC_ERR_ARG;
#if defined(__GLIBC__)
    /* a value glibc refuses (an mmap threshold past its heap size) leaves the old one */
    if (!mallopt(M_MMAP_THRESHOLD, (int)mmap_threshold)) return 0;
    return mallopt(M_TRIM_THRESHOLD, (int)trim_threshold) ? 1 : 0;
#else
    return 0;
#endif
}

int mvc_release_mapped(const void *p, size_t n) {
    if (n == 0) return MVC_OK;
    uintptr_t a = (uintptr_t)p;
    if (p == NULL || a > UINTPTR_MAX - n) return MVC_ERR_ARG;
#if defined(MADV_DONTNEED)
    long ps = sysconf(_SC_PAGESIZE);
    uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096u;
    uintptr_t start = a & ~(page - 1);
    uintptr_t end = a + n;
    /* the last partial page too: rounding up cannot wrap past the top page of the space */
    end = end > UINTPTR_MAX - (page - 1) ? UINTPTR_MAX & ~(page - 1) : (end + page - 1) & ~(page - 1);
    if (madvise((void *)start, (size_t)(end - start), MADV_DONTNEED) != 0) return MVC_ERR_INTERNAL;
#endif
    return MVC_OK;
}
