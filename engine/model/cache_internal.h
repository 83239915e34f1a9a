/* engine/model/cache_internal.h: the backend-neutral part of kvl_cache (token ids, counts,
 * capacity) and the handle of its backend storage.  Private to engine/model. */
#ifndef KVL_ENGINE_MODEL_CACHE_INTERNAL_H
#define KVL_ENGINE_MODEL_CACHE_INTERNAL_H

#include "kvlingo/backend.h"
#include "kvlingo/cache.h"

struct kvl_cache {
    kvl_model_config cfg;
    const kvl_backend_ops *ops;   /* the backend holding the K/V storage              */
    void *be;                     /* its cache object                                 */
    void *bm;                     /* the backend model it serves (NULL: CPU caches made
                                   * from a geometry alone)                           */
    int capacity;                 /* max tokens                                       */
    int n_tokens;                 /* tokens held: [0, n_tokens)                       */
    int32_t *ids;                 /* [capacity] token ids                             */
};

#endif
