/* engine/model/model_internal.h: the model's weights and scratch, shared by the engine's files
 * (forward pass, translator training).  Not a public header. */
#ifndef KVL_ENGINE_MODEL_INTERNAL_H
#define KVL_ENGINE_MODEL_INTERNAL_H

#include <pthread.h>

#include "kvlingo/model.h"

/* One decoder layer's parameters, float32, nn.Linear layout W[out, in]. */
typedef struct kvl__layer_weights {
    float *attn_norm;   /* [H]           input_layernorm.weight                  */
    float *wq;          /* [Hq*D, H]     self_attn.q_proj.weight                 */
    float *wk;          /* [Hkv*D, H]    self_attn.k_proj.weight                 */
    float *wv;          /* [Hkv*D, H]    self_attn.v_proj.weight                 */
    float *bq;          /* [Hq*D]        q_proj.bias, NULL without bias           */
    float *bk;          /* [Hkv*D]                                               */
    float *bv;          /* [Hkv*D]                                               */
    float *q_norm;      /* [D]           self_attn.q_norm.weight (Qwen3), else NULL */
    float *k_norm;      /* [D]           self_attn.k_norm.weight (Qwen3), else NULL */
    float *wo;          /* [H, Hq*D]     self_attn.o_proj.weight                 */
    float *bo;          /* [H]           o_proj.bias or NULL                      */
    float *mlp_norm;    /* [H]           post_attention_layernorm.weight          */
    float *w_gate;      /* [F, H]        mlp.gate_proj.weight                     */
    float *w_up;        /* [F, H]        mlp.up_proj.weight                       */
    float *w_down;      /* [H, F]        mlp.down_proj.weight                     */
} kvl__layer_weights;

/* Activation scratch for one forward call, carved from one allocation (grown as needed). */
typedef struct kvl__scratch {
    float *base;
    size_t cap_floats;
    int cap_tokens;     /* tokens the carve below was sized for */
    int cap_ctx;        /* attention context the carve was sized for */
    float *x;           /* [T, H]      residual stream          */
    float *xn;          /* [T, H]      normed input             */
    float *q;           /* [T, Hq*D]                            */
    float *k;           /* [T, Hkv*D]  post-norm post-RoPE      */
    float *kpre;        /* [T, Hkv*D]  k_proj output            */
    float *v;           /* [T, Hkv*D]                           */
    float *att;         /* [T, Hq*D]   attention output         */
    float *gate;        /* [T, F]                               */
    float *up;          /* [T, F]                               */
    float *kctx;        /* [ctx, Hkv*D] gathered keys of one sequence   */
    float *vctx;        /* [ctx, Hkv*D] gathered values                  */
    float *scores;      /* attention scratch                             */
    float *logit_x;     /* [T, H] rows that need logits (normed)         */
    int *pos;           /* [T] positions                                 */
    float **kblk;       /* [ctx blocks] block pointers for decode attention */
    float **vblk;
    float *rope_cos;    /* [T, D/2] RoPE angles of the batch's tokens */
    float *rope_sin;    /* [T, D/2] */
} kvl__scratch;

struct kvl_model {
    kvl_model_config cfg;
    char dir[1024];
    char name[256];
    char hash[17];
    int n_threads;
    float *embed;        /* [V, H] model.embed_tokens.weight       */
    float *final_norm;   /* [H]    model.norm.weight               */
    float *lm_head;      /* [V, H] lm_head.weight, or == embed when tied */
    kvl__layer_weights *layers;   /* [L] */
    float *weights_base; /* one allocation holding every parameter above */
    size_t weights_floats;
    pthread_mutex_t lock;   /* serialises forward calls (shared scratch) */
    kvl__scratch scratch;
};

#endif
