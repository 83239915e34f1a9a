/* kernels/cpu/kv_blocks.h: the CPU backend's KV cache storage: a table of fixed-size blocks.
 * One block holds every layer's planes for `block_tokens` consecutive tokens:
 *   block = [L][planes][block_tokens][Hkv*D] float32 or bf16 (the cache's element type),
 *           planes K, V (and Kpre for k_norm models)
 * Blocks are taken as tokens arrive and given back on truncation.  They come from a block pool
 * shared by the caches of one model: a switch or a new session then reuses memory that is
 * already mapped and faulted in instead of mapping fresh pages (a 2048-token span of a small
 * model otherwise costs ~10k page faults).  Private to kernels/cpu. */
#ifndef KVL_KERNELS_CPU_KV_BLOCKS_H
#define KVL_KERNELS_CPU_KV_BLOCKS_H

#include <pthread.h>
#include <stddef.h>

#include "kvlingo/backend.h"

/* Blocks of one size for the caches of one model (block_pool.c), carved from slabs of 2 MB
 * huge pages so that attention's scattered reads of many sessions' blocks stay within the TLB;
 * reference-counted, so caches and the model may be freed in any order.  Thread-safe.
 * Free blocks are kept for reuse (already mapped and faulted in) up to max_idle_bytes; above
 * it, slabs whose blocks are all free go back to the system (a slab with a block in use stays,
 * so what is kept is bounded by the peak in use). */
typedef struct kvl__block_pool kvl__block_pool;
kvl_status kvl__block_pool_create(size_t block_bytes, size_t max_idle_bytes, kvl__block_pool **out);
void kvl__block_pool_ref(kvl__block_pool *p);
void kvl__block_pool_unref(kvl__block_pool *p);   /* the last reference frees it */
/* One block of block_bytes (64-byte aligned, contents undefined), or NULL when out of memory. */
void *kvl__block_pool_take(kvl__block_pool *p);
/* Gives back a block from kvl__block_pool_take: 1.  Anything else (a pointer the pool never
 * handed out, one inside a block, a block already given back): 0, and the pool is unchanged. */
int kvl__block_pool_give(kvl__block_pool *p, void *b);
size_t kvl__block_pool_block_bytes(const kvl__block_pool *p);
/* Slabs held, free blocks among them, and blocks per slab (any pointer may be NULL). */
void kvl__block_pool_stats(kvl__block_pool *p, int *slabs, size_t *free_blocks, int *per_slab);

typedef struct kvl__kv_blocks {
    kvl_model_config cfg;
    int block_tokens;
    int capacity;          /* max tokens                                      */
    size_t row;            /* Hkv*D elements per token per plane              */
    int planes;            /* 2 (K, V) or 3 (K, V, Kpre)                      */
    int bf16;              /* elements are bf16 (uint16_t), else float32       */
    int n_blocks_max;
    int n_blocks_alloc;
    void **blocks;         /* [n_blocks_max], NULL when not allocated          */
    kvl__block_pool *pool; /* where blocks come from and go back; NULL: malloc   */
    float *scratch;        /* reused working memory of translate-apply          */
    size_t scratch_floats;
    /* The inverse-RoPE tables of the key export in progress, [exp_t1 - exp_t0, D/2] each:
     * a span is read layer after layer over one range, and the angles (a sincosf per position
     * and frequency) cost more than the rotation, so they are made once per span, not per
     * layer.  Built and read under exp_mu; freed after the last layer. */
    pthread_mutex_t exp_mu;
    float *exp_cos, *exp_sin;
    int exp_t0, exp_t1;
} kvl__kv_blocks;

/* The largest block_tokens a cache takes (a block of 64k tokens already holds every layer's
 * K/V for more context than a block is useful for). */
#define KVL__KV_BLOCK_TOKENS_MAX 65536
/* pool may be NULL (blocks are then malloc'ed and freed); a pool of another block size is
 * not used.  bf16: store elements as bf16 (rounded to nearest even on the way in, widened
 * exactly on the way out), half the bytes of float32. */
kvl_status kvl__kv_blocks_create(const kvl_model_config *cfg, int capacity, int block_tokens,
                                 int bf16, kvl__block_pool *pool, kvl__kv_blocks **out);
/* Bytes in one block of this geometry and element type. */
size_t kvl__kv_blocks_block_bytes(const kvl_model_config *cfg, int block_tokens, int bf16);
/* At least n floats of the cache's translate scratch (grown, never shrunk until free). */
float *kvl__kv_blocks_scratch(kvl__kv_blocks *c, size_t n);
void kvl__kv_blocks_free(kvl__kv_blocks *c);
size_t kvl__kv_blocks_bytes(const kvl__kv_blocks *c);
/* Pointer to token t's row of (layer, plane), float * or uint16_t * by c->bf16; t's block must
 * be allocated. */
void *kvl__kv_blocks_slot(const kvl__kv_blocks *c, int layer, int plane, int t);
/* Make sure blocks holding tokens [0, n_total) exist.  KVL_ERR_RANGE past capacity. */
kvl_status kvl__kv_blocks_reserve(kvl__kv_blocks *c, int n_total);
/* Free blocks wholly past token n. */
void kvl__kv_blocks_truncate(kvl__kv_blocks *c, int n);
/* Copy rows [t0, t1) of (layer, plane) to / from a contiguous [t1-t0, row] float32 buffer
 * (converting when the cache holds bf16). */
void kvl__kv_blocks_gather(const kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                           float *dst);
void kvl__kv_blocks_scatter(kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                            const float *src);
/* Rows [t0, t1) of (layer, plane) as bf16 into a contiguous [t1-t0, row] buffer: rounded to
 * nearest even from a float32 cache, copied from a bf16 one. */
void kvl__kv_blocks_gather_bf16(const kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                                uint16_t *dst);

#endif
