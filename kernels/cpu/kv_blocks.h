/* kernels/cpu/kv_blocks.h: the CPU backend's KV cache storage: a table of fixed-size blocks.
 * One block holds every layer's planes for `block_tokens` consecutive tokens:
 *   block = [L][planes][block_tokens][Hkv*D] float32, planes K, V (and Kpre for k_norm models)
 * Blocks are allocated as tokens arrive and freed on truncation.  Private to kernels/cpu. */
#ifndef KVL_KERNELS_CPU_KV_BLOCKS_H
#define KVL_KERNELS_CPU_KV_BLOCKS_H

#include <stddef.h>

#include "kvlingo/backend.h"

typedef struct kvl__kv_blocks {
    kvl_model_config cfg;
    int block_tokens;
    int capacity;          /* max tokens                                      */
    size_t row;            /* Hkv*D floats per token per plane                */
    int planes;            /* 2 (K, V) or 3 (K, V, Kpre)                      */
    int n_blocks_max;
    int n_blocks_alloc;
    float **blocks;        /* [n_blocks_max], NULL when not allocated          */
} kvl__kv_blocks;

kvl_status kvl__kv_blocks_create(const kvl_model_config *cfg, int capacity, int block_tokens,
                                 kvl__kv_blocks **out);
void kvl__kv_blocks_free(kvl__kv_blocks *c);
size_t kvl__kv_blocks_bytes(const kvl__kv_blocks *c);
/* Pointer to token t's row of (layer, plane); t's block must be allocated. */
float *kvl__kv_blocks_slot(const kvl__kv_blocks *c, int layer, int plane, int t);
/* Make sure blocks holding tokens [0, n_total) exist.  KVL_ERR_RANGE past capacity. */
kvl_status kvl__kv_blocks_reserve(kvl__kv_blocks *c, int n_total);
/* Free blocks wholly past token n. */
void kvl__kv_blocks_truncate(kvl__kv_blocks *c, int n);
/* Copy rows [t0, t1) of (layer, plane) to / from a contiguous [t1-t0, row] buffer. */
void kvl__kv_blocks_gather(const kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                           float *dst);
void kvl__kv_blocks_scatter(kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                            const float *src);

#endif
