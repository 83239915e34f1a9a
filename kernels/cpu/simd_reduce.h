/* kernels/cpu/simd_reduce.h: horizontal sums of AVX-512 and AVX2 accumulators, shared by the
 * matmul tiles (matmul_f32.c, matmul_bf16.c).  Private to kernels/cpu. */
#ifndef KVL_KERNELS_CPU_SIMD_REDUCE_H
#define KVL_KERNELS_CPU_SIMD_REDUCE_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* s[i] = the sum of the 16 lanes of a[i], i = 0..15, in 45 instructions where 16 separate
 * horizontal sums take ~130: pairs of vectors interleaved and added (unpack ps, then pd), then
 * 128-bit lanes exchanged and added twice.  The order of the additions differs from a
 * lane-by-lane sum only in float32 rounding. */
__attribute__((target("avx512f"))) static inline __m512 kvl__reduce16_ps(const __m512 a[16]) {
    __m512 b[8], c[4];
    for (int j = 0; j < 8; j++)
        b[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]),
                             _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
    for (int j = 0; j < 4; j++) {
        __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b[2 * j]), _mm512_castps_pd(b[2 * j + 1]));
        __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b[2 * j]), _mm512_castps_pd(b[2 * j + 1]));
        c[j] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    /* c[j]: 128-bit lane L holds lane L's partial sums of a[4j..4j+3] */
    __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

/* s[i] = the sum of the 8 lanes of a[i], i = 0..7 (AVX2): three rounds of pairwise horizontal
 * adds within 128-bit lanes, then the two halves added.  Same rounding caveat as above. */
__attribute__((target("avx2"))) static inline __m256 kvl__reduce8_ps(const __m256 a[8]) {
    __m256 h0 = _mm256_hadd_ps(a[0], a[1]), h1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h2 = _mm256_hadd_ps(a[4], a[5]), h3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);
    /* g0: [a0..a3 low-half sums | a0..a3 high-half sums], g1 likewise for a4..a7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}
#endif

#endif
