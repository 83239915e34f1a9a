/* kernels/cpu/attention_decode.c: attention read in place from the cache blocks, one KV head
 * with the query heads of its GQA group at a time (see ops.h): single-query decode, and below
 * it causal prefill over a tile of query rows.
 *
 * Why per group: the group's query heads share that KV head's keys and values, so one pass over
 * them serves the whole group; and a (sequence, KV head) pair is the unit a batched decode step
 * splits over threads.  Dot products and the weighted sum of values run 16 lanes wide, compiled
 * for AVX-512, AVX2 and the base ISA and chosen at load time (function multi-versioning); the
 * result is the same on every path up to float rounding of the 16 partial sums, and the same
 * for a sequence whether it runs alone or in a batch (the same code on the same data).  Where
 * the CPU has AVX-512F and head_dim is a multiple of 16 (up to 128), decode takes the
 * intrinsics form of attention_decode_avx512.c instead (16 scores per reduction tree, each key
 * and value loaded once for up to 4 heads of the group), and where it has only AVX2 + FMA and
 * head_dim is a multiple of 8 (up to 128), 8 keys a pass (attention_decode_avx2.c);
 * KVL_CPU_DECODE=portable keeps the forms above, KVL_CPU_DECODE=avx2 picks the AVX2 form on an
 * AVX-512 CPU too. */
#include "attention_decode_avx2.h"
#include "attention_decode_avx512.h"
#include "fastmath.h"
#include "ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


#define LANES 16

/* sum_d a[d] * b[d] over n = a multiple of LANES, in LANES partial sums */
static inline __attribute__((always_inline)) float dot_lanes(const float *restrict a,
                                                             const float *restrict b, int n) {
    float acc[LANES] = {0};
    for (int d = 0; d < n; d += LANES)
        for (int i = 0; i < LANES; i++) acc[i] += a[d + i] * b[d + i];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++) acc[i] += acc[i + w];
    return acc[0];
}

/* o[d] += p * v[d], n = a multiple of LANES */
static inline __attribute__((always_inline)) void axpy_lanes(float *restrict o, float p,
                                                             const float *restrict v, int n) {
    for (int d = 0; d < n; d += LANES)
        for (int i = 0; i < LANES; i++) o[d + i] += p * v[d + i];
}

static inline __attribute__((always_inline)) float dot_any(const float *a, const float *b, int n) {
    if ((n % LANES) == 0) return dot_lanes(a, b, n);
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

static inline __attribute__((always_inline)) void axpy_any(float *o, float p, const float *v, int n) {
    if ((n % LANES) == 0) {
        axpy_lanes(o, p, v, n);
        return;
    }
    for (int d = 0; d < n; d++) o[d] += p * v[d];
}

#define exp_nonpos kvl__exp_nonpos   /* fastmath.h */

/* Softmax of each head's scores in place: scratch[hh * Tk + j] */
static inline __attribute__((always_inline)) void softmax_heads(float *scratch, int group, int Tk) {
    for (int hh = 0; hh < group; hh++) {
        float *restrict s = scratch + (size_t)hh * Tk;
        /* the maximum and e^x in blocks of LANES: compilers run a fixed-count inner loop 16
         * lanes wide, a loop over Tk with the max's select or exp_nonpos's bit moves not */
        float mv[LANES];
        for (int i = 0; i < LANES; i++) mv[i] = -INFINITY;
        int j = 0;
        for (; j + LANES <= Tk; j += LANES)
            for (int i = 0; i < LANES; i++) mv[i] = s[j + i] > mv[i] ? s[j + i] : mv[i];
        float m = -INFINITY;
        for (; j < Tk; j++) m = s[j] > m ? s[j] : m;
        for (int i = 0; i < LANES; i++) m = mv[i] > m ? mv[i] : m;
        for (j = 0; j + LANES <= Tk; j += LANES)
            for (int i = 0; i < LANES; i++) s[j + i] = exp_nonpos(s[j + i] - m);
        for (; j < Tk; j++) s[j] = exp_nonpos(s[j] - m);
        float acc[LANES] = {0};
        j = 0;
        for (; j + LANES <= Tk; j += LANES)
            for (int i = 0; i < LANES; i++) acc[i] += s[j + i];
        float sum = 0.0f;
        for (; j < Tk; j++) sum += s[j];
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int i = 0; i < w; i++) acc[i] += acc[i + w];
        const float inv = 1.0f / (sum + acc[0]);
        for (j = 0; j < Tk; j++) s[j] *= inv;
    }
}

/* head_dim known at compile time (the common 64 and 128): four keys per pass over the query
 * (independent accumulator chains, the query read once for four keys) and the output kept in
 * registers across keys, two key chains wide. */
#define KVL_DECODE_GROUP_FIXED(DIM)                                                              \
    static inline __attribute__((always_inline)) void decode_group_##DIM(                         \
        float *out, const float *q, const float *const *k_blk, const float *const *v_blk,        \
        int block_tokens, int row, int head_off, int Tk, int group, float *scratch) {            \
        const float scale = 1.0f / sqrtf((float)(DIM));                                           \
        for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {                               \
            const float *kb = k_blk[b] + head_off;                                               \
            const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;                        \
            int t = 0;                                                                           \
            for (; t + 4 <= n; t += 4) {                                                          \
                const float *restrict k0 = kb + (size_t)t * row, *restrict k1 = k0 + row;        \
                const float *restrict k2 = k1 + row, *restrict k3 = k2 + row;                    \
                for (int hh = 0; hh < group; hh++) {                                              \
                    const float *restrict qh = q + (size_t)hh * (DIM);                           \
                    float a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0};    \
                    for (int d = 0; d < (DIM); d += LANES)                                        \
                        for (int i = 0; i < LANES; i++) {                                         \
                            a0[i] += qh[d + i] * k0[d + i];                                       \
                            a1[i] += qh[d + i] * k1[d + i];                                       \
                            a2[i] += qh[d + i] * k2[d + i];                                       \
                            a3[i] += qh[d + i] * k3[d + i];                                       \
                        }                                                                        \
                    for (int w = LANES / 2; w > 0; w /= 2)                                        \
                        for (int i = 0; i < w; i++) {                                             \
                            a0[i] += a0[i + w];                                                   \
                            a1[i] += a1[i + w];                                                   \
                            a2[i] += a2[i + w];                                                   \
                            a3[i] += a3[i + w];                                                   \
                        }                                                                        \
                    float *sc = scratch + (size_t)hh * Tk + j0 + t;                               \
                    sc[0] = a0[0] * scale;                                                       \
                    sc[1] = a1[0] * scale;                                                       \
                    sc[2] = a2[0] * scale;                                                       \
                    sc[3] = a3[0] * scale;                                                       \
                }                                                                                \
            }                                                                                    \
            for (; t < n; t++)                                                                   \
                for (int hh = 0; hh < group; hh++)                                                \
                    scratch[(size_t)hh * Tk + j0 + t] =                                           \
                        dot_lanes(q + (size_t)hh * (DIM), kb + (size_t)t * row, (DIM)) * scale;  \
        }                                                                                        \
        softmax_heads(scratch, group, Tk);                                                       \
        for (int hh = 0; hh < group; hh++) {                                                      \
            const float *p = scratch + (size_t)hh * Tk;                                          \
            float o0[DIM] = {0}, o1[DIM] = {0};                                                  \
            for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {                           \
                const float *vb = v_blk[b] + head_off;                                           \
                const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;                    \
                int t = 0;                                                                       \
                for (; t + 2 <= n; t += 2) {                                                      \
                    const float *restrict v0 = vb + (size_t)t * row, *restrict v1 = v0 + row;    \
                    const float p0 = p[j0 + t], p1 = p[j0 + t + 1];                               \
                    for (int d = 0; d < (DIM); d++) {                                             \
                        o0[d] += p0 * v0[d];                                                     \
                        o1[d] += p1 * v1[d];                                                     \
                    }                                                                            \
                }                                                                                \
                if (t < n) {                                                                      \
                    const float *restrict v0 = vb + (size_t)t * row;                             \
                    const float p0 = p[j0 + t];                                                   \
                    for (int d = 0; d < (DIM); d++) o0[d] += p0 * v0[d];                          \
                }                                                                                \
            }                                                                                    \
            float *restrict oh = out + (size_t)hh * (DIM);                                       \
            for (int d = 0; d < (DIM); d++) oh[d] = o0[d] + o1[d];                                \
        }                                                                                        \
    }

KVL_DECODE_GROUP_FIXED(64)
KVL_DECODE_GROUP_FIXED(128)

/* bf16 cache rows widened to float (exact: a bf16 is the top half of a float) */
static inline __attribute__((always_inline)) void widen_row(float *restrict dst,
                                                            const uint16_t *restrict src, int n) {
    for (int i = 0; i < n; i++) {
        union { uint32_t u; float f; } v = {(uint32_t)src[i] << 16};
        dst[i] = v.f;
    }
}

/* Any head_dim, float32 or bf16 rows (bf16: each row widened into a stack row first, so
 * D <= KVL__ATT_BF16_MAX_D): scores, softmax, then the weighted sum of values. */
static inline __attribute__((always_inline)) void decode_group_any(
    float *out, const float *q, const void *const *k_blk, const void *const *v_blk,
    int block_tokens, int row, int head_off, int Tk, int group, int D, float *scratch, const int bf16) {
    float w[KVL__ATT_BF16_MAX_D];
    const float scale = 1.0f / sqrtf((float)D);
    /* scores: scratch[hh * Tk + j] */
    for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {
        const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;
        for (int t = 0; t < n; t++) {
            const size_t at = (size_t)head_off + (size_t)t * row;
            const float *kj = (const float *)k_blk[b] + at;
            if (bf16) widen_row(w, (const uint16_t *)k_blk[b] + at, D), kj = w;
            for (int hh = 0; hh < group; hh++)
                scratch[(size_t)hh * Tk + j0 + t] = dot_any(q + (size_t)hh * D, kj, D) * scale;
        }
    }
    softmax_heads(scratch, group, Tk);
    for (int hh = 0; hh < group; hh++) memset(out + (size_t)hh * D, 0, sizeof(float) * (size_t)D);
    for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {
        const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;
        for (int t = 0; t < n; t++) {
            const size_t at = (size_t)head_off + (size_t)t * row;
            const float *vj = (const float *)v_blk[b] + at;
            if (bf16) widen_row(w, (const uint16_t *)v_blk[b] + at, D), vj = w;
            for (int hh = 0; hh < group; hh++)
                axpy_any(out + (size_t)hh * D, scratch[(size_t)hh * Tk + j0 + t], vj, D);
        }
    }
}

#if KVL__ATT_DECODE_AVX512
#define KVL_DECODE_AVX512 1
#endif

/* Which decode form runs, decided once a process: AVX-512 (where compiled and the CPU has it),
 * else AVX2 + FMA (attention_decode_avx2.c), else the portable forms above.  KVL_CPU_DECODE in
 * the environment picks one for tests: "portable", or "avx2" (where the CPU has it). */
#define DECODE_PORTABLE 0
#define DECODE_AVX2 1
#define DECODE_AVX512 2
static int decode_form(void) {
    static int form = -1;   /* a benign race: every thread computes the same answer */
    if (form < 0) {
        int f = DECODE_PORTABLE;
#if KVL__ATT_DECODE_AVX2
        const char *env = getenv("KVL_CPU_DECODE");
        const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        if (env && !strcmp(env, "portable")) f = DECODE_PORTABLE;
        else if (env && !strcmp(env, "avx2")) f = avx2 ? DECODE_AVX2 : DECODE_PORTABLE;
#ifdef KVL_DECODE_AVX512
        else if (__builtin_cpu_supports("avx512f")) f = DECODE_AVX512;
#endif
        else if (avx2) f = DECODE_AVX2;
#endif
        form = f;
    }
    return form;
}

KVL_MULTIVERSION
void kvl__cpu_attention_decode_group(float *out, const float *q, const float *const *k_blk,
                                     const float *const *v_blk, int block_tokens, int row,
                                     int head_off, int Tk, int group, int D, float *scratch) {
#ifdef KVL_DECODE_AVX512
    if (D % 16 == 0 && D <= 128 && decode_form() == DECODE_AVX512) {
        kvl__att_decode_scores_avx512(scratch, q, k_blk, block_tokens, row, head_off, Tk, group, D,
                                      1.0f / sqrtf((float)D));
        softmax_heads(scratch, group, Tk);
        kvl__att_decode_pv_avx512(out, scratch, v_blk, block_tokens, row, head_off, Tk, group, D);
        return;
    }
#endif
#if KVL__ATT_DECODE_AVX2
    if (D % 8 == 0 && D <= KVL__ATT_DECODE_AVX2_MAX_D && decode_form() == DECODE_AVX2) {
        kvl__att_decode_scores_avx2(scratch, q, k_blk, block_tokens, row, head_off, Tk, group, D);
        kvl__att_decode_softmax_avx2(scratch, group, Tk);
        kvl__att_decode_pv_avx2(out, scratch, v_blk, block_tokens, row, head_off, Tk, group, D);
        return;
    }
#endif
    if (D == 64) {
        decode_group_64(out, q, k_blk, v_blk, block_tokens, row, head_off, Tk, group, scratch);
        return;
    }
    if (D == 128) {
        decode_group_128(out, q, k_blk, v_blk, block_tokens, row, head_off, Tk, group, scratch);
        return;
    }
    decode_group_any(out, q, (const void *const *)k_blk, (const void *const *)v_blk, block_tokens,
                     row, head_off, Tk, group, D, scratch, 0);
}

void kvl__cpu_attention_decode_blocks(float *out, const float *q, const float *const *k_blk,
                                      const float *const *v_blk, int block_tokens, int Tk, int Hq,
                                      int Hkv, int D, float *scratch) {
    const int group = Hq / Hkv;
    for (int g = 0; g < Hkv; g++)
        kvl__cpu_attention_decode_group(out + (size_t)g * group * D, q + (size_t)g * group * D,
                                        k_blk, v_blk, block_tokens, Hkv * D, g * D, Tk, group, D,
                                        scratch);
}

/* ---- decode over a bf16 cache ---------------------------------------------------------------
 *
 * The portable form is decode_group_any on widened rows; the AVX-512 form at the end of this
 * file widens in registers. */


KVL_MULTIVERSION
void kvl__cpu_attention_decode_group_bf16(float *out, const float *q, const uint16_t *const *k_blk,
                                          const uint16_t *const *v_blk, int block_tokens, int row,
                                          int head_off, int Tk, int group, int D, float *scratch) {
#ifdef KVL_DECODE_AVX512
    if (D % 16 == 0 && D <= 128 && decode_form() == DECODE_AVX512) {
        kvl__att_decode_scores_avx512_bf16(scratch, q, k_blk, block_tokens, row, head_off, Tk, group,
                                           D, 1.0f / sqrtf((float)D));
        softmax_heads(scratch, group, Tk);
        kvl__att_decode_pv_avx512_bf16(out, scratch, v_blk, block_tokens, row, head_off, Tk, group, D);
        return;
    }
#endif
#if KVL__ATT_DECODE_AVX2
    if (D % 8 == 0 && D <= KVL__ATT_DECODE_AVX2_MAX_D && decode_form() == DECODE_AVX2) {
        kvl__att_decode_scores_avx2_bf16(scratch, q, k_blk, block_tokens, row, head_off, Tk, group, D);
        kvl__att_decode_softmax_avx2(scratch, group, Tk);
        kvl__att_decode_pv_avx2_bf16(out, scratch, v_blk, block_tokens, row, head_off, Tk, group, D);
        return;
    }
#endif
    if (D > KVL__ATT_BF16_MAX_D) return;   /* refused when the cache was made */
    decode_group_any(out, q, (const void *const *)k_blk, (const void *const *)v_blk, block_tokens,
                     row, head_off, Tk, group, D, scratch, 1);
}

/* ---- prefill: a tile of query rows over the blocks ------------------------------------------
 *
 * Why a tile: the rows of one prefill chunk see the same keys but their last few, so one pass
 * over a key block serves every row of the tile (the decode kernel per row would read the
 * context once per row).  A tile holds up to LANES query vectors (rows x heads of the group),
 * one per lane: scores are computed for all of them at once by broadcasting each key element
 * against the tile's transposed queries (no reduction across lanes, keys read in place), the
 * softmax runs lane-wise down the keys, and the weighted sum of values runs over head_dim for
 * four query vectors at a time with the outputs held in registers. */

int kvl__cpu_attention_prefill_rows(int group) {
    const int nh = group < LANES ? group : LANES;
    return LANES / nh;
}

size_t kvl__cpu_attention_prefill_scratch(int Tk, int D) {
    return (size_t)LANES * ((size_t)Tk + (size_t)D);
}

/* Scores S[j][l] = q_l . k_j for keys [0, Tk) (Qt: [D][LANES] queries pre-scaled). */
static inline __attribute__((always_inline)) void prefill_scores(
    float *restrict S, const float *restrict Qt, const float *const *k_blk, int block_tokens,
    int row, int head_off, int Tk, const int D) {
    for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {
        const float *kb = k_blk[b] + head_off;
        const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;
        int t = 0;
        for (; t + 4 <= n; t += 4) {
            const float *restrict k0 = kb + (size_t)t * row, *restrict k1 = k0 + row;
            const float *restrict k2 = k1 + row, *restrict k3 = k2 + row;
            float a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0};
            for (int d = 0; d < D; d++) {
                const float *restrict qt = Qt + (size_t)d * LANES;
                const float x0 = k0[d], x1 = k1[d], x2 = k2[d], x3 = k3[d];
                for (int l = 0; l < LANES; l++) {
                    a0[l] += x0 * qt[l];
                    a1[l] += x1 * qt[l];
                    a2[l] += x2 * qt[l];
                    a3[l] += x3 * qt[l];
                }
            }
            float *restrict s = S + (size_t)(j0 + t) * LANES;
            for (int l = 0; l < LANES; l++) {
                s[l] = a0[l];
                s[LANES + l] = a1[l];
                s[2 * LANES + l] = a2[l];
                s[3 * LANES + l] = a3[l];
            }
        }
        for (; t < n; t++) {
            const float *restrict k0 = kb + (size_t)t * row;
            float a0[LANES] = {0};
            for (int d = 0; d < D; d++)
                for (int l = 0; l < LANES; l++) a0[l] += k0[d] * Qt[(size_t)d * LANES + l];
            for (int l = 0; l < LANES; l++) S[(size_t)(j0 + t) * LANES + l] = a0[l];
        }
    }
}

/* out_l = sum_j S[j][l] v_j * inv[l] for the NL lanes lg.. (NL <= 4), written to dst[m]. */
static inline __attribute__((always_inline)) void prefill_pv(
    float *const *dst, const float *restrict S, const float *inv, int lg, const float *const *v_blk,
    int block_tokens, int row, int head_off, int Tk, const int D, const int NL) {
    float o[4][D];
    for (int m = 0; m < NL; m++)
        for (int d = 0; d < D; d++) o[m][d] = 0.0f;
    for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {
        const float *vb = v_blk[b] + head_off;
        const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;
        for (int t = 0; t < n; t++) {
            const float *restrict vr = vb + (size_t)t * row;
            const float *restrict p = S + (size_t)(j0 + t) * LANES + lg;
            for (int m = 0; m < NL; m++) {
                const float pm = p[m];
                for (int d = 0; d < D; d++) o[m][d] += pm * vr[d];
            }
        }
    }
    for (int m = 0; m < NL; m++)
        for (int d = 0; d < D; d++) dst[m][d] = o[m][d] * inv[lg + m];
}

/* One tile: rows [0, r) at positions p0 + i, heads [0, nh) of q/out (lane l = i * nh + hh). */
static inline __attribute__((always_inline)) void prefill_tile(
    float *out, const float *q, int ldq, const float *const *k_blk, const float *const *v_blk,
    int block_tokens, int row, int head_off, int p0, int r, int nh, const int D, float *scratch) {
    const int L = r * nh, Tk = p0 + r, jall = p0 + 1;   /* keys [0, jall) are seen by all rows */
    float *restrict S = scratch;                         /* [Tk][LANES] */
    float *restrict Qt = scratch + (size_t)Tk * LANES;   /* [D][LANES]  */
    const float scale = 1.0f / sqrtf((float)D);
    for (int d = 0; d < D; d++)
        for (int l = 0; l < LANES; l++)
            Qt[(size_t)d * LANES + l] =
                l < L ? q[(size_t)(l / nh) * ldq + (size_t)(l % nh) * D + d] * scale : 0.0f;
    prefill_scores(S, Qt, k_blk, block_tokens, row, head_off, Tk, D);
    int vis[LANES];
    for (int l = 0; l < LANES; l++) vis[l] = l < L ? p0 + l / nh + 1 : jall;
    float mx[LANES], sum[LANES], inv[LANES];
    for (int l = 0; l < LANES; l++) { mx[l] = -INFINITY; sum[l] = 0.0f; }
    for (int j = 0; j < jall; j++)
        for (int l = 0; l < LANES; l++) mx[l] = S[(size_t)j * LANES + l] > mx[l] ? S[(size_t)j * LANES + l] : mx[l];
    for (int j = jall; j < Tk; j++)   /* the causal tail: the last r - 1 keys */
        for (int l = 0; l < LANES; l++)
            if (j < vis[l] && S[(size_t)j * LANES + l] > mx[l]) mx[l] = S[(size_t)j * LANES + l];
    for (int j = 0; j < jall; j++) {
        float *restrict s = S + (size_t)j * LANES;
        for (int l = 0; l < LANES; l++) {
            s[l] = exp_nonpos(s[l] - mx[l]);
            sum[l] += s[l];
        }
    }
    for (int j = jall; j < Tk; j++) {
        float *restrict s = S + (size_t)j * LANES;
        for (int l = 0; l < LANES; l++) {
            s[l] = j < vis[l] ? exp_nonpos(s[l] - mx[l]) : 0.0f;
            sum[l] += s[l];
        }
    }
    for (int l = 0; l < LANES; l++) inv[l] = 1.0f / sum[l];
    for (int lg = 0; lg < L; lg += 4) {
        float *dst[4];
        const int nl = L - lg < 4 ? L - lg : 4;
        for (int m = 0; m < 4; m++) {
            const int l = lg + (m < nl ? m : 0);
            dst[m] = out + (size_t)(l / nh) * ldq + (size_t)(l % nh) * D;
        }
        if (nl == 4) prefill_pv(dst, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, 4);
        else if (nl == 3) prefill_pv(dst, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, 3);
        else if (nl == 2) prefill_pv(dst, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, 2);
        else prefill_pv(dst, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, 1);
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

#include "kv_prefetch.h"
#include "simd_reduce.h"
#define KVL_PREFILL_AVX512 1

/* bf16 rows widened in registers: 16 bf16 -> the top halves of 16 floats (exact) */
#define KVL_LOAD_F32(p) _mm512_loadu_ps(p)
#define KVL_LOAD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
/* The prefill forms below are written once for float32 and for bf16 cache rows: LOADKV loads
 * 16 elements as floats, LOADKV_TAIL the masked last vector of a row (bf16 rows come here only
 * when head_dim is a multiple of 16, so theirs is a whole vector), GETKV one element. */
#define KVL_GET_F32(x) (x)
#define KVL_GET_BF16(x) kvl__att_bf16_to_f32(x)
#define KVL_LOAD_F32_TAIL(m, p) _mm512_maskz_loadu_ps(m, p)
#define KVL_LOAD_BF16_TAIL(m, p) KVL_LOAD_BF16(p)
static inline float kvl__att_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}
#define KVL_PREFILL_KERNELS(SFX, KV_T, LOADKV, LOADKV_TAIL, GETKV)                                                                                                    \
/* AVX-512 form of prefill_scores: eight keys per pass over the tile's queries (eight                                                                                 \
 * independent FMA chains), each key element broadcast from the block in place. */                                                                                    \
__attribute__((target("avx512f"))) static void prefill_scores_avx512##SFX(                                                                                            \
    float *restrict S, const float *restrict Qt, const KV_T *const *k_blk, int block_tokens,                                                                          \
    int row, int head_off, int Tk, int D) {                                                                                                                           \
    const int RLINES = (int)((D * sizeof(KV_T) + 63) / 64);                                                                                                           \
    for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {                                                                                                       \
        const KV_T *kb = k_blk[b] + head_off;                                                                                                                         \
        const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;                                                                                                \
        /* the rows of this head KVL__KV_PF_BLOCKS blocks ahead, as this pass reaches each row */                                                                   \
        const int ahead = Tk - j0 - KVL__KV_PF_BLOCKS * block_tokens;                                                                                                 \
        const int nn = ahead < block_tokens ? ahead : block_tokens;                                                                                                   \
        const KV_T *kn = nn > 0 ? k_blk[b + KVL__KV_PF_BLOCKS] + head_off : NULL;                                                                                     \
        int t = 0;                                                                                                                                                    \
        for (; t + 8 <= n; t += 8) {                                                                                                                                  \
            const KV_T *k0 = kb + (size_t)t * row;                                                                                                                    \
            if (kn) KVL__KV_PREFETCH_ROWS(kn, t, t + 8 < nn ? t + 8 : nn, row, RLINES);                                                                              \
            __m512 a[8];                                                                                                                                              \
            for (int m = 0; m < 8; m++) a[m] = _mm512_setzero_ps();                                                                                                   \
            for (int d = 0; d < D; d++) {                                                                                                                             \
                const __m512 qt = _mm512_loadu_ps(Qt + (size_t)d * LANES);                                                                                            \
_Pragma("GCC unroll 8")                                                                                                                                               \
                for (int m = 0; m < 8; m++)                                                                                                                           \
                    a[m] = _mm512_fmadd_ps(_mm512_set1_ps(GETKV(k0[(size_t)m * row + d])), qt, a[m]);                                                                 \
            }                                                                                                                                                         \
_Pragma("GCC unroll 8")                                                                                                                                               \
            for (int m = 0; m < 8; m++) _mm512_storeu_ps(S + (size_t)(j0 + t + m) * LANES, a[m]);                                                                     \
        }                                                                                                                                                             \
        for (; t < n; t++) {                                                                                                                                          \
            const KV_T *k0 = kb + (size_t)t * row;                                                                                                                    \
            if (kn && t < nn) KVL__KV_PREFETCH_ROWS(kn, t, t + 1, row, RLINES);                                                                                      \
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();                                                                                                \
            int d = 0;                                                                                                                                                \
            for (; d + 2 <= D; d += 2) {                                                                                                                              \
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(GETKV(k0[d])), _mm512_loadu_ps(Qt + (size_t)d * LANES), a0);                                                      \
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(GETKV(k0[d + 1])),                                                                                                \
                                     _mm512_loadu_ps(Qt + (size_t)(d + 1) * LANES), a1);                                                                              \
            }                                                                                                                                                         \
            if (d < D) a0 = _mm512_fmadd_ps(_mm512_set1_ps(GETKV(k0[d])), _mm512_loadu_ps(Qt + (size_t)d * LANES), a0);                                               \
            _mm512_storeu_ps(S + (size_t)(j0 + t) * LANES, _mm512_add_ps(a0, a1));                                                                                    \
        }                                                                                                                                                             \
    }                                                                                                                                                                 \
}                                                                                                                                                                     \
                                                                                                                                                                      \
/* AVX-512 form of prefill_pv for head_dim D in DV vectors (the last one masked by `tail` when D is                                                                   \
 * not a multiple of 16): NL lanes' outputs (NL * DV vectors) held in registers across all keys;                                                                      \
 * rows of lanes >= L are computed and not stored. */                                                                                                                 \
static inline __attribute__((always_inline, target("avx512f"))) void prefill_pv_avx512##SFX(                                                                          \
    float *out, int ldq, int nh, int L, const float *restrict S, const float *inv, int lg,                                                                            \
    const KV_T *const *v_blk, int block_tokens, int row, int head_off, int Tk, int D,                                                                                 \
    __mmask16 tail, const int DV, const int NL) {                                                                                                                     \
    __m512 o[16];   /* NL * DV <= 16 (a fixed size: a VLA would live in memory) */                                                                                    \
    const int RLINES = (int)((D * sizeof(KV_T) + 63) / 64);                                                                                                           \
_Pragma("GCC unroll 16")                                                                                                                                              \
    for (int i = 0; i < NL * DV; i++) o[i] = _mm512_setzero_ps();                                                                                                     \
    for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {                                                                                                       \
        const KV_T *vb = v_blk[b] + head_off;                                                                                                                         \
        const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;                                                                                                \
        /* the first pass over the values reads them from memory: prefetched as the keys are */                                                                       \
        const int ahead = Tk - j0 - KVL__KV_PF_BLOCKS * block_tokens;                                                                                                 \
        const int nn = lg > 0 ? 0 : ahead < block_tokens ? ahead : block_tokens;                                                                                      \
        const KV_T *vn = nn > 0 ? v_blk[b + KVL__KV_PF_BLOCKS] + head_off : NULL;                                                                                     \
        for (int t = 0; t < n; t++) {                                                                                                                                 \
            const KV_T *vr = vb + (size_t)t * row;                                                                                                                    \
            if (vn && t < nn) KVL__KV_PREFETCH_ROWS(vn, t, t + 1, row, RLINES);                                                                                      \
            const float *p = S + (size_t)(j0 + t) * LANES + lg;                                                                                                       \
            __m512 v[8];                                                                                                                                              \
_Pragma("GCC unroll 8")                                                                                                                                               \
            for (int e = 0; e < DV; e++)                                                                                                                              \
                v[e] = e < DV - 1 ? LOADKV(vr + 16 * e) : LOADKV_TAIL(tail, vr + 16 * e);                                                                             \
_Pragma("GCC unroll 4")                                                                                                                                               \
            for (int m = 0; m < NL; m++) {                                                                                                                            \
                const __m512 pm = _mm512_set1_ps(p[m]);                                                                                                               \
_Pragma("GCC unroll 8")                                                                                                                                               \
                for (int e = 0; e < DV; e++) o[m * DV + e] = _mm512_fmadd_ps(pm, v[e], o[m * DV + e]);                                                                \
            }                                                                                                                                                         \
        }                                                                                                                                                             \
    }                                                                                                                                                                 \
_Pragma("GCC unroll 4")                                                                                                                                               \
    for (int m = 0; m < NL; m++) {                                                                                                                                    \
        const int l = lg + m;                                                                                                                                         \
        if (l >= L) break;                                                                                                                                            \
        float *dst = out + (size_t)(l / nh) * ldq + (size_t)(l % nh) * D;                                                                                             \
        const __m512 sc = _mm512_set1_ps(inv[l]);                                                                                                                     \
_Pragma("GCC unroll 8")                                                                                                                                               \
        for (int e = 0; e < DV - 1; e++) _mm512_storeu_ps(dst + 16 * e, _mm512_mul_ps(o[m * DV + e], sc));                                                            \
        _mm512_mask_storeu_ps(dst + 16 * (DV - 1), tail, _mm512_mul_ps(o[m * DV + DV - 1], sc));                                                                      \
    }                                                                                                                                                                 \
}                                                                                                                                                                     \
                                                                                                                                                                      \
                                                                                                                                                                      \
/* The tile of prefill_tile on AVX-512 for head_dim up to 128: the same                                                                                               \
 * arithmetic in the same order per lane (equal results up to the FMA contraction). */                                                                                \
__attribute__((target("avx512f"))) static void prefill_tile_avx512##SFX(                                                                                              \
    float *out, const float *q, int ldq, const KV_T *const *k_blk, const KV_T *const *v_blk,                                                                          \
    int block_tokens, int row, int head_off, int p0, int r, int nh, int D, float *scratch) {                                                                          \
    const int L = r * nh, Tk = p0 + r, jall = p0 + 1;                                                                                                                 \
    float *restrict S = scratch;                                                                                                                                      \
    float *restrict Qt = scratch + (size_t)Tk * LANES;                                                                                                                \
    const float scale = 1.0f / sqrtf((float)D);                                                                                                                       \
    for (int d = 0; d < D; d++)                                                                                                                                       \
        for (int l = 0; l < LANES; l++)                                                                                                                               \
            Qt[(size_t)d * LANES + l] =                                                                                                                               \
                l < L ? q[(size_t)(l / nh) * ldq + (size_t)(l % nh) * D + d] * scale : 0.0f;                                                                          \
    prefill_scores_avx512##SFX(S, Qt, k_blk, block_tokens, row, head_off, Tk, D);                                                                                     \
    /* causal tail: lane l (row l / nh) sees keys [0, p0 + l/nh + 1) */                                                                                               \
    for (int j = jall; j < Tk; j++)                                                                                                                                   \
        for (int l = 0; l < LANES; l++)                                                                                                                               \
            if (l < L && j >= p0 + l / nh + 1) S[(size_t)j * LANES + l] = -INFINITY;                                                                                  \
    __m512 mx = _mm512_set1_ps(-INFINITY);                                                                                                                            \
    for (int j = 0; j < Tk; j++) mx = _mm512_max_ps(mx, _mm512_loadu_ps(S + (size_t)j * LANES));                                                                      \
    float mxs[LANES], sum[LANES], inv[LANES];                                                                                                                         \
    _mm512_storeu_ps(mxs, mx);                                                                                                                                        \
    for (int l = 0; l < LANES; l++) sum[l] = 0.0f;                                                                                                                    \
    /* exp_nonpos over whole rows (compiled 16 wide here); -inf - max clamps to e^-87.3, so the                                                                       \
     * masked keys are zeroed after */                                                                                                                                \
    for (int j = 0; j < Tk; j++) {                                                                                                                                    \
        float *restrict sj = S + (size_t)j * LANES;                                                                                                                   \
        for (int l = 0; l < LANES; l++) {                                                                                                                             \
            sj[l] = exp_nonpos(sj[l] - mxs[l]);                                                                                                                       \
            sum[l] += sj[l];                                                                                                                                          \
        }                                                                                                                                                             \
    }                                                                                                                                                                 \
    for (int j = jall; j < Tk; j++)                                                                                                                                   \
        for (int l = 0; l < LANES; l++)                                                                                                                               \
            if (l < L && j >= p0 + l / nh + 1) {                                                                                                                      \
                sum[l] -= S[(size_t)j * LANES + l];                                                                                                                   \
                S[(size_t)j * LANES + l] = 0.0f;                                                                                                                      \
            }                                                                                                                                                         \
    for (int l = 0; l < LANES; l++) inv[l] = 1.0f / sum[l];                                                                                                           \
    const __mmask16 tail = D % 16 ? (__mmask16)((1u << (D % 16)) - 1) : (__mmask16)0xFFFF;                                                                            \
    switch ((D + 15) / 16) {                                                                                                                                          \
        case 1: for (int lg = 0; lg < L; lg += 4) prefill_pv_avx512##SFX(out, ldq, nh, L, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, tail, 1, 4); break;  \
        case 2: for (int lg = 0; lg < L; lg += 4) prefill_pv_avx512##SFX(out, ldq, nh, L, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, tail, 2, 4); break;  \
        case 3: for (int lg = 0; lg < L; lg += 4) prefill_pv_avx512##SFX(out, ldq, nh, L, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, tail, 3, 4); break;  \
        case 4: for (int lg = 0; lg < L; lg += 4) prefill_pv_avx512##SFX(out, ldq, nh, L, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, tail, 4, 4); break;  \
        case 5: for (int lg = 0; lg < L; lg += 2) prefill_pv_avx512##SFX(out, ldq, nh, L, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, tail, 5, 2); break;  \
        case 6: for (int lg = 0; lg < L; lg += 2) prefill_pv_avx512##SFX(out, ldq, nh, L, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, tail, 6, 2); break;  \
        case 7: for (int lg = 0; lg < L; lg += 2) prefill_pv_avx512##SFX(out, ldq, nh, L, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, tail, 7, 2); break;  \
        case 8: for (int lg = 0; lg < L; lg += 2) prefill_pv_avx512##SFX(out, ldq, nh, L, S, inv, lg, v_blk, block_tokens, row, head_off, Tk, D, tail, 8, 2); break;  \
    }                                                                                                                                                                 \
}
KVL_PREFILL_KERNELS(, float, KVL_LOAD_F32, KVL_LOAD_F32_TAIL, KVL_GET_F32)
KVL_PREFILL_KERNELS(_bf16, uint16_t, KVL_LOAD_BF16, KVL_LOAD_BF16_TAIL, KVL_GET_BF16)
#undef KVL_PREFILL_KERNELS
#endif

static inline __attribute__((always_inline)) void prefill_group_dim(
    float *out, const float *q, int ldq, const float *const *k_blk, const float *const *v_blk,
    int block_tokens, int row, int head_off, int p0, int n_rows, int group, const int D,
    float *scratch) {
    const int nh_max = group < LANES ? group : LANES, r_max = LANES / nh_max;
#ifdef KVL_PREFILL_AVX512
    const int use_avx512 = D <= 128 && __builtin_cpu_supports("avx512f");
#endif
    for (int h0 = 0; h0 < group; h0 += nh_max) {
        const int nh = group - h0 < nh_max ? group - h0 : nh_max;
        for (int i0 = 0; i0 < n_rows; i0 += r_max) {
            const int r = n_rows - i0 < r_max ? n_rows - i0 : r_max;
            const size_t off = (size_t)i0 * ldq + (size_t)h0 * D;
#ifdef KVL_PREFILL_AVX512
            if (use_avx512) {
                prefill_tile_avx512(out + off, q + off, ldq, k_blk, v_blk, block_tokens, row,
                                    head_off, p0 + i0, r, nh, D, scratch);
                continue;
            }
#endif
            prefill_tile(out + off, q + off, ldq, k_blk, v_blk, block_tokens, row, head_off, p0 + i0,
                         r, nh, D, scratch);
        }
    }
}

int kvl__cpu_attention_prefill_bf16_vectorised(int D) {
#ifdef KVL_PREFILL_AVX512
    return D % 16 == 0 && D <= 128 && __builtin_cpu_supports("avx512f");
#else
    (void)D;
    return 0;
#endif
}

void kvl__cpu_attention_prefill_group_bf16(float *out, const float *q, int ldq,
                                           const uint16_t *const *k_blk, const uint16_t *const *v_blk,
                                           int block_tokens, int row, int head_off, int p0,
                                           int n_rows, int group, int D, float *scratch) {
#ifdef KVL_PREFILL_AVX512
    if (!kvl__cpu_attention_prefill_bf16_vectorised(D)) return;   /* the caller gathers instead */
    const int nh_max = group < LANES ? group : LANES, r_max = LANES / nh_max;
    for (int h0 = 0; h0 < group; h0 += nh_max) {
        const int nh = group - h0 < nh_max ? group - h0 : nh_max;
        for (int i0 = 0; i0 < n_rows; i0 += r_max) {
            const int r = n_rows - i0 < r_max ? n_rows - i0 : r_max;
            const size_t off = (size_t)i0 * ldq + (size_t)h0 * D;
            prefill_tile_avx512_bf16(out + off, q + off, ldq, k_blk, v_blk, block_tokens, row,
                                     head_off, p0 + i0, r, nh, D, scratch);
        }
    }
#else
    (void)out, (void)q, (void)ldq, (void)k_blk, (void)v_blk, (void)block_tokens, (void)row;
    (void)head_off, (void)p0, (void)n_rows, (void)group, (void)D, (void)scratch;
#endif
}

int kvl__cpu_attention_prefill_vectorised(int D) {
#ifdef KVL_PREFILL_AVX512
    return D <= 128 && __builtin_cpu_supports("avx512f");
#else
    (void)D;
    return 0;
#endif
}

KVL_MULTIVERSION
void kvl__cpu_attention_prefill_group(float *out, const float *q, int ldq,
                                      const float *const *k_blk, const float *const *v_blk,
                                      int block_tokens, int row, int head_off, int p0, int n_rows,
                                      int group, int D, float *scratch) {
    if (D == 64)
        prefill_group_dim(out, q, ldq, k_blk, v_blk, block_tokens, row, head_off, p0, n_rows, group,
                          64, scratch);
    else if (D == 128)
        prefill_group_dim(out, q, ldq, k_blk, v_blk, block_tokens, row, head_off, p0, n_rows, group,
                          128, scratch);
    else
        prefill_group_dim(out, q, ldq, k_blk, v_blk, block_tokens, row, head_off, p0, n_rows, group,
                          D, scratch);
}
