/* kernels/cpu/attention_decode_avx512.h: decode attention's two passes on AVX-512F, for one KV
 * head and the `group` query heads sharing it (GQA), several heads per load of a key or value;
 * private to kernels/cpu.  The caller (attention_decode.c) checks that the CPU has AVX-512F and
 * that head_dim D is a multiple of 16 up to 128, and runs the softmax between the two passes.
 *   q        [group*D]     queries of the group's heads, after q_norm and RoPE
 *   k_blk[b] + head_off    keys of block b: [block_tokens, row] (float32 or bf16 elements)
 *   v_blk[b] + head_off    values, likewise
 *   scratch  [group, Tk]   scores_* writes scale * q . k_j (scale = 1/sqrt(D), the scaled dot
 *                          product of "Attention Is All You Need"); pv_* reads its softmax
 *   out      [group*D]     pv_* writes sum_j p_j v_j
 * Bit-identical to a per-head pass of the same kernels (see the .c file). */
#ifndef KVL_KERNELS_CPU_ATTENTION_DECODE_AVX512_H
#define KVL_KERNELS_CPU_ATTENTION_DECODE_AVX512_H

#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVL__ATT_DECODE_AVX512 1
#else
#define KVL__ATT_DECODE_AVX512 0
#endif

#if KVL__ATT_DECODE_AVX512
void kvl__att_decode_scores_avx512(float *scratch, const float *q, const float *const *k_blk,
                                   int block_tokens, int row, int head_off, int Tk, int group,
                                   int D, float scale);
void kvl__att_decode_pv_avx512(float *out, const float *scratch, const float *const *v_blk,
                               int block_tokens, int row, int head_off, int Tk, int group, int D);
void kvl__att_decode_scores_avx512_bf16(float *scratch, const float *q,
                                        const uint16_t *const *k_blk, int block_tokens, int row,
                                        int head_off, int Tk, int group, int D, float scale);
void kvl__att_decode_pv_avx512_bf16(float *out, const float *scratch,
                                    const uint16_t *const *v_blk, int block_tokens, int row,
                                    int head_off, int Tk, int group, int D);
#endif

#endif
