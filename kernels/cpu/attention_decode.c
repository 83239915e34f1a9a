/* kernels/cpu/attention_decode.c: single-query attention (decode) read in place from the cache
 * blocks, one KV head with the query heads of its GQA group at a time (see ops.h).
 *
 * Why per group: the group's query heads share that KV head's keys and values, so one pass over
 * them serves the whole group; and a (sequence, KV head) pair is the unit a batched decode step
 * splits over threads.  Dot products and the weighted sum of values run 16 lanes wide, compiled
 * for AVX-512, AVX2 and the base ISA and chosen at load time (function multi-versioning); the
 * result is the same on every path up to float rounding of the 16 partial sums, and the same
 * for a sequence whether it runs alone or in a batch (the same code on the same data). */
#include "ops.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define KVL_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef KVL_MULTIVERSION
#define KVL_MULTIVERSION
#endif

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

/* e^x for x <= 0 (a score minus the row's maximum), in plain arithmetic the compiler runs 16
 * lanes wide, where expf is a call per element.  x = n ln2 + f with |f| <= ln2/2 (Cody-Waite: ln2
 * in two parts), e^f by its Taylor series to f^6 (truncation < 1.3e-7 relative), times 2^n
 * through the exponent bits.  Below -87.3 (e^x < 1.2e-38, 2^n no longer normal) the result is
 * that of -87.3, which no softmax weight can tell from 0. */
static inline __attribute__((always_inline)) float exp_nonpos(float x) {
    x = x < -87.3f ? -87.3f : x;
    const float shift = 12582912.0f;   /* 1.5 * 2^23: adding it rounds to an integer */
    float r = x * 1.44269504088896341f + shift;
    float n = r - shift;
    int32_t ni;
    memcpy(&ni, &r, sizeof ni);
    ni -= 0x4B400000;                  /* the bits of `shift`: ni = n */
    float f = x - n * 0.693145751953125f - n * 1.42860676533018e-06f;
    float p = 1.0f + f * (1.0f + f * (0.5f + f * (0.166666667f + f * (0.0416666667f +
                                                                     f * (0.00833333333f + f * 0.00138888889f)))));
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += ni * (1 << 23);
    memcpy(&p, &bits, sizeof p);
    return p;
}

/* Softmax of each head's scores in place: scratch[hh * Tk + j] */
static inline __attribute__((always_inline)) void softmax_heads(float *scratch, int group, int Tk) {
    for (int hh = 0; hh < group; hh++) {
        float *restrict s = scratch + (size_t)hh * Tk;
        float m = -INFINITY;
        for (int j = 0; j < Tk; j++) m = s[j] > m ? s[j] : m;
        for (int j = 0; j < Tk; j++) s[j] = exp_nonpos(s[j] - m);
        float acc[LANES] = {0};
        int j = 0;
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

KVL_MULTIVERSION
void kvl__cpu_attention_decode_group(float *out, const float *q, const float *const *k_blk,
                                     const float *const *v_blk, int block_tokens, int row,
                                     int head_off, int Tk, int group, int D, float *scratch) {
    if (D == 64) {
        decode_group_64(out, q, k_blk, v_blk, block_tokens, row, head_off, Tk, group, scratch);
        return;
    }
    if (D == 128) {
        decode_group_128(out, q, k_blk, v_blk, block_tokens, row, head_off, Tk, group, scratch);
        return;
    }
    const float scale = 1.0f / sqrtf((float)D);
    /* scores: scratch[hh * Tk + j] */
    for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {
        const float *kb = k_blk[b] + head_off;
        const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;
        for (int t = 0; t < n; t++) {
            const float *kj = kb + (size_t)t * row;
            for (int hh = 0; hh < group; hh++)
                scratch[(size_t)hh * Tk + j0 + t] = dot_any(q + (size_t)hh * D, kj, D) * scale;
        }
    }
    softmax_heads(scratch, group, Tk);
    for (int hh = 0; hh < group; hh++) memset(out + (size_t)hh * D, 0, sizeof(float) * (size_t)D);
    for (int j0 = 0, b = 0; j0 < Tk; j0 += block_tokens, b++) {
        const float *vb = v_blk[b] + head_off;
        const int n = Tk - j0 < block_tokens ? Tk - j0 : block_tokens;
        for (int t = 0; t < n; t++) {
            const float *vj = vb + (size_t)t * row;
            for (int hh = 0; hh < group; hh++)
                axpy_any(out + (size_t)hh * D, scratch[(size_t)hh * Tk + j0 + t], vj, D);
        }
    }
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
