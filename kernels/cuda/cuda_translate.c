/* kernels/cuda/cuda_translate.c: host side of the fused translation kernel: upload of the maps,
 * checks, launch of the two passes (keys, values) and the byte count for bandwidth figures
 * (include/kvlingo/cuda.h, kvl_cuda_translate). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "error.h"

struct kvl_cuda_translator {
    kvl_cuda_model *dst;
    int device;            /* dst's GPU, kept for the free (the model may be gone)         */
    kvl_model_config src_cfg;
    int Ls, Hs, Ds, Lt, Ht, Dt;
    void *w;               /* [2][Lt][Ht*Dt][Hs*Ds] act: W_K maps, then W_V maps          */
    int32_t *layer_map;    /* [Lt] device                                                  */
    float *k_norm;         /* [Lt][Dt] f32 device, NULL when the target has no k_norm      */
    float *src_inv_freq;   /* [Ds/2] f32 device                                            */
    float src_rope_unscale;/* 1 / the source's RoPE attention factor                       */
    int n_src_used;        /* distinct source layers the map reads                         */
    void *stage;           /* [Ls][3][stage_cap][Hs*Ds] act: a host span staged for the kernel */
    int stage_cap;         /* tokens `stage` holds                                          */
};

void kvl_cuda_translator_free(kvl_cuda_translator *tr) {
    if (!tr) return;
    (void)cudaSetDevice(tr->device);
    cudaFree(tr->w);
    cudaFree(tr->layer_map);
    cudaFree(tr->k_norm);
    cudaFree(tr->src_inv_freq);
    cudaFree(tr->stage);
    free(tr);
}

kvl_status kvl_cuda_translator_create(const kvl_kv_maps *mp, const kvl_model_config *src,
                                      kvl_cuda_model *dst, kvl_cuda_translator **out) {
    if (!mp || !src || !dst || !out || !mp->wk || !mp->wv || !mp->layer_map)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_cuda_translator_create: NULL argument");
    *out = NULL;
    const kvl_model_config *t = &dst->cfg;
    if (mp->src_layers != src->n_layers || mp->src_kv_heads != src->n_kv_heads ||
        mp->src_head_dim != src->head_dim || mp->dst_layers != t->n_layers ||
        mp->dst_kv_heads != t->n_kv_heads || mp->dst_head_dim != t->head_dim)
        return kvl__errorf(KVL_ERR_MISMATCH, "cuda translator: maps are %d x %d x %d -> %d x %d x %d "
                          "(layers x kv heads x head_dim), models are %d x %d x %d -> %d x %d x %d",
                          mp->src_layers, mp->src_kv_heads, mp->src_head_dim, mp->dst_layers,
                          mp->dst_kv_heads, mp->dst_head_dim, src->n_layers, src->n_kv_heads,
                          src->head_dim, t->n_layers, t->n_kv_heads, t->head_dim);
    if (src->head_dim % 2 || src->head_dim > 1024)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda translator: source head_dim %d", src->head_dim);
    /* the source's inverse-RoPE table is computed for rope.dim and read as head_dim / 2 */
    if (src->rope.dim != src->head_dim)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda translator: source RoPE dim %d is not its "
                           "head_dim %d", src->rope.dim, src->head_dim);
    if (t->n_layers > 4096 || src->n_layers > 4096)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda translator: more than 4096 layers");
    unsigned char used[4096] = {0};
    int n_used = 0;
    for (int l = 0; l < t->n_layers; l++) {
        int sl = mp->layer_map[l];
        if (sl < 0 || sl >= src->n_layers || sl >= 4096)
            return kvl__errorf(KVL_ERR_MISMATCH, "cuda translator: layer map sends target layer %d "
                              "to source layer %d of %d", l, sl, src->n_layers);
        if (!used[sl]++) n_used++;
    }
    kvl_status us = kvl__cu_use(dst);
    if (us != KVL_OK) return us;
    kvl_cuda_translator *tr = calloc(1, sizeof *tr);
    if (!tr) return kvl__errorf(KVL_ERR_NOMEM, "cuda translator: out of memory");
    tr->dst = dst;
    tr->device = dst->prm.device;
    tr->src_cfg = *src;
    tr->Ls = src->n_layers; tr->Hs = src->n_kv_heads; tr->Ds = src->head_dim;
    tr->Lt = t->n_layers; tr->Ht = t->n_kv_heads; tr->Dt = t->head_dim;
    tr->n_src_used = n_used;
    size_t per = (size_t)tr->Lt * tr->Ht * tr->Dt * (size_t)tr->Hs * tr->Ds;
    kvl_status s = KVL_CU(cudaMalloc(&tr->w, 2 * per * dst->esz));
    if (s == KVL_OK) s = kvl__cu_upload(dst, tr->w, mp->wk, per, 0);
    if (s == KVL_OK) s = kvl__cu_upload(dst, (char *)tr->w + per * dst->esz, mp->wv, per, 0);
    if (s == KVL_OK) s = KVL_CU(cudaMalloc((void **)&tr->layer_map, sizeof(int32_t) * tr->Lt));
    if (s == KVL_OK) {
        int32_t map[4096];
        for (int l = 0; l < tr->Lt && l < 4096; l++) map[l] = mp->layer_map[l];
        s = KVL_CU(cudaMemcpy(tr->layer_map, map, sizeof(int32_t) * tr->Lt, cudaMemcpyHostToDevice));
    }
    if (s == KVL_OK && t->qk_norm) {
        s = KVL_CU(cudaMalloc((void **)&tr->k_norm, sizeof(float) * tr->Lt * tr->Dt));
        for (int l = 0; l < tr->Lt && s == KVL_OK; l++)
            s = KVL_CU(cudaMemcpy(tr->k_norm + (size_t)l * tr->Dt, dst->layers[l].k_norm,
                                  sizeof(float) * tr->Dt, cudaMemcpyDeviceToDevice));
    }
    if (s == KVL_OK) {
        /* the source's RoPE table, float32 as the CPU path, for the inverse rotation */
        float inv[512], attn;
        if (src->rope.type == KVL_ROPE_DYNAMIC)
            s = kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda translator: 'dynamic' RoPE scaling of the "
                           "source is not supported (use the CPU backend)");
        int half = tr->Ds / 2;
        kvl_rope_inv_freq(&src->rope, 0, inv, &attn);
        tr->src_rope_unscale = 1.0f / attn;
        if (s == KVL_OK) s = KVL_CU(cudaMalloc((void **)&tr->src_inv_freq, sizeof(float) * half));
        if (s == KVL_OK)
            s = KVL_CU(cudaMemcpy(tr->src_inv_freq, inv, sizeof(float) * half, cudaMemcpyHostToDevice));
    }
    /* the copies ran on the legacy default stream, which does not order the target model's
     * non-blocking stream: finish them before any translate kernel can read the maps */
    if (s == KVL_OK) s = KVL_CU(cudaDeviceSynchronize());
    if (s != KVL_OK) { kvl_cuda_translator_free(tr); return s; }
    *out = tr;
    return KVL_OK;
}

kvl_status kvl_cuda_translate(kvl_cuda_translator *tr, const kvl_cuda_cache *src, int t0, int t1,
                              kvl_cuda_cache *dst, size_t *bytes_out) {
    if (!tr || !src || !dst) return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda translate: NULL argument");
    const kvl_model_config *sc = &src->model->cfg;
    if (sc->n_layers != tr->Ls || sc->n_kv_heads != tr->Hs || sc->head_dim != tr->Ds ||
        sc->qk_norm != tr->src_cfg.qk_norm)
        return kvl__errorf(KVL_ERR_MISMATCH, "cuda translate: source cache geometry is not the translator's");
    if (dst->model != tr->dst)
        return kvl__errorf(KVL_ERR_MISMATCH, "cuda translate: target cache belongs to another model");
    if (src->model->dt != tr->dst->dt)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda translate: source and target dtypes differ");
    if (t0 < 0 || t1 < t0 || t1 > src->n_tokens)
        return kvl__errorf(KVL_ERR_RANGE, "cuda translate: span [%d, %d) outside the source's %d tokens",
                          t0, t1, src->n_tokens);
    if (dst->n_tokens != t0)
        return kvl__errorf(KVL_ERR_RANGE, "cuda translate: target holds %d tokens, span starts at %d",
                          dst->n_tokens, t0);
    if (t1 > dst->capacity)
        return kvl__errorf(KVL_ERR_RANGE, "cuda translate: %d tokens exceed the target capacity %d",
                          t1, dst->capacity);
    kvl_cuda_model *m = tr->dst;
    if (src->model->prm.device != m->prm.device)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda translate: source cache on GPU %d, target on "
                           "GPU %d (one device only)", src->model->prm.device, m->prm.device);
    kvl_status us = kvl__cu_use(m);
    if (us != KVL_OK) return us;
    /* the source rows were written on the source model's stream */
    if (src->model->stream != m->stream) KVL_CU_TRY(cudaStreamSynchronize(src->model->stream));
    const int n = t1 - t0;
    size_t per = (size_t)tr->Lt * tr->Ht * tr->Dt * (size_t)tr->Hs * tr->Ds;
    kvl__cu_translate_args a = {
        .dt = m->dt, .n = n, .t0 = t0,
        .src_base = src->base, .src_planes = src->planes, .src_cap = src->capacity,
        .src_row0 = 0, .Hs = tr->Hs, .Ds = tr->Ds, .src_unrope = !sc->qk_norm, .src_inv_freq = tr->src_inv_freq,
        .src_rope_unscale = tr->src_rope_unscale,
        .layer_map = tr->layer_map,
        .dst_base = dst->base, .dst_planes = dst->planes, .dst_cap = dst->capacity,
        .Lt = tr->Lt, .Ht = tr->Ht, .Dt = tr->Dt, .k_norm = tr->k_norm,
        .eps = m->cfg.rms_norm_eps, .dst_inv_freq = m->inv_freq,
        .dst_rope_scale = m->rope_scale,
    };
    for (int side = 0; side < 2 && n > 0; side++) {
        a.side = side;
        a.w = (const char *)tr->w + (side ? per * m->esz : 0);
        int rc = kvl__cu_translate(m->stream, &a);
        if (rc != 0)
            return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda translate: unsupported shape (%d x %d -> %d x %d) "
                              "or shared-memory opt-in failed", tr->Hs, tr->Ds, tr->Ht, tr->Dt);
        KVL_CU_LAUNCHED();
    }
    memcpy(dst->ids + t0, src->ids + t0, sizeof(int32_t) * (size_t)n);
    dst->n_tokens = t1;
    if (bytes_out) {
        size_t ks = (size_t)tr->Hs * tr->Ds, kt = (size_t)tr->Ht * tr->Dt;
        size_t rd = 2 * (size_t)tr->n_src_used * n * ks * m->esz + 2 * per * m->esz;
        size_t wr = (size_t)tr->Lt * n * kt * m->esz * (size_t)dst->planes;
        *bytes_out = rd + wr;
    }
    return KVL_OK;
}

kvl_status kvl__cuda_translate_host(kvl_cuda_translator *tr, const float *k_src, const float *v_src,
                                    int t0, int n, kvl_cuda_cache *dst) {
    if (!tr || !dst || n < 0 || (n > 0 && (!k_src || !v_src)))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda translate (host span): bad arguments");
    if (dst->model != tr->dst)
        return kvl__errorf(KVL_ERR_MISMATCH, "cuda translate: target cache belongs to another model");
    if (dst->n_tokens != t0)
        return kvl__errorf(KVL_ERR_RANGE, "cuda translate: target holds %d tokens, span starts at %d",
                           dst->n_tokens, t0);
    if (t0 + n > dst->capacity)
        return kvl__errorf(KVL_ERR_RANGE, "cuda translate: %d tokens exceed the target capacity %d",
                           t0 + n, dst->capacity);
    if (n == 0) return KVL_OK;
    kvl_cuda_model *m = tr->dst;
    kvl_status us = kvl__cu_use(m);
    if (us != KVL_OK) return us;
    const size_t ks = (size_t)tr->Hs * tr->Ds;
    if (n > tr->stage_cap) {
        /* the staging area is the kernel's source "cache" of 3 planes (K unused, V, Kpre) */
        int cap = n > 2 * tr->stage_cap ? n : 2 * tr->stage_cap;
        void *nb = NULL;
        KVL_CU_TRY(cudaStreamSynchronize(m->stream));   /* no launch still reads the old one */
        KVL_CU_TRY(cudaMalloc(&nb, (size_t)tr->Ls * 3 * (size_t)cap * ks * m->esz));
        cudaFree(tr->stage);
        tr->stage = nb;
        tr->stage_cap = cap;
    } else {
        KVL_CU_TRY(cudaStreamSynchronize(m->stream));   /* the previous span may still be read */
    }
    for (int l = 0; l < tr->Ls; l++) {
        char *layer = (char *)tr->stage + (size_t)l * 3 * tr->stage_cap * ks * m->esz;
        kvl_status s = kvl__cu_upload(m, layer + (size_t)2 * tr->stage_cap * ks * m->esz,
                                      k_src + (size_t)l * n * ks, (size_t)n * ks, 0);
        if (s == KVL_OK)
            s = kvl__cu_upload(m, layer + (size_t)tr->stage_cap * ks * m->esz,
                               v_src + (size_t)l * n * ks, (size_t)n * ks, 0);
        if (s != KVL_OK) return s;
    }
    size_t per = (size_t)tr->Lt * tr->Ht * tr->Dt * ks;
    kvl__cu_translate_args a = {
        .dt = m->dt, .n = n, .t0 = t0,
        .src_base = tr->stage, .src_planes = 3, .src_cap = tr->stage_cap, .src_row0 = t0,
        .Hs = tr->Hs, .Ds = tr->Ds, .src_unrope = 0, .src_inv_freq = tr->src_inv_freq,
        .src_rope_unscale = 1.0f,
        .layer_map = tr->layer_map,
        .dst_base = dst->base, .dst_planes = dst->planes, .dst_cap = dst->capacity,
        .Lt = tr->Lt, .Ht = tr->Ht, .Dt = tr->Dt, .k_norm = tr->k_norm,
        .eps = m->cfg.rms_norm_eps, .dst_inv_freq = m->inv_freq, .dst_rope_scale = m->rope_scale,
    };
    for (int side = 0; side < 2; side++) {
        a.side = side;
        a.w = (const char *)tr->w + (side ? per * m->esz : 0);
        if (kvl__cu_translate(m->stream, &a) != 0)
            return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda translate: unsupported shape (%d x %d -> %d x %d) "
                               "or shared-memory opt-in failed", tr->Hs, tr->Ds, tr->Ht, tr->Dt);
        KVL_CU_LAUNCHED();
    }
    KVL_CU_TRY(cudaStreamSynchronize(m->stream));   /* the import is complete when this returns */
    for (int i = 0; i < n; i++) dst->ids[t0 + i] = -1;
    dst->n_tokens = t0 + n;
    return KVL_OK;
}
