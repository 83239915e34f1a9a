/* kernels/cpu/attention_decode_avx512.c: decode attention's scores and weighted sum of values on
 * AVX-512F, the query heads of a GQA group sharing each load of a key or value (see
 * attention_decode_avx512.h).
 *
 * Why: a dot product of head_dim 64 is 4 vector FMAs, so a per-head pass over the keys loads a
 * key vector for every FMA, and a group of g heads loads the keys g times (from L2 after the
 * first head: 49 KB of keys per 192-token session at qwen3-b's geometry).  Here a pass takes
 * HC heads of the group at once (HC * head_dim <= 128 floats of queries in registers): each key
 * vector is loaded once and multiplied into HC accumulators; 16 / HC keys a pass fill the 16
 * accumulators that one transpose-and-add tree (simd_reduce.h) reduces to 16 scores.  The
 * weighted sum of values likewise loads each value vector once for HC heads' outputs, held in
 * registers two key chains wide.
 *
 * Each (key, head) score is the same sequence of operations as in a per-head pass (product of
 * the first 16 elements, FMAs over the rest, the same reduction tree: its additions do not
 * depend on an accumulator's position), and each head's output sums its keys in the same two
 * chains (even and odd keys of a block), so the results are bit-identical to the per-head
 * form; a sequence gets the same numbers alone or in a batch. */
#include "attention_decode_avx512.h"

#if KVL__ATT_DECODE_AVX512

#include <immintrin.h>
#include <stdint.h>

#include "kv_prefetch.h"
#include "simd_reduce.h"

#define KVL_A5_INLINE static inline __attribute__((always_inline, target("avx512f")))

/* 16 elements of a cache row as floats: float32 as they are; bf16 widened exactly (a bf16 is
 * the top half of a float) */
#define KVL_A5_LOAD_F32(p) _mm512_loadu_ps(p)
#define KVL_A5_LOAD_BF16(p)                                                                       \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))

/* Heads per pass for head_dim 16 * DV: the queries (HC * DV vectors) and the outputs (2 * HC
 * * DV) must leave registers for the rest; HC in {1, 2, 4} so that 16 / HC keys fill a pass. */
static int heads_per_pass(int DV, int heads_left) {
    const int cap = DV <= 2 ? 4 : DV <= 4 ? 2 : 1;
    const int h = heads_left < cap ? heads_left : cap;
    return h >= 4 ? 4 : h >= 2 ? 2 : 1;
}

/* Both passes prefetch the blocks ahead (kv_prefetch.h); `lines`: 64-byte lines of a row's head
 * (16 * DV elements). */

/* scores of heads [h0, h0 + HC): scratch[(h0 + h) * Tk + j] = scale * q_h . k_j */
#define KVL_A5_DECODE(SFX, KV_T, LOADKV)                                                          \
    KVL_A5_INLINE void scores_pass##SFX(float *scratch, const float *q, const KV_T *const *k_blk, \
                                        int block_tokens, int row, int head_off, int Tk, int h0,  \
                                        float scale, const int HC, const int DV) {                \
        const int KC = 16 / HC;                                                                   \
        const __m512 vscale = _mm512_set1_ps(scale);                                              \
        __m512 qv[8];                                                                             \
        _Pragma("GCC unroll 8") for (int i = 0; i < HC * DV; i++)                                 \
            qv[i] = _mm512_loadu_ps(q + (size_t)h0 * 16 * DV + 16 * i);                           \
        for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {                               \
            const KV_T *kb = k_blk[b] + head_off;                                                 \
            const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;                        \
            const int ahead = Tk - j0 - KVL__KV_PF_BLOCKS * block_tokens;                         \
            const int nn = ahead < block_tokens ? ahead : block_tokens;                           \
            const KV_T *kn = nn > 0 ? k_blk[b + KVL__KV_PF_BLOCKS] + head_off : NULL;             \
            for (int t0 = 0; t0 < n; t0 += KC) {                                                  \
                const int nk = n - t0 < KC ? n - t0 : KC;                                         \
                if (kn)                                                                           \
                    KVL__KV_PREFETCH_ROWS(kn, t0, t0 + KC < nn ? t0 + KC : nn, row,               \
                                    DV * sizeof(KV_T) / 4);                                       \
                __m512 acc[16];                                                                   \
                _Pragma("GCC unroll 16") for (int i = 0; i < KC; i++) {                           \
                    /* keys past the block's last are a copy of it, their scores not stored */    \
                    const KV_T *kj = kb + (size_t)(t0 + (i < nk ? i : nk - 1)) * row;             \
                    __m512 a[4];                                                                  \
                    const __m512 k0 = LOADKV(kj);                                                 \
                    _Pragma("GCC unroll 4") for (int h = 0; h < HC; h++)                          \
                        a[h] = _mm512_mul_ps(qv[h * DV], k0);                                     \
                    _Pragma("GCC unroll 8") for (int e = 1; e < DV; e++) {                        \
                        const __m512 ke = LOADKV(kj + 16 * e);                                    \
                        _Pragma("GCC unroll 4") for (int h = 0; h < HC; h++)                      \
                            a[h] = _mm512_fmadd_ps(qv[h * DV + e], ke, a[h]);                     \
                    }                                                                             \
                    _Pragma("GCC unroll 4") for (int h = 0; h < HC; h++) acc[h * KC + i] = a[h];  \
                }                                                                                 \
                const __m512 s = _mm512_mul_ps(kvl__reduce16_ps(acc), vscale);                    \
                const __mmask16 m = (__mmask16)((1u << nk) - 1);                                  \
                _Pragma("GCC unroll 4") for (int h = 0; h < HC; h++) {                            \
                    /* lanes h*KC .. h*KC+nk-1 hold head h's scores: moved down to lane 0 */      \
                    const __m512 sh = h == 0 ? s                                                  \
                                             : _mm512_permutexvar_ps(                             \
                                                   _mm512_add_epi32(_mm512_set_epi32(             \
                                                       15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4,  \
                                                       3, 2, 1, 0), _mm512_set1_epi32(h * KC)),   \
                                                   s);                                            \
                    _mm512_mask_storeu_ps(scratch + (size_t)(h0 + h) * Tk + j0 + t0, m, sh);      \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
                                                                                                  \
    /* out[(h0 + h) * D + d] = sum_j p[(h0 + h) * Tk + j] * v_j[d] for heads [h0, h0 + HC) */     \
    KVL_A5_INLINE void pv_pass##SFX(float *out, const float *scratch, const KV_T *const *v_blk,   \
                                    int block_tokens, int row, int head_off, int Tk, int h0,      \
                                    const int HC, const int DV) {                                 \
        __m512 o0[8], o1[8];                                                                      \
        _Pragma("GCC unroll 8") for (int i = 0; i < HC * DV; i++) o0[i] = o1[i] =                 \
            _mm512_setzero_ps();                                                                  \
        const float *p = scratch + (size_t)h0 * Tk;                                               \
        for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {                               \
            const KV_T *vb = v_blk[b] + head_off;                                                 \
            const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;                        \
            const int ahead = Tk - j0 - KVL__KV_PF_BLOCKS * block_tokens;                         \
            const int nn = ahead < block_tokens ? ahead : block_tokens;                           \
            const KV_T *vn = nn > 0 ? v_blk[b + KVL__KV_PF_BLOCKS] + head_off : NULL;             \
            int t = 0;                                                                            \
            for (; t + 2 <= n; t += 2) {                                                          \
                const KV_T *v0 = vb + (size_t)t * row, *v1 = v0 + row;                            \
                if (vn)                                                                           \
                    KVL__KV_PREFETCH_ROWS(vn, t, t + 2 < nn ? t + 2 : nn, row,                    \
                                          DV * sizeof(KV_T) / 4);                                 \
                __m512 p0[4], p1[4];                                                              \
                _Pragma("GCC unroll 4") for (int h = 0; h < HC; h++) {                            \
                    p0[h] = _mm512_set1_ps(p[(size_t)h * Tk + j0 + t]);                           \
                    p1[h] = _mm512_set1_ps(p[(size_t)h * Tk + j0 + t + 1]);                       \
                }                                                                                 \
                _Pragma("GCC unroll 8") for (int e = 0; e < DV; e++) {                            \
                    const __m512 a = LOADKV(v0 + 16 * e), c = LOADKV(v1 + 16 * e);                \
                    _Pragma("GCC unroll 4") for (int h = 0; h < HC; h++) {                        \
                        o0[h * DV + e] = _mm512_fmadd_ps(p0[h], a, o0[h * DV + e]);               \
                        o1[h * DV + e] = _mm512_fmadd_ps(p1[h], c, o1[h * DV + e]);               \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            if (t < n) {                                                                          \
                const KV_T *v0 = vb + (size_t)t * row;                                            \
                _Pragma("GCC unroll 8") for (int e = 0; e < DV; e++) {                            \
                    const __m512 a = LOADKV(v0 + 16 * e);                                         \
                    _Pragma("GCC unroll 4") for (int h = 0; h < HC; h++) o0[h * DV + e] =         \
                        _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)h * Tk + j0 + t]), a,            \
                                        o0[h * DV + e]);                                          \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 8") for (int i = 0; i < HC * DV; i++)                                 \
            _mm512_storeu_ps(out + (size_t)h0 * 16 * DV + 16 * i, _mm512_add_ps(o0[i], o1[i]));   \
    }
KVL_A5_DECODE(_f32, float, KVL_A5_LOAD_F32)
KVL_A5_DECODE(_bf16, uint16_t, KVL_A5_LOAD_BF16)
#undef KVL_A5_DECODE

/* Every head chunk of the group through one pass kind, with HC and DV compile-time constants
 * in each case (the loops above unroll fully). */
#define KVL_A5_CASES(CALL)                                                                        \
    switch (DV * 8 + HC) {                                                                        \
    case 1 * 8 + 1: CALL(1, 1); break;                                                            \
    case 1 * 8 + 2: CALL(2, 1); break;                                                            \
    case 1 * 8 + 4: CALL(4, 1); break;                                                            \
    case 2 * 8 + 1: CALL(1, 2); break;                                                            \
    case 2 * 8 + 2: CALL(2, 2); break;                                                            \
    case 2 * 8 + 4: CALL(4, 2); break;                                                            \
    case 3 * 8 + 1: CALL(1, 3); break;                                                            \
    case 3 * 8 + 2: CALL(2, 3); break;                                                            \
    case 4 * 8 + 1: CALL(1, 4); break;                                                            \
    case 4 * 8 + 2: CALL(2, 4); break;                                                            \
    case 5 * 8 + 1: CALL(1, 5); break;                                                            \
    case 6 * 8 + 1: CALL(1, 6); break;                                                            \
    case 7 * 8 + 1: CALL(1, 7); break;                                                            \
    case 8 * 8 + 1: CALL(1, 8); break;                                                            \
    }


#define KVL_A5_SCORES_F32(HC_, DV_)                                                               \
    scores_pass_f32(scratch, q, k_blk, block_tokens, row, head_off, Tk, h0, scale, HC_, DV_)
#define KVL_A5_SCORES_BF16(HC_, DV_)                                                              \
    scores_pass_bf16(scratch, q, k_blk, block_tokens, row, head_off, Tk, h0, scale, HC_, DV_)
#define KVL_A5_PV_F32(HC_, DV_) pv_pass_f32(out, scratch, v_blk, block_tokens, row, head_off, Tk, h0, HC_, DV_)
#define KVL_A5_PV_BF16(HC_, DV_) pv_pass_bf16(out, scratch, v_blk, block_tokens, row, head_off, Tk, h0, HC_, DV_)

__attribute__((target("avx512f"))) void kvl__att_decode_scores_avx512(
    float *scratch, const float *q, const float *const *k_blk, int block_tokens, int row,
    int head_off, int Tk, int group, int D, float scale) {
    const int DV = D / 16;
    for (int h0 = 0; h0 < group;) {
        const int HC = heads_per_pass(DV, group - h0);
        KVL_A5_CASES(KVL_A5_SCORES_F32)
        h0 += HC;
    }
}

__attribute__((target("avx512f"))) void kvl__att_decode_scores_avx512_bf16(
    float *scratch, const float *q, const uint16_t *const *k_blk, int block_tokens, int row,
    int head_off, int Tk, int group, int D, float scale) {
    const int DV = D / 16;
    for (int h0 = 0; h0 < group;) {
        const int HC = heads_per_pass(DV, group - h0);
        KVL_A5_CASES(KVL_A5_SCORES_BF16)
        h0 += HC;
    }
}

__attribute__((target("avx512f"))) void kvl__att_decode_pv_avx512(
    float *out, const float *scratch, const float *const *v_blk, int block_tokens, int row,
    int head_off, int Tk, int group, int D) {
    const int DV = D / 16;
    for (int h0 = 0; h0 < group;) {
        const int HC = heads_per_pass(DV, group - h0);
        KVL_A5_CASES(KVL_A5_PV_F32)
        h0 += HC;
    }
}

__attribute__((target("avx512f"))) void kvl__att_decode_pv_avx512_bf16(
    float *out, const float *scratch, const uint16_t *const *v_blk, int block_tokens, int row,
    int head_off, int Tk, int group, int D) {
    const int DV = D / 16;
    for (int h0 = 0; h0 < group;) {
        const int HC = heads_per_pass(DV, group - h0);
        KVL_A5_CASES(KVL_A5_PV_BF16)
        h0 += HC;
    }
}

#endif
