/* kernels/cpu/attention_decode_avx2.c: decode attention's scores and weighted sum of values on
 * AVX2 + FMA, eight keys a pass (see attention_decode_avx2.h).
 *
 * Why: on a CPU without AVX-512 the portable form (attention_decode.c) runs at 8 lanes, and it
 * sums each (key, head) dot product across its lanes on its own: at head_dim 64 that is 8 FMAs
 * a key and a reduction tree nearly as long.  Here a pass takes 8 keys of one head (8
 * independent FMA chains over head_dim, the query read once for the 8) and reduces the 8
 * accumulators together in one tree (simd_reduce.h) into a vector of 8 scores, as the AVX-512
 * form does with 16.  The weighted sum of values keeps up to 64 floats of a head's output in
 * registers while it walks the keys.  Compiled with function-level target attributes, so the
 * rest of the build stays baseline x86-64; the caller checks the CPU. */
#include "attention_decode_avx2.h"

#if KVL__ATT_DECODE_AVX2

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "simd_reduce.h"

#define KVL_A2 __attribute__((target("avx2,fma")))
#define KVL_A2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))

/* 8 elements of a cache row as floats: float32 as they are; bf16 widened exactly (a bf16 is
 * the top half of a float) */
#define KVL_A2_LOAD_F32(p) _mm256_loadu_ps(p)
#define KVL_A2_LOAD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))

/* head_dim D = 8 * DV.  scores: scratch[hh * Tk + j] = scale * q_hh . k_j.
 * values: out[hh * D + d] = sum_j p[hh * Tk + j] * v_j[d], in chunks of up to 8 vectors (64
 * floats), keys two at a time into the same accumulators (8 independent chains per chunk). */
#define KVL_A2_DECODE(SFX, KV_T, LOADKV)                                                          \
    KVL_A2_INLINE void scores_dv##SFX(float *scratch, const float *q, const KV_T *const *k_blk,   \
                                      int block_tokens, int row, int head_off, int Tk, int group, \
                                      float scale, const int DV) {                                \
        const __m256 vscale = _mm256_set1_ps(scale);                                              \
        for (int hh = 0; hh < group; hh++) {                                                      \
            const float *qh = q + (size_t)hh * 8 * DV;                                            \
            float *sc = scratch + (size_t)hh * Tk;                                                \
            for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {                           \
                const KV_T *kb = k_blk[b] + head_off;                                             \
                const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;                    \
                for (int t0 = 0; t0 < n; t0 += 8) {                                               \
                    const int nk = n - t0 < 8 ? n - t0 : 8;                                       \
                    const KV_T *kj[8];                                                            \
                    /* keys past the block's last are a copy of it, their scores not stored */    \
                    for (int i = 0; i < 8; i++) kj[i] = kb + (size_t)(t0 + (i < nk ? i : nk - 1)) * row; \
                    __m256 acc[8];                                                                \
                    __m256 qv = _mm256_loadu_ps(qh);                                              \
                    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)                           \
                        acc[i] = _mm256_mul_ps(qv, LOADKV(kj[i]));                                \
                    _Pragma("GCC unroll 16") for (int e = 1; e < DV; e++) {                       \
                        qv = _mm256_loadu_ps(qh + 8 * e);                                         \
                        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)                       \
                            acc[i] = _mm256_fmadd_ps(qv, LOADKV(kj[i] + 8 * e), acc[i]);          \
                    }                                                                             \
                    const __m256 s = _mm256_mul_ps(kvl__reduce8_ps(acc), vscale);                 \
                    if (nk == 8) {                                                                \
                        _mm256_storeu_ps(sc + j0 + t0, s);                                        \
                    } else {                                                                      \
                        float tmp[8];                                                             \
                        _mm256_storeu_ps(tmp, s);                                                 \
                        memcpy(sc + j0 + t0, tmp, sizeof(float) * (size_t)nk);                    \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
                                                                                                  \
    KVL_A2_INLINE void pv_dv##SFX(float *out, const float *scratch, const KV_T *const *v_blk,     \
                                  int block_tokens, int row, int head_off, int Tk, int group,     \
                                  const int DV) {                                                 \
        for (int hh = 0; hh < group; hh++) {                                                      \
            const float *p = scratch + (size_t)hh * Tk;                                           \
            for (int c0 = 0; c0 < DV; c0 += 8) {                                                  \
                const int cn = DV - c0 < 8 ? DV - c0 : 8;                                         \
                __m256 o[8];                                                                      \
                _Pragma("GCC unroll 8") for (int e = 0; e < 8; e++) o[e] = _mm256_setzero_ps();   \
                for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {                       \
                    const KV_T *vb = v_blk[b] + head_off + 8 * c0;                                \
                    const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;                \
                    int t = 0;                                                                    \
                    for (; t + 2 <= n; t += 2) {                                                  \
                        const KV_T *v0 = vb + (size_t)t * row, *v1 = v0 + row;                    \
                        const __m256 p0 = _mm256_broadcast_ss(p + j0 + t);                        \
                        const __m256 p1 = _mm256_broadcast_ss(p + j0 + t + 1);                    \
                        _Pragma("GCC unroll 8") for (int e = 0; e < 8; e++) if (e < cn)           \
                            o[e] = _mm256_fmadd_ps(p1, LOADKV(v1 + 8 * e),                        \
                                                   _mm256_fmadd_ps(p0, LOADKV(v0 + 8 * e), o[e])); \
                    }                                                                             \
                    if (t < n) {                                                                  \
                        const KV_T *v0 = vb + (size_t)t * row;                                    \
                        const __m256 p0 = _mm256_broadcast_ss(p + j0 + t);                        \
                        _Pragma("GCC unroll 8") for (int e = 0; e < 8; e++) if (e < cn)           \
                            o[e] = _mm256_fmadd_ps(p0, LOADKV(v0 + 8 * e), o[e]);                 \
                    }                                                                             \
                }                                                                                 \
                float *oh = out + (size_t)hh * 8 * DV + 8 * c0;                                   \
                _Pragma("GCC unroll 8") for (int e = 0; e < 8; e++) if (e < cn)                   \
                    _mm256_storeu_ps(oh + 8 * e, o[e]);                                           \
            }                                                                                     \
        }                                                                                         \
    }
KVL_A2_DECODE(, float, KVL_A2_LOAD_F32)
KVL_A2_DECODE(_bf16, uint16_t, KVL_A2_LOAD_BF16)
#undef KVL_A2_DECODE

/* Softmax of each head's scores in place (kvl__softmax_row_avx2, one row per head): GCC left the
 * portable form's e^x scalar in its AVX2 copy, 4.7% of a 16-session decode step's samples. */
KVL_A2 void kvl__att_decode_softmax_avx2(float *scratch, int group, int Tk) {
    for (int hh = 0; hh < group; hh++) kvl__softmax_row_avx2(scratch + (size_t)hh * Tk, Tk);
}

/* one specialisation per DV = D / 8 (1..16), so every loop over head_dim is unrolled */
#define KVL_A2_CASES(CALL) \
    CALL(1) CALL(2) CALL(3) CALL(4) CALL(5) CALL(6) CALL(7) CALL(8) \
    CALL(9) CALL(10) CALL(11) CALL(12) CALL(13) CALL(14) CALL(15) CALL(16)

KVL_A2 void kvl__att_decode_scores_avx2(float *scratch, const float *q, const float *const *k_blk,
                                        int block_tokens, int row, int head_off, int Tk, int group,
                                        int D) {
    const float scale = 1.0f / sqrtf((float)D);
#define KVL_A2_CASE(DV_) \
    case DV_: scores_dv(scratch, q, k_blk, block_tokens, row, head_off, Tk, group, scale, DV_); break;
    switch (D / 8) { KVL_A2_CASES(KVL_A2_CASE) }
#undef KVL_A2_CASE
}

KVL_A2 void kvl__att_decode_pv_avx2(float *out, const float *scratch, const float *const *v_blk,
                                    int block_tokens, int row, int head_off, int Tk, int group, int D) {
#define KVL_A2_CASE(DV_) case DV_: pv_dv(out, scratch, v_blk, block_tokens, row, head_off, Tk, group, DV_); break;
    switch (D / 8) { KVL_A2_CASES(KVL_A2_CASE) }
#undef KVL_A2_CASE
}

KVL_A2 void kvl__att_decode_scores_avx2_bf16(float *scratch, const float *q,
                                             const uint16_t *const *k_blk, int block_tokens, int row,
                                             int head_off, int Tk, int group, int D) {
    const float scale = 1.0f / sqrtf((float)D);
#define KVL_A2_CASE(DV_) \
    case DV_: scores_dv_bf16(scratch, q, k_blk, block_tokens, row, head_off, Tk, group, scale, DV_); break;
    switch (D / 8) { KVL_A2_CASES(KVL_A2_CASE) }
#undef KVL_A2_CASE
}

KVL_A2 void kvl__att_decode_pv_avx2_bf16(float *out, const float *scratch,
                                         const uint16_t *const *v_blk, int block_tokens, int row,
                                         int head_off, int Tk, int group, int D) {
#define KVL_A2_CASE(DV_) \
    case DV_: pv_dv_bf16(out, scratch, v_blk, block_tokens, row, head_off, Tk, group, DV_); break;
    switch (D / 8) { KVL_A2_CASES(KVL_A2_CASE) }
#undef KVL_A2_CASE
}
#undef KVL_A2_CASES

#endif
