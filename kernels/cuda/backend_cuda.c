/* kernels/cuda/backend_cuda.c: the CUDA backend behind kvl_backend_ops (kvlingo/backend.h), on
 * the device model and caches of cuda.h.  What the table does on a GPU:
 *   weights   bf16 on the device (q/k/v and gate/up fused), uploaded from the host view;
 *   cache     one device allocation per session, [L][planes][capacity][Hkv*D];
 *   forward   each sequence as a prefill (cuBLAS + flash-style attention) or a decode step
 *             (replayed from a CUDA graph);
 *   export    pre-norm K/V of a range read back from device memory.
 *   import    host K/V rows written into the device cache, converted to the model dtype;
 *   translate the translator's maps uploaded once per (translator, target); a host span of
 *             pre-norm K/V staged on the device and run through the fused kernel
 *             (k_norm, RoPE at absolute positions) straight into the device cache.
 * Host staging is used because the span arrives in host memory from the transport. */
#include <stdlib.h>

#include "cuda_internal.h"
#include "error.h"
#include "kvlingo/backend.h"
#include "kvlingo/cuda.h"

typedef struct cuda_model {
    kvl_cuda_model *dev;
    kvl_model_config cfg;
    size_t elem_bytes;         /* 2 (bf16) or 4 (f32) */
} cuda_model;

typedef struct cuda_cache {
    kvl_cuda_cache *dev;
    size_t bytes;
} cuda_cache;

static kvl_status cu_model_create(const kvl_weights_view *w, const kvl_model_params *p, void **out) {
    cuda_model *m = calloc(1, sizeof *m);
    if (!m) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    kvl_cuda_params cp = kvl_cuda_default_params();
    if (p) cp.device = p->device_index;
    kvl_status s = kvl_cuda_model_create(w, &cp, &m->dev);
    if (s != KVL_OK) { free(m); return s; }
    m->cfg = w->cfg;
    m->elem_bytes = cp.dtype == KVL_CUDA_F32 ? 4 : 2;
    *out = m;
    return KVL_OK;
}

static void cu_model_free(void *pm) {
    cuda_model *m = pm;
    if (!m) return;
    kvl_cuda_model_free(m->dev);
    free(m);
}

static void cu_model_set_threads(void *pm, int n) { (void)pm; (void)n; }

static kvl_status cu_cache_create(const kvl_model_config *cfg, void *pm, int capacity,
                                  int block_tokens, void **out) {
    (void)block_tokens;   /* the device cache is one allocation, not blocks */
    cuda_model *m = pm;
    if (!m) return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda cache: needs the model it serves "
                               "(kvl_model_cache_create)");
    cuda_cache *c = calloc(1, sizeof *c);
    if (!c) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    kvl_status s = kvl_cuda_cache_create(m->dev, capacity, &c->dev);
    if (s != KVL_OK) { free(c); return s; }
    c->bytes = (size_t)cfg->n_layers * (cfg->qk_norm ? 3 : 2) * (size_t)capacity *
               (size_t)cfg->n_kv_heads * cfg->head_dim * m->elem_bytes;
    *out = c;
    return KVL_OK;
}

static void cu_cache_free(void *pc) {
    cuda_cache *c = pc;
    if (!c) return;
    kvl_cuda_cache_free(c->dev);
    free(c);
}

static size_t cu_cache_bytes(const void *pc) { return ((const cuda_cache *)pc)->bytes; }

static kvl_status cu_cache_truncate(void *pc, int n_held, int n) {
    (void)n_held;
    return kvl_cuda_cache_truncate(((cuda_cache *)pc)->dev, n);
}

static kvl_status cu_cache_write(void *pc, int t0, int n, const float *k_post, const float *v,
                                 const float *k_pre) {
    return kvl__cuda_cache_write_host(((cuda_cache *)pc)->dev, t0, n, k_post, v, k_pre);
}

static kvl_status cu_cache_read(const void *pc, int layer, kvl_cache_plane plane, int t0, int t1,
                                float *out) {
    const kvl_cuda_cache *c = ((const cuda_cache *)pc)->dev;
    switch (plane) {
    case KVL_PLANE_K: return kvl_cuda_cache_read_kv(c, layer, t0, t1, out, NULL);
    case KVL_PLANE_V: return kvl_cuda_cache_read_kv(c, layer, t0, t1, NULL, out);
    case KVL_PLANE_KPRE: return kvl_cuda_cache_read_prenorm(c, layer, t0, t1, out, NULL);
    }
    return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda cache: unknown plane %d", (int)plane);
}

static kvl_status cu_cache_export_prenorm(const void *pc, int layer, int t0, int t1, float *k_out,
                                          float *v_out) {
    return kvl_cuda_cache_read_prenorm(((const cuda_cache *)pc)->dev, layer, t0, t1, k_out, v_out);
}

static kvl_status cu_forward(void *pm, const kvl_backend_seq *seqs, int n_seqs) {
    cuda_model *m = pm;
    for (int i = 0; i < n_seqs; i++) {
        const kvl_backend_seq *q = &seqs[i];
        kvl_cuda_cache *c = ((cuda_cache *)q->cache)->dev;
        if (kvl_cuda_cache_n_tokens(c) != q->n_past)
            return kvl__errorf(KVL_ERR_INTERNAL, "cuda forward: device cache holds %d tokens, the "
                               "session %d", kvl_cuda_cache_n_tokens(c), q->n_past);
        kvl_status s = q->n_tokens == 1 && q->logits_mode != KVL_LOGITS_ALL
                           ? kvl_cuda_decode(m->dev, c, q->tokens[0],
                                             q->logits_mode == KVL_LOGITS_LAST ? q->logits : NULL, NULL)
                           : kvl_cuda_prefill(m->dev, c, q->tokens, q->n_tokens, q->logits_mode,
                                              q->logits, NULL);
        if (s != KVL_OK) {
            /* sequences before i are committed on the device: roll them back (atomic call) */
            for (int j = 0; j < i; j++)
                kvl_cuda_cache_truncate(((cuda_cache *)seqs[j].cache)->dev, seqs[j].n_past);
            return s;
        }
    }
    return KVL_OK;
}

static kvl_status cu_translate_prepare(void *pm, const kvl_translate_params *p, void **out) {
    cuda_model *m = pm;
    if (!m) return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda translate: needs the target model "
                               "(a cache made by kvl_model_cache_create)");
    const kvl_kv_maps *mp = p->maps;
    /* the source geometry is the maps'; its keys arrive pre-norm, so no source RoPE is read */
    kvl_model_config src = {0};
    src.n_layers = mp->src_layers;
    src.n_kv_heads = mp->src_kv_heads;
    src.head_dim = mp->src_head_dim;
    src.rope_theta = 1e4;   /* unused: the staged keys are pre-norm and pre-RoPE already */
    src.rope = kvl_rope_default_params(src.rope_theta, src.head_dim, 0);
    src.qk_norm = 1;
    kvl_cuda_translator *tr = NULL;
    kvl_status s = kvl_cuda_translator_create(mp, &src, m->dev, &tr);
    if (s != KVL_OK) return s;
    *out = tr;
    return KVL_OK;
}

static void cu_translate_release(void *p) { kvl_cuda_translator_free(p); }

static kvl_status cu_translate_apply(void *p, const float *k_src, const float *v_src, int t0, int n,
                                     void *pc) {
    return kvl__cuda_translate_host(p, k_src, v_src, t0, n, ((cuda_cache *)pc)->dev);
}

static const kvl_backend_ops cuda_ops = {
    .name = "cuda",
    .model_create = cu_model_create,
    .model_free = cu_model_free,
    .model_set_threads = cu_model_set_threads,
    .cache_create = cu_cache_create,
    .cache_free = cu_cache_free,
    .cache_bytes = cu_cache_bytes,
    .cache_truncate = cu_cache_truncate,
    .cache_write = cu_cache_write,
    .cache_read = cu_cache_read,
    .cache_export_prenorm = cu_cache_export_prenorm,
    .forward = cu_forward,
    .translate_prepare = cu_translate_prepare,
    .translate_release = cu_translate_release,
    .translate_apply = cu_translate_apply,
};

const kvl_backend_ops *kvl_backend_cuda(void) { return &cuda_ops; }
