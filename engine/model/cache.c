/* engine/model/cache.c: block-structured KV cache (see include/kvlingo/cache.h). */
#include "kvlingo/cache.h"

#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "error.h"
#include "cache_internal.h"

kvl_cache_params kvl_cache_default_params(void) {
    kvl_cache_params p = {.max_tokens = 0, .block_tokens = 16};
    return p;
}

kvl_status kvl_cache_create(const kvl_model_config *cfg, const kvl_cache_params *params,
                            kvl_cache **out) {
    if (!cfg || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_cache_create: NULL argument");
    kvl_cache_params p = params ? *params : kvl_cache_default_params();
    if (p.block_tokens <= 0) p.block_tokens = 16;
    if (p.max_tokens <= 0) p.max_tokens = cfg->max_position_embeddings;
    if (p.max_tokens <= 0)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_cache_create: max_tokens must be > 0");
    kvl_cache *c = calloc(1, sizeof *c);
    if (!c) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    c->cfg = *cfg;
    c->block_tokens = p.block_tokens;
    c->capacity = p.max_tokens;
    c->row = (size_t)cfg->n_kv_heads * cfg->head_dim;
    c->planes = cfg->qk_norm ? 3 : 2;
    c->n_blocks_max = (p.max_tokens + p.block_tokens - 1) / p.block_tokens;
    c->blocks = calloc((size_t)c->n_blocks_max, sizeof *c->blocks);
    c->ids = malloc(sizeof(int32_t) * (size_t)p.max_tokens);
    if (!c->blocks || !c->ids) {
        kvl_cache_free(c);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory for a cache of %d tokens", p.max_tokens);
    }
    *out = c;
    return KVL_OK;
}

void kvl_cache_free(kvl_cache *c) {
    if (!c) return;
    if (c->blocks)
        for (int b = 0; b < c->n_blocks_max; b++) free(c->blocks[b]);
    free(c->blocks);
    free(c->ids);
    free(c);
}

int kvl_cache_n_tokens(const kvl_cache *c) { return c->n_tokens; }
int kvl_cache_capacity(const kvl_cache *c) { return c->capacity; }
const int32_t *kvl_cache_tokens(const kvl_cache *c) { return c->ids; }

size_t kvl__cache_block_floats(const kvl_cache *c) {
    return (size_t)c->cfg.n_layers * c->planes * c->block_tokens * c->row;
}

size_t kvl_cache_bytes(const kvl_cache *c) {
    return (size_t)c->n_blocks_alloc * kvl__cache_block_floats(c) * sizeof(float);
}

float *kvl__cache_slot(const kvl_cache *c, int layer, int plane, int t) {
    int b = t / c->block_tokens, i = t % c->block_tokens;
    float *blk = c->blocks[b];
    return blk + (((size_t)layer * c->planes + plane) * c->block_tokens + i) * c->row;
}

kvl_status kvl__cache_reserve(kvl_cache *c, int n_total) {
    if (n_total > c->capacity)
        return kvl__errorf(KVL_ERR_RANGE, "cache: %d tokens exceed the context capacity of %d",
                          n_total, c->capacity);
    int need = (n_total + c->block_tokens - 1) / c->block_tokens;
    size_t bf = kvl__cache_block_floats(c);
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

kvl_status kvl_cache_truncate(kvl_cache *c, int n) {
    if (n < 0 || n > c->n_tokens)
        return kvl__errorf(KVL_ERR_RANGE, "cache: truncate to %d tokens but %d are held", n, c->n_tokens);
    int keep = (n + c->block_tokens - 1) / c->block_tokens;
    for (int b = keep; b < c->n_blocks_max; b++) {
        if (c->blocks[b]) { free(c->blocks[b]); c->blocks[b] = NULL; c->n_blocks_alloc--; }
    }
    c->n_tokens = n;
    return KVL_OK;
}

static kvl_status check_range(const kvl_cache *c, int layer, int t0, int t1) {
    if (layer < 0 || layer >= c->cfg.n_layers)
        return kvl__errorf(KVL_ERR_RANGE, "cache: layer %d out of range [0, %d)", layer, c->cfg.n_layers);
    if (t0 < 0 || t1 < t0 || t1 > c->n_tokens)
        return kvl__errorf(KVL_ERR_RANGE, "cache: token range [%d, %d) outside the %d tokens held",
                          t0, t1, c->n_tokens);
    return KVL_OK;
}

void kvl__cache_gather(const kvl_cache *c, int layer, int plane, int t0, int t1, float *dst) {
    int t = t0;
    while (t < t1) {
        int i = t % c->block_tokens;
        int n = c->block_tokens - i;
        if (n > t1 - t) n = t1 - t;
        memcpy(dst + (size_t)(t - t0) * c->row, kvl__cache_slot(c, layer, plane, t),
               sizeof(float) * c->row * (size_t)n);
        t += n;
    }
}

void kvl__cache_scatter(kvl_cache *c, int layer, int plane, int t0, int t1, const float *src) {
    int t = t0;
    while (t < t1) {
        int i = t % c->block_tokens;
        int n = c->block_tokens - i;
        if (n > t1 - t) n = t1 - t;
        memcpy(kvl__cache_slot(c, layer, plane, t), src + (size_t)(t - t0) * c->row,
               sizeof(float) * c->row * (size_t)n);
        t += n;
    }
}

kvl_status kvl_cache_read_kv(const kvl_cache *c, int layer, int t0, int t1, float *k_out,
                             float *v_out) {
    kvl_status s = check_range(c, layer, t0, t1);
    if (s != KVL_OK) return s;
    if (k_out) kvl__cache_gather(c, layer, KVL_PLANE_K, t0, t1, k_out);
    if (v_out) kvl__cache_gather(c, layer, KVL_PLANE_V, t0, t1, v_out);
    return KVL_OK;
}

kvl_status kvl_cache_read_prenorm(const kvl_cache *c, int layer, int t0, int t1, float *k_out,
                                  float *v_out) {
    kvl_status s = check_range(c, layer, t0, t1);
    if (s != KVL_OK) return s;
    if (v_out) kvl__cache_gather(c, layer, KVL_PLANE_V, t0, t1, v_out);
    if (!k_out || t1 == t0) return KVL_OK;
    if (c->cfg.qk_norm) {
        kvl__cache_gather(c, layer, KVL_PLANE_KPRE, t0, t1, k_out);
        return KVL_OK;
    }
    /* No k_norm: the cached key is RoPE(k_proj output); rotate back. */
    kvl__cache_gather(c, layer, KVL_PLANE_K, t0, t1, k_out);
    int n = t1 - t0;
    int *pos = malloc(sizeof(int) * (size_t)n);
    if (!pos) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) pos[i] = t0 + i;
    kvl__cpu_rope_forward(k_out, pos, n, c->cfg.n_kv_heads, c->cfg.head_dim, c->cfg.rope_theta, 1);
    free(pos);
    return KVL_OK;
}

kvl_status kvl_cache_append(kvl_cache *c, int n, const int32_t *ids, const float *k_post,
                            const float *v, const float *k_pre) {
    if (n < 0 || (n > 0 && (!k_post || !v)))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cache append: bad arguments (n=%d)", n);
    if (n > 0 && c->cfg.qk_norm && !k_pre)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cache append: this model has k_norm, so the "
                          "pre-norm keys (k_pre) are required");
    kvl_status s = kvl__cache_reserve(c, c->n_tokens + n);
    if (s != KVL_OK) return s;   /* blocks reserved beyond n_tokens are harmless */
    int t0 = c->n_tokens, t1 = t0 + n;
    for (int l = 0; l < c->cfg.n_layers; l++) {
        size_t off = (size_t)l * n * c->row;
        kvl__cache_scatter(c, l, KVL_PLANE_K, t0, t1, k_post + off);
        kvl__cache_scatter(c, l, KVL_PLANE_V, t0, t1, v + off);
        if (c->cfg.qk_norm) kvl__cache_scatter(c, l, KVL_PLANE_KPRE, t0, t1, k_pre + off);
    }
    for (int i = 0; i < n; i++) c->ids[t0 + i] = ids ? ids[i] : -1;
    c->n_tokens = t1;
    return KVL_OK;
}
