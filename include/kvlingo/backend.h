/* kvlingo/backend.h: the compute seam.  Every device kvlingo computes on (the CPU, a CUDA GPU)
 * is one table of function pointers, kvl_backend_ops, in the style of ggml-backend and Redis's
 * ae_* event-loop backends: kvl_model, kvl_cache and the translators call through the table and
 * never know which device runs the work.  A backend owns four things for a model:
 *   - its weights (uploaded once from the host view below, kept in the device's layout/dtype);
 *   - its KV cache storage (cache "blocks": whatever layout the device reads fastest);
 *   - the forward pass over a batch (prefill chunks and decode steps in one call);
 *   - the span seam: export of a range's pre-norm K/V, and translate-apply of a source span
 *     straight into the cache.
 * Token ids, counts and capacity of a cache are kept by engine/model (backend-neutral).
 *
 * Conventions: shapes row-major with named dimensions, L layers, T tokens, H hidden,
 * Hq query heads, Hkv kv heads, D head_dim, F intermediate, V vocabulary; all host buffers are
 * float32 and caller-owned; every function returns kvl_status (0 ok, negative error, message
 * in kvl_last_error()); an op that fails leaves the cache as it was.
 * The conformance suite every backend passes: tests/unit/test_backend.c.
 */
#ifndef KVLINGO_BACKEND_H
#define KVLINGO_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/kv_maps.h"
#include "kvlingo/model.h"
#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One decoder layer's parameters as the host holds them (float32, nn.Linear layout W[out, in]).
 * Optional tensors are NULL when the architecture has none. */
typedef struct kvl_layer_view {
    const float *attn_norm;   /* [H]        input_layernorm.weight                      */
    const float *wq;          /* [Hq*D, H]  self_attn.q_proj.weight                     */
    const float *wk;          /* [Hkv*D, H] self_attn.k_proj.weight                     */
    const float *wv;          /* [Hkv*D, H] self_attn.v_proj.weight                     */
    const float *bq;          /* [Hq*D]     q_proj.bias (Qwen2), else NULL              */
    const float *bk;          /* [Hkv*D]                                                */
    const float *bv;          /* [Hkv*D]                                                */
    const float *q_norm;      /* [D]        self_attn.q_norm.weight (Qwen3), else NULL  */
    const float *k_norm;      /* [D]        self_attn.k_norm.weight (Qwen3), else NULL  */
    const float *wo;          /* [H, Hq*D]  self_attn.o_proj.weight                     */
    const float *bo;          /* [H]        o_proj.bias or NULL                         */
    const float *mlp_norm;    /* [H]        post_attention_layernorm.weight             */
    const float *w_gate;      /* [F, H]     mlp.gate_proj.weight                        */
    const float *w_up;        /* [F, H]     mlp.up_proj.weight                          */
    const float *w_down;      /* [H, F]     mlp.down_proj.weight                        */
} kvl_layer_view;

/* A model's weights as the host holds them: what a backend uploads, and what translator
 * training reads (it runs the frozen target on the CPU).  Owned by the kvl_model; valid while
 * it lives. */
typedef struct kvl_weights_view {
    kvl_model_config cfg;
    const float *embed;           /* [V, H] model.embed_tokens.weight                  */
    const float *final_norm;      /* [H]    model.norm.weight                          */
    const float *lm_head;         /* [V, H] lm_head.weight (== embed when tied)        */
    const kvl_layer_view *layers; /* [L]                                               */
} kvl_weights_view;

/* The host weights of a loaded model (never NULL for a valid model). */
const kvl_weights_view *kvl_model_weights(const kvl_model *model);

/* One sequence of a backend forward call: n_tokens new tokens at positions [n_past, +n_tokens)
 * of `cache` (the backend's own cache object).  Logits as in kvl_batch_seq (kvlingo/model.h). */
typedef struct kvl_backend_seq {
    void *cache;
    int n_past;
    const int32_t *tokens;        /* [n_tokens], already range-checked                 */
    int n_tokens;
    kvl_logits_mode logits_mode;
    float *logits;                /* host, [V] or [n_tokens, V]                        */
} kvl_backend_seq;

/* Cache planes a backend stores per layer and token, each [Hkv*D]. */
typedef enum kvl_cache_plane {
    KVL_PLANE_K = 0,      /* key after k_norm and RoPE (what attention reads)        */
    KVL_PLANE_V = 1,      /* value                                                   */
    KVL_PLANE_KPRE = 2,   /* k_proj output before k_norm (models with k_norm only)   */
} kvl_cache_plane;

/* A translation prepared for a target backend: the maps (kvlingo/kv_maps.h) and the target's
 * k_norm weights, uploaded or viewed once, applied per span. */
typedef struct kvl_translate_params {
    const kvl_kv_maps *maps;      /* geometry + W_K, W_V [Lt][Ht*Dt][Hs*Ds], layer map    */
    const float *k_norm;          /* [Lt][Dt] target k_norm weights, NULL without k_norm  */
    float k_norm_eps;
    kvl_rope_params rope;         /* the target's RoPE (kvl_model_config.rope)            */
} kvl_translate_params;

typedef struct kvl_backend_ops {
    const char *name;             /* "cpu", "cuda" */
    /* What the backend computes with on this machine (kernels chosen at run time), e.g.
     * "float32: OpenBLAS (SkylakeX kernels); bf16 weights: AVX-512 kernel" (static string; may be NULL). */
    const char *(*describe)(void);

    /* Weights: make the backend's model from the host view (which must outlive it: the CPU
     * backend computes on it in place, or with params->weights_dtype KVL_WEIGHTS_BF16 on bf16
     * copies of the matrices it makes here; a GPU backend copies).  params: threads, device,
     * weights_dtype (F32 or BF16 as kvl_model resolves it; NULL params: float32). */
    kvl_status (*model_create)(const kvl_weights_view *w, const kvl_model_params *params,
                               void **out);
    void (*model_free)(void *model);
    /* Host threads the backend's work may use (BLAS, attention); 0 = the library default. */
    void (*model_set_threads)(void *model, int n_threads);

    /* Cache blocks for geometry `cfg`: room for `capacity` tokens, allocated in blocks of
     * `block_tokens` as tokens arrive (the CPU) or up front (a GPU).  `model` is the backend
     * model the cache will serve; backends whose storage needs no device context accept NULL
     * (the CPU), others answer KVL_ERR_INVALID_ARG. */
    kvl_status (*cache_create)(const kvl_model_config *cfg, void *model, int capacity,
                               int block_tokens, void **out);
    void (*cache_free)(void *cache);
    size_t (*cache_bytes)(const void *cache);     /* bytes of K/V storage held            */
    /* Forget tokens [n, n_held): their storage may be released. */
    kvl_status (*cache_truncate)(void *cache, int n_held, int n);
    /* Write tokens [t0, t0+n) of every layer: k_post, v, k_pre [L][n][Hkv*D] (k_pre only
     * for models with k_norm, else NULL). */
    kvl_status (*cache_write)(void *cache, int t0, int n, const float *k_post, const float *v,
                              const float *k_pre);
    /* Read rows [t0, t1) of one plane of one layer into out [t1-t0, Hkv*D]. */
    kvl_status (*cache_read)(const void *cache, int layer, kvl_cache_plane plane, int t0, int t1,
                             float *out);
    /* Pre-norm K/V export of a range, the span a translator reads: k_out, v_out
     * [t1-t0, Hkv*D] (either may be NULL); for models without k_norm the key is the cached
     * key rotated back by the inverse RoPE. */
    kvl_status (*cache_export_prenorm)(const void *cache, int layer, int t0, int t1,
                                       float *k_out, float *v_out);
    /* Optional (NULL: the caller reads float32 layer by layer and rounds): the same export of
     * every layer at once, rounded to bf16 (nearest even; a bf16 cache's elements as stored):
     * k_out, v_out [L][t1-t0][Hkv*D] uint16_t, host.  `model` is the backend model the cache
     * serves (NULL for a cache made from a geometry), whose threads may share the work.
     * Errors: KVL_ERR_NOMEM. */
    kvl_status (*cache_export_prenorm_bf16)(void *model, const void *cache, int t0, int t1,
                                            uint16_t *k_out, uint16_t *v_out);

    /* Forward over a batch (kvlingo/model.h kvl_model_forward): append every sequence's new
     * K/V to its cache and write the logits asked for.  Calls on one model are serialised by
     * the caller. */
    kvl_status (*forward)(void *model, const kvl_backend_seq *seqs, int n_seqs);

    /* Translate-apply: prepare once per (translator, target), then write the translation of a
     * source span straight into the target cache.  k_src, v_src: [Ls][n][Hs*Ds] source
     * pre-norm K/V of tokens [t0, t0+n) (host); the target cache holds exactly t0 tokens.
     * Writes K = RoPE(k_norm(W_K k_s)), V = W_V v_s (and Kpre = W_K k_s) for every target
     * layer (kvlingo/translator.h). */
    kvl_status (*translate_prepare)(void *model, const kvl_translate_params *params, void **out);
    void (*translate_release)(void *prepared);
    kvl_status (*translate_apply)(void *prepared, const float *k_src, const float *v_src, int t0,
                                  int n, void *cache);
    /* Optional (NULL: never): whether translate_apply multiplies maps given as bf16 pairs
     * (kvl_kv_maps.wkP) in bf16, for a target of head_dim D, dt = Ht*D output and din input
     * features per token; the source rows are then rounded to bf16 first. */
    int (*translate_bf16_products)(int D, int dt, int din);
    /* Optional (NULL: none): translate_apply from source rows already in bf16 (k_src16, v_src16
     * [Ls][n][Hs*Ds] uint16_t, a bf16 span as it came off the wire), multiplied by the maps' bf16
     * pairs with no float32 copy of the rows: the bytes translate_apply writes for the same
     * (finite) rows widened, since it rounds them to bf16 first.  KVL_ERR_UNSUPPORTED, with the cache
     * unchanged, where this translation does not take bf16 products (the caller widens the
     * rows and calls translate_apply). */
    kvl_status (*translate_apply_bf16)(void *prepared, const uint16_t *k_src16,
                                       const uint16_t *v_src16, int t0, int n, void *cache);
} kvl_backend_ops;

/* The CPU backend (always built). */
const kvl_backend_ops *kvl_backend_cpu(void);
/* The CUDA backend's table (kernels/cuda/); NULL in a build without CUDA.  Prefer
 * kvl_backend_for_device, which also checks that a GPU is there. */
const kvl_backend_ops *kvl_backend_cuda(void);

/* The backend for `device`: KVL_ERR_UNSUPPORTED (a build without it, message says how to build
 * it) or KVL_ERR_DEVICE (built, but no usable device here). */
kvl_status kvl_backend_for_device(kvl_device device, const kvl_backend_ops **out);

/* Parse a device name as the programs spell it: "cpu", "cuda" or "cuda:N" (N a GPU ordinal,
 * 0..1023).  *device and *index receive the parts (index 0 for "cpu" and "cuda").
 * KVL_ERR_INVALID_ARG with a message quoting the text otherwise.  Whether the device exists is
 * checked by kvl_backend_for_device, not here. */
kvl_status kvl_device_parse(const char *text, kvl_device *device, int *index);
/* "cpu" or "cuda" (static string). */
const char *kvl_device_name(kvl_device device);

/* The backend a model computes on. */
const kvl_backend_ops *kvl_model_backend(const kvl_model *model);

#ifdef __cplusplus
}
#endif
#endif
