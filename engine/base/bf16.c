/* engine/base/bf16.c: float32 <-> bfloat16 over arrays, for every folder that converts a KV
 * cache's rows, a span's payload or weights (bf16.h).  Written 16 lanes wide in plain C (GCC /
 * clang vector extensions) and compiled for AVX-512F, AVX2 and the base ISA, the copy chosen at
 * load time (fastmath.h KVL_MULTIVERSION): the element loops stay scalar at -O2, 1 ms for the
 * 2 M values of a 2048-token span of qwen3-a.  Element for element the results of
 * kvl__bf16_round / kvl__bf16_widen.  Loads and stores go through memcpy: callers' arrays are
 * only element-aligned. */
#include "bf16.h"

#include "fastmath.h"

typedef uint32_t kvl__bf16_u32x16 __attribute__((vector_size(64)));
typedef uint16_t kvl__bf16_u16x16 __attribute__((vector_size(32)));

KVL_MULTIVERSION void kvl__bf16_widen_n(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        kvl__bf16_u16x16 h;
        memcpy(&h, src + i, sizeof h);
        const kvl__bf16_u32x16 w = __builtin_convertvector(h, kvl__bf16_u32x16) << 16;
        memcpy(dst + i, &w, sizeof w);
    }
    for (; i < n; i++) dst[i] = kvl__bf16_widen(src[i]);
}

KVL_MULTIVERSION void kvl__bf16_round_n(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        kvl__bf16_u32x16 u;
        memcpy(&u, src + i, sizeof u);
        /* kvl__bf16_round per lane: a NaN keeps its top half, made quiet; else round to nearest even */
        const kvl__bf16_u32x16 nan = (kvl__bf16_u32x16)((u & 0x7fffffffu) > 0x7f800000u);
        const kvl__bf16_u32x16 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
        const kvl__bf16_u16x16 h = __builtin_convertvector((nan & q) | (~nan & r), kvl__bf16_u16x16);
        memcpy(dst + i, &h, sizeof h);
    }
    for (; i < n; i++) dst[i] = kvl__bf16_round(src[i]);
}
