/* kernels/cpu/attention_decode_avx2.h: decode attention's two passes on AVX2 + FMA, for one KV
 * head and the `group` query heads sharing it (GQA); private to kernels/cpu.  The caller
 * (attention_decode.c) checks that the CPU has AVX2 and FMA and that head_dim D is a multiple of
 * 8 up to 128, and runs kvl__att_decode_softmax_avx2 between the two passes.
 *   q        [group*D]     queries of the group's heads, after q_norm and RoPE
 *   k_blk[b] + head_off    keys of block b: [block_tokens, row] (float32 or bf16 elements)
 *   v_blk[b] + head_off    values, likewise
 *   scratch  [group, Tk]   scores_avx2 writes scale * q . k_j (scale = 1/sqrt(D), the scaled
 *                          dot product of "Attention Is All You Need"); pv_avx2 reads the
 *                          softmax of it
 *   out      [group*D]     pv_avx2 writes sum_j p_j v_j
 * Same math as the portable form up to float rounding (8 partial sums a dot product). */
#ifndef KVL_KERNELS_CPU_ATTENTION_DECODE_AVX2_H
#define KVL_KERNELS_CPU_ATTENTION_DECODE_AVX2_H

#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define KVL__ATT_DECODE_AVX2 1
#else
#define KVL__ATT_DECODE_AVX2 0
#endif

#if KVL__ATT_DECODE_AVX2
#define KVL__ATT_DECODE_AVX2_MAX_D 128

void kvl__att_decode_scores_avx2(float *scratch, const float *q, const float *const *k_blk,
                                 int block_tokens, int row, int head_off, int Tk, int group, int D);
void kvl__att_decode_pv_avx2(float *out, const float *scratch, const float *const *v_blk,
                             int block_tokens, int row, int head_off, int Tk, int group, int D);
void kvl__att_decode_scores_avx2_bf16(float *scratch, const float *q, const uint16_t *const *k_blk,
                                      int block_tokens, int row, int head_off, int Tk, int group,
                                      int D);
void kvl__att_decode_pv_avx2_bf16(float *out, const float *scratch, const uint16_t *const *v_blk,
                                  int block_tokens, int row, int head_off, int Tk, int group, int D);
/* The softmax between the two passes: scratch[hh * Tk + j] replaced by
 * softmax_j(scratch[hh * Tk + .]) for each of the group's heads. */
void kvl__att_decode_softmax_avx2(float *scratch, int group, int Tk);
#endif

#endif
