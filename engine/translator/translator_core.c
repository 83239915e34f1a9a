/* engine/translator/translator_core.c: instantiates the stage-2 training core (translator_core.inc) for
 * float (training) and double (gradient check), and the float view of a loaded model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ops_backward.h"
#include "error.h"
#include "model_internal.h"
#include "translator_internal.h"

#define R float
#define SFX f32
#define CAT(a) a##_f32
#define FWD(name) name
#define BWD(name) name
#include "translator_core.inc"
#undef R
#undef SFX
#undef CAT
#undef FWD
#undef BWD

#define R double
#define SFX f64
#define CAT(a) a##_f64
#define FWD(name) name##_f64
#define BWD(name) name##_f64
#include "translator_core.inc"

kvl_status kvl__tnet_from_model_f32(const kvl_model *m, kvl__tnet_f32 *out) {
    memset(out, 0, sizeof *out);
    int L = m->cfg.n_layers;
    kvl__tlayer_f32 *ls = calloc((size_t)L, sizeof *ls);
    if (!ls) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    for (int l = 0; l < L; l++) {
        const kvl__layer_weights *w = &m->layers[l];
        ls[l] = (kvl__tlayer_f32){w->attn_norm, w->wq, w->wk, w->wv, w->bq, w->bk, w->bv, w->q_norm,
                                 w->k_norm, w->wo, w->bo, w->mlp_norm, w->w_gate, w->w_up, w->w_down};
    }
    out->cfg = m->cfg;
    out->embed = m->embed;
    out->final_norm = m->final_norm;
    out->lm_head = m->lm_head;
    out->layers = ls;
    return KVL_OK;
}

void kvl__tnet_free_f32(kvl__tnet_f32 *net) {
    if (!net) return;
    free((void *)net->layers);
    net->layers = NULL;
}
