/* engine/base/bigalloc.c: see bigalloc.h. */
#include "bigalloc.h"

#include <stdlib.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define KVL_HUGE_PAGE ((size_t)2 << 20)

void *kvl__bigalloc(size_t bytes) {
    if (bytes == 0) return NULL;
    /* whole huge pages, so the last one is not shared with other allocations */
    size_t len = (bytes + KVL_HUGE_PAGE - 1) & ~(KVL_HUGE_PAGE - 1);
    if (len < bytes) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, KVL_HUGE_PAGE, len) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, len, MADV_HUGEPAGE);   /* advice only: an error leaves ordinary pages */
#endif
    return p;
}
