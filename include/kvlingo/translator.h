/* kvlingo/translator.h: KV-Lingo translators, which turn a source model's keys and values into
 * cache entries a target model reads as its own (the KV-Lingo method, below).
 *
 * A translator holds, per target layer l, two bias-free maps W_K[l], W_V[l] of shape
 * [Ht*Dt, Hs*Ds] (float32 in memory) and a layer map s(l) (default round(l*(Ls-1)/(Lt-1))).
 * For a source token at absolute position p with pre-norm key k_s and value v_s (the source's
 * k_proj / v_proj outputs at layer s(l)):
 *     k_pre_t = W_K[l] k_s                       (kept as the target's pre-norm key)
 *     k_t     = RoPE_T(k_norm_T(k_pre_t), p)     (k_norm only when the target has one)
 *     v_t     = W_V[l] v_s
 * and (k_t, v_t, k_pre_t) are appended to the target's cache at position p.
 *
 * Multi-layer maps (metadata `source_taps` T > 1): target layer l reads T source layers
 * s(l,0) < ... < s(l,T-1), and the maps act on their concatenation, still linear per token:
 *     k_pre_t = W_K[l] [k_s(l,0); ...; k_s(l,T-1)]     W_K[l], W_V[l]: [Ht*Dt, T*Hs*Ds]
 * (the same for v), so a small source's few features per layer are not the map's limit.
 *
 * File format: safetensors with tensors `layers.{l}.k.weight`, `layers.{l}.v.weight`
 * ([Ht*Dt, T*Hs*Ds], F32 or BF16) and string metadata (see kvl_translator_save).
 */
#ifndef KVLINGO_TRANSLATOR_H
#define KVLINGO_TRANSLATOR_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvl_translator kvl_translator;

/* Load and validate a translator file: tensor names/shapes consistent with the geometry in its
 * metadata, finite weights (NaN/Inf -> KVL_ERR_NUMERIC naming the tensor).  Free with
 * kvl_translator_free. */
kvl_status kvl_translator_load(const char *path, kvl_translator **out);
void kvl_translator_free(kvl_translator *tr);

/* Import a translator in the plain layout other tools write: tensors `layers.{l}.k.weight` and
 * `layers.{l}.v.weight` ([Ht*Dt, T*Hs*Ds], F32/BF16/F16) for each target layer, metadata
 * `layer_map` ("0,1,2" or "[0, 1, 2]": one source layer per target layer; "[[0, 1], [1, 2]]" or
 * "0+1,1+2": T ascending source layers per target layer, the same T for all) and no `format` key.
 * The geometry is checked against `src` and `dst` (KVL_ERR_MISMATCH naming the tensor), the
 * target's k_norm is taken from `dst`, and the identity metadata of both models is written, so
 * kvl_translator_save gives a kvlingo translator file.  Free with kvl_translator_free. */
kvl_status kvl_translator_import_plain(const char *path, const kvl_model *src, const kvl_model *dst,
                                       kvl_translator **out);

/* Check that `tr` translates from `src` to `dst`: geometry (layers, kv heads, head_dim) must
 * match both models, and the model hashes in the metadata must equal kvl_model_hash() unless
 * the metadata has none.  KVL_ERR_MISMATCH with a message naming the field otherwise. */
kvl_status kvl_translator_check(const kvl_translator *tr, const kvl_model *src, const kvl_model *dst);

/* Identity of the pair, from the metadata (owned by tr). */
const char *kvl_translator_source_name(const kvl_translator *tr);
const char *kvl_translator_target_name(const kvl_translator *tr);
const char *kvl_translator_source_hash(const kvl_translator *tr);
const char *kvl_translator_target_hash(const kvl_translator *tr);
/* Metadata value by key (NULL if absent), e.g. "eval" (JSON figures). */
const char *kvl_translator_metadata(const kvl_translator *tr, const char *key);

/* Translate a span of source pre-norm K/V and append it to the target cache.
 *   k_src, v_src: [Ls][n][Hs*Ds] float32, the source's k_proj / v_proj outputs of tokens at
 *                 absolute positions [t0, t0+n) for every source layer (as kvl_cache_read_prenorm
 *                 gives them, layer after layer)
 *   ids:          [n] token ids (may be NULL)
 *   dst:          target cache holding exactly t0 tokens (else KVL_ERR_RANGE)
 * Atomic: on error dst is unchanged.  Errors: KVL_ERR_MISMATCH (geometry of dst), KVL_ERR_RANGE,
 * KVL_ERR_NOMEM. */
kvl_status kvl_translator_apply(const kvl_translator *tr, const float *k_src, const float *v_src,
                                int t0, int n, const int32_t *ids, kvl_cache *dst);

/* kvl_translator_apply from bf16 source rows: k_src16, v_src16 [Ls][n][Hs*Ds] uint16_t (bf16 bit
 * patterns, as a span sent as bf16 carries them), otherwise as kvl_translator_apply.  Where the
 * apply takes bf16 products (kvl_translator_bf16_products) the rows are multiplied as they are,
 * with no float32 copy (the products round float32 rows to bf16 first, so the cache gets the
 * same bytes as from the rows widened, for finite rows); elsewhere they are widened (exactly) into a temporary
 * copy of 2 * Ls * n * Hs*Ds floats and applied.  Atomic: on error dst is unchanged.  Errors as
 * kvl_translator_apply. */
kvl_status kvl_translator_apply_bf16(const kvl_translator *tr, const uint16_t *k_src16,
                                     const uint16_t *v_src16, int t0, int n, const int32_t *ids,
                                     kvl_cache *dst);

/* The maps' products on the CPU: on (the default), a CPU with AVX512_BF16 multiplies in bf16 (the
 * maps and the source rows rounded to bf16, nearest even; products exact, sums in float32 in
 * pairs; half the multiply instructions: a 2048-token span qwen3-a -> qwen3-b 3.2-3.4 against
 * 4.1 ms on a 2-core Zen 4); off, or KVL_CPU_TRANSLATE=f32 in the environment, float32
 * throughout.  A translated value moves by up to ~2^-8 of the sum of its terms' magnitudes, far
 * below the maps' own error against the target's native K/V (`kvlingo translator eval` of
 * qwen3-a -> qwen3-b: translated perplexity 38.811 either way).  Other CPUs and GPUs take
 * float32 products either way.  Not thread-safe against a concurrent apply. */
void kvl_translator_set_bf16_products(kvl_translator *tr, int on);

/* 1 when kvl_translator_apply into caches of `target` takes the bf16 products (the setting
 * above, this CPU, the target's backend and geometry), else 0: a span sent to it may then
 * travel as bf16 at no cost to the translation. */
int kvl_translator_bf16_products(const kvl_translator *tr, const kvl_model *target);

/* Convenience: read tokens [t0, t1) of `src` (pre-norm K/V) and kvl_translator_apply them to
 * `dst` (which must hold exactly t0 tokens); where the apply takes bf16 products, read as bf16
 * (kvl_cache_read_prenorm_bf16) and kvl_translator_apply_bf16'd: the same cache, half the bytes
 * read, as a node pulling the span from a peer does. */
kvl_status kvl_translator_translate_span(const kvl_translator *tr, const kvl_cache *src, int t0,
                                         int t1, kvl_cache *dst);

#ifdef __cplusplus
}
#endif
#endif
