/* kernels/cpu/decoder.h: the one decoder layer of the CPU backend, shared by inference (the CPU
 * backend's forward pass) and translator training (the stage-2 core runs the frozen target
 * through the same function, saving activations for its backward pass), as llm.c shares one
 * gpt2_forward.  Written once over a scalar type (decoder.inc): float for inference and
 * training, double for the gradient check, and float activations over bf16 weights for
 * inference with KVL_WEIGHTS_BF16 (same body; only the projections' matmul differs).
 *
 * Math (transformers' Qwen3DecoderLayer / Qwen2DecoderLayer / LlamaDecoderLayer), T tokens:
 *   xn   = RMSNorm(x_in; attn_norm)
 *   qpre = xn Wq^T + bq     kpre = xn Wk^T + bk     v = xn Wv^T + bv
 *   q    = RoPE(q_norm(qpre))   k = RoPE(k_norm(kpre))      (norms only with qk_norm)
 *   att  = attend(q, k, v)   (the caller's attention: it writes K/V where they live)
 *   x_mid = x_in + att Wo^T + bo
 *   x_out = x_mid + W_down (silu(W_gate n) * (W_up n)),  n = RMSNorm(x_mid; mlp_norm)
 * Private to kernels/cpu and engine/translator (through kvl_cpu_kernels_iface). */
#ifndef KVL_KERNELS_CPU_DECODER_H
#define KVL_KERNELS_CPU_DECODER_H

#include <stdint.h>

#include "kvlingo/backend.h"
#include "matmul_bf16.h"
#include "pool.h"

/* The float64 twin of kvl_layer_view (same members), for the gradient check. */
typedef struct kvl__layer_view_f64 {
    const double *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *q_norm, *k_norm, *wo, *bo,
        *mlp_norm, *w_gate, *w_up, *w_down;
} kvl__layer_view_f64;

/* The bf16-weight view of a layer (the CPU backend's KVL_WEIGHTS_BF16 inference path): the
 * big matrices as bf16 bits, norms and biases float32 (same members as kvl_layer_view), and
 * the execution context of its matmuls (kvl__cpu_matmul_bf16: thread pool and scratch). */
typedef struct kvl__layer_view_bf16 {
    const float *attn_norm;
    const uint16_t *wq, *wk, *wv;
    const float *bq, *bk, *bv, *q_norm, *k_norm;
    const uint16_t *wo;
    const float *bo, *mlp_norm;
    const uint16_t *w_gate, *w_up, *w_down;
    const kvl__bf16_exec *exec;
} kvl__layer_view_bf16;

/* The float32 inference view of a layer (the CPU backend's forward in float32 mode): the host
 * view's tensors (same members as kvl_layer_view) and the pool its decode-sized matmuls split
 * over (kvl__cpu_matmul_f32; *pool NULL: the caller alone).  Training keeps kvl_layer_view,
 * whose matmuls are OpenBLAS's. */
typedef struct kvl__layer_view_f32p {
    const float *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *q_norm, *k_norm, *wo, *bo,
        *mlp_norm, *w_gate, *w_up, *w_down;
    kvl__pool *const *pool;
} kvl__layer_view_f32p;

/* Activation buffers of one layer over T tokens.  Aliasing allowed where noted:
 *   x_in [T,H]; x_mid [T,H] (may alias x_in); x_out [T,H] (may alias x_mid); xn [T,H] scratch;
 *   qpre [T,Hq*D], q [T,Hq*D] (q may alias qpre); kpre [T,Hkv*D], k [T,Hkv*D] (k may alias
 *   kpre only without qk_norm); v [T,Hkv*D]; att [T,Hq*D]; gate, up [T,F]; h [T,F] (may
 *   alias gate). */
#define KVL__DECODER_DECLARE(R, SFX, LAYER)                                                       \
    typedef struct kvl__decoder_acts_##SFX {                                                      \
        const R *x_in;                                                                            \
        R *x_mid, *x_out, *xn, *qpre, *q, *kpre, *k, *v, *att, *gate, *up, *h;                    \
    } kvl__decoder_acts_##SFX;                                                                    \
    /* Attention of the layer's T new tokens: q [T,Hq*D] after norm and RoPE, k/kpre/v their     \
     * keys and values (to be stored wherever the caller keeps its cache); writes att [T,Hq*D]. */ \
    typedef void (*kvl__attend_fn_##SFX)(void *ctx, int layer, int T, const R *q, const R *k,     \
                                         const R *kpre, const R *v, R *att);                      \
    /* One decoder layer over T tokens; rope_cos/rope_sin [T, D/2] the tokens' RoPE angles.     */ \
    void kvl__cpu_decoder_layer_forward_##SFX(const LAYER *w, const kvl_model_config *c, int layer, \
                                              int T, const R *rope_cos, const R *rope_sin,        \
                                              const kvl__decoder_acts_##SFX *a,                   \
                                              kvl__attend_fn_##SFX attend, void *ctx);

KVL__DECODER_DECLARE(float, f32, kvl_layer_view)
KVL__DECODER_DECLARE(double, f64, kvl__layer_view_f64)
KVL__DECODER_DECLARE(float, bf16, kvl__layer_view_bf16)
KVL__DECODER_DECLARE(float, f32p, kvl__layer_view_f32p)

#endif
