/* transport/spanbuf.h: a cache of span payload buffers.  A span of a few thousand tokens is
 * megabytes: a fresh allocation of that size is mapped and page-faulted on first touch (about
 * a thousand faults per 4 MB), on the exporter (encode) and on the importer (receive) of every
 * switch.  Buffers given back are kept, already faulted in, for the next span: at most
 * `max_buffers` of them and `max_bytes` in all; a larger span gets a buffer of its own, freed
 * when given back.  Thread-safe. */
#ifndef KVL_SPANBUF_H
#define KVL_SPANBUF_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/status.h"

typedef struct kvl__spanbufs kvl__spanbufs;

/* KVL_ERR_INVALID_ARG for max_buffers outside [1, 64], KVL_ERR_NOMEM.  Free with
 * kvl__spanbufs_free (buffers still taken then stay valid and are freed when given back). */
kvl_status kvl__spanbufs_create(int max_buffers, size_t max_bytes, kvl__spanbufs **out);
void kvl__spanbufs_free(kvl__spanbufs *p);

/* A buffer of at least len bytes, 64-byte aligned, owned by the caller until given back; NULL
 * when out of memory.  p NULL: a plain allocation. */
uint8_t *kvl__spanbuf_take(kvl__spanbufs *p, size_t len);
/* Give a buffer of kvl__spanbuf_take back (kept for the next span, or freed).  NULL buf: no-op. */
void kvl__spanbuf_give(kvl__spanbufs *p, uint8_t *buf);

/* Buffers kept now and their bytes (for tests and metrics). */
void kvl__spanbufs_stats(kvl__spanbufs *p, int *kept, size_t *bytes);

#endif
