/* kernels/cuda/cuda_internal.h: structs of the CUDA backend and the C entry points of its
 * kernels (defined in *.cu), shared by the host files (cuda_model.c, cuda_translate.c).
 * Not a public header; see include/kvlingo/cuda.h.
 *
 * Dimension names: T tokens of a call, H hidden, Hq / Hkv query / kv heads, D head_dim,
 * QD = Hq*D, KD = Hkv*D, F ffn width, V vocab.  "act" buffers hold the model dtype (bf16 or
 * f32: dt = 0 / 1), everything named f32 is float32. */
#ifndef KVL_KERNELS_CUDA_INTERNAL_H
#define KVL_KERNELS_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kvlingo/cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- error conversion: every CUDA / cuBLAS return code goes through these ---------------- */
kvl_status kvl__cuda_status(cudaError_t e, const char *call, const char *file, int line);
kvl_status kvl__cublas_status(cublasStatus_t e, const char *call, const char *file, int line);
#define KVL_CU(call) kvl__cuda_status((call), #call, __FILE__, __LINE__)
#define KVL_CUBLAS(call) kvl__cublas_status((call), #call, __FILE__, __LINE__)
/* In functions returning kvl_status: evaluate, return on failure. */
#define KVL_CU_TRY(call) do { kvl_status s_ = KVL_CU(call); if (s_ != KVL_OK) return s_; } while (0)
#define KVL_CUBLAS_TRY(call) do { kvl_status s_ = KVL_CUBLAS(call); if (s_ != KVL_OK) return s_; } while (0)
/* After kernel launches: the launch error (bad configuration), not the kernel's completion. */
#define KVL_CU_LAUNCHED() KVL_CU_TRY(cudaGetLastError())

typedef struct kvl__cu_layer {
    void *wqkv;        /* [QD + 2KD, H] act   q_proj | k_proj | v_proj rows       */
    float *bqkv;       /* [QD + 2KD] f32, NULL without q/k/v bias                 */
    float *q_norm;     /* [D] f32 or NULL                                         */
    float *k_norm;     /* [D] f32 or NULL                                         */
    void *wo;          /* [H, QD] act                                             */
    float *bo;         /* [H] f32 or NULL                                         */
    float *attn_norm;  /* [H] f32                                                 */
    float *mlp_norm;   /* [H] f32                                                 */
    void *wgu;         /* [2F, H] act        gate_proj | up_proj rows             */
    void *wdown;       /* [H, F] act                                              */
} kvl__cu_layer;

/* Activation buffers for up to cap_T tokens of one call. */
typedef struct kvl__cu_acts {
    int cap_T;
    void *base;
    float *x;          /* [T, H] f32 residual stream                              */
    void *xn;          /* [T, H] act normed input of a GEMM                       */
    float *qkv;        /* [T, QD + 2KD] f32 projections                           */
    void *q;           /* [T, QD] act queries after q_norm and RoPE               */
    void *att;         /* [T, QD] act attention output                            */
    float *gu;         /* [T, 2F] f32 gate | up                                   */
    void *act;         /* [T, F] act silu(gate) * up                              */
    float *part;       /* split-K attention partials [T][Hq][nsplit][D + 2] f32   */
    int part_splits;   /* nsplit the partial buffer was sized for                 */
    int32_t *tok;      /* [T] token ids                                           */
} kvl__cu_acts;

struct kvl_cuda_model {
    kvl_model_config cfg;
    kvl_cuda_params prm;
    int dt;                 /* 0 bf16, 1 f32                                              */
    size_t esz;             /* bytes per act / weight element                             */
    int sm_count;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;          /* cuBLAS workspace (set explicitly: graph capture needs it)  */
    void *wbase;            /* one allocation: every act-dtype weight                     */
    float *fbase;           /* one allocation: norms and biases (f32)                     */
    size_t weight_bytes;
    void *embed;            /* [V, H] act                                                 */
    void *lm_head;          /* [V, H] act (== embed when tied)                            */
    float *final_norm;      /* [H] f32                                                    */
    kvl__cu_layer *layers;   /* [L] host array of device pointers                          */
    kvl__cu_acts pre;        /* prefill activations (grown on demand)                      */
    kvl__cu_acts dec;        /* decode activations (T = 1, fixed: captured in graphs)      */
    float *logits;          /* [cap_logit_rows, V] f32 (prefill)                          */
    float *dec_logits;      /* [V] f32 (decode: fixed, captured in graphs)                */
    int cap_logit_rows;
    void *logit_x;          /* [cap_logit_rows, H] act                                    */
    int32_t *d_argmax;      /* [1] device                                                 */
    int32_t *h_pinned;      /* [4] pinned host: token in, argmax out                      */
    float *inv_freq;        /* [D/2] f32 device RoPE table (kvl_rope_inv_freq)            */
    float rope_scale;       /* RoPE attention factor on cos and sin (1 but for yarn)      */
    int dec_splits;         /* split-K factor of the decode attention                     */
};

struct kvl_cuda_cache {
    kvl_cuda_model *model;
    int capacity, n_tokens, planes;
    int device;             /* the model's GPU, kept for the free (the model may be gone)   */
    size_t kd;              /* Hkv*D                                                      */
    void *base;             /* [L][planes][capacity][KD] act                              */
    int32_t *ids;           /* [capacity] host token ids                                  */
    int32_t *d_pos;         /* [2] device: position of the next decode token, token id    */
    int dev_pos_valid;      /* d_pos[0] == n_tokens known on device                       */
    cudaGraph_t graph;
    cudaGraphExec_t graph_exec;
};

/* Make the model's GPU the calling thread's current device.  The current device is per host
 * thread and model_alloc set it only on the thread that made the model: a call from another
 * thread (a daemon's workers), or after a model on another GPU was made, would allocate on
 * and launch into device 0 with streams of device N.  Every entry point taking a model or a
 * cache calls this first. */
static inline kvl_status kvl__cu_use(const struct kvl_cuda_model *m) {
    return KVL_CU(cudaSetDevice(m->prm.device));
}

/* Pointer to (layer, plane) of a cache: [capacity][KD]. */
static inline void *kvl__cu_plane(const struct kvl_cuda_cache *c, int layer, int plane) {
    size_t esz = c->model->esz;
    return (char *)c->base + ((size_t)layer * c->planes + plane) * c->capacity * c->kd * esz;
}

/* Write host rows [t0, t0+n) of every layer into a device cache: k_post, v, k_pre
 * [L][n][KD] float32 (k_pre only for caches with a Kpre plane), converted to the model dtype;
 * sets n_tokens = t0 + n (ids -1: the caller keeps the ids).  Errors: KVL_ERR_RANGE
 * (t0 != n_tokens or past capacity), KVL_ERR_DEVICE.  (cuda_model.c) */
kvl_status kvl__cuda_cache_write_host(struct kvl_cuda_cache *c, int t0, int n, const float *k_post,
                                      const float *v, const float *k_pre);
/* Translate a host span: k_src, v_src [Ls][n][Hs*Ds] float32 pre-norm K/V of positions
 * [t0, t0+n) are staged on the device (grown once, reused) and run through the fused kernel
 * into `dst` (which holds t0 tokens).  (cuda_translate.c) */
kvl_status kvl__cuda_translate_host(kvl_cuda_translator *tr, const float *k_src, const float *v_src,
                                    int t0, int n, struct kvl_cuda_cache *dst);

/* Copy n host floats into device memory of the model's dtype (as_f32: keep float32);
 * bf16 rounds to nearest even.  (cuda_model.c) */
kvl_status kvl__cu_upload(struct kvl_cuda_model *m, void *dst, const float *src, size_t n, int as_f32);

/* ---- kernels (kernels.cu) --------------------------------------------------------------- */

/* x[T,H] f32 = embed[tok[t], :] (act). */
void kvl__cu_embed(cudaStream_t s, int dt, float *x, const void *embed, const int32_t *tok, int T, int H);
/* out[T,C] act = in[T,C] * rsqrt(mean(in^2) + eps) * w[C]  (Qwen3RMSNorm, f32 math);
 * in_stride: floats between rows of in. */
void kvl__cu_rmsnorm(cudaStream_t s, int dt, void *out, const float *in, size_t in_stride,
                    const float *w, int T, int C, float eps);
/* After the fused qkv GEMM: add bias, q/k RMSNorm (when q_norm != NULL), RoPE at position
 * pos0 + t (inv_freq [D/2] f32 device table computed on the host by kvl_rope_inv_freq as the
 * CPU path; angle = (float)pos * inv_freq[i]; cos and sin times rope_scale, the attention
 * factor); pos0 is read from *d_pos0
 * when d_pos0 != NULL.  Writes q [T, QD] act and the cache
 * rows K, V, Kpre (kpre NULL when the model has no k_norm) at token pos0 + t of
 * [capacity][KD] act planes. */
void kvl__cu_qkv_post(cudaStream_t s, int dt, const float *qkv, const float *bias,
                     const float *q_norm, const float *k_norm, int pos0, const int32_t *d_pos0,
                     int T, int Hq, int Hkv, int D, const float *inv_freq, float rope_scale, float eps, void *q_out,
                     void *k_cache, void *v_cache, void *kpre_cache);
/* act[T,F] = silu(gu[t, f]) * gu[t, F + f]. */
void kvl__cu_swiglu(cudaStream_t s, int dt, void *act, const float *gu, int T, int F);
/* x[T,N] += b[N]. */
void kvl__cu_add_bias(cudaStream_t s, float *x, const float *b, int T, int N);
/* *out = argmax(logits[V]) (first index wins ties); when next_tok != NULL also writes it
 * there and increments *pos (the device-side decode state). */
void kvl__cu_argmax(cudaStream_t s, const float *logits, int V, int32_t *out, int32_t *next_tok,
                   int32_t *pos);
/* dst[n] act = uniform(-a, a) from a counter hash of (seed, index), a = std * sqrt(3). */
void kvl__cu_fill_random(cudaStream_t s, int dt, void *dst, size_t n, uint64_t seed, float std);
void kvl__cu_fill_f32(cudaStream_t s, float *dst, size_t n, float value);
/* dst[n] (act) = src[n] (f32) */
void kvl__cu_convert(cudaStream_t s, int dt, void *dst, const float *src, size_t n);

/* ---- attention (attention.cu) ----------------------------------------------------------- */

/* Causal GQA attention of T queries at positions p0 .. p0+T-1 over cache rows [0, p0+T):
 * q [T, QD] act, k/v planes [capacity][KD] act, out [T, QD] act.  bf16 with D in {32,64,128}:
 * flash-style tiled kernel on tensor cores (wmma 16x16x16, online softmax, 64x64 tiles);
 * otherwise the split-K kernel below with one split.  part: scratch of
 * kvl__cu_attention_part_floats(T, Hq, D, 1) floats. */
int kvl__cu_attention_prefill(cudaStream_t s, int dt, void *out, const void *q, const void *k,
                             const void *v, float *part, int T, int p0, int Hq, int Hkv, int D);
/* Decode (T = 1) split-K attention: the query at position *d_pos reads keys [0, *d_pos]; the
 * key range is cut into nsplit chunks (one block per kv head and chunk, all query heads of
 * the group in the block), then combined.  part: kvl__cu_attention_part_floats(1, Hq, D, nsplit). */
int kvl__cu_attention_decode(cudaStream_t s, int dt, void *out, const void *q, const void *k,
                            const void *v, float *part, const int32_t *d_pos, int nsplit, int Hq,
                            int Hkv, int D);
size_t kvl__cu_attention_part_floats(int T, int Hq, int D, int nsplit);

/* ---- translation (translate.cu) --------------------------------------------------------- */

typedef struct kvl__cu_translate_args {
    int dt;
    int side;                 /* 0 keys, 1 values                                        */
    int n, t0;                /* tokens [t0, t0+n)                                       */
    /* source */
    const void *src_base;     /* source cache [Ls][src_planes][src_cap][Hs*Ds] act       */
    int src_planes, src_cap, Hs, Ds;
    int src_row0;             /* source row of token position p is p - src_row0 (0 for a
                               * cache; t0 for a staged span of rows [0, n))              */
    int src_unrope;           /* 1: keys come from plane K with inverse RoPE (no k_norm)  */
    const float *src_inv_freq;/* [Ds/2] f32 device, used when src_unrope                 */
    float src_rope_unscale;   /* 1 / the source's RoPE attention factor (src_unrope)      */
    /* maps */
    const void *w;            /* [Lt][Ht*Dt][Hs*Ds] act                                  */
    const int32_t *layer_map; /* [Lt] device                                             */
    /* target */
    void *dst_base;           /* target cache [Lt][dst_planes][dst_cap][Ht*Dt] act       */
    int dst_planes, dst_cap, Lt, Ht, Dt;
    const float *k_norm;      /* [Lt][Dt] f32 or NULL                                    */
    float eps;
    const float *dst_inv_freq;/* [Dt/2] f32 device                                       */
    float dst_rope_scale;     /* the target's RoPE attention factor                      */
} kvl__cu_translate_args;

/* One launch for all target layers of one side; returns 0 or -1 (unsupported shape). */
int kvl__cu_translate(cudaStream_t s, const kvl__cu_translate_args *a);

#ifdef __cplusplus
}
#endif
#endif
