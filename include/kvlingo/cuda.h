/* kvlingo/cuda.h: the CUDA backend: a model with bf16 (or f32) weights on one GPU, KV
 * caches in GPU memory, prefill / decode (decode replayed from a CUDA graph), span export from GPU
 * memory, and the fused KV-Lingo translation kernel.
 *
 * Numerics: weights bf16 (KVL_CUDA_BF16, default) or f32 (KVL_CUDA_F32, for 1e-4 parity with the
 * CPU path); every product accumulates in float32 (cuBLAS CUBLAS_COMPUTE_32F, no TF32); the
 * residual stream, norms, softmax and RoPE run in float32; the KV cache and the activations fed
 * to GEMMs are stored in the weight dtype.  Formulas as in include/kvlingo/model.h.
 *
 * Device cache layout: one allocation [L][planes][capacity][Hkv*D] (planes K, V, and for models
 * with k_norm the pre-norm key Kpre), i.e. [layer][token][head][dim] per plane; K is post k_norm
 * and post RoPE at its absolute position, as in include/kvlingo/cache.h.
 *
 * Availability: in a build without CUDA (KVL_CUDA=OFF, or AUTO without nvcc) every function
 * returns KVL_ERR_UNSUPPORTED; on a machine without a usable GPU, kvl_cuda_probe and the
 * constructors return KVL_ERR_DEVICE.  Every CUDA / cuBLAS failure becomes KVL_ERR_DEVICE (or
 * KVL_ERR_NOMEM for cudaErrorMemoryAllocation) with the call, file and line in kvl_last_error().
 * Objects of one model are not thread-safe: serialise calls on one kvl_cuda_model.
 */
#ifndef KVLINGO_CUDA_H
#define KVLINGO_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/backend.h"
#include "kvlingo/kv_maps.h"
#include "kvlingo/model.h"
#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build contains the CUDA backend (KVL_CUDA on), else 0. */
int kvl_cuda_built(void);

/* Check that CUDA works here: KVL_OK with *n_devices >= 1; KVL_ERR_UNSUPPORTED in a build
 * without CUDA; KVL_ERR_DEVICE when cudaGetDeviceCount fails or finds no device (message says
 * why).  n_devices may be NULL. */
kvl_status kvl_cuda_probe(int *n_devices);

/* Name of device 0 and its multiprocessor count (for reports); buf gets "" when unavailable. */
kvl_status kvl_cuda_device_name(char *buf, size_t cap, int *sm_count);

typedef enum kvl_cuda_dtype { KVL_CUDA_BF16 = 0, KVL_CUDA_F32 = 1 } kvl_cuda_dtype;

typedef struct kvl_cuda_params {
    int device;             /* CUDA device ordinal, default 0                                    */
    kvl_cuda_dtype dtype;   /* weight / cache dtype, default KVL_CUDA_BF16                       */
    int use_graph;          /* 1 (default): decode replays a captured CUDA graph                 */
} kvl_cuda_params;

kvl_cuda_params kvl_cuda_default_params(void);

typedef struct kvl_cuda_model kvl_cuda_model;
typedef struct kvl_cuda_cache kvl_cuda_cache;
typedef struct kvl_cuda_translator kvl_cuda_translator;

/* Upload a model's host weights (float32, kvlingo/backend.h kvl_weights_view: e.g.
 * kvl_model_weights(model)) to the GPU, converting to params->dtype (bf16 rounds to nearest
 * even).  The host weights may be freed afterwards.
 * q/k/v weights are fused into one [Hq*D + 2*Hkv*D, H] matrix and gate/up into [2F, H].
 * Errors: KVL_ERR_UNSUPPORTED (no CUDA build; head_dim not in {32, 64, 128}; GQA group > 8),
 * KVL_ERR_DEVICE, KVL_ERR_NOMEM.  Free with kvl_cuda_model_free. */
kvl_status kvl_cuda_model_create(const kvl_weights_view *host, const kvl_cuda_params *params,
                                 kvl_cuda_model **out);

/* A model of geometry `cfg` whose weights are generated on the GPU (uniform, std 0.02; norm
 * weights 1; biases 0), seeded by `seed`: a published SHAPE at full size in seconds. */
kvl_status kvl_cuda_model_create_random(const kvl_model_config *cfg, uint64_t seed,
                                        const kvl_cuda_params *params, kvl_cuda_model **out);
void kvl_cuda_model_free(kvl_cuda_model *model);
const kvl_model_config *kvl_cuda_model_config(const kvl_cuda_model *model);
/* Bytes of weights held on the device. */
size_t kvl_cuda_model_weight_bytes(const kvl_cuda_model *model);

/* Wait for all work queued on the model's stream. */
kvl_status kvl_cuda_synchronize(kvl_cuda_model *model);

/* A KV cache in GPU memory for `model`'s geometry holding up to max_tokens tokens (allocated
 * up front: L * planes * max_tokens * Hkv*D elements of the dtype).  Errors: KVL_ERR_INVALID_ARG
 * (max_tokens < 1), KVL_ERR_NOMEM, KVL_ERR_DEVICE. */
kvl_status kvl_cuda_cache_create(kvl_cuda_model *model, int max_tokens, kvl_cuda_cache **out);
void kvl_cuda_cache_free(kvl_cuda_cache *cache);
int kvl_cuda_cache_n_tokens(const kvl_cuda_cache *cache);
int kvl_cuda_cache_capacity(const kvl_cuda_cache *cache);
/* Drop tokens [n, n_tokens) (n <= n_tokens); the memory stays allocated. */
kvl_status kvl_cuda_cache_truncate(kvl_cuda_cache *cache, int n);

/* Prefill: append tokens[n] (ids in [0, vocab)) to `cache` at positions [n_tokens, +n).
 * logits (host, float32) as in kvl_logits_mode: NONE, LAST [vocab] or ALL [n, vocab];
 * argmax_out (may be NULL) receives the greedy next token (argmax of the last row, first
 * index wins ties).  Synchronous: returns when the result is on the host.  Atomic on bad
 * input; a device failure leaves the cache's new rows undefined but n_tokens unchanged.
 * Errors: KVL_ERR_INVALID_ARG, KVL_ERR_RANGE (capacity), KVL_ERR_MISMATCH (cache of another
 * model), KVL_ERR_DEVICE, KVL_ERR_NOMEM. */
kvl_status kvl_cuda_prefill(kvl_cuda_model *model, kvl_cuda_cache *cache, const int32_t *tokens,
                            int n, kvl_logits_mode mode, float *logits, int32_t *argmax_out);

/* Decode one token at position n_tokens; logits (may be NULL) receives [vocab] float32,
 * argmax_out (may be NULL) the greedy next token.  With use_graph the whole step (embedding
 * to argmax) is one CUDA graph launch, captured on the first decode of this (model, cache)
 * pair; the position and token live in device memory so one graph serves every step. */
kvl_status kvl_cuda_decode(kvl_cuda_model *model, kvl_cuda_cache *cache, int32_t token,
                           float *logits, int32_t *argmax_out);

/* Span export from GPU memory, tokens [t0, t1) of `layer`, into host float32 buffers of shape
 * [t1-t0, Hkv*D] (either may be NULL):
 *   read_kv:      the cached keys (post k_norm, post RoPE) and values;
 *   read_prenorm: pre-norm keys (k_proj output: the Kpre plane for k_norm models, else the
 *                 cached key rotated back by the inverse RoPE) and values.
 * Errors: KVL_ERR_RANGE, KVL_ERR_DEVICE. */
kvl_status kvl_cuda_cache_read_kv(const kvl_cuda_cache *cache, int layer, int t0, int t1,
                                  float *k_out, float *v_out);
kvl_status kvl_cuda_cache_read_prenorm(const kvl_cuda_cache *cache, int layer, int t0, int t1,
                                       float *k_out, float *v_out);

/* Upload translator maps (kvlingo/kv_maps.h, float32 host arrays) for source geometry `src`
 * into target model `dst` (whose k_norm weights, eps, RoPE theta and dtype are used).
 * Errors: KVL_ERR_MISMATCH (maps vs src/dst geometry), KVL_ERR_UNSUPPORTED (Dt not in
 * {32, 64, 128}), KVL_ERR_DEVICE, KVL_ERR_NOMEM. */
kvl_status kvl_cuda_translator_create(const kvl_kv_maps *maps, const kvl_model_config *src,
                                      kvl_cuda_model *dst, kvl_cuda_translator **out);
void kvl_cuda_translator_free(kvl_cuda_translator *tr);

/* Translate tokens [t0, t1) of `src` (a cache of the source model, on the same device) and
 * append them to `dst` (a cache of the translator's target model holding exactly t0 tokens:
 * KVL_ERR_RANGE otherwise), on the target model's stream, asynchronously: one fused kernel per
 * side (K, V) reads the source span's pre-norm K/V (inverse RoPE for sources without k_norm),
 * applies W_K / W_V for every target layer, then k_norm and RoPE for keys, and writes K, V
 * (and Kpre) straight into dst.  Token ids are copied from src.  *bytes_out (may be NULL)
 * receives the bytes the kernels read and wrote (for bandwidth figures). */
kvl_status kvl_cuda_translate(kvl_cuda_translator *tr, const kvl_cuda_cache *src, int t0, int t1,
                              kvl_cuda_cache *dst, size_t *bytes_out);

/* Device-to-device copy bandwidth: copies `bytes` (e.g. 1 GiB) `reps` times with cudaMemcpy
 * and reports (2 * bytes) / time per copy in GB/s (read + write counted), the figure the
 * translate kernel's bytes_out / time is compared against. */
kvl_status kvl_cuda_copy_bandwidth(size_t bytes, int reps, double *gbps_out);

#ifdef __cplusplus
}
#endif
#endif
