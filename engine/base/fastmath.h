/* engine/base/fastmath.h: e^x for x <= 0 in plain float arithmetic that compilers run 16 lanes
 * wide, for the softmax-shaped loops of the runtime (attention scores, the sampled token's
 * log-probability), where expf is a library call per element.  Header-only (inline). */
#ifndef KVL_BASE_FASTMATH_H
#define KVL_BASE_FASTMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A function compiled for AVX-512F, AVX2 and the base ISA, the copy chosen at load time
 * (GCC function multi-versioning; other compilers: the base ISA only), for loops written 16
 * lanes wide in plain C. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define KVL_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef KVL_MULTIVERSION
#define KVL_MULTIVERSION
#endif

/* e^x for x <= 0 (typically a value minus its row's maximum).  x = n ln2 + f with |f| <= ln2/2
 * (Cody-Waite: ln2 in two parts), e^f by its Taylor series to f^6 (truncation < 1.3e-7
 * relative), times 2^n through the exponent bits.  Below -87.3 (e^x < 1.2e-38, 2^n no longer
 * normal) the result is that of -87.3, which no softmax weight can tell from 0. */
static inline __attribute__((always_inline)) float kvl__exp_nonpos(float x) {
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

/* The same e^x, 8 lanes at a time, for loops GCC's vectoriser leaves scalar at -O2 (a select or
 * a clamp in the loop body is control flow it will not convert for AVX2).  The steps are those
 * above; the fused multiply-adds round once where the plain C rounds twice, so a lane can
 * differ from kvl__exp_nonpos in its last bit.  A NaN stays NaN (the clamp keeps x when the
 * comparison fails).  Call it only where kvl__cpu_has_avx2_fma() holds. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define KVL_HAVE_EXP_AVX2 1
#define KVL_AVX2_FMA_FN __attribute__((target("avx2,fma")))
static inline __attribute__((always_inline)) KVL_AVX2_FMA_FN __m256 kvl__exp_nonpos_avx2(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);   /* maxps returns its second operand on NaN */
    const __m256 shift = _mm256_set1_ps(12582912.0f);
    const __m256 r = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shift);
    const __m256 n = _mm256_sub_ps(r, shift);
    const __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(r), _mm256_set1_epi32(0x4B400000));
    __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860676533018e-06f), f);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0.00138888889f), f, _mm256_set1_ps(0.00833333333f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.0416666667f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.166666667f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(ni, 23)));
}

/* softmax of row[n] in place, 8 lanes at a time: the maximum (NaN entries passed over, as a
 * plain `x > m ? x : m` does), e^(x - max) by kvl__exp_nonpos_avx2 (the last n % 8 by
 * kvl__exp_nonpos) summed in 8 lanes, then the scaling.  Shared by the attention forms that
 * normalise score rows (kernels/cpu). */
static inline __attribute__((always_inline)) KVL_AVX2_FMA_FN void kvl__softmax_row_avx2(float *row, int n) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(_mm256_loadu_ps(row + j), mv);
    float lane[8];
    _mm256_storeu_ps(lane, mv);
    float m = -INFINITY;
    for (int l = 0; l < 8; l++) m = lane[l] > m ? lane[l] : m;
    for (int k = j; k < n; k++) m = row[k] > m ? row[k] : m;
    const __m256 mm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
        const __m256 e = kvl__exp_nonpos_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + j), mm));
        _mm256_storeu_ps(row + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(lane, acc);
    float sum = 0.0f;
    for (int l = 0; l < 8; l++) sum += lane[l];
    for (int k = j; k < n; k++) {
        row[k] = kvl__exp_nonpos(row[k] - m);
        sum += row[k];
    }
    const float inv = 1.0f / sum;
    const __m256 vi = _mm256_set1_ps(inv);
    for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), vi));
    for (; j < n; j++) row[j] *= inv;
}

/* The lanes of a row's last n % 8 elements: a mask for _mm256_maskload_ps / _mm256_maskstore_ps. */
static inline __attribute__((always_inline)) KVL_AVX2_FMA_FN __m256i kvl__tail_mask_avx2(int n_left) {
    static const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(lanes + 8 - n_left));
}
#endif

/* AVX2 and FMA usable here (the CPU has them and the OS saves the ymm state), decided once. */
static inline int kvl__cpu_has_avx2_fma(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    static int has = -1;   /* a benign race: every thread stores the same value */
    if (has < 0) has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return has;
#else
    return 0;
#endif
}

#endif
