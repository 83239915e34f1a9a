/* kernels/cpu/cache_cpu.c: the CPU backend's cache entries of kvl_backend_ops (kvlingo/backend.h)
 * over kv_blocks.h: free, size, truncate, write, read, and the pre-norm export (the stored Kpre
 * plane, or for models without k_norm the cached keys rotated back by the inverse RoPE), layer
 * by layer in float32 or every layer at once in bf16 on the model's pool.
 * cache_create stays in backend_cpu.c, which knows the model's block pool and KV dtype. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backend_cpu_internal.h"
#include "bf16.h"
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

/* ---- the export of a whole span in bf16 (kvl_backend_ops.cache_export_prenorm_bf16) ---------
 * Items of (layer, 64 tokens), claimed by whichever part is free: each reads its rows from the
 * blocks and rounds them into the output in one pass (the keys of a model without k_norm
 * through the part's float32 scratch, rotated back there), so the span is read once and
 * written once, on every core the model's pool has. */
#define KVL_EXPORT_CHUNK 64

typedef struct export_job {
    const kvl__kv_blocks *c;
    int t0, t1, n_chunks;
    atomic_int next;
    uint16_t *k, *v;              /* [L][t1-t0][row] */
    float *tmp;                   /* no k_norm: [parts][KVL_EXPORT_CHUNK * row] */
    const float *rcos, *rsin;     /* no k_norm: the inverse tables of [t0, t1), [n, D/2] */
} export_job;

static void export_part(void *pj, int part, int n_parts) {
    export_job *j = pj;
    (void)n_parts;
    const kvl__kv_blocks *c = j->c;
    const size_t row = c->row, per = (size_t)(j->t1 - j->t0) * row;
    const int half = c->cfg.head_dim / 2, n_items = c->cfg.n_layers * j->n_chunks;
    for (int i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < n_items;) {
        const int l = i / j->n_chunks, a = j->t0 + (i % j->n_chunks) * KVL_EXPORT_CHUNK;
        const int b = a + KVL_EXPORT_CHUNK < j->t1 ? a + KVL_EXPORT_CHUNK : j->t1;
        const size_t off = l * per + (size_t)(a - j->t0) * row;
        kvl__kv_blocks_gather_bf16(c, l, KVL_PLANE_V, a, b, j->v + off);
        if (c->planes == 3) {
            kvl__kv_blocks_gather_bf16(c, l, KVL_PLANE_KPRE, a, b, j->k + off);
            continue;
        }
        float *x = j->tmp + (size_t)part * KVL_EXPORT_CHUNK * row;
        kvl__kv_blocks_gather(c, l, KVL_PLANE_K, a, b, x);
        kvl__cpu_rope_apply(x, j->rcos + (size_t)(a - j->t0) * half, j->rsin + (size_t)(a - j->t0) * half,
                            b - a, c->cfg.n_kv_heads, c->cfg.head_dim, 1);
        kvl__bf16_round_n(j->k + off, x, (size_t)(b - a) * row);
    }
}

kvl_status kvl__cpu_cache_export_prenorm_bf16(void *model, const void *pc, int t0, int t1,
                                              uint16_t *k_out, uint16_t *v_out) {
    const kvl__kv_blocks *c = pc;
    const int n = t1 - t0, half = c->cfg.head_dim / 2;
    if (n <= 0) return KVL_OK;
    /* a hand-off costs more than it saves below ~256 KB of rows */
    kvl__cpu_exec ex;
    const double bytes = 2.0 * c->cfg.n_layers * n * (double)c->row * (c->bf16 ? 2 : 4);
    const int parts = model && bytes >= 262144.0 ? kvl__cpu_model_exec_take(model, &ex) : 1;
    export_job j = {.c = c, .t0 = t0, .t1 = t1, .n_chunks = (n + KVL_EXPORT_CHUNK - 1) / KVL_EXPORT_CHUNK,
                    .k = k_out, .v = v_out};
    atomic_init(&j.next, 0);
    float *mem = NULL;
    if (c->planes != 3) {
        /* the inverse tables of the whole range, as the float32 export makes them, then each
         * part's scratch */
        const size_t tab = (size_t)n * half;
        mem = malloc(sizeof(float) * (2 * tab + (size_t)parts * KVL_EXPORT_CHUNK * c->row) + sizeof(int) * (size_t)n);
        if (!mem) {
            if (parts > 1) pthread_mutex_unlock(ex.lock);
            return kvl__errorf(KVL_ERR_NOMEM, "out of memory exporting %d tokens", n);
        }
        int *pos = (int *)(mem + 2 * tab + (size_t)parts * KVL_EXPORT_CHUNK * c->row);
        for (int i = 0; i < n; i++) pos[i] = t0 + i;
        kvl__cpu_rope_table_mode(mem, mem + tab, pos, n, c->cfg.head_dim, &c->cfg.rope, KVL_ROPE_INVERSE);
        j.rcos = mem;
        j.rsin = mem + tab;
        j.tmp = mem + 2 * tab;
    }
    if (parts > 1) {
        kvl__pool_run(ex.pool, export_part, &j);
        pthread_mutex_unlock(ex.lock);
    } else {
        export_part(&j, 0, 1);
    }
    free(mem);
    return KVL_OK;
}
