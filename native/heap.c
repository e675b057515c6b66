#include "heap.h"

#include <stdlib.h> /* defines __GLIBC__ on glibc, before it is tested below */
#if defined(__GLIBC__)
#include <malloc.h>
#endif

int mvc_heap_trim(void) {
#if defined(__GLIBC__)
    return malloc_trim(0) ? 1 : 0;
#else
    return 0;
#endif
}
