/* kernels/cpu/matmul_bf16_amx.h: the bf16-weight prefill matmul on Intel AMX tiles (AMX-BF16,
 * Sapphire Rapids and later), behind kvl__cpu_matmul_bf16 (matmul_bf16.h).
 *
 *   out[T, n] = in[T, K] @ W[n, K]^T + bias[n]   for n in [0, N32), N32 = N rounded down to 32
 *   W bf16 (raw uint16 bits, row-major [N, K]), in / out / bias float32
 *
 * TDPBF16PS multiplies bf16 by bf16 into float32 accumulators, so the float32 input is split
 * into a hi/lo bf16 pair (hi = bf16(x), lo = bf16(x - hi), each rounded to nearest even) and
 * both halves are multiplied by the exact weights: the product then carries the input to
 * 2^-16 of its value (float32: 2^-24), where rounding the input to bf16 alone (2^-8) would
 * move logits visibly.  The weight tiles are loaded straight from W (16 rows of 32 k), the input
 * is packed once per call into the tiles' pair-interleaved (VNNI) layout, and each 16 x 16
 * float32 result tile is transposed into out on the way out.
 *
 * Requires: kvl__amx_usable(), K % 32 == 0, N >= 32, T >= 1; the columns [N32, N) are the
 * caller's.  Scratch: `pack`, pack_bytes long (any alignment: the call starts at its first
 * cache line); the call packs and multiplies as many rows of in at a time as it holds, in 32s
 * (kvl__amx_pack_bytes(32, K) at the least).  Private to kernels/cpu. */
#ifndef KVL_KERNELS_CPU_MATMUL_BF16_AMX_H
#define KVL_KERNELS_CPU_MATMUL_BF16_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

/* 1 when the CPU reports AMX-TILE and AMX-BF16, AVX-512 F/BW/VL/BF16 (the packing), and the
 * Linux kernel grants this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM); the
 * first call asks, later calls return the answer.  0 on other CPUs, OSes and compilers. */
int kvl__amx_usable(void);

/* Bytes of packed input for T rows of K: T rounded up to 32, times K, times 4 (hi + lo bf16). */
size_t kvl__amx_pack_bytes(int T, int K);

/* out[:, 0:N32) as above, on the pool's threads (NULL: the caller alone); pack_bytes is the
 * size of `pack`.  Returns 0, or -1 (nothing written) when the shapes or scratch do not suit. */
int kvl__amx_matmul_bf16(kvl__pool *pool, float *out, const float *in, const uint16_t *W,
                         const float *bias, int T, int K, int N, void *pack, size_t pack_bytes);

#endif
