/* engine/translator/kv_maps.c: KV-Lingo maps as plain arrays: random initialiser and the host reference
 * apply (include/kvlingo/kv_maps.h).  The reference follows the method exactly
 * (../shared/DESIGN.md): k_pre = W_K k_s, k = RoPE(k_norm(k_pre)), v = W_V v_s, in float32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "ops.h"
#include "error.h"
#include "kvlingo/kv_maps.h"
#include "model_internal.h"

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

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
    int Ls = src->n_layers, Lt = dst->n_layers;
    for (int l = 0; l < Lt; l++)   /* s(l) = round(l (Ls-1) / (Lt-1)) */
        out->layer_map[l] = Lt > 1 ? (int)floor((double)l * (Ls - 1) / (Lt - 1) + 0.5) : 0;
    float a = 1.7320508f / sqrtf((float)ks);
    uint64_t st = seed;
    for (size_t i = 0; i < n; i++) out->wk[i] = (2.0f * (float)(splitmix64(&st) >> 40) / 16777216.0f - 1.0f) * a;
    for (size_t i = 0; i < n; i++) out->wv[i] = (2.0f * (float)(splitmix64(&st) >> 40) / 16777216.0f - 1.0f) * a;
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
    const kvl_model_config *tc = kvl_model_config_get(dst_model);
    if (mp->dst_layers != tc->n_layers || mp->dst_kv_heads != tc->n_kv_heads ||
        mp->dst_head_dim != tc->head_dim)
        return kvl__errorf(KVL_ERR_MISMATCH, "kv maps: target geometry differs from model '%s'",
                          kvl_model_name(dst_model));
    if (src->cfg.n_layers != mp->src_layers || src->cfg.n_kv_heads != mp->src_kv_heads ||
        src->cfg.head_dim != mp->src_head_dim)
        return kvl__errorf(KVL_ERR_MISMATCH, "kv maps: source cache geometry %d x %d x %d, maps expect "
                          "%d x %d x %d", src->cfg.n_layers, src->cfg.n_kv_heads, src->cfg.head_dim,
                          mp->src_layers, mp->src_kv_heads, mp->src_head_dim);
    if (t0 < 0 || t1 < t0 || t1 > kvl_cache_n_tokens(src))
        return kvl__errorf(KVL_ERR_RANGE, "kv maps: span [%d, %d) outside the source's %d tokens", t0,
                          t1, kvl_cache_n_tokens(src));
    if (kvl_cache_n_tokens(dst) != t0)
        return kvl__errorf(KVL_ERR_RANGE, "kv maps: target holds %d tokens, span starts at %d",
                          kvl_cache_n_tokens(dst), t0);
    const int n = t1 - t0, Lt = tc->n_layers, Ht = tc->n_kv_heads, Dt = tc->head_dim;
    const size_t ks = (size_t)mp->src_kv_heads * mp->src_head_dim, kt = (size_t)Ht * Dt;
    if (n == 0) return KVL_OK;
    float *xk = malloc(sizeof(float) * n * ks), *xv = malloc(sizeof(float) * n * ks);
    float *kpre = malloc(sizeof(float) * Lt * n * kt), *kpost = malloc(sizeof(float) * Lt * n * kt);
    float *v = malloc(sizeof(float) * Lt * n * kt);
    int *pos = malloc(sizeof(int) * n);
    kvl_status s = (xk && xv && kpre && kpost && v && pos) ? KVL_OK
                   : kvl__errorf(KVL_ERR_NOMEM, "kv maps: out of memory for %d tokens", n);
    for (int i = 0; i < n && s == KVL_OK; i++) pos[i] = t0 + i;
    for (int l = 0; l < Lt && s == KVL_OK; l++) {
        if ((s = kvl_cache_read_prenorm(src, mp->layer_map[l], t0, t1, xk, xv)) != KVL_OK) break;
        float *kp = kpre + (size_t)l * n * kt, *ko = kpost + (size_t)l * n * kt, *vo = v + (size_t)l * n * kt;
        const float *wk = mp->wk + (size_t)l * kt * ks, *wv = mp->wv + (size_t)l * kt * ks;
        kvl__cpu_matmul_forward(kp, xk, wk, NULL, n, (int)ks, (int)kt);
        kvl__cpu_matmul_forward(vo, xv, wv, NULL, n, (int)ks, (int)kt);
        memcpy(ko, kp, sizeof(float) * n * kt);
        if (tc->qk_norm) kvl__cpu_rmsnorm_forward(ko, ko, dst_model->layers[l].k_norm, n * Ht, Dt, tc->rms_norm_eps);
        kvl__cpu_rope_forward(ko, pos, n, Ht, Dt, tc->rope_theta, 0);
    }
    if (s == KVL_OK)
        s = kvl_cache_append(dst, n, kvl_cache_tokens(src) + t0, kpost, v, tc->qk_norm ? kpre : NULL);
    free(xk); free(xv); free(kpre); free(kpost); free(v); free(pos);
    return s;
}
