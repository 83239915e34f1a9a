/* engine/translator/kv_maps.c: plain maps (kvlingo/kv_maps.h): random maps of a pair's shape, and
 * their apply on the host, as a translator file's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kvlingo/kv_maps.h"
#include "model_iface.h"
#include "rng.h"
#include "translator_internal.h"

kvl_status kvl_kv_maps_random(const kvl_model_config *src, const kvl_model_config *dst,
                              uint64_t seed, kvl_kv_maps *out) {
    if (!src || !dst || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_kv_maps_random: NULL argument");
    memset(out, 0, sizeof *out);
    out->src_layers = src->n_layers; out->src_kv_heads = src->n_kv_heads; out->src_head_dim = src->head_dim;
    out->dst_layers = dst->n_layers; out->dst_kv_heads = dst->n_kv_heads; out->dst_head_dim = dst->head_dim;
    size_t ks = (size_t)src->n_kv_heads * src->head_dim, kt = (size_t)dst->n_kv_heads * dst->head_dim;
    size_t n = (size_t)dst->n_layers * kt * ks;
    out->layer_map = malloc(sizeof(int) * (size_t)dst->n_layers);
    out->wk = malloc(sizeof(float) * n);
    out->wv = malloc(sizeof(float) * n);
    out->owned = 1;
    if (!out->layer_map || !out->wk || !out->wv) {
        kvl_kv_maps_free(out);
        return kvl__errorf(KVL_ERR_NOMEM, "random maps: out of memory for 2 x %zu weights", n);
    }
    for (int l = 0; l < dst->n_layers; l++)
        out->layer_map[l] = kvl__tr_default_source_layer(l, src->n_layers, dst->n_layers);
    /* uniform with std 1/sqrt(Hs*Ds): translated K/V stay at the scale of the source's */
    float a = 1.7320508f / sqrtf((float)ks);
    uint64_t st = seed;
    kvl__rng_fill_uniform(out->wk, n, &st, a);
    kvl__rng_fill_uniform(out->wv, n, &st, a);
    return KVL_OK;
}

void kvl_kv_maps_free(kvl_kv_maps *m) {
    if (!m || !m->owned) return;
    free(m->layer_map);
    free(m->wk);
    free(m->wv);
    memset(m, 0, sizeof *m);
}

kvl_status kvl_kv_maps_apply_host(const kvl_kv_maps *mp, const kvl_model *dst_model,
                                  const kvl_cache *src, int t0, int t1, kvl_cache *dst) {
    if (!mp || !dst_model || !src || !dst)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_kv_maps_apply_host: NULL argument");
    const kvl_model_config *tc = kvl_model_config_get(dst_model), *sc = kvl_cache_config(src);
    if (mp->dst_layers != tc->n_layers || mp->dst_kv_heads != tc->n_kv_heads ||
        mp->dst_head_dim != tc->head_dim)
        return kvl__errorf(KVL_ERR_MISMATCH, "kv maps: target geometry differs from model '%s'",
                          kvl_model_name(dst_model));
    if (sc->n_layers != mp->src_layers || sc->n_kv_heads != mp->src_kv_heads ||
        sc->head_dim != mp->src_head_dim)
        return kvl__errorf(KVL_ERR_MISMATCH, "kv maps: source cache geometry %d x %d x %d, maps expect "
                          "%d x %d x %d", sc->n_layers, sc->n_kv_heads, sc->head_dim,
                          mp->src_layers, mp->src_kv_heads, mp->src_head_dim);
    /* the kernels write the maps' rows into dst's blocks as they are laid out for its own
     * geometry, and read the source layer each entry of layer_map names */
    const kvl_model_config *dc = kvl_cache_config(dst);
    if (dc->n_layers != tc->n_layers || dc->n_kv_heads != tc->n_kv_heads ||
        dc->head_dim != tc->head_dim || dc->qk_norm != tc->qk_norm)
        return kvl__errorf(KVL_ERR_MISMATCH, "kv maps: target cache geometry %d x %d x %d is not model "
                          "'%s''s %d x %d x %d", dc->n_layers, dc->n_kv_heads, dc->head_dim,
                          kvl_model_name(dst_model), tc->n_layers, tc->n_kv_heads, tc->head_dim);
    for (int l = 0; l < mp->dst_layers; l++)
        if (!mp->layer_map || mp->layer_map[l] < 0 || mp->layer_map[l] >= mp->src_layers)
            return kvl__errorf(KVL_ERR_MISMATCH, "kv maps: target layer %d maps to source layer %d, "
                              "outside [0, %d)", l, mp->layer_map ? mp->layer_map[l] : -1,
                              mp->src_layers);
    if (t0 < 0 || t1 < t0 || t1 > kvl_cache_n_tokens(src))
        return kvl__errorf(KVL_ERR_RANGE, "kv maps: span [%d, %d) outside the source's %d tokens", t0,
                          t1, kvl_cache_n_tokens(src));
    if (kvl_cache_n_tokens(dst) != t0)
        return kvl__errorf(KVL_ERR_RANGE, "kv maps: target holds %d tokens, span starts at %d",
                          kvl_cache_n_tokens(dst), t0);
    const int n = t1 - t0, Dt = tc->head_dim;
    if (n == 0) return KVL_OK;
    float *k_norm = NULL;
    if (tc->qk_norm) {   /* the target's own k_norm weights, [Lt][Dt] */
        k_norm = malloc(sizeof(float) * (size_t)tc->n_layers * Dt);
        if (!k_norm) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
        for (int l = 0; l < tc->n_layers; l++)
            memcpy(k_norm + (size_t)l * Dt, kvl_model_weights(dst_model)->layers[l].k_norm,
                   sizeof(float) * Dt);
    }
    float *k = NULL, *v = NULL;
    kvl_status s = kvl__tr_read_span(src, mp->src_layers, (size_t)n * mp->src_kv_heads * mp->src_head_dim,
                             t0, t1, &k, &v);
    kvl_translate_params p = {mp, k_norm, tc->rms_norm_eps, tc->rope};
    if (s == KVL_OK) s = kvl__cache_translate(dst, &p, k, v, n, kvl_cache_tokens(src) + t0);
    free(k); free(v); free(k_norm);
    return s;
}
