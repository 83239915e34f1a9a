/* kvlingo/cache.h: a session's KV cache, in fixed-size blocks of tokens.
 *
 * Per layer l and token t the cache holds what the model's attention reads:
 *   K[l][t] : [Hkv, D] float32, the key after k_norm (Qwen3) and after RoPE at position t
 *   V[l][t] : [Hkv, D] float32, the value (v_proj output, no transform)
 * and, for models with k_norm (whose input cannot be recovered from K), the pre-normalisation
 * key Kpre[l][t] : [Hkv*D] float32 (the k_proj output), which translators read.
 * Token t always sits at absolute position t (RoPE position), tokens [0, n) are held.
 * Token ids and counts are kept here; the K/V storage belongs to a backend (kvlingo/backend.h).
 * The CPU backend stores a table of blocks of `block_tokens` tokens each (default 16); one
 * block holds every layer's K, V (and Kpre) for its tokens: [layer][K|V|Kpre][block_tokens]
 * [Hkv*D], allocated as tokens are appended and freed on truncation.  Caches made by
 * kvl_model_cache_create for a model loaded with kv_dtype KVL_KV_BF16 store those elements as
 * bf16 (kvlingo/model.h); every function below still reads and writes float32 (widened exactly
 * on the way out, rounded to nearest even on the way in).
 */
#ifndef KVLINGO_CACHE_H
#define KVLINGO_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/model.h"
#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvl_cache kvl_cache;

typedef struct kvl_cache_params {
    int max_tokens;      /* capacity in tokens (context limit); 0 = config max_position_embeddings */
    int block_tokens;    /* tokens per block; 0 = 16, at most 65536 (the CPU backend's blocks;   */
                         /* the CUDA cache is one slab and ignores it)                           */
} kvl_cache_params;

kvl_cache_params kvl_cache_default_params(void);

/* Create an empty cache for a model of geometry `cfg` (copied), stored by the CPU backend.
 * Free with kvl_cache_free. */
kvl_status kvl_cache_create(const kvl_model_config *cfg, const kvl_cache_params *params,
                            kvl_cache **out);
/* Create an empty cache stored by `model`'s backend (kvlingo/backend.h: host blocks on the CPU,
 * device memory on a GPU), the cache that model's forward pass needs. */
kvl_status kvl_model_cache_create(const kvl_model *model, const kvl_cache_params *params,
                                  kvl_cache **out);
void kvl_cache_free(kvl_cache *cache);

/* Geometry of the model the cache was made for (copied at creation). */
const kvl_model_config *kvl_cache_config(const kvl_cache *cache);

/* Tokens held, capacity, and bytes currently allocated for blocks. */
int kvl_cache_n_tokens(const kvl_cache *cache);
int kvl_cache_capacity(const kvl_cache *cache);
size_t kvl_cache_bytes(const kvl_cache *cache);
/* Token ids held, [n_tokens] int32, owned by the cache (valid until the next mutation). */
const int32_t *kvl_cache_tokens(const kvl_cache *cache);

/* Drop tokens [n, n_tokens); n <= n_tokens.  Frees blocks wholly past n. */
kvl_status kvl_cache_truncate(kvl_cache *cache, int n);

/* Copy the cached (post-norm, post-RoPE) keys and values of layer `layer`, tokens [t0, t1), into
 * caller buffers k_out, v_out of shape [t1-t0, Hkv*D] float32 (either may be NULL). */
kvl_status kvl_cache_read_kv(const kvl_cache *cache, int layer, int t0, int t1, float *k_out,
                             float *v_out);

/* Copy the pre-normalisation keys and values (k_proj / v_proj outputs, before k_norm and
 * before RoPE) of layer `layer`, tokens [t0, t1), into [t1-t0, Hkv*D] float32 buffers.
 * For models without k_norm the key is recovered exactly (up to float rounding) by the
 * inverse RoPE rotation of the cached key; for Qwen3 it comes from the Kpre buffer. */
kvl_status kvl_cache_read_prenorm(const kvl_cache *cache, int layer, int t0, int t1,
                                  float *k_out, float *v_out);

/* Every layer's pre-normalisation keys and values of tokens [t0, t1) (as kvl_cache_read_prenorm
 * gives them) rounded to bf16, nearest even: k_out, v_out [n_layers][t1-t0][Hkv*D] uint16_t
 * (caller-owned), the layout of a span sent as bf16.  On the CPU one pass over the blocks, split
 * over the cache's model's threads when they are free (kvld's export of 2048 tokens of qwen3-a,
 * read, rounded and hashed: 0.37 against 0.57 ms read layer by layer and rounded, on 2 cores).
 * An empty range (t0 == t1) reads nothing (the buffers may be NULL).  Errors: KVL_ERR_RANGE
 * (range), KVL_ERR_INVALID_ARG (NULL buffer), KVL_ERR_NOMEM. */
kvl_status kvl_cache_read_prenorm_bf16(const kvl_cache *cache, int t0, int t1, uint16_t *k_out,
                                       uint16_t *v_out);

/* Append tokens [n_tokens, n_tokens + n) given their per-layer entries:
 * k_post, v: [L][n][Hkv*D] (post-norm post-RoPE keys at their absolute positions, values);
 * k_pre: [L][n][Hkv*D] pre-norm keys, required when the model has k_norm, ignored otherwise;
 * ids: [n] token ids (may be NULL: stored as -1).  Atomic: on error nothing is appended.
 * Used by translators to write translated spans.  KVL_ERR_RANGE past capacity. */
kvl_status kvl_cache_append(kvl_cache *cache, int n, const int32_t *ids, const float *k_post,
                            const float *v, const float *k_pre);

#ifdef __cplusplus
}
#endif
#endif
