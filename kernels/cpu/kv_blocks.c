/* kernels/cpu/kv_blocks.c: block storage of the CPU backend's KV cache (kv_blocks.h). */
#include "kv_blocks.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "matmul_bf16.h"

static void *block_take(kvl__kv_blocks *c, size_t bytes) {
    return c->pool ? kvl__block_pool_take(c->pool) : malloc(bytes);
}

static void block_give(kvl__kv_blocks *c, void *b) {
    if (!c->pool || !kvl__block_pool_give(c->pool, b)) free(b);
}

size_t kvl__kv_blocks_block_bytes(const kvl_model_config *cfg, int block_tokens, int bf16) {
    return (size_t)cfg->n_layers * (cfg->qk_norm ? 3 : 2) * (size_t)block_tokens *
           (size_t)cfg->n_kv_heads * cfg->head_dim * (bf16 ? sizeof(uint16_t) : sizeof(float));
}

kvl_status kvl__kv_blocks_create(const kvl_model_config *cfg, int capacity, int block_tokens,
                                 int bf16, kvl__block_pool *pool, kvl__kv_blocks **out) {
    if (capacity < 1 || block_tokens < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cache: capacity %d and block_tokens %d must be > 0",
                           capacity, block_tokens);
    /* block counts are rounded up as (tokens + block_tokens - 1) / block_tokens in int, here
     * and in the attention kernels' callers: past INT_MAX that sum wraps negative (a cache with
     * no block table, written through anyway) */
    if (block_tokens > KVL__KV_BLOCK_TOKENS_MAX || capacity > INT_MAX - block_tokens)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cache: block_tokens %d (at most %d) with capacity %d "
                           "is too large", block_tokens, KVL__KV_BLOCK_TOKENS_MAX, capacity);
    kvl__kv_blocks *c = calloc(1, sizeof *c);
    if (!c) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    c->cfg = *cfg;
    c->block_tokens = block_tokens;
    c->capacity = capacity;
    c->row = (size_t)cfg->n_kv_heads * cfg->head_dim;
    c->planes = cfg->qk_norm ? 3 : 2;
    c->bf16 = bf16 != 0;
    c->n_blocks_max = (capacity + block_tokens - 1) / block_tokens;
    c->blocks = calloc((size_t)c->n_blocks_max, sizeof *c->blocks);
    if (!c->blocks) {
        free(c);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory for a cache of %d tokens", capacity);
    }
    if (pthread_mutex_init(&c->exp_mu, NULL)) {
        free(c->blocks);
        free(c);
        return kvl__errorf(KVL_ERR_NOMEM, "cache: cannot create its export lock");
    }
    if (pool && kvl__block_pool_block_bytes(pool) == kvl__kv_blocks_block_bytes(cfg, block_tokens, c->bf16)) {
        kvl__block_pool_ref(pool);
        c->pool = pool;
    }
    *out = c;
    return KVL_OK;
}

void kvl__kv_blocks_free(kvl__kv_blocks *c) {
    if (!c) return;
    for (int b = 0; b < c->n_blocks_max; b++)
        if (c->blocks[b]) block_give(c, c->blocks[b]);
    kvl__block_pool_unref(c->pool);
    free(c->blocks);
    free(c->scratch);
    free(c->exp_cos);
    pthread_mutex_destroy(&c->exp_mu);
    free(c);
}

float *kvl__kv_blocks_scratch(kvl__kv_blocks *c, size_t n) {
    if (n > c->scratch_floats) {
        float *s = malloc(n * sizeof(float));
        if (!s) return NULL;
        free(c->scratch);
        c->scratch = s;
        c->scratch_floats = n;
    }
    return c->scratch;
}

static size_t block_bytes(const kvl__kv_blocks *c) {
    return kvl__kv_blocks_block_bytes(&c->cfg, c->block_tokens, c->bf16);
}

size_t kvl__kv_blocks_bytes(const kvl__kv_blocks *c) {
    return (size_t)c->n_blocks_alloc * block_bytes(c);
}

void *kvl__kv_blocks_slot(const kvl__kv_blocks *c, int layer, int plane, int t) {
    int b = t / c->block_tokens, i = t % c->block_tokens;
    size_t e = (((size_t)layer * c->planes + plane) * c->block_tokens + i) * c->row;
    return c->bf16 ? (void *)((uint16_t *)c->blocks[b] + e) : (void *)((float *)c->blocks[b] + e);
}

kvl_status kvl__kv_blocks_reserve(kvl__kv_blocks *c, int n_total) {
    if (n_total > c->capacity)
        return kvl__errorf(KVL_ERR_RANGE, "cache: %d tokens exceed the context capacity of %d",
                           n_total, c->capacity);
    int need = (n_total + c->block_tokens - 1) / c->block_tokens;
    size_t bytes = block_bytes(c);
    for (int b = 0; b < need; b++) {
        if (c->blocks[b]) continue;
        c->blocks[b] = block_take(c, bytes);
        if (!c->blocks[b])
            return kvl__errorf(KVL_ERR_NOMEM, "cache: out of memory for block %d (%zu bytes)", b,
                               bytes);
        c->n_blocks_alloc++;
    }
    return KVL_OK;
}

void kvl__kv_blocks_truncate(kvl__kv_blocks *c, int n) {
    int keep = (n + c->block_tokens - 1) / c->block_tokens;
    for (int b = keep; b < c->n_blocks_max; b++) {
        if (c->blocks[b]) { block_give(c, c->blocks[b]); c->blocks[b] = NULL; c->n_blocks_alloc--; }
    }
}

/* Tokens from t to the end of t's block or to t1, whichever comes first: a run of rows that
 * lie one after another in one block. */
static int run_len(const kvl__kv_blocks *c, int t, int t1) {
    const int n = c->block_tokens - t % c->block_tokens;
    return n < t1 - t ? n : t1 - t;
}

void kvl__kv_blocks_gather(const kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                           float *dst) {
    for (int t = t0, n; t < t1; t += n) {
        n = run_len(c, t, t1);
        float *d = dst + (size_t)(t - t0) * c->row;
        if (c->bf16) kvl__bf16_to_f32_n(d, kvl__kv_blocks_slot(c, layer, plane, t), c->row * (size_t)n);
        else memcpy(d, kvl__kv_blocks_slot(c, layer, plane, t), sizeof(float) * c->row * (size_t)n);
    }
}

void kvl__kv_blocks_gather_bf16(const kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                                uint16_t *dst) {
    for (int t = t0, n; t < t1; t += n) {
        n = run_len(c, t, t1);
        uint16_t *d = dst + (size_t)(t - t0) * c->row;
        if (c->bf16) memcpy(d, kvl__kv_blocks_slot(c, layer, plane, t), sizeof(uint16_t) * c->row * (size_t)n);
        else kvl__bf16_round_n(d, kvl__kv_blocks_slot(c, layer, plane, t), c->row * (size_t)n);
    }
}

void kvl__kv_blocks_scatter(kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                            const float *src) {
    for (int t = t0, n; t < t1; t += n) {
        n = run_len(c, t, t1);
        const float *sp = src + (size_t)(t - t0) * c->row;
        if (c->bf16) kvl__bf16_from_f32(kvl__kv_blocks_slot(c, layer, plane, t), sp, c->row * (size_t)n);
        else memcpy(kvl__kv_blocks_slot(c, layer, plane, t), sp, sizeof(float) * c->row * (size_t)n);
    }
}
