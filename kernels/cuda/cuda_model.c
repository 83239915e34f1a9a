/* kernels/cuda/cuda_model.c: the CUDA backend's host side: device model (weights, activations,
 * cuBLAS), device KV caches, prefill / decode (decode captured in a CUDA graph) and span export
 * (include/kvlingo/cuda.h).  Host code is C11 against the CUDA runtime and cuBLAS C APIs; the
 * kernels it launches live in the .cu files beside it (cuda_internal.h). */
#include "cuda_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "error.h"
#include "kvlingo/backend.h"

/* ---- status conversion ------------------------------------------------------------------- */

kvl_status kvl__cuda_status(cudaError_t e, const char *call, const char *file, int line) {
    if (e == cudaSuccess) return KVL_OK;
    return kvl__errorf(e == cudaErrorMemoryAllocation ? KVL_ERR_NOMEM : KVL_ERR_DEVICE,
                      "%s:%d: %s: %s (%s)", file, line, call, cudaGetErrorString(e), cudaGetErrorName(e));
}

kvl_status kvl__cublas_status(cublasStatus_t e, const char *call, const char *file, int line) {
    if (e == CUBLAS_STATUS_SUCCESS) return KVL_OK;
    return kvl__errorf(e == CUBLAS_STATUS_ALLOC_FAILED ? KVL_ERR_NOMEM : KVL_ERR_DEVICE,
                      "%s:%d: %s: cuBLAS status %d (%s)", file, line, call, (int)e,
                      cublasGetStatusString(e));
}

int kvl_cuda_built(void) { return 1; }

kvl_status kvl_cuda_probe(int *n_devices) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (n_devices) *n_devices = e == cudaSuccess ? n : 0;
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
        /* the runtime says "insufficient driver" also where no NVIDIA driver is loaded at all */
        return kvl__errorf(KVL_ERR_DEVICE, "no usable CUDA device: this machine has no NVIDIA GPU, or "
                           "no NVIDIA driver for this CUDA %d.%d runtime is loaded (%s: %s)",
                           CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, cudaGetErrorName(e),
                           cudaGetErrorString(e));
    if (e != cudaSuccess)
        return kvl__errorf(KVL_ERR_DEVICE, "no usable CUDA device: cudaGetDeviceCount: %s (%s)",
                          cudaGetErrorString(e), cudaGetErrorName(e));
    if (n < 1) return kvl__errorf(KVL_ERR_DEVICE, "no CUDA device found (cudaGetDeviceCount = 0)");
    return KVL_OK;
}

kvl_status kvl_cuda_device_name(char *buf, size_t cap, int *sm_count) {
    if (buf && cap) buf[0] = '\0';
    kvl_status s = kvl_cuda_probe(NULL);
    if (s != KVL_OK) return s;
    struct cudaDeviceProp p;
    KVL_CU_TRY(cudaGetDeviceProperties(&p, 0));
    if (buf && cap) snprintf(buf, cap, "%s", p.name);
    if (sm_count) *sm_count = p.multiProcessorCount;
    return KVL_OK;
}

kvl_cuda_params kvl_cuda_default_params(void) {
    kvl_cuda_params p = {.device = 0, .dtype = KVL_CUDA_BF16, .use_graph = 1};
    return p;
}

/* ---- host conversion ---------------------------------------------------------------------- */

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);   /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One host-to-device copy on the model's stream, complete when this returns.  A plain
 * cudaMemcpy from pageable memory may return before its DMA lands, and it runs on the legacy
 * default stream, which the model's non-blocking stream does not wait for: a forward or a
 * translate kernel queued next could read the rows before they arrive.  On the model's stream
 * the copy also waits for work already queued there that may still read `dst`. */
static kvl_status upload_sync(kvl_cuda_model *m, void *dst, const void *src, size_t bytes) {
    KVL_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, m->stream));
    KVL_CU_TRY(cudaStreamSynchronize(m->stream));   /* and the host buffer is free again */
    return KVL_OK;
}

/* Copy n host floats to device memory of the model's dtype (bf16: converted in chunks). */
kvl_status kvl__cu_upload(kvl_cuda_model *m, void *dst, const float *src, size_t n, int as_f32) {
    if (as_f32 || m->dt == 1) return upload_sync(m, dst, src, n * sizeof(float));
    enum { CHUNK = 1 << 20 };
    uint16_t *buf = malloc(sizeof(uint16_t) * CHUNK);
    if (!buf) return kvl__errorf(KVL_ERR_NOMEM, "cuda: out of host memory converting weights");
    kvl_status s = KVL_OK;
    for (size_t o = 0; o < n && s == KVL_OK; o += CHUNK) {
        size_t c = n - o < CHUNK ? n - o : CHUNK;
        for (size_t i = 0; i < c; i++) buf[i] = f32_to_bf16(src[o + i]);
        s = upload_sync(m, (uint16_t *)dst + o, buf, c * 2);
    }
    free(buf);
    return s;
}

/* ---- model layout --------------------------------------------------------------------------- */

static kvl_status check_geometry(const kvl_model_config *c) {
    if (c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 128)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda: head_dim %d not supported (32, 64 or 128)", c->head_dim);
    /* the device table is kvl_rope_inv_freq's rope.dim / 2 entries copied as head_dim / 2: a
     * config whose rope was left unset (dim 0) would upload uninitialised frequencies, one
     * with a larger dim would overrun model_alloc's table (as the CPU's kvl_model_create_random) */
    if (c->rope.dim != c->head_dim)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda: RoPE dim %d is not head_dim %d (fill "
                          "kvl_model_config.rope, e.g. kvl_rope_default_params)", c->rope.dim, c->head_dim);
    if (c->rope.type == KVL_ROPE_DYNAMIC)   /* one inv_freq table per model, uploaded once */
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda: 'dynamic' RoPE scaling is not supported (its "
                          "frequencies depend on the sequence length; use the CPU backend)");
    if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > 8)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda: GQA group %d/%d not supported (at most 8 query "
                          "heads per kv head)", c->n_heads, c->n_kv_heads);
    if (c->hidden_size < 1 || c->n_layers < 1 || c->vocab_size < 1 || c->intermediate_size < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda: bad model geometry");
    return KVL_OK;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static kvl_status acts_alloc(kvl_cuda_model *m, kvl__cu_acts *a, int T, int nsplit) {
    const kvl_model_config *c = &m->cfg;
    size_t H = c->hidden_size, D = c->head_dim, QD = (size_t)c->n_heads * D;
    size_t KD = (size_t)c->n_kv_heads * D, F = c->intermediate_size, e = m->esz;
    size_t sizes[] = {T * H * 4, T * H * e, T * (QD + 2 * KD) * 4, T * QD * e, T * QD * e,
                      T * 2 * F * 4, T * F * e,
                      kvl__cu_attention_part_floats(T, c->n_heads, (int)D, nsplit) * 4, (size_t)T * 4};
    void **dst[] = {(void **)&a->x, &a->xn, (void **)&a->qkv, &a->q, &a->att, (void **)&a->gu,
                    &a->act, (void **)&a->part, (void **)&a->tok};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += align_up(sizes[i], 256);
    if (a->base) { KVL_CU_TRY(cudaFree(a->base)); a->base = NULL; a->cap_T = 0; }
    KVL_CU_TRY(cudaMalloc(&a->base, total));
    char *cur = a->base;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *dst[i] = cur;
        cur += align_up(sizes[i], 256);
    }
    a->cap_T = T;
    a->part_splits = nsplit;
    return KVL_OK;
}

/* Allocate weights (uninitialised), stream, cuBLAS, decode buffers; point the layer table. */
static kvl_status model_alloc(const kvl_model_config *cfg, const kvl_cuda_params *prm,
                              kvl_cuda_model **out) {
    kvl_status s = check_geometry(cfg);
    if (s != KVL_OK) return s;
    if ((s = kvl_cuda_probe(NULL)) != KVL_OK) return s;
    kvl_cuda_model *m = calloc(1, sizeof *m);
    if (!m) return kvl__errorf(KVL_ERR_NOMEM, "cuda: out of memory");
    m->cfg = *cfg;
    m->prm = prm ? *prm : kvl_cuda_default_params();
    m->dt = m->prm.dtype == KVL_CUDA_F32 ? 1 : 0;
    m->esz = m->dt ? 4 : 2;
    *out = m;   /* the caller frees on error */
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers) return kvl__errorf(KVL_ERR_NOMEM, "cuda: out of memory");
    KVL_CU_TRY(cudaSetDevice(m->prm.device));
    int sm = 0;
    KVL_CU_TRY(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, m->prm.device));
    m->sm_count = sm;
    KVL_CU_TRY(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    KVL_CUBLAS_TRY(cublasCreate(&m->blas));
    KVL_CUBLAS_TRY(cublasSetStream(m->blas, m->stream));
    /* float32 products stay float32 (no TF32) so --dtype f32 matches the CPU to 1e-4 */
    KVL_CUBLAS_TRY(cublasSetMathMode(m->blas, CUBLAS_DEFAULT_MATH));
    /* an explicit workspace: cuBLAS must not allocate while a decode graph is captured */
    size_t ws = (size_t)32 << 20;
    KVL_CU_TRY(cudaMalloc(&m->blas_ws, ws));
    KVL_CUBLAS_TRY(cublasSetWorkspace(m->blas, m->blas_ws, ws));

    const kvl_model_config *c = cfg;
    size_t H = c->hidden_size, D = c->head_dim, QD = (size_t)c->n_heads * D;
    size_t KD = (size_t)c->n_kv_heads * D, F = c->intermediate_size, V = c->vocab_size;
    size_t per_layer = (QD + 2 * KD) * H + H * QD + 2 * F * H + H * F;
    size_t n_w = V * H * (c->tie_word_embeddings ? 1 : 2) + per_layer * c->n_layers;
    size_t f_layer = 2 * H + (c->qkv_bias ? QD + 2 * KD : 0) + (c->qk_norm ? 2 * D : 0) + (c->o_bias ? H : 0);
    size_t n_f = H + D / 2 + f_layer * c->n_layers;
    KVL_CU_TRY(cudaMalloc(&m->wbase, n_w * m->esz));
    KVL_CU_TRY(cudaMalloc((void **)&m->fbase, n_f * sizeof(float)));
    m->weight_bytes = n_w * m->esz + n_f * sizeof(float);
    char *w = m->wbase;
    float *f = m->fbase;
#define TAKE_W(n) (w += (n) * m->esz, (void *)(w - (n) * m->esz))
#define TAKE_F(n) (f += (n), f - (n))
    m->embed = TAKE_W(V * H);
    m->lm_head = c->tie_word_embeddings ? m->embed : TAKE_W(V * H);
    m->final_norm = TAKE_F(H);
    m->inv_freq = TAKE_F(D / 2);
    for (int l = 0; l < c->n_layers; l++) {
        kvl__cu_layer *L = &m->layers[l];
        L->wqkv = TAKE_W((QD + 2 * KD) * H);
        L->wo = TAKE_W(H * QD);
        L->wgu = TAKE_W(2 * F * H);
        L->wdown = TAKE_W(H * F);
        L->attn_norm = TAKE_F(H);
        L->mlp_norm = TAKE_F(H);
        if (c->qkv_bias) L->bqkv = TAKE_F(QD + 2 * KD);
        if (c->qk_norm) { L->q_norm = TAKE_F(D); L->k_norm = TAKE_F(D); }
        if (c->o_bias) L->bo = TAKE_F(H);
    }
#undef TAKE_W
#undef TAKE_F
    /* RoPE table exactly as the CPU path (kvl__cpu_rope_angles): kvl_rope_inv_freq in float32 */
    float inv[512];
    kvl_rope_inv_freq(&c->rope, 0, inv, &m->rope_scale);
    KVL_CU_TRY(cudaMemcpy(m->inv_freq, inv, D / 2 * sizeof(float), cudaMemcpyHostToDevice));

    m->dec_splits = 2 * m->sm_count / c->n_kv_heads;
    if (m->dec_splits < 1) m->dec_splits = 1;
    if (m->dec_splits > 256) m->dec_splits = 256;
    if ((s = acts_alloc(m, &m->dec, 1, m->dec_splits)) != KVL_OK) return s;
    KVL_CU_TRY(cudaMalloc((void **)&m->dec_logits, V * sizeof(float)));
    KVL_CU_TRY(cudaMalloc((void **)&m->d_argmax, 4 * sizeof(int32_t)));
    KVL_CU_TRY(cudaMallocHost((void **)&m->h_pinned, 4 * sizeof(int32_t)));
    return KVL_OK;
}

void kvl_cuda_model_free(kvl_cuda_model *m) {
    if (!m) return;
    (void)cudaSetDevice(m->prm.device);   /* best effort: a free reports nothing */
    if (m->stream) cudaStreamSynchronize(m->stream);
    if (m->blas) cublasDestroy(m->blas);
    cudaFree(m->blas_ws);
    cudaFree(m->wbase);
    cudaFree(m->fbase);
    cudaFree(m->pre.base);
    cudaFree(m->dec.base);
    cudaFree(m->logits);
    cudaFree(m->dec_logits);
    cudaFree(m->logit_x);
    cudaFree(m->d_argmax);
    if (m->h_pinned) cudaFreeHost(m->h_pinned);
    if (m->stream) cudaStreamDestroy(m->stream);
    free(m->layers);
    free(m);
}

kvl_status kvl_cuda_model_create(const kvl_weights_view *host, const kvl_cuda_params *params,
                                 kvl_cuda_model **out) {
    if (!host || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_cuda_model_create: NULL argument");
    *out = NULL;
    kvl_cuda_model *m = NULL;
    kvl_status s = model_alloc(&host->cfg, params, &m);
    const kvl_model_config *c = &host->cfg;
    size_t H = c->hidden_size, D = c->head_dim, QD = (size_t)c->n_heads * D;
    size_t KD = (size_t)c->n_kv_heads * D, F = c->intermediate_size, V = c->vocab_size;
    if (s == KVL_OK) s = kvl__cu_upload(m, m->embed, host->embed, V * H, 0);
    if (s == KVL_OK && !c->tie_word_embeddings) s = kvl__cu_upload(m, m->lm_head, host->lm_head, V * H, 0);
    if (s == KVL_OK) s = kvl__cu_upload(m, m->final_norm, host->final_norm, H, 1);
    for (int l = 0; l < c->n_layers && s == KVL_OK; l++) {
        const kvl_layer_view *hw = &host->layers[l];
        kvl__cu_layer *L = &m->layers[l];
        char *qkv = L->wqkv;
        if ((s = kvl__cu_upload(m, qkv, hw->wq, QD * H, 0)) != KVL_OK) break;
        if ((s = kvl__cu_upload(m, qkv + QD * H * m->esz, hw->wk, KD * H, 0)) != KVL_OK) break;
        if ((s = kvl__cu_upload(m, qkv + (QD + KD) * H * m->esz, hw->wv, KD * H, 0)) != KVL_OK) break;
        if ((s = kvl__cu_upload(m, L->wo, hw->wo, H * QD, 0)) != KVL_OK) break;
        if ((s = kvl__cu_upload(m, L->wgu, hw->w_gate, F * H, 0)) != KVL_OK) break;
        if ((s = kvl__cu_upload(m, (char *)L->wgu + F * H * m->esz, hw->w_up, F * H, 0)) != KVL_OK) break;
        if ((s = kvl__cu_upload(m, L->wdown, hw->w_down, H * F, 0)) != KVL_OK) break;
        if ((s = kvl__cu_upload(m, L->attn_norm, hw->attn_norm, H, 1)) != KVL_OK) break;
        if ((s = kvl__cu_upload(m, L->mlp_norm, hw->mlp_norm, H, 1)) != KVL_OK) break;
        if (c->qkv_bias) {
            if ((s = kvl__cu_upload(m, L->bqkv, hw->bq, QD, 1)) != KVL_OK) break;
            if ((s = kvl__cu_upload(m, L->bqkv + QD, hw->bk, KD, 1)) != KVL_OK) break;
            if ((s = kvl__cu_upload(m, L->bqkv + QD + KD, hw->bv, KD, 1)) != KVL_OK) break;
        }
        if (c->qk_norm) {
            if ((s = kvl__cu_upload(m, L->q_norm, hw->q_norm, D, 1)) != KVL_OK) break;
            if ((s = kvl__cu_upload(m, L->k_norm, hw->k_norm, D, 1)) != KVL_OK) break;
        }
        if (c->o_bias && (s = kvl__cu_upload(m, L->bo, hw->bo, H, 1)) != KVL_OK) break;
    }
    /* every upload waited on the model's stream (kvl__cu_upload); this also waits for any other
     * device work the loading queued, before the model is handed out */
    if (s == KVL_OK) s = KVL_CU(cudaDeviceSynchronize());
    if (s != KVL_OK) { kvl_cuda_model_free(m); return s; }
    *out = m;
    return KVL_OK;
}

kvl_status kvl_cuda_model_create_random(const kvl_model_config *cfg, uint64_t seed,
                                        const kvl_cuda_params *params, kvl_cuda_model **out) {
    if (!cfg || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_cuda_model_create_random: NULL argument");
    *out = NULL;
    kvl_cuda_model *m = NULL;
    kvl_status s = model_alloc(cfg, params, &m);
    if (s == KVL_OK) {
        /* every act-dtype weight is one random stream; norms 1, biases 0 (set below) */
        const kvl_model_config *c = cfg;
        size_t H = c->hidden_size, D = c->head_dim, QD = (size_t)c->n_heads * D;
        size_t KD = (size_t)c->n_kv_heads * D, F = c->intermediate_size, V = c->vocab_size;
        size_t n_w = V * H * (c->tie_word_embeddings ? 1 : 2) +
              ((QD + 2 * KD) * H + H * QD + 2 * F * H + H * F) * c->n_layers;
        kvl__cu_fill_random(m->stream, m->dt, m->wbase, n_w, seed, 0.02f);
        s = KVL_CU(cudaGetLastError());
        for (int l = 0; l < c->n_layers && s == KVL_OK; l++) {
            kvl__cu_layer *L = &m->layers[l];
            kvl__cu_fill_f32(m->stream, L->attn_norm, H, 1.0f);
            kvl__cu_fill_f32(m->stream, L->mlp_norm, H, 1.0f);
            if (L->bqkv) kvl__cu_fill_f32(m->stream, L->bqkv, QD + 2 * KD, 0.0f);
            if (L->q_norm) kvl__cu_fill_f32(m->stream, L->q_norm, D, 1.0f);
            if (L->k_norm) kvl__cu_fill_f32(m->stream, L->k_norm, D, 1.0f);
            if (L->bo) kvl__cu_fill_f32(m->stream, L->bo, H, 0.0f);
            s = KVL_CU(cudaGetLastError());
        }
        if (s == KVL_OK) kvl__cu_fill_f32(m->stream, m->final_norm, H, 1.0f);
        if (s == KVL_OK) s = KVL_CU(cudaGetLastError());
        if (s == KVL_OK) s = KVL_CU(cudaDeviceSynchronize());   /* and the RoPE table upload */
    }
    if (s != KVL_OK) { kvl_cuda_model_free(m); return s; }
    *out = m;
    return KVL_OK;
}

const kvl_model_config *kvl_cuda_model_config(const kvl_cuda_model *m) { return &m->cfg; }
size_t kvl_cuda_model_weight_bytes(const kvl_cuda_model *m) { return m->weight_bytes; }

kvl_status kvl_cuda_synchronize(kvl_cuda_model *m) {
    kvl_status s = kvl__cu_use(m);
    if (s != KVL_OK) return s;
    KVL_CU_TRY(cudaStreamSynchronize(m->stream));
    return KVL_OK;
}

/* ---- caches --------------------------------------------------------------------------------- */

kvl_status kvl_cuda_cache_create(kvl_cuda_model *m, int max_tokens, kvl_cuda_cache **out) {
    if (!m || !out || max_tokens < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_cuda_cache_create: NULL model or max_tokens %d < 1", max_tokens);
    *out = NULL;
    kvl_status s = kvl__cu_use(m);
    if (s != KVL_OK) return s;
    kvl_cuda_cache *c = calloc(1, sizeof *c);
    if (!c) return kvl__errorf(KVL_ERR_NOMEM, "cuda: out of memory");
    c->model = m;
    c->device = m->prm.device;
    c->capacity = max_tokens;
    c->planes = m->cfg.qk_norm ? 3 : 2;
    c->kd = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim;
    c->ids = malloc(sizeof(int32_t) * (size_t)max_tokens);
    s = c->ids ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "cuda: out of memory for %d token ids", max_tokens);
    size_t bytes = (size_t)m->cfg.n_layers * c->planes * (size_t)max_tokens * c->kd * m->esz;
    if (s == KVL_OK) s = KVL_CU(cudaMalloc(&c->base, bytes));
    if (s == KVL_OK) s = KVL_CU(cudaMalloc((void **)&c->d_pos, 2 * sizeof(int32_t)));
    if (s != KVL_OK) {
        kvl__error_prefix(s, "cuda cache");
        kvl_cuda_cache_free(c);
        return s;
    }
    *out = c;
    return KVL_OK;
}

void kvl_cuda_cache_free(kvl_cuda_cache *c) {
    if (!c) return;
    (void)cudaSetDevice(c->device);
    if (c->graph_exec) cudaGraphExecDestroy(c->graph_exec);
    if (c->graph) cudaGraphDestroy(c->graph);
    cudaFree(c->base);
    cudaFree(c->d_pos);
    free(c->ids);
    free(c);
}

int kvl_cuda_cache_n_tokens(const kvl_cuda_cache *c) { return c->n_tokens; }
int kvl_cuda_cache_capacity(const kvl_cuda_cache *c) { return c->capacity; }

kvl_status kvl__cuda_cache_write_host(kvl_cuda_cache *c, int t0, int n, const float *k_post,
                                      const float *v, const float *k_pre) {
    if (!c || n < 0 || (n > 0 && (!k_post || !v || (c->planes == 3 && !k_pre))))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda cache write: bad arguments (n=%d)", n);
    if (t0 != c->n_tokens || t0 + n > c->capacity)
        return kvl__errorf(KVL_ERR_RANGE, "cuda cache write: rows [%d, %d) but the cache holds %d of "
                           "%d tokens", t0, t0 + n, c->n_tokens, c->capacity);
    kvl_status us = kvl__cu_use(c->model);
    if (us != KVL_OK) return us;
    const int L = c->model->cfg.n_layers;
    const size_t esz = c->model->esz;
    /* kvl__cu_upload copies on the model's stream and waits: the rows are in place before the
     * next forward reads them */
    for (int l = 0; l < L; l++) {
        const float *src[3] = {k_post + (size_t)l * n * c->kd, v + (size_t)l * n * c->kd,
                               k_pre ? k_pre + (size_t)l * n * c->kd : NULL};
        for (int p = 0; p < c->planes; p++) {
            char *dst = (char *)kvl__cu_plane(c, l, p) + (size_t)t0 * c->kd * esz;
            kvl_status s = kvl__cu_upload(c->model, dst, src[p], (size_t)n * c->kd, 0);
            if (s != KVL_OK) return s;
        }
    }
    for (int i = 0; i < n; i++) c->ids[t0 + i] = -1;
    c->n_tokens = t0 + n;
    return KVL_OK;
}

kvl_status kvl_cuda_cache_truncate(kvl_cuda_cache *c, int n) {
    if (n < 0 || n > c->n_tokens)
        return kvl__errorf(KVL_ERR_RANGE, "cuda cache truncate: %d outside [0, %d]", n, c->n_tokens);
    c->n_tokens = n;
    return KVL_OK;
}

/* ---- forward ------------------------------------------------------------------------------ */

static kvl_status gemm(kvl_cuda_model *m, const void *W, const void *X, float *Y, int T, int K,
                       int N, float beta) {
    /* row-major Y[T,N] (+)= X[T,K] W[N,K]^T  ==  column-major Y^T = W^T(op T) X^T */
    const float alpha = 1.0f;
    cudaDataType_t t = m->dt ? CUDA_R_32F : CUDA_R_16BF;
    KVL_CUBLAS_TRY(cublasGemmEx(m->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, t, K, X, t,
                                K, &beta, Y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return KVL_OK;
}

/* All decoder layers for the T tokens in a->tok (prefill: positions p0 + t; decode: T = 1 at
 * position *d_pos, d_pos != NULL).  Leaves the final residual stream in a->x. */
static kvl_status run_layers(kvl_cuda_model *m, kvl__cu_acts *a, kvl_cuda_cache *c, int T, int p0,
                             const int32_t *d_tok, const int32_t *d_pos) {
    const kvl_model_config *cf = &m->cfg;
    const int H = cf->hidden_size, D = cf->head_dim, Hq = cf->n_heads, Hkv = cf->n_kv_heads;
    const int QD = Hq * D, KD = Hkv * D, F = cf->intermediate_size;
    kvl_status s;
    cudaStream_t st = m->stream;
    kvl__cu_embed(st, m->dt, a->x, m->embed, d_tok, T, H);
    KVL_CU_LAUNCHED();
    for (int l = 0; l < cf->n_layers; l++) {
        const kvl__cu_layer *L = &m->layers[l];
        void *kp = kvl__cu_plane(c, l, 0), *vp = kvl__cu_plane(c, l, 1);
        void *pp = c->planes > 2 ? kvl__cu_plane(c, l, 2) : NULL;
        kvl__cu_rmsnorm(st, m->dt, a->xn, a->x, (size_t)H, L->attn_norm, T, H, cf->rms_norm_eps);
        if ((s = gemm(m, L->wqkv, a->xn, a->qkv, T, H, QD + 2 * KD, 0.0f)) != KVL_OK) return s;
        kvl__cu_qkv_post(st, m->dt, a->qkv, L->bqkv, L->q_norm, L->k_norm, p0, d_pos, T, Hq, Hkv, D,
                        m->inv_freq, m->rope_scale, cf->rms_norm_eps, a->q, kp, vp, pp);
        int rc = d_pos ? kvl__cu_attention_decode(st, m->dt, a->att, a->q, kp, vp, a->part, d_pos,
                                                 a->part_splits, Hq, Hkv, D)
                       : kvl__cu_attention_prefill(st, m->dt, a->att, a->q, kp, vp, a->part, T, p0,
                                                  Hq, Hkv, D);
        if (rc != 0) return kvl__errorf(KVL_ERR_UNSUPPORTED, "cuda attention: unsupported shape "
                                       "(Hq %d, Hkv %d, D %d) or shared-memory opt-in failed", Hq, Hkv, D);
        KVL_CU_LAUNCHED();
        if ((s = gemm(m, L->wo, a->att, a->x, T, QD, H, 1.0f)) != KVL_OK) return s;   /* x += o_proj */
        if (L->bo) kvl__cu_add_bias(st, a->x, L->bo, T, H);
        kvl__cu_rmsnorm(st, m->dt, a->xn, a->x, (size_t)H, L->mlp_norm, T, H, cf->rms_norm_eps);
        if ((s = gemm(m, L->wgu, a->xn, a->gu, T, H, 2 * F, 0.0f)) != KVL_OK) return s;
        kvl__cu_swiglu(st, m->dt, a->act, a->gu, T, F);
        if ((s = gemm(m, L->wdown, a->act, a->x, T, F, H, 1.0f)) != KVL_OK) return s;   /* x += mlp */
        KVL_CU_LAUNCHED();
    }
    return KVL_OK;
}

static kvl_status check_tokens(const kvl_cuda_model *m, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda: token %d has id %d outside the vocabulary "
                              "[0, %d)", i, tokens[i], m->cfg.vocab_size);
    return KVL_OK;
}

kvl_status kvl_cuda_prefill(kvl_cuda_model *m, kvl_cuda_cache *c, const int32_t *tokens, int n,
                            kvl_logits_mode mode, float *logits, int32_t *argmax_out) {
    if (!m || !c || !tokens || n < 1) return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda prefill: no tokens");
    if (c->model != m) return kvl__errorf(KVL_ERR_MISMATCH, "cuda prefill: cache belongs to another model");
    if (mode != KVL_LOGITS_NONE && !logits)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda prefill: logits asked for but no buffer");
    if (c->n_tokens + n > c->capacity)
        return kvl__errorf(KVL_ERR_RANGE, "cuda prefill: %d tokens exceed the cache capacity %d",
                          c->n_tokens + n, c->capacity);
    kvl_status s = check_tokens(m, tokens, n);
    if (s == KVL_OK) s = kvl__cu_use(m);
    if (s != KVL_OK) return s;
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    if (m->pre.cap_T < n && (s = acts_alloc(m, &m->pre, n, 1)) != KVL_OK) return s;
    int rows = mode == KVL_LOGITS_ALL ? n : 1;
    if (m->cap_logit_rows < rows) {
        cudaFree(m->logits);
        cudaFree(m->logit_x);
        m->logits = NULL;
        m->logit_x = NULL;
        m->cap_logit_rows = 0;
        KVL_CU_TRY(cudaMalloc((void **)&m->logits, (size_t)rows * V * sizeof(float)));
        KVL_CU_TRY(cudaMalloc(&m->logit_x, (size_t)rows * H * m->esz));
        m->cap_logit_rows = rows;
    }
    kvl__cu_acts *a = &m->pre;
    KVL_CU_TRY(cudaMemcpyAsync(a->tok, tokens, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice, m->stream));
    const int p0 = c->n_tokens;
    if ((s = run_layers(m, a, c, n, p0, a->tok, NULL)) != KVL_OK) return s;
    int first = mode == KVL_LOGITS_ALL ? 0 : n - 1;
    kvl__cu_rmsnorm(m->stream, m->dt, m->logit_x, a->x + (size_t)first * H, (size_t)H, m->final_norm,
                   rows, H, m->cfg.rms_norm_eps);
    if ((s = gemm(m, m->lm_head, m->logit_x, m->logits, rows, H, V, 0.0f)) != KVL_OK) return s;
    kvl__cu_argmax(m->stream, m->logits + (size_t)(rows - 1) * V, V, m->d_argmax, NULL, NULL);
    KVL_CU_LAUNCHED();
    if (mode != KVL_LOGITS_NONE)
        KVL_CU_TRY(cudaMemcpyAsync(logits, m->logits, (size_t)rows * V * sizeof(float),
                                   cudaMemcpyDeviceToHost, m->stream));
    KVL_CU_TRY(cudaMemcpyAsync(m->h_pinned + 2, m->d_argmax, sizeof(int32_t), cudaMemcpyDeviceToHost, m->stream));
    KVL_CU_TRY(cudaStreamSynchronize(m->stream));
    if (argmax_out) *argmax_out = m->h_pinned[2];
    memcpy(c->ids + p0, tokens, sizeof(int32_t) * (size_t)n);
    c->n_tokens += n;
    return KVL_OK;
}

/* The decode step as queued work: reads token and position from c->d_pos[1], c->d_pos[0]. */
static kvl_status decode_work(kvl_cuda_model *m, kvl_cuda_cache *c) {
    kvl__cu_acts *a = &m->dec;
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    kvl_status s = run_layers(m, a, c, 1, 0, c->d_pos + 1, c->d_pos);
    if (s != KVL_OK) return s;
    kvl__cu_rmsnorm(m->stream, m->dt, a->xn, a->x, (size_t)H, m->final_norm, 1, H, m->cfg.rms_norm_eps);
    if ((s = gemm(m, m->lm_head, a->xn, m->dec_logits, 1, H, V, 0.0f)) != KVL_OK) return s;
    kvl__cu_argmax(m->stream, m->dec_logits, V, m->d_argmax, NULL, NULL);
    KVL_CU_LAUNCHED();
    return KVL_OK;
}

static kvl_status capture_decode(kvl_cuda_model *m, kvl_cuda_cache *c) {
    cudaGraph_t g = NULL;
    KVL_CU_TRY(cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal));
    kvl_status s = decode_work(m, c);
    cudaError_t e = cudaStreamEndCapture(m->stream, &g);   /* always end the capture */
    if (s != KVL_OK) { if (g) cudaGraphDestroy(g); return s; }
    if ((s = KVL_CU(e)) != KVL_OK) return s;
    cudaGraphExec_t ge = NULL;
    if ((s = KVL_CU(cudaGraphInstantiate(&ge, g, 0))) != KVL_OK) { cudaGraphDestroy(g); return s; }
    c->graph = g;
    c->graph_exec = ge;
    return KVL_OK;
}

kvl_status kvl_cuda_decode(kvl_cuda_model *m, kvl_cuda_cache *c, int32_t token, float *logits,
                           int32_t *argmax_out) {
    if (!m || !c) return kvl__errorf(KVL_ERR_INVALID_ARG, "cuda decode: NULL argument");
    if (c->model != m) return kvl__errorf(KVL_ERR_MISMATCH, "cuda decode: cache belongs to another model");
    if (c->n_tokens + 1 > c->capacity)
        return kvl__errorf(KVL_ERR_RANGE, "cuda decode: cache full (%d tokens)", c->capacity);
    kvl_status s = check_tokens(m, &token, 1);
    if (s == KVL_OK) s = kvl__cu_use(m);
    if (s != KVL_OK) return s;
    m->h_pinned[0] = c->n_tokens;
    m->h_pinned[1] = token;
    KVL_CU_TRY(cudaMemcpyAsync(c->d_pos, m->h_pinned, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, m->stream));
    if (m->prm.use_graph && c->graph_exec) {
        KVL_CU_TRY(cudaGraphLaunch(c->graph_exec, m->stream));
    } else {
        /* the first step runs eagerly: modules load and cuBLAS picks its kernels outside the
         * capture; capturing afterwards records the same (idempotent) work for later steps */
        if ((s = decode_work(m, c)) != KVL_OK) return s;
        if (m->prm.use_graph && capture_decode(m, c) != KVL_OK) {
            /* capture refused (driver or cuBLAS without graph support): stay eager; the step
             * itself already ran */
            (void)cudaGetLastError();
            m->prm.use_graph = 0;
        }
    }
    if (logits)
        KVL_CU_TRY(cudaMemcpyAsync(logits, m->dec_logits, sizeof(float) * (size_t)m->cfg.vocab_size,
                                   cudaMemcpyDeviceToHost, m->stream));
    KVL_CU_TRY(cudaMemcpyAsync(m->h_pinned + 2, m->d_argmax, sizeof(int32_t), cudaMemcpyDeviceToHost, m->stream));
    KVL_CU_TRY(cudaStreamSynchronize(m->stream));
    if (argmax_out) *argmax_out = m->h_pinned[2];
    c->ids[c->n_tokens++] = token;
    return KVL_OK;
}

/* ---- span export -------------------------------------------------------------------------- */

static kvl_status read_plane(const kvl_cuda_cache *c, int layer, int plane, int t0, int t1, float *out) {
    const kvl_cuda_model *m = c->model;
    size_t n = (size_t)(t1 - t0) * c->kd;
    const char *src = (const char *)kvl__cu_plane(c, layer, plane) + (size_t)t0 * c->kd * m->esz;
    kvl_status us = kvl__cu_use(m);
    if (us != KVL_OK) return us;
    KVL_CU_TRY(cudaStreamSynchronize(m->stream));   /* the rows may still be being written */
    if (m->dt == 1) {
        KVL_CU_TRY(cudaMemcpy(out, src, n * sizeof(float), cudaMemcpyDeviceToHost));
        return KVL_OK;
    }
    uint16_t *tmp = malloc(n * sizeof(uint16_t) + 1);
    if (!tmp) return kvl__errorf(KVL_ERR_NOMEM, "cuda export: out of memory");
    kvl_status s = KVL_CU(cudaMemcpy(tmp, src, n * 2, cudaMemcpyDeviceToHost));
    if (s == KVL_OK)
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32(tmp[i]);
    free(tmp);
    return s;
}

static kvl_status export_check(const kvl_cuda_cache *c, int layer, int t0, int t1) {
    if (!c || layer < 0 || layer >= c->model->cfg.n_layers || t0 < 0 || t1 < t0 || t1 > c->n_tokens)
        return kvl__errorf(KVL_ERR_RANGE, "cuda export: layer %d tokens [%d, %d) outside the cache "
                          "(%d tokens)", layer, t0, t1, c ? c->n_tokens : 0);
    return KVL_OK;
}

kvl_status kvl_cuda_cache_read_kv(const kvl_cuda_cache *c, int layer, int t0, int t1, float *k_out,
                                  float *v_out) {
    kvl_status s = export_check(c, layer, t0, t1);
    if (s == KVL_OK && k_out) s = read_plane(c, layer, 0, t0, t1, k_out);
    if (s == KVL_OK && v_out) s = read_plane(c, layer, 1, t0, t1, v_out);
    return s;
}

kvl_status kvl_cuda_cache_read_prenorm(const kvl_cuda_cache *c, int layer, int t0, int t1,
                                       float *k_out, float *v_out) {
    kvl_status s = export_check(c, layer, t0, t1);
    if (s != KVL_OK) return s;
    if (k_out) {
        if (c->planes > 2) {
            s = read_plane(c, layer, 2, t0, t1, k_out);
        } else if ((s = read_plane(c, layer, 0, t0, t1, k_out)) == KVL_OK) {
            /* no k_norm: the pre-RoPE key is the cached key rotated back */
            int n = t1 - t0;
            int *pos = malloc(sizeof(int) * (size_t)(n ? n : 1));
            if (!pos) return kvl__errorf(KVL_ERR_NOMEM, "cuda export: out of memory");
            for (int i = 0; i < n; i++) pos[i] = t0 + i;
            kvl__cpu_rope_forward(k_out, pos, n, c->model->cfg.n_kv_heads, c->model->cfg.head_dim,
                                 &c->model->cfg.rope, KVL_ROPE_INVERSE);
            free(pos);
        }
    }
    if (s == KVL_OK && v_out) s = read_plane(c, layer, 1, t0, t1, v_out);
    return s;
}

/* ---- copy bandwidth ------------------------------------------------------------------------- */

kvl_status kvl_cuda_copy_bandwidth(size_t bytes, int reps, double *gbps_out) {
    kvl_status s = kvl_cuda_probe(NULL);
    if (s != KVL_OK) return s;
    if (reps < 1) reps = 1;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0.0f;
    s = KVL_CU(cudaMalloc(&a, bytes));
    if (s == KVL_OK) s = KVL_CU(cudaMalloc(&b, bytes));
    if (s == KVL_OK) s = KVL_CU(cudaMemset(a, 1, bytes));
    if (s == KVL_OK) s = KVL_CU(cudaEventCreate(&e0));
    if (s == KVL_OK) s = KVL_CU(cudaEventCreate(&e1));
    if (s == KVL_OK) s = KVL_CU(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));   /* warm-up */
    if (s == KVL_OK) s = KVL_CU(cudaEventRecord(e0, 0));
    for (int r = 0; r < reps && s == KVL_OK; r++)
        s = KVL_CU(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    if (s == KVL_OK) s = KVL_CU(cudaEventRecord(e1, 0));
    if (s == KVL_OK) s = KVL_CU(cudaEventSynchronize(e1));
    if (s == KVL_OK) s = KVL_CU(cudaEventElapsedTime(&ms, e0, e1));
    if (s == KVL_OK && gbps_out) *gbps_out = ms > 0 ? 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9 : 0.0;
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return s;
}
