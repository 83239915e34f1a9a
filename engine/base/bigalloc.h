/* engine/base/bigalloc.h: allocations of model weights (gigabytes, streamed every decode step).
 *
 * kvl__bigalloc returns `bytes` of uninitialised memory aligned to 2 MiB and, on Linux, asks the
 * kernel for transparent huge pages there (madvise MADV_HUGEPAGE).  Where THP is in "madvise"
 * mode (this project's build hosts, and many others), memory from plain malloc stays on 4 KiB
 * pages: a decode step that streams every weight then misses the TLB on every 4 KiB, and the
 * AMX tiles, which load 16 rows of a matrix at once (16 pages), miss it on nearly every tile.
 * The advice is a hint: where the kernel has no huge pages to give, or THP is off, the memory
 * is ordinary.  NULL when out of memory (or bytes == 0).  Free with free(). */
#ifndef KVL_BASE_BIGALLOC_H
#define KVL_BASE_BIGALLOC_H

#include <stddef.h>

void *kvl__bigalloc(size_t bytes);

#endif
