/* engine/model/model_iface.h: what engine/model offers the engine's other folders (the
 * translators) beyond the public API; reached through the INTERFACE target kvl_model_iface. */
#ifndef KVL_ENGINE_MODEL_IFACE_H
#define KVL_ENGINE_MODEL_IFACE_H

#include "kvlingo/backend.h"
#include "kvlingo/cache.h"

/* Translate a source span into `dst` on dst's backend (prepare, apply straight into its storage,
 * release) and commit its n token ids.  k_src, v_src: [Ls][n][Hs*Ds]; dst must hold t0 tokens,
 * where the span starts (checked by the caller).  On error dst is unchanged. */
kvl_status kvl__cache_translate(kvl_cache *dst, const kvl_translate_params *p, const float *k_src,
                                const float *v_src, int n, const int32_t *ids);

/* The same from bf16 source rows (k_src16, v_src16 [Ls][n][Hs*Ds] uint16_t), on a backend that
 * takes them (kvl_backend_ops.translate_apply_bf16); KVL_ERR_UNSUPPORTED, dst unchanged, where
 * it does not or this translation takes float32 products (the caller widens the rows). */
kvl_status kvl__cache_translate_bf16(kvl_cache *dst, const kvl_translate_params *p,
                                     const uint16_t *k_src16, const uint16_t *v_src16, int n,
                                     const int32_t *ids);

/* The backend a cache lives on and the backend model it serves (NULL for CPU caches made
 * from a geometry), to prepare a translation once for that target (ops->translate_prepare). */
void kvl__cache_backend(const kvl_cache *c, const kvl_backend_ops **ops, void **bm);

/* Apply a translation prepared for dst's backend (kvl__cache_backend) into dst and commit its
 * n token ids; as kvl__cache_translate otherwise. */
kvl_status kvl__cache_translate_prepared(kvl_cache *dst, void *prepared, const float *k_src,
                                         const float *v_src, int n, const int32_t *ids);

/* The BLAS thread count a model's forward uses (0 = library default); returns the old value.
 * Training sets 1 while its own threads run forwards in parallel. */
int kvl__model_set_threads(kvl_model *m, int n_threads);

#endif
