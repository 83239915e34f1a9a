/* kernels/cpu/cache_cpu.c: the CPU backend's cache entries of kvl_backend_ops (kvlingo/backend.h)
 * over kv_blocks.h: free, size, truncate, write, read, and the pre-norm export (the stored Kpre
 * plane, or for models without k_norm the cached keys rotated back by the inverse RoPE).
 * cache_create stays in backend_cpu.c, which knows the model's block pool and KV dtype. */
#include <pthread.h>
#include <stdlib.h>

#include "backend_cpu_internal.h"
#include "error.h"
#include "kv_blocks.h"
#include "ops.h"

void kvl__cpu_cache_free(void *c) { kvl__kv_blocks_free(c); }
size_t kvl__cpu_cache_bytes(const void *c) { return kvl__kv_blocks_bytes(c); }

kvl_status kvl__cpu_cache_truncate(void *c, int n_held, int n) {
    (void)n_held;
    kvl__kv_blocks_truncate(c, n);
    return KVL_OK;
}

kvl_status kvl__cpu_cache_write(void *pc, int t0, int n, const float *k_post, const float *v,
                                const float *k_pre) {
    kvl__kv_blocks *c = pc;
    kvl_status s = kvl__kv_blocks_reserve(c, t0 + n);
    if (s != KVL_OK) return s;   /* blocks reserved beyond the held tokens are harmless */
    for (int l = 0; l < c->cfg.n_layers; l++) {
        size_t off = (size_t)l * n * c->row;
        kvl__kv_blocks_scatter(c, l, KVL_PLANE_K, t0, t0 + n, k_post + off);
        kvl__kv_blocks_scatter(c, l, KVL_PLANE_V, t0, t0 + n, v + off);
        if (c->planes == 3) kvl__kv_blocks_scatter(c, l, KVL_PLANE_KPRE, t0, t0 + n, k_pre + off);
    }
    return KVL_OK;
}

kvl_status kvl__cpu_cache_read(const void *pc, int layer, kvl_cache_plane plane, int t0, int t1,
                               float *out) {
    const kvl__kv_blocks *c = pc;
    if ((int)plane >= c->planes)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cache: plane %d is not stored for this model", plane);
    kvl__kv_blocks_gather(c, layer, plane, t0, t1, out);
    return KVL_OK;
}

kvl_status kvl__cpu_cache_export_prenorm(const void *pc, int layer, int t0, int t1, float *k_out,
                                         float *v_out) {
    const kvl__kv_blocks *c = pc;
    if (v_out) kvl__kv_blocks_gather(c, layer, KVL_PLANE_V, t0, t1, v_out);
    if (!k_out || t1 == t0) return KVL_OK;
    if (c->planes == 3) {
        kvl__kv_blocks_gather(c, layer, KVL_PLANE_KPRE, t0, t1, k_out);
        return KVL_OK;
    }
    /* No k_norm: the cached key is RoPE(k_proj output); rotate back, with the range's tables
     * made by the first layer read (kv_blocks.h: exp_cos).  The cache is const to its readers;
     * the tables are a memo of values, under their own lock. */
    kvl__kv_blocks_gather(c, layer, KVL_PLANE_K, t0, t1, k_out);
    kvl__kv_blocks *mc = (kvl__kv_blocks *)c;
    const int n = t1 - t0, half = c->cfg.head_dim / 2;
    pthread_mutex_lock(&mc->exp_mu);
    if (!mc->exp_cos || mc->exp_t0 != t0 || mc->exp_t1 != t1) {
        free(mc->exp_cos);
        mc->exp_cos = mc->exp_sin = NULL;
        float *tab = malloc(sizeof(float) * (size_t)n * (size_t)half * 2 + sizeof(int) * (size_t)n);
        if (!tab) {
            pthread_mutex_unlock(&mc->exp_mu);
            return kvl__errorf(KVL_ERR_NOMEM, "out of memory for the RoPE tables of %d tokens", n);
        }
        int *pos = (int *)(tab + (size_t)n * half * 2);
        for (int i = 0; i < n; i++) pos[i] = t0 + i;
        kvl__cpu_rope_table_mode(tab, tab + (size_t)n * half, pos, n, c->cfg.head_dim, &c->cfg.rope,
                                 KVL_ROPE_INVERSE);
        mc->exp_cos = tab;
        mc->exp_sin = tab + (size_t)n * half;
        mc->exp_t0 = t0;
        mc->exp_t1 = t1;
    }
    kvl__cpu_rope_apply(k_out, mc->exp_cos, mc->exp_sin, n, c->cfg.n_kv_heads, c->cfg.head_dim, 1);
    if (layer == c->cfg.n_layers - 1) {
        free(mc->exp_cos);
        mc->exp_cos = mc->exp_sin = NULL;
    }
    pthread_mutex_unlock(&mc->exp_mu);
    return KVL_OK;
}
