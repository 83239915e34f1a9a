/* kvlingo/kv_maps.h: KV-Lingo per-layer maps as plain in-memory arrays, a random initialiser
 * (benchmarks: SHAPE pairs without a trained translator) and a host reference apply.
 *
 * This is the unowned "view" form of a translator (include/kvlingo/translator.h holds the file
 * format, metadata and training); the CUDA backend (include/kvlingo/cuda.h) uploads maps in this
 * form.  Math (kvlingo/translator.h), for target layer l, token at position p:
 *     k_pre_t = W_K[l] k_s(l)          k_t = RoPE_T(k_norm_T(k_pre_t), p)          v_t = W_V[l] v_s(l)
 */
#ifndef KVLINGO_KV_MAPS_H
#define KVLINGO_KV_MAPS_H

#include <stdint.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvl_kv_maps {
    int src_layers, src_kv_heads, src_head_dim;   /* Ls, Hs, Ds                                  */
    int dst_layers, dst_kv_heads, dst_head_dim;   /* Lt, Ht, Dt                                  */
    int *layer_map;   /* [Lt] source layer s(l) of target layer l                               */
    float *wk;        /* [Lt][Ht*Dt][Hs*Ds] float32, row-major (nn.Linear layout, bias-free)     */
    float *wv;        /* [Lt][Ht*Dt][Hs*Ds]                                                       */
    int owned;        /* 1 when the arrays were allocated by kvl_kv_maps_random (free them)      */
    /* Optional, read-only: wk and wv transposed, [Lt][Hs*Ds][Ht*Dt] each, for kernels that read
     * the maps input-major (the CPU's fused rows); NULL, and a kernel transposes what it needs
     * per span.  Must equal the transpose of wk / wv when set (a translator keeps them so, at
     * the maps' size again).  Zero-initialise the struct ({0}) when filling it by hand. */
    const float *wkT, *wvT;
    /* Optional, read-only, with wkT / wvT: wk and wv as bf16 pairs, [Lt][(Hs*Ds)/2][Ht*Dt][2]
     * uint16 each (element [l][j/2][i][j%2] = W[l][i][j] rounded to bf16, nearest even),
     * Hs*Ds even.  When set, a CPU with AVX512_BF16 takes bf16 products on the fused rows,
     * into float32 and bf16 caches alike (the source rows rounded to bf16 too, float32 sums:
     * half the multiply instructions; kvl_translator_set_bf16_products says how far results
     * move).  NULL: float32 products. */
    const uint16_t *wkP, *wvP;
} kvl_kv_maps;

/* Maps of the right shape for src -> dst with the default layer map
 * s(l) = round(l (Ls-1) / (Lt-1)) and weights uniform with standard deviation
 * 1/sqrt(Hs*Ds) (keeps the translated K/V at the scale of the source's), from a
 * splitmix64 stream seeded with `seed`.  Free with kvl_kv_maps_free.  KVL_ERR_NOMEM. */
kvl_status kvl_kv_maps_random(const kvl_model_config *src, const kvl_model_config *dst,
                              uint64_t seed, kvl_kv_maps *out);
void kvl_kv_maps_free(kvl_kv_maps *maps);

/* Host reference: read tokens [t0, t1) of `src` (pre-norm K/V, kvl_cache_read_prenorm), apply
 * the maps with `dst_model`'s k_norm weights, eps and RoPE theta, and append the result to `dst`
 * (which must hold exactly t0 tokens: KVL_ERR_RANGE otherwise).  Float32 throughout.
 * Errors: KVL_ERR_MISMATCH (geometry of maps vs caches/model), KVL_ERR_RANGE, KVL_ERR_NOMEM. */
kvl_status kvl_kv_maps_apply_host(const kvl_kv_maps *maps, const kvl_model *dst_model,
                                  const kvl_cache *src, int t0, int t1, kvl_cache *dst);

#ifdef __cplusplus
}
#endif
#endif
