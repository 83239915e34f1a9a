/* engine/model/cache_internal.h: block layout of kvl_cache, for the engine's own files
 * (forward pass, translators, span export). */
#ifndef KVL_ENGINE_CACHE_INTERNAL_H
#define KVL_ENGINE_CACHE_INTERNAL_H

#include "kvlingo/cache.h"

enum { KVL_PLANE_K = 0, KVL_PLANE_V = 1, KVL_PLANE_KPRE = 2 };

struct kvl_cache {
    kvl_model_config cfg;
    int block_tokens;
    int capacity;          /* max tokens */
    int n_tokens;          /* tokens held: [0, n_tokens) */
    size_t row;            /* Hkv*D floats per token per plane */
    int planes;            /* 2 (K, V) or 3 (K, V, Kpre) */
    int n_blocks_max;
    int n_blocks_alloc;
    float **blocks;        /* [n_blocks_max], NULL when not allocated; block = [L][planes][bt][row] */
    int32_t *ids;          /* [capacity] token ids */
};

/* Floats in one block. */
size_t kvl__cache_block_floats(const kvl_cache *c);
/* Pointer to token t's row of (layer, plane); the block must be allocated. */
float *kvl__cache_slot(const kvl_cache *c, int layer, int plane, int t);
/* Make sure blocks for tokens [0, n_total) exist (does not change n_tokens). */
kvl_status kvl__cache_reserve(kvl_cache *c, int n_total);
/* Copy rows [t0, t1) of (layer, plane) to/from a contiguous [t1-t0, row] buffer. */
void kvl__cache_gather(const kvl_cache *c, int layer, int plane, int t0, int t1, float *dst);
void kvl__cache_scatter(kvl_cache *c, int layer, int plane, int t0, int t1, const float *src);

#endif
