/* kernels/cpu/translate_avx512.h: translate-apply's fused rows on AVX-512F (translate_avx512.c),
 * private to kernels/cpu.
 *
 * For each token of a row range, in registers: the maps' products (W_K x_k, W_V x_v, float32,
 * summed over the source features in order; or bf16 products summed in float32 a pair of
 * features at a time, kvl__translate_rows_avx512_bf16), the target's k_norm over each head and
 * RoPE at the token's position, then the K, V (and Kpre) rows written once into the cache
 * blocks.  The sgemm + fused_rows path of translate_cpu.c computes the same thing through two
 * scratch matrices per layer, and stays the portable form and the reference the tests hold this
 * one to.
 *
 * Formula: KV-Lingo (kvlingo/translator.h): k_t = RoPE(k_norm(W_K[l] k_s)), v_t = W_V[l] v_s;
 * k_norm is Qwen3RMSNorm over head_dim (w * (x * rsqrt(mean(x^2) + eps))), RoPE rotate_half. */
#ifndef KVL_KERNELS_CPU_TRANSLATE_AVX512_H
#define KVL_KERNELS_CPU_TRANSLATE_AVX512_H

#include <stdint.h>

#include "kv_blocks.h"

/* Whether the fused rows run on this CPU for a target of head_dim D and dt = Ht*D output
 * features: compiled in, the CPU reports avx512f, KVL_CPU_TRANSLATE is not "portable", D is 32,
 * 64 or 128 and dt a multiple of 64 (a panel of 64 or 128 features holds whole heads). */
int kvl__translate_avx512_usable(int D, int dt);

/* Whether the bf16 products run (kvl__translate_rows_avx512_bf16): the fused rows are usable,
 * the CPU reports avx512_bf16, KVL_CPU_TRANSLATE is neither "portable" nor "f32", and the source
 * has an even number ds of features per token. */
int kvl__translate_bf16_usable(int D, int dt, int ds);

/* The maps of one target layer, transposed for the row kernel: wT[j][i] = W[i][j].
 * W: [dt, ds] row-major float32 (kvl_kv_maps layout); wT: [ds, dt], caller-owned. */
void kvl__translate_transpose(float *wT, const float *W, int dt, int ds);

/* Rows [a, b) of target layer l: token t reads xk + t*ds and xv + t*ds (float32 [.., ds]) and
 * the RoPE row t of rcos / rsin ([.., D/2], the target's angles at position t0 + t), and is
 * written to cache position t0 + t (whose block must be reserved).
 * wkT, wvT: [ds, dt] (kvl__translate_transpose of W_K[l], W_V[l]); kn: [D] the layer's k_norm
 * weights or NULL (no k_norm: keys are only rotated); eps: k_norm's epsilon.
 * stream 1: the K and V rows are written past the caches (non-temporal stores, as the Kpre
 * rows always are; float32 caches whose rows are 64-byte aligned), for spans too large to stay
 * cached; the part ends with a store fence either way.
 * Only where kvl__translate_avx512_usable(D, dt) holds; c->row must equal dt. */
void kvl__translate_rows_avx512(kvl__kv_blocks *c, int l, int t0, const float *xk,
                                const float *xv, int ds, const float *wkT, const float *wvT,
                                int dt, int D, const float *kn, float eps, const float *rcos,
                                const float *rsin, int a, int b, int stream);

/* kvl__translate_rows_avx512 with bf16 products: source rows xk, xv as bf16 ([.., ds] uint16)
 * and the layer's maps as bf16 pairs, [ds/2][dt][2] (element [j/2][i][j%2] = W[i][j] rounded to
 * bf16; the translator's kvl_kv_maps.wkP / wvP); each output feature is summed in float32 a pair
 * of source features at a time (VDPBF16PS: exact bf16 x bf16 products, bf16 subnormals taken as
 * zero), so in another order than the float32 rows.  Against those, an output moves by up to
 * ~2^-8 of sum_j |W[i][j] x[j]| (the two roundings), which is a larger share of the output itself
 * where the terms cancel; far below the maps' own error against a target's native K/V.  Called
 * only where kvl__translate_bf16_usable(D, dt, ds) holds: a compiler without the bf16
 * intrinsics builds it empty, and there that check always answers 0. */
void kvl__translate_rows_avx512_bf16(kvl__kv_blocks *c, int l, int t0, const uint16_t *xk,
                                     const uint16_t *xv, int ds, const uint16_t *wkP,
                                     const uint16_t *wvP, int dt, int D, const float *kn, float eps,
                                     const float *rcos, const float *rsin, int a, int b, int stream);

#endif
