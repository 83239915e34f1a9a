/* engine/base/fastmath.h: e^x for x <= 0 in plain float arithmetic that compilers run 16 lanes
 * wide, for the softmax-shaped loops of the runtime (attention scores, the sampled token's
 * log-probability), where expf is a library call per element.  Header-only (inline). */
#ifndef KVL_BASE_FASTMATH_H
#define KVL_BASE_FASTMATH_H

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

#endif
