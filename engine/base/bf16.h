/* engine/base/bf16.h: float32 <-> bfloat16, the one definition every folder uses (weights
 * converted at load, the bf16 KV cache, bf16 spans on the wire).  Header-only (inline).
 *   kvl__bf16_round: round to nearest even (as torch's .to(torch.bfloat16)); a NaN stays a
 *                    (quiet) NaN, a finite value past the largest bf16 becomes infinity;
 *   kvl__bf16_widen: exact (a bf16 is the top half of a float32);
 *   kvl__bf16_round_n / kvl__bf16_widen_n: the same over arrays, 16 lanes at a time (bf16.c). */
#ifndef KVL_BASE_BF16_H
#define KVL_BASE_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t kvl__bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float kvl__bf16_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* dst[i] = kvl__bf16_round(src[i]) / kvl__bf16_widen(src[i]) for i < n; dst and src must not
 * overlap. */
void kvl__bf16_round_n(uint16_t *dst, const float *src, size_t n);
void kvl__bf16_widen_n(float *dst, const uint16_t *src, size_t n);

#endif
