/* kernels/cpu/kv_blocks.c: block storage of the CPU backend's KV cache (kv_blocks.h). */
#include "kv_blocks.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

kvl_status kvl__kv_blocks_create(const kvl_model_config *cfg, int capacity, int block_tokens,
                                 kvl__kv_blocks **out) {
    if (capacity < 1 || block_tokens < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cache: capacity %d and block_tokens %d must be > 0",
                           capacity, block_tokens);
    kvl__kv_blocks *c = calloc(1, sizeof *c);
    if (!c) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    c->cfg = *cfg;
    c->block_tokens = block_tokens;
    c->capacity = capacity;
    c->row = (size_t)cfg->n_kv_heads * cfg->head_dim;
    c->planes = cfg->qk_norm ? 3 : 2;
    c->n_blocks_max = (capacity + block_tokens - 1) / block_tokens;
    c->blocks = calloc((size_t)c->n_blocks_max, sizeof *c->blocks);
    if (!c->blocks) {
        free(c);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory for a cache of %d tokens", capacity);
    }
    *out = c;
    return KVL_OK;
}

void kvl__kv_blocks_free(kvl__kv_blocks *c) {
    if (!c) return;
    for (int b = 0; b < c->n_blocks_max; b++) free(c->blocks[b]);
    free(c->blocks);
    free(c);
}

static size_t block_floats(const kvl__kv_blocks *c) {
    return (size_t)c->cfg.n_layers * c->planes * c->block_tokens * c->row;
}

size_t kvl__kv_blocks_bytes(const kvl__kv_blocks *c) {
    return (size_t)c->n_blocks_alloc * block_floats(c) * sizeof(float);
}

float *kvl__kv_blocks_slot(const kvl__kv_blocks *c, int layer, int plane, int t) {
    int b = t / c->block_tokens, i = t % c->block_tokens;
    return c->blocks[b] + (((size_t)layer * c->planes + plane) * c->block_tokens + i) * c->row;
}

kvl_status kvl__kv_blocks_reserve(kvl__kv_blocks *c, int n_total) {
    if (n_total > c->capacity)
        return kvl__errorf(KVL_ERR_RANGE, "cache: %d tokens exceed the context capacity of %d",
                           n_total, c->capacity);
    int need = (n_total + c->block_tokens - 1) / c->block_tokens;
    size_t bf = block_floats(c);
    for (int b = 0; b < need; b++) {
        if (c->blocks[b]) continue;
        c->blocks[b] = malloc(bf * sizeof(float));
        if (!c->blocks[b])
            return kvl__errorf(KVL_ERR_NOMEM, "cache: out of memory for block %d (%zu bytes)", b,
                               bf * sizeof(float));
        c->n_blocks_alloc++;
    }
    return KVL_OK;
}

void kvl__kv_blocks_truncate(kvl__kv_blocks *c, int n) {
    int keep = (n + c->block_tokens - 1) / c->block_tokens;
    for (int b = keep; b < c->n_blocks_max; b++) {
        if (c->blocks[b]) { free(c->blocks[b]); c->blocks[b] = NULL; c->n_blocks_alloc--; }
    }
}

void kvl__kv_blocks_gather(const kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                           float *dst) {
    for (int t = t0; t < t1;) {
        int n = c->block_tokens - t % c->block_tokens;
        if (n > t1 - t) n = t1 - t;
        memcpy(dst + (size_t)(t - t0) * c->row, kvl__kv_blocks_slot(c, layer, plane, t),
               sizeof(float) * c->row * (size_t)n);
        t += n;
    }
}

void kvl__kv_blocks_scatter(kvl__kv_blocks *c, int layer, int plane, int t0, int t1,
                            const float *src) {
    for (int t = t0; t < t1;) {
        int n = c->block_tokens - t % c->block_tokens;
        if (n > t1 - t) n = t1 - t;
        memcpy(kvl__kv_blocks_slot(c, layer, plane, t), src + (size_t)(t - t0) * c->row,
               sizeof(float) * c->row * (size_t)n);
        t += n;
    }
}
