/* engine/model/cache.c: the KV cache's backend-neutral half (include/kvlingo/cache.h): token ids,
 * counts, range checks; K/V storage lives in the backend (kvlingo/backend.h). */
#include "cache_internal.h"

#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "error.h"
#include "model_internal.h"

kvl_cache_params kvl_cache_default_params(void) {
    kvl_cache_params p = {.max_tokens = 0, .block_tokens = 16};
    return p;
}

static kvl_status cache_new(const kvl_model_config *cfg, const kvl_backend_ops *ops, void *bm,
                            const kvl_cache_params *params, kvl_cache **out) {
    kvl_cache_params p = params ? *params : kvl_cache_default_params();
    if (p.block_tokens <= 0) p.block_tokens = 16;
    if (p.max_tokens <= 0) p.max_tokens = cfg->max_position_embeddings;
    if (p.max_tokens <= 0)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_cache_create: max_tokens must be > 0");
    kvl_cache *c = calloc(1, sizeof *c);
    if (!c) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    c->cfg = *cfg;
    c->ops = ops;
    c->bm = bm;
    c->capacity = p.max_tokens;
    c->ids = malloc(sizeof(int32_t) * (size_t)p.max_tokens);
    if (!c->ids) {
        free(c);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory for a cache of %d tokens", p.max_tokens);
    }
    kvl_status s = ops->cache_create(cfg, bm, p.max_tokens, p.block_tokens, &c->be);
    if (s != KVL_OK) {
        free(c->ids);
        free(c);
        return s;
    }
    *out = c;
    return KVL_OK;
}

kvl_status kvl_cache_create(const kvl_model_config *cfg, const kvl_cache_params *params,
                            kvl_cache **out) {
    if (!cfg || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_cache_create: NULL argument");
    return cache_new(cfg, kvl_backend_cpu(), NULL, params, out);
}

kvl_status kvl_model_cache_create(const kvl_model *m, const kvl_cache_params *params,
                                  kvl_cache **out) {
    if (!m || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_model_cache_create: NULL argument");
    return cache_new(&m->cfg, m->ops, m->be, params, out);
}

void kvl_cache_free(kvl_cache *c) {
    if (!c) return;
    if (c->be) c->ops->cache_free(c->be);
    free(c->ids);
    free(c);
}

int kvl_cache_n_tokens(const kvl_cache *c) { return c->n_tokens; }
int kvl_cache_capacity(const kvl_cache *c) { return c->capacity; }
const int32_t *kvl_cache_tokens(const kvl_cache *c) { return c->ids; }
size_t kvl_cache_bytes(const kvl_cache *c) { return c->ops->cache_bytes(c->be); }

kvl_status kvl_cache_truncate(kvl_cache *c, int n) {
    if (n < 0 || n > c->n_tokens)
        return kvl__errorf(KVL_ERR_RANGE, "cache: truncate to %d tokens but %d are held", n, c->n_tokens);
    kvl_status s = c->ops->cache_truncate(c->be, c->n_tokens, n);
    if (s == KVL_OK) c->n_tokens = n;
    return s;
}

static kvl_status check_range(const kvl_cache *c, int layer, int t0, int t1) {
    if (layer < 0 || layer >= c->cfg.n_layers)
        return kvl__errorf(KVL_ERR_RANGE, "cache: layer %d out of range [0, %d)", layer, c->cfg.n_layers);
    if (t0 < 0 || t1 < t0 || t1 > c->n_tokens)
        return kvl__errorf(KVL_ERR_RANGE, "cache: token range [%d, %d) outside the %d tokens held",
                           t0, t1, c->n_tokens);
    return KVL_OK;
}

kvl_status kvl_cache_read_kv(const kvl_cache *c, int layer, int t0, int t1, float *k_out,
                             float *v_out) {
    kvl_status s = check_range(c, layer, t0, t1);
    if (s == KVL_OK && k_out && t1 > t0) s = c->ops->cache_read(c->be, layer, KVL_PLANE_K, t0, t1, k_out);
    if (s == KVL_OK && v_out && t1 > t0) s = c->ops->cache_read(c->be, layer, KVL_PLANE_V, t0, t1, v_out);
    return s;
}

kvl_status kvl_cache_read_prenorm(const kvl_cache *c, int layer, int t0, int t1, float *k_out,
                                  float *v_out) {
    kvl_status s = check_range(c, layer, t0, t1);
    if (s != KVL_OK || t1 == t0) return s;
    return c->ops->cache_export_prenorm(c->be, layer, t0, t1, k_out, v_out);
}

kvl_status kvl_cache_read_prenorm_bf16(const kvl_cache *c, int t0, int t1, uint16_t *k_out,
                                       uint16_t *v_out) {
    kvl_status s = check_range(c, 0, t0, t1);
    if (s != KVL_OK || t1 == t0) return s;
    if (!k_out || !v_out) return kvl__errorf(KVL_ERR_INVALID_ARG, "cache: read_prenorm_bf16: NULL buffer");
    if (c->ops->cache_export_prenorm_bf16)
        return c->ops->cache_export_prenorm_bf16(c->bm, c->be, t0, t1, k_out, v_out);
    /* a backend without it (a device): each layer's float32 export over the whole range (one
     * copy from the device a layer, the range's RoPE as kvl_cache_read_prenorm has it), rounded */
    const size_t row = (size_t)c->cfg.n_kv_heads * c->cfg.head_dim, per = (size_t)(t1 - t0) * row;
    float *tmp = malloc(2 * per * sizeof(float));
    if (!tmp) return kvl__errorf(KVL_ERR_NOMEM, "cache: read_prenorm_bf16: %zu floats", 2 * per);
    for (int l = 0; s == KVL_OK && l < c->cfg.n_layers; l++) {
        s = c->ops->cache_export_prenorm(c->be, l, t0, t1, tmp, tmp + per);
        if (s != KVL_OK) break;
        kvl__bf16_round_n(k_out + l * per, tmp, per);
        kvl__bf16_round_n(v_out + l * per, tmp + per, per);
    }
    free(tmp);
    return s;
}

kvl_status kvl_cache_append(kvl_cache *c, int n, const int32_t *ids, const float *k_post,
                            const float *v, const float *k_pre) {
    if (n < 0 || (n > 0 && (!k_post || !v)))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cache append: bad arguments (n=%d)", n);
    if (n > 0 && c->cfg.qk_norm && !k_pre)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cache append: this model has k_norm, so the "
                           "pre-norm keys (k_pre) are required");
    if (c->n_tokens + n > c->capacity)
        return kvl__errorf(KVL_ERR_RANGE, "cache: %d tokens exceed the context capacity of %d",
                           c->n_tokens + n, c->capacity);
    if (n == 0) return KVL_OK;
    kvl_status s = c->ops->cache_write(c->be, c->n_tokens, n, k_post, v, c->cfg.qk_norm ? k_pre : NULL);
    if (s != KVL_OK) return s;
    kvl__cache_commit(c, n, ids);
    return KVL_OK;
}

void kvl__cache_commit(kvl_cache *c, int n, const int32_t *ids) {
    for (int i = 0; i < n; i++) c->ids[c->n_tokens + i] = ids ? ids[i] : -1;
    c->n_tokens += n;
}

void kvl__cache_backend(const kvl_cache *c, const kvl_backend_ops **ops, void **bm) {
    *ops = c->ops;
    *bm = c->bm;
}

kvl_status kvl__cache_translate_prepared(kvl_cache *dst, void *prepared, const float *k_src,
                                         const float *v_src, int n, const int32_t *ids) {
    if (n == 0) return KVL_OK;
    kvl_status s = dst->ops->translate_apply(prepared, k_src, v_src, dst->n_tokens, n, dst->be);
    if (s == KVL_OK) kvl__cache_commit(dst, n, ids);
    return s;
}

/* Prepare, apply (float32 rows, or bf16 ones where k16 is given), release, commit. */
static kvl_status translate_rows(kvl_cache *dst, const kvl_translate_params *p, const float *k_src,
                                 const float *v_src, const uint16_t *k16, const uint16_t *v16, int n,
                                 const int32_t *ids) {
    if (n == 0) return KVL_OK;
    void *prep = NULL;
    kvl_status s = dst->ops->translate_prepare(dst->bm, p, &prep);
    if (s != KVL_OK) return s;
    s = k16 ? dst->ops->translate_apply_bf16(prep, k16, v16, dst->n_tokens, n, dst->be)
            : dst->ops->translate_apply(prep, k_src, v_src, dst->n_tokens, n, dst->be);
    dst->ops->translate_release(prep);
    if (s == KVL_OK) kvl__cache_commit(dst, n, ids);
    return s;
}

kvl_status kvl__cache_translate(kvl_cache *dst, const kvl_translate_params *p, const float *k_src,
                                const float *v_src, int n, const int32_t *ids) {
    return translate_rows(dst, p, k_src, v_src, NULL, NULL, n, ids);
}

kvl_status kvl__cache_translate_bf16(kvl_cache *dst, const kvl_translate_params *p,
                                     const uint16_t *k_src16, const uint16_t *v_src16, int n,
                                     const int32_t *ids) {
    if (!dst->ops->translate_apply_bf16)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "translate: this backend takes float32 source rows only");
    return translate_rows(dst, p, NULL, NULL, k_src16, v_src16, n, ids);
}

const kvl_model_config *kvl_cache_config(const kvl_cache *c) { return &c->cfg; }
