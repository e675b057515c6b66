#ifndef MVC_HEAP_H
#define MVC_HEAP_H
/* Hand the C heap's free pages back to the operating system (glibc's malloc_trim(0)): memory a
 * commit's temporaries used and freed that the allocator would otherwise keep in its arenas.
 * Returns 1 when pages were released, 0 when none were or the C library has no such call. */
int mvc_heap_trim(void);
#endif
