/* kernels/cpu/matmul_bf16.h: nn.Linear over bfloat16 weights with float32 accumulation, the
 * CPU backend's weight-streaming path (KVL_WEIGHTS_BF16, kvlingo/model.h).
 *
 *   out[T,N] = in[T,K] @ W[N,K]^T + bias[N]     W bf16 (raw uint16 bits), in/out/bias float32
 *
 * T <= KVL__BF16_WIDE_T (decode, batched decode, short chunks): tiles of 4 weight rows x up to
 * 4 input rows (on AVX-512 a last tile of 5 or 6 takes the 1 or 2 rows left over) widen the
 * weights to float32 in registers (exact: a bf16 is the top half of a float32) and multiply
 * the exact inputs with FMA, the rows of W split over the pool's threads
 * and streamed once.  Three kernels do that arithmetic, chosen once at run time: AVX-512
 * (16 lanes) where the CPU has AVX-512F/BW/VL, AVX2 + FMA (8 lanes, 4 x 3 tiles) where it has
 * those, and a portable C loop (one weight row at a time, T <= KVL__BF16_SMALL_T) otherwise.
 * On AVX-512 BF16 CPUs these beat vdpbf16ps, which needs the inputs split into a hi/lo bf16
 * pair and takes two instructions per 32 products at half the FMA's rate.
 * From KVL__BF16_AMX_MIN_T rows (a switch's turn, batched decode of many sessions, prefill): on
 * AMX CPUs, AMX-BF16 tiles multiply the weights by a hi/lo bf16 split of
 * the inputs (matmul_bf16_amx.h: the inputs carried to 2^-16 of their value, float32
 * accumulation).  Elsewhere, or for K not a multiple of 32, panels of W are widened to float32
 * (exact) and multiplied by OpenBLAS sgemm with the float32 input, each part of the pool on its
 * own rows of the panel (so OpenBLAS must be on one thread while a pool runs this:
 * openblas_set_num_threads(1), as the CPU backend's forward sets it).  Every other path
 * multiplies the exact float32 inputs by the exact widened weights, so those kernels agree
 * within float32 summation-order rounding.  (Debian's OpenBLAS 0.3.21
 * declares cblas_sbgemm in cblas.h but its library does not export it.)
 * Private to kernels/cpu (and its tests, through kvl_cpu_kernels_iface). */
#ifndef KVL_KERNELS_CPU_MATMUL_BF16_H
#define KVL_KERNELS_CPU_MATMUL_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "bf16.h"
#include "pool.h"

#define KVL__BF16_SMALL_T 16  /* most input rows the portable row loop takes */
#define KVL__BF16_WIDE_T 32   /* most input rows the AVX-512 / AVX2 widening tiles take */
/* On AMX CPUs, from this many input rows the AMX tiles take the product: the widening tiles
 * are bound by FMA issue from 4 rows up (about 0.4 ms more per row on a 1536 x 8960 product, 2
 * threads), the AMX tiles cost about the same from 1 to 16 rows (one 16-row input block).
 * Measured, weights on huge pages, widening vs AMX: 4 rows 1.3 vs 2.0 ms, 5 rows 1.9 vs 1.9,
 * 6 rows 2.1 vs 1.9, 9 rows 3.2 vs 2.0, 16 rows 5.0 vs 1.9 (with the widening tiles of 4 + 1
 * and 4 + 2 rows at 5 and 6, before the last tile of 5 or 6 rows; not measured again since:
 * the hosts at hand have no AMX). */
#define KVL__BF16_AMX_MIN_T 6

/* float32 -> bf16, round to nearest even (NaN stays NaN), and back (exact), one value or an
 * array: engine/base/bf16.h */
#define kvl__f32_to_bf16 kvl__bf16_round
#define kvl__bf16_to_f32 kvl__bf16_widen
#define kvl__bf16_from_f32 kvl__bf16_round_n
#define kvl__bf16_to_f32_n kvl__bf16_widen_n

/* The kernels a run can choose: AUTO picks AMX where kvl__amx_usable() (matmul_bf16_amx.h) and
 * the CPU has AVX512, else AVX512 when the CPU reports avx512f + avx512bw + avx512vl, else AVX2
 * when it reports avx2 + fma (and the build compiled them), PORTABLE otherwise.  The environment
 * variable KVL_CPU_BF16_KERNEL=portable (or =avx2 / =avx512, where the CPU has it) forces that
 * kernel for a whole process. */
typedef enum kvl__bf16_kernel {
    KVL__BF16_KERNEL_AUTO = 0,
    KVL__BF16_KERNEL_PORTABLE = 1,
    KVL__BF16_KERNEL_AVX512 = 2,
    KVL__BF16_KERNEL_AVX2 = 3,
    KVL__BF16_KERNEL_AMX = 4,   /* AVX512's tiles below KVL__BF16_AMX_MIN_T rows, AMX tiles from it */
} kvl__bf16_kernel;
/* The kernel in use (never AUTO); kvl__bf16_set_kernel returns the previous one, and refuses
 * (returns -1, changes nothing) a kernel the CPU or build lacks.  Tests only: not safe
 * while a matmul runs on another thread. */
kvl__bf16_kernel kvl__bf16_kernel_active(void);
int kvl__bf16_set_kernel(kvl__bf16_kernel k);
const char *kvl__bf16_kernel_name(kvl__bf16_kernel k);

/* Scratch one matmul call needs, owned by the caller (the backend's activation scratch):
 *   panel   >= kvl__bf16_panel_elems(K) floats (the widened weight panel for prefill T),
 * sized for the largest K the caller will pass. */
#define KVL__BF16_PANEL_FLOATS ((size_t)1 << 22)   /* 16 MB: panels wide enough for sgemm to run at its rate */
size_t kvl__bf16_panel_elems(int K);

typedef struct kvl__bf16_exec {
    kvl__pool *pool;      /* NULL: run on the caller only */
    float *panel;
} kvl__bf16_exec;

void kvl__cpu_matmul_bf16(const kvl__bf16_exec *ex, float *out, const float *in, const uint16_t *W,
                          const float *bias, int T, int K, int N);

/* One input times several bf16 weight matrices of the same K (a layer's q/k/v projections, its
 * gate and up) as one job on the pool, where the widening tiles run (T <= KVL__BF16_WIDE_T, not
 * on AMX from KVL__BF16_AMX_MIN_T rows): each part takes its own rows of every output, so each
 * output gets exactly the bits of its own kvl__cpu_matmul_bf16 call (a row's sum does not depend
 * on the rows beside it in a tile), in one pool hand-off instead of n.  Elsewhere it is
 * kvl__cpu_matmul_bf16 on each output in turn. */
#define KVL__BF16_MULTI_MAX 3
typedef struct kvl__bf16_out {
    float *out;
    const uint16_t *W;
    const float *bias;   /* may be NULL */
    int N;
} kvl__bf16_out;
void kvl__cpu_matmul_bf16_multi(const kvl__bf16_exec *ex, const float *in, int T, int K,
                                const kvl__bf16_out *o, int n);

#endif
