/* kernels/cpu/ops.h: CPU reference kernels of the forward pass (float32, row-major).
 *
 * Each kernel documents its shapes with named dimensions: T tokens, C channels, H hidden,
 * Hq query heads, Hkv kv heads, D head_dim, N output features, K input features.
 * Formulas follow transformers' modeling_qwen3.py / modeling_llama.py (noted per kernel).
 * Backward kernels (translator training) sit beside their forward with the same argument
 * order, as in llm.c. */
#ifndef KVL_KERNELS_CPU_OPS_H
#define KVL_KERNELS_CPU_OPS_H

#include <stdint.h>

#include <stddef.h>

#include "kvlingo/rope.h"

/* out[T,N] = in[T,K] @ W[N,K]^T + bias[N] (bias may be NULL).  nn.Linear layout.  OpenBLAS sgemm. */
void kvl__cpu_matmul_forward(float *out, const float *in, const float *W, const float *bias,
                            int T, int K, int N);

/* out[T,C] = in[T,C] / sqrt(mean(in^2) + eps) * w[C]   (Qwen3RMSNorm; variance in float32).
 * out may alias in. */
void kvl__cpu_rmsnorm_forward(float *out, const float *in, const float *w, int T, int C, float eps);

/* RoPE angles for one position: cos/sin[D/2] = a * cos/sin(float(pos) * inv_freq[i]), with
 * inv_freq and the attention factor a from kvl_rope_inv_freq (kvlingo/rope.h: transformers'
 * ROPE_INIT_FUNCTIONS in float32; `cos = cos * attention_scaling`), seq_len = pos + 1. */
void kvl__cpu_rope_angles(float *cos_out, float *sin_out, int pos, int D,
                          const kvl_rope_params *rope);

/* Modes of kvl__cpu_rope_forward. */
#define KVL_ROPE_FORWARD 0     /* x' = a R(angle) x: what attention reads                   */
#define KVL_ROPE_INVERSE 1     /* x' = R(-angle) x / a: recovers the pre-RoPE vector        */
#define KVL_ROPE_TRANSPOSE 2   /* x' = a R(-angle) x: the gradient of FORWARD               */

/* In-place rotary embedding of x[T, n_heads, D] at positions pos[T] (rotate_half form: element i
 * pairs with i + D/2): x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, cos/sin as
 * kvl__cpu_rope_angles, all positions with the inv_freq of seq_len = max(pos) + 1 (one call). */
void kvl__cpu_rope_forward(float *x, const int *pos, int T, int n_heads, int D,
                          const kvl_rope_params *rope, int mode);

/* out[n] = silu(gate[n]) * up[n], silu(x) = x / (1 + exp(-x)).  out may alias gate. */
void kvl__cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n);

/* Causal GQA attention of Tq queries over Tk cached keys/values.
 *   q   [Tq, Hq*D]   queries (after q_norm and RoPE), query i sits at absolute position q_pos0 + i
 *   k   [Tk, Hkv*D]  keys of positions 0..Tk-1 (Tk >= q_pos0 + Tq)
 *   v   [Tk, Hkv*D]
 *   out [Tq, Hq*D]   softmax(q k^T / sqrt(D) + causal mask) v; head h reads kv head h / (Hq/Hkv)
 *   scratch: at least kvl__cpu_attention_scratch(Tq, Tk) floats.
 *   probs (optional, may be NULL): [Hq, Tq, Tk] receives the attention probabilities (zeros
 *   above the causal diagonal), for the backward pass. */
size_t kvl__cpu_attention_scratch(int Tq, int Tk);
void kvl__cpu_attention_forward(float *out, float *probs, const float *q, const float *k,
                               const float *v, int Tq, int Tk, int q_pos0, int Hq, int Hkv, int D,
                               float *scratch);

/* In-place softmax over each row of x[rows, n]. */
void kvl__cpu_softmax_rows(float *x, int rows, int n);

/* Set OpenBLAS's thread count for the process (n_threads <= 0: leave it) and return the count
 * it had, so a caller can put it back. */
int kvl__cpu_set_threads(int n_threads);

/* The kernel set OpenBLAS runs on this CPU ("SkylakeX", "Haswell", ...; static storage).  When
 * OpenBLAS picked one weaker than the CPU's features allow, the process ran itself again with
 * OPENBLAS_CORETYPE set (blas_core.c). */
const char *kvl__cpu_blas_core(void);


/* Single-query attention (decode) read straight from cache blocks, no gather.
 *   q       [Hq*D]    the query at absolute position Tk-1 (after q_norm and RoPE)
 *   k_blk   [n_blocks] pointers to each block's keys of this layer: [block_tokens, Hkv*D]
 *   v_blk   [n_blocks] likewise for values
 *   out     [Hq*D]
 *   scratch at least (Hq/Hkv)*Tk floats.  Same math as kvl__cpu_attention_forward with Tq = 1
 *   (16-lane partial sums: equal up to float rounding).  Source: attention_decode.c. */
void kvl__cpu_attention_decode_blocks(float *out, const float *q, const float *const *k_blk,
                                      const float *const *v_blk, int block_tokens, int Tk, int Hq,
                                      int Hkv, int D, float *scratch);

/* The same for one KV head g and the `group` query heads sharing it (GQA), the unit a batched
 * decode step splits over threads.
 *   q        [group*D]   queries of heads g*group .. g*group+group-1
 *   k_blk[b] + head_off  keys of block b, rows of `row` floats ([block_tokens, row]); head_off = g*D
 *   out      [group*D];  scratch at least group*Tk floats. */
void kvl__cpu_attention_decode_group(float *out, const float *q, const float *const *k_blk,
                                     const float *const *v_blk, int block_tokens, int row,
                                     int head_off, int Tk, int group, int D, float *scratch);

/* The same over a bf16 KV cache: k_blk / v_blk rows are bf16 (uint16_t), widened exactly to
 * float32 as they are read; scores, softmax and the weighted sum in float32 as above.  Where
 * the CPU has AVX-512F and D is a multiple of 16 up to 128, the sixteen-keys-a-pass form;
 * elsewhere a portable form that widens one row at a time.  D <= KVL__ATT_BF16_MAX_D. */
#define KVL__ATT_BF16_MAX_D 512
void kvl__cpu_attention_decode_group_bf16(float *out, const float *q, const uint16_t *const *k_blk,
                                          const uint16_t *const *v_blk, int block_tokens, int row,
                                          int head_off, int Tk, int group, int D, float *scratch);

/* Causal prefill attention of n_rows query rows read straight from cache blocks, for one KV head
 * g and its `group` query heads (the unit a prefill chunk splits over threads).
 *   q, out   row i's heads of the group at q + i*ldq (ldq = Hq*D floats; q pre-offset to head
 *            g*group), [group*D] each; row i sits at absolute position p0 + i and sees keys
 *            [0, p0 + i + 1) (the chunk's own keys already in the blocks)
 *   k_blk, v_blk, block_tokens, row, head_off as kvl__cpu_attention_decode_group
 *   scratch  at least kvl__cpu_attention_prefill_scratch(p0 + n_rows, D) floats.
 * Same math as kvl__cpu_attention_forward (equal up to float rounding).  Rows are processed in
 * tiles of kvl__cpu_attention_prefill_rows(group) rows, whose keys are read once per tile: a
 * caller splitting work gives each part whole tiles. */
int kvl__cpu_attention_prefill_rows(int group);
/* 1 when the tiles run the AVX-512 kernel here (an AVX-512F CPU, head_dim <= 128); else they run
 * compiler-vectorised C, which measured slower than a gather + kvl__cpu_attention_forward at
 * head_dim 20 (the backend then keeps that path for prefill). */
int kvl__cpu_attention_prefill_vectorised(int D);

/* kvl__cpu_attention_prefill_group over a bf16 KV cache (rows widened exactly as read), where
 * kvl__cpu_attention_prefill_bf16_vectorised(D) is 1 (AVX-512F, D a multiple of 16 up to 128);
 * elsewhere it does nothing, and a caller gathers the context to float32 instead. */
int kvl__cpu_attention_prefill_bf16_vectorised(int D);
void kvl__cpu_attention_prefill_group_bf16(float *out, const float *q, int ldq,
                                           const uint16_t *const *k_blk, const uint16_t *const *v_blk,
                                           int block_tokens, int row, int head_off, int p0,
                                           int n_rows, int group, int D, float *scratch);
size_t kvl__cpu_attention_prefill_scratch(int Tk, int D);
void kvl__cpu_attention_prefill_group(float *out, const float *q, int ldq,
                                      const float *const *k_blk, const float *const *v_blk,
                                      int block_tokens, int row, int head_off, int p0, int n_rows,
                                      int group, int D, float *scratch);

/* RoPE with precomputed angles, so a forward pass (or a translation) computes the cos/sin of each
 * position once for all layers instead of once per layer and per q/k.
 *   kvl__cpu_rope_table: cos_tab, sin_tab [T, D/2] for positions pos[T] (the float32 values of
 *                       kvl__cpu_rope_angles, with the inv_freq of seq_len = max(pos) + 1)
 *   kvl__cpu_rope_apply: x[T, n_heads, D] rotated in place with row t of the tables; inverse != 0
 *                       negates the sines (the transposed rotation: the inverse when the
 *                       attention factor is 1). */
void kvl__cpu_rope_table(float *cos_tab, float *sin_tab, const int *pos, int T, int D,
                         const kvl_rope_params *rope);
/* The same with the sequence length `dynamic` RoPE reads given (kvl__cpu_rope_table takes
 * max(pos) + 1): rows of one table made in parts then agree with the table made whole. */
void kvl__cpu_rope_table_len(float *cos_tab, float *sin_tab, const int *pos, int T, int D,
                             const kvl_rope_params *rope, int seq_len);
/* A model's RoPE tables for positions [0, n_pos), made once: a translated span of C tokens
 * needs C x D/2 angles, ~0.3 ms of sincosf per 2048 tokens on every switch, and a prefill
 * chunk as many.  n_pos = min(max_position_embeddings, KVL__ROPE_CACHE_BYTES / (4 D)).  Rows
 * are those kvl__cpu_rope_table_len gives for any seq_len <= max_position_embeddings (dynamic
 * RoPE's frequencies change only beyond it; no other type reads seq_len), so a lookup of
 * [p0, p0 + n) with p0 + n <= n_pos is bit for bit the table computed on the spot. */
#define KVL__ROPE_CACHE_BYTES ((size_t)8 << 20)
typedef struct kvl__rope_cache {
    float *cos, *sin;       /* [n_pos, half] each; NULL when n_pos = 0 */
    int n_pos, half;
    kvl_rope_params rope;   /* what they were made from: a lookup with other parameters computes */
} kvl__rope_cache;
/* Without memory for the tables (a speed-up only), or without max_position_embeddings, n_pos
 * is 0 and every lookup computes its rows. */
void kvl__rope_cache_create(const kvl_rope_params *rope, int D, kvl__rope_cache *out);
void kvl__rope_cache_free(kvl__rope_cache *rc);
/* 1 when rc (may be NULL) holds the rows of positions [p0, p0 + n) for `rope` and head_dim D. */
int kvl__rope_cache_covers(const kvl__rope_cache *rc, const kvl_rope_params *rope, int D, int p0, int n);
/* cos_tab, sin_tab [T, D/2] for pos[T] (seq_len = max(pos) + 1, as kvl__cpu_rope_table): rows
 * copied from `rc` (may be NULL) when it was made for `rope` and D and every position is below
 * its n_pos, else computed. */
void kvl__cpu_rope_table_cached(const kvl__rope_cache *rc, float *cos_tab, float *sin_tab,
                                const int *pos, int T, int D, const kvl_rope_params *rope);
/* The tables of kvl__cpu_rope_forward's mode: as kvl__cpu_rope_table, scaled by 1/a instead of a
 * for KVL_ROPE_INVERSE; rotating with them (kvl__cpu_rope_apply, inverse = mode != FORWARD) gives
 * kvl__cpu_rope_forward's result bit for bit. */
void kvl__cpu_rope_table_mode(float *cos_tab, float *sin_tab, const int *pos, int T, int D,
                              const kvl_rope_params *rope, int mode);
void kvl__cpu_rope_apply(float *x, const float *cos_tab, const float *sin_tab, int T, int n_heads,
                        int D, int inverse);

#endif
