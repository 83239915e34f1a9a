/* tests/server/span_source.h: a span source (transport/span.h) reading a kvl_cache of a model,
 * as kvld builds one for its sessions, for the tests that encode spans themselves. */
#ifndef KVL_TESTS_SPAN_SOURCE_H
#define KVL_TESTS_SPAN_SOURCE_H

#include "kvlingo/cache.h"
#include "span.h"

static kvl_status test_read_prenorm(const void *cache, int layer, int t0, int t1, float *k, float *v) {
    return kvl_cache_read_prenorm(cache, layer, t0, t1, k, v);
}

static inline kvl_status test_read_prenorm_bf16(const void *cache, int t0, int t1, uint16_t *k, uint16_t *v) {
    return kvl_cache_read_prenorm_bf16(cache, t0, t1, k, v);
}

/* read_prenorm_bf16 left NULL: the codec's chunked float32 reads (kvld sets it) */
static inline kvl__span_source test_span_source(const kvl_model *m, const kvl_cache *c) {
    const kvl_model_config *cfg = kvl_model_config_get(m);
    kvl__span_source s = {kvl_model_name(m), kvl_model_hash(m), (uint32_t)cfg->n_layers,
                          (uint32_t)cfg->n_kv_heads, (uint32_t)cfg->head_dim,
                          (uint32_t)kvl_cache_n_tokens(c), kvl_cache_tokens(c),
                          test_read_prenorm, c, NULL, 0, 0, NULL};
    return s;
}

#endif
