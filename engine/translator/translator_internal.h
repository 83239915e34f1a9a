/* engine/translator/translator_internal.h: the translator struct and the training core, shared by the
 * engine's translator files (translator.c, translator_ridge.c, translator_train.c,
 * translator_eval.c) and the unit tests.  Not a public header. */
#ifndef KVL_ENGINE_TRANSLATOR_INTERNAL_H
#define KVL_ENGINE_TRANSLATOR_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "decoder.h"
#include "kvlingo/backend.h"
#include "kvlingo/model.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/translator.h"

struct kvl_translator {
    int src_layers, src_kv_heads, src_head_dim;   /* Ls, Hs, Ds */
    int dst_layers, dst_kv_heads, dst_head_dim;   /* Lt, Ht, Dt */
    int dst_qk_norm;                              /* target applies k_norm               */
    int taps;                                     /* T: source layers each target layer reads */
    int *layer_map;                               /* [Lt][T] source layers of target layer l */
    int *ident_map;                               /* [Lt] 0..Lt-1: the apply view when T > 1 */
    float *wk, *wv;                               /* [Lt][Ht*Dt][T*Hs*Ds] each           */
    float *k_norm;                                /* [Lt][Dt] target k_norm weights, or NULL */
    float k_norm_eps;
    int n_meta;
    char **meta_keys, **meta_vals;                /* [n_meta] owned strings              */
    /* The maps prepared for the last device target model they were applied on (a GPU backend
     * uploads them once, not per span; the device copies what it needs, so the view used to
     * prepare may go); guarded by prep_lock, which is held while a device applies them. */
    pthread_mutex_t prep_lock;
    const kvl_backend_ops *prep_ops;
    void *prep_bm;
    void *prep;
    unsigned prep_gen;                            /* maps_gen when prep was made             */
    /* wk and wv transposed, [2][Lt][T*Hs*Ds][Ht*Dt] (the kv_maps view's wkT, wvT): made at the
     * first apply after the maps changed, under prep_lock; NULL until then */
    float *wT;
    unsigned wT_gen;                              /* maps_gen when wT was made               */
    /* wk and wv as bf16 pairs, [2][Lt][din/2][dt][2] (the kv_maps view's wkP, wvP), made with wT
     * when din is even; NULL otherwise or until then */
    uint16_t *wP;
    int bf16_products;                            /* kvl_translator_set_bf16_products        */
    unsigned maps_gen;                            /* bumped by every write of wk / wv        */
};

/* The maps were (or are about to be) written: prepared forms (wT, a device's prep) are made again
 * at the next apply.  Every writer of wk / wv calls it (the writable accessors do). */
static inline void kvl__tr_maps_changed(kvl_translator *t) {
    __atomic_add_fetch(&t->maps_gen, 1, __ATOMIC_RELEASE);
}

/* Bounds on a loaded translator's maps (its metadata's geometry is checked against them before
 * anything is allocated): a map's input or output width (features), and its weights per side
 * (keys or values) over all target layers: 2^31 floats, 8 GB. */
#define KVL_TR_MAX_WIDTH (1LL << 20)
#define KVL_TR_MAX_WEIGHTS (1LL << 31)

/* Feature widths: one source layer's Hs*Ds, a map's input T*Hs*Ds, the target's Ht*Dt. */
static inline int kvl__tr_ds(const kvl_translator *t) { return t->src_kv_heads * t->src_head_dim; }
static inline int kvl__tr_din(const kvl_translator *t) { return t->taps * kvl__tr_ds(t); }
static inline int kvl__tr_dt(const kvl_translator *t) { return t->dst_kv_heads * t->dst_head_dim; }

/* Source pre-norm K/V of tokens [t0, t1) of every layer, [Ls][n][per / n] float32 each, per =
 * n * Hs*Ds (malloc'ed; the caller frees both).  KVL_ERR_NOMEM, or the cache's read error. */
kvl_status kvl__tr_read_span(const kvl_cache *src, int Ls, size_t per, int t0, int t1, float **k,
                             float **v);

/* Default layer map s(l) = round(l (Ls-1) / (Lt-1)) (kvlingo/translator.h). */
int kvl__tr_default_source_layer(int l, int Ls, int Lt);
/* Default taps of target layer l: the T source layers nearest to l (Ls-1)/(Lt-1), ascending
 * (T = 1 gives kvl__tr_default_source_layer).  out: [T]. */
void kvl__tr_default_sources(int l, int Ls, int Lt, int T, int *out);

/* The map input of target layer l for n tokens, from one side (keys or values) of a span:
 *   x:   [Ls][n][Hs*Ds] float32, every source layer (kvl_translator_apply's k_src layout)
 *   out: [n][T*Hs*Ds], row t = [x[s(l,0)][t] | ... | x[s(l,T-1)][t]] */
void kvl__tr_gather(const kvl_translator *tr, int l, const float *x, int n, float *out);
/* Tensor `name` of a translator file at path, of shape [d0] (nd 1) or [d0, d1] (nd 2), into
 * dst as float32, every value finite; errors name the file and the tensor (translator.c). */
kvl_status kvl__tr_load_tensor(const kvl_safetensors *st, const char *path, const char *name, int nd,
                               int64_t d0, int64_t d1, float *dst);

/* ---- training core, generic over the scalar type (float: training; double: grad check) ---- */

/* A frozen target network as the training core reads it: for float, the model's own host
 * weights (kvlingo/backend.h kvl_weights_view); for double (the gradient check), the same
 * members in double.  The decoder layer is the CPU backend's (kernels/cpu/decoder.h). */
typedef kvl_layer_view kvl__tlayer_f32;
typedef kvl_weights_view kvl__tnet_f32;
typedef kvl__layer_view_f64 kvl__tlayer_f64;
typedef struct kvl__tnet_f64 {
    kvl_model_config cfg;
    const double *embed, *final_norm, *lm_head;
    const kvl__tlayer_f64 *layers;
} kvl__tnet_f64;

#define KVL_TR_DECLARE(R, SFX)                                                                    \
    /* One distillation sample.  The translated cache holds n_ctx prefix tokens at positions    \
     * 0..n_ctx-1; the target reads tokens[n_read] at positions n_ctx..n_ctx+n_read-1 and is    \
     * scored against teacher_logits[n_read, V] (the target's own logits at those positions    \
     * when it read the prefix natively).  xk, xv: [Lt][n_ctx][Hs*Ds] source pre-norm keys /    \
     * values already routed through the layer map (row l holds source layer s(l)). */          \
    typedef struct kvl__tsample_##SFX {                                                            \
        int n_ctx, n_read;                                                                        \
        const int32_t *tokens;                                                                    \
        const R *teacher_logits;                                                                  \
        const R *xk, *xv;                                                                         \
    } kvl__tsample_##SFX;                                                                          \
    typedef struct kvl__tws_##SFX kvl__tws_##SFX;                                                   \
    /* Workspace for samples of at most max_ctx prefix and max_read read tokens. */              \
    kvl_status kvl__tws_create_##SFX(const kvl_model_config *cfg, int ds, int max_ctx,             \
                                    int max_read, kvl__tws_##SFX **out);                           \
    void kvl__tws_free_##SFX(kvl__tws_##SFX *ws);                                                   \
    size_t kvl__tws_bytes_##SFX(const kvl__tws_##SFX *ws);                                          \
    /* Forward (and backward when dwk != NULL) of one sample.  wk, wv: [Lt][Dt][Ds] maps;        \
     * dwk, dwv: same shape, gradients of the returned loss ACCUMULATED (scaled by grad_scale). \
     * Returns the loss: mean over the n_read tokens of KL(teacher || student), in nats.        \
     * *agree (may be NULL) receives the count of tokens whose argmax agrees with the teacher. */ \
    double kvl__tr_step_##SFX(const kvl__tnet_##SFX *net, int ds, const R *wk, const R *wv,         \
                             const kvl__tsample_##SFX *s, R *dwk, R *dwv, double grad_scale,       \
                             kvl__tws_##SFX *ws, int *agree);

KVL_TR_DECLARE(float, f32)
KVL_TR_DECLARE(double, f64)


#endif
