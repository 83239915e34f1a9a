/* kernels/cpu/ops_backward.h: CPU backward kernels for translator training, and float64
 * variants of the forward kernels (for the double-precision gradient check).
 *
 * Conventions (as in llm.c, https://github.com/karpathy/llm.c train_gpt2.c): a backward kernel
 * takes the gradients it produces first, then the upstream gradient `dout`, then the forward's
 * own arguments in the forward's order.  Every produced gradient is ACCUMULATED (+=) into its
 * buffer, so a tensor read by several consumers (the normed input read by q, k and v) sums
 * their contributions; callers zero buffers where a fresh gradient is wanted.  Weight
 * gradients are optional (NULL skips them: the target model is frozen, so training asks only
 * for gradients with respect to activations).
 * Shapes use the names of ops.h: T tokens, C channels, K input features, N output features,
 * Hq query heads, Hkv kv heads, D head_dim.  Suffix _f64: the same kernel in double. */
#ifndef KVL_KERNELS_CPU_OPS_BACKWARD_H
#define KVL_KERNELS_CPU_OPS_BACKWARD_H

#include <stddef.h>

#include "kvlingo/rope.h"

/* Forward: out[T,N] = in[T,K] @ W[N,K]^T + bias[N].
 * Backward: dinp[T,K] += dout[T,N] @ W[N,K];  dweight[N,K] += dout^T @ in (if dweight);
 * dbias[N] += sum_t dout (if dbias).  dinp may be NULL. */
void kvl__cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *W, int T, int K, int N);
void kvl__cpu_matmul_backward_f64(double *dinp, double *dweight, double *dbias, const double *dout,
                                 const double *inp, const double *W, int T, int K, int N);

/* Forward: y = w * x * r, r = 1/sqrt(mean(x^2) + eps) per row of [T, C].
 * Backward (derivation: dy/dx of y_i = w_i x_i r):
 *   dx_i += r * (w_i dy_i) - x_i * r^3 / C * sum_j(w_j dy_j x_j);   dw_i += sum_t dy_i x_i r. */
void kvl__cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                              const float *w, int T, int C, float eps);
void kvl__cpu_rmsnorm_backward_f64(double *dinp, double *dweight, const double *dout,
                                  const double *inp, const double *w, int T, int C, double eps);

/* RoPE is a rotation per pair (i, i+D/2) times the attention factor a, so its gradient is the
 * transposed rotation of dout: a R(-angle) dout (KVL_ROPE_TRANSPOSE, ops.h).  In place on dx[T, n_heads, D] at positions pos[T] (rotate_half form, ops.h). */
void kvl__cpu_rope_backward(float *dx, const int *pos, int T, int n_heads, int D,
                            const kvl_rope_params *rope);
void kvl__cpu_rope_backward_f64(double *dx, const int *pos, int T, int n_heads, int D,
                                const kvl_rope_params *rope);

/* Forward: out = silu(gate) * up.  Backward: dgate += dout * up * s (1 + g (1 - s)),
 * s = sigmoid(g);  dup += dout * silu(g). */
void kvl__cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, size_t n);
void kvl__cpu_swiglu_backward_f64(double *dgate, double *dup, const double *dout,
                                 const double *gate, const double *up, size_t n);

/* Causal GQA attention backward (forward in ops.h, kvl__cpu_attention_forward).
 *   dq [Tq, Hq*D], dk [Tk, Hkv*D], dv [Tk, Hkv*D]   accumulated gradients
 *   dout [Tq, Hq*D], probs [Hq, Tq, Tk] (the forward's probabilities, zeros where masked),
 *   q, k, v as in the forward (q after RoPE, k the cached post-RoPE keys).
 * With S = q k^T / sqrt(D), P = softmax(S), O = P V:
 *   dV += P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP));  dq += dS K / sqrt(D);
 *   dK += dS^T q / sqrt(D).
 *   scratch: at least kvl__cpu_attention_backward_scratch(Tq, Tk) elements. */
size_t kvl__cpu_attention_backward_scratch(int Tq, int Tk);
void kvl__cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                const float *probs, const float *q, const float *k, const float *v,
                                int Tq, int Tk, int q_pos0, int Hq, int Hkv, int D, float *scratch);
void kvl__cpu_attention_backward_f64(double *dq, double *dk, double *dv, const double *dout,
                                    const double *probs, const double *q, const double *k,
                                    const double *v, int Tq, int Tk, int q_pos0, int Hq, int Hkv,
                                    int D, double *scratch);

/* Float64 forward kernels, same contracts as their float32 versions in ops.h (RoPE angles in
 * double). */
void kvl__cpu_matmul_forward_f64(double *out, const double *in, const double *W,
                                const double *bias, int T, int K, int N);
void kvl__cpu_rmsnorm_forward_f64(double *out, const double *in, const double *w, int T, int C,
                                 double eps);
void kvl__cpu_rope_forward_f64(double *x, const int *pos, int T, int n_heads, int D,
                               const kvl_rope_params *rope, int mode);
void kvl__cpu_rope_table_f64(double *cos_tab, double *sin_tab, const int *pos, int T, int D,
                             const kvl_rope_params *rope);
void kvl__cpu_rope_apply_f64(double *x, const double *cos_tab, const double *sin_tab, int T,
                             int n_heads, int D, int inverse);
void kvl__cpu_swiglu_forward_f64(double *out, const double *gate, const double *up, size_t n);
void kvl__cpu_attention_forward_f64(double *out, double *probs, const double *q, const double *k,
                                   const double *v, int Tq, int Tk, int q_pos0, int Hq, int Hkv,
                                   int D, double *scratch);

#endif
