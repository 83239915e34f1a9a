/* engine/model/model_internal.h: the kvl_model struct.  Private to engine/model: other folders
 * reach a model's weights through kvl_model_weights() (kvlingo/backend.h) and the engine-level
 * helpers of model_iface.h. */
#ifndef KVL_ENGINE_MODEL_INTERNAL_H
#define KVL_ENGINE_MODEL_INTERNAL_H

#include <pthread.h>

#include "kvlingo/backend.h"
#include "kvlingo/model.h"
#include "model_iface.h"

/* One decoder layer's parameters, float32, nn.Linear layout W[out, in] (shapes in backend.h). */
typedef struct kvl__layer_weights {
    float *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *q_norm, *k_norm, *wo, *bo, *mlp_norm,
        *w_gate, *w_up, *w_down;
} kvl__layer_weights;

struct kvl_model {
    kvl_model_config cfg;
    char dir[1024];
    char name[256];
    char hash[17];
    int n_threads;
    kvl_weights_dtype weights_dtype; /* F32 or BF16 (AUTO resolved at load)             */
    kvl_kv_dtype kv_dtype;           /* element type of kvl_model_cache_create's caches  */
    float *embed;                 /* [V, H] model.embed_tokens.weight                  */
    float *final_norm;            /* [H]    model.norm.weight                          */
    float *lm_head;               /* [V, H] lm_head.weight, or == embed when tied      */
    kvl__layer_weights *layers;   /* [L]                                               */
    float *weights_base;          /* one allocation holding every parameter above      */
    size_t weights_floats;
    kvl_weights_view view;        /* the same weights as backends and training read them */
    kvl_layer_view *layer_views;  /* [L] */
    const kvl_backend_ops *ops;   /* the backend the model computes on                 */
    void *be;                     /* its model object                                  */
    pthread_mutex_t lock;         /* serialises forward calls (the backend's scratch)  */
};

/* Sizes table (llm.c style): every parameter's name, shape and destination pointer.  Shared by
 * the checkpoint loader and the random-weights constructor, so both carve the same layout. */
typedef struct kvl__param_spec {
    char name[128];
    int n_dims;
    int64_t shape[2];
    float **dst;
} kvl__param_spec;

/* An empty model of geometry cfg with its sizes table: m->layers allocated, specs[*n_specs]
 * malloc'ed (caller frees), *total the number of floats they need. */
kvl_status kvl__model_alloc(const kvl_model_config *cfg, const kvl_model_params *params,
                            kvl_model **out, kvl__param_spec **specs, int *n_specs, size_t *total);
/* After the weights are in place: build the views and hand them to the chosen backend.
 * `params->weights_dtype` AUTO becomes `auto_dtype` (F32 or BF16) for the backend. */
kvl_status kvl__model_finish(kvl_model *m, const kvl_model_params *params,
                             kvl_weights_dtype auto_dtype);

/* Append n committed tokens (ids may be NULL: -1) to the neutral half of the cache. */
void kvl__cache_commit(kvl_cache *c, int n, const int32_t *ids);

#endif
