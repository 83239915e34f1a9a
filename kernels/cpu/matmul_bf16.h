/* kernels/cpu/matmul_bf16.h: nn.Linear over bfloat16 weights with float32 accumulation, the
 * CPU backend's weight-streaming path (KVL_WEIGHTS_BF16, kvlingo/model.h).
 *
 *   out[T,N] = in[T,K] @ W[N,K]^T + bias[N]     W bf16 (raw uint16 bits), in/out/bias float32
 *
 * Single decode row (T = 1) and, on the portable kernel, T <= KVL__BF16_SMALL_T: the input rows
 * are split once into a pair of bf16, hi = bf16(x), lo = bf16(x - hi) (16 significant bits,
 * relative error <= 2^-17), and each output is sum_k W[n,k]*hi[k] + W[n,k]*lo[k] accumulated in
 * float32 (bf16 products are exact in float32); the rows of W are split over the pool's threads
 * and streamed once.  Two kernels do that arithmetic, chosen once at run time: AVX-512 BF16
 * (vdpbf16ps) where the CPU has it, a portable C loop otherwise.
 * AVX-512, 2 <= T <= KVL__BF16_WIDE_T (batched decode, short chunks): tiles of 4 weight rows x 4
 * input rows widen the weights to float32 in registers (exact) and multiply the exact inputs
 * with FMA: a 16-session decode step of a small model ran 1.3-1.4x faster than on the hi/lo
 * tiles, whose two vdpbf16ps per 32 products ran at half the FMA's rate here.
 * Larger T (prefill): panels of W are widened to float32 (exact) and
 * multiplied by OpenBLAS sgemm with the float32 input, each part of the pool on its own rows of
 * the panel (so OpenBLAS must be on one thread while a pool runs this: openblas_set_num_threads(1),
 * as the CPU backend's forward sets it).  The kernels agree within float32 summation-order
 * rounding where both see exact inputs, and within the split's 2^-17 input rounding where one
 * splits.  (Debian's OpenBLAS 0.3.21
 * declares cblas_sbgemm in cblas.h but its library does not export it.)
 * Private to kernels/cpu (and its tests, through kvl_cpu_kernels_iface). */
#ifndef KVL_KERNELS_CPU_MATMUL_BF16_H
#define KVL_KERNELS_CPU_MATMUL_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "bf16.h"
#include "pool.h"

#define KVL__BF16_SMALL_T 16
#define KVL__BF16_TCHUNK 64   /* most input rows the split scratch holds at once */
#define KVL__BF16_WIDE_T 32   /* most input rows the AVX-512 widening tiles take */

/* float32 -> bf16, round to nearest even (NaN stays NaN), and back (exact): engine/base/bf16.h */
#define kvl__f32_to_bf16 kvl__bf16_round
#define kvl__bf16_to_f32 kvl__bf16_widen
void kvl__bf16_from_f32(uint16_t *dst, const float *src, size_t n);
void kvl__bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);

/* The kernels a run can choose: AUTO picks AVX512 when the CPU reports avx512f + avx512bw +
 * avx512bf16 and the build compiled it, PORTABLE otherwise.  The environment variable
 * KVL_CPU_BF16_KERNEL=portable forces the portable kernel for a whole process. */
typedef enum kvl__bf16_kernel {
    KVL__BF16_KERNEL_AUTO = 0,
    KVL__BF16_KERNEL_PORTABLE = 1,
    KVL__BF16_KERNEL_AVX512 = 2,
} kvl__bf16_kernel;
/* The kernel in use (never AUTO); kvl__bf16_set_kernel returns the previous one, and refuses
 * (returns -1, changes nothing) AVX512 on a CPU or build without it.  Tests only: not safe
 * while a matmul runs on another thread. */
kvl__bf16_kernel kvl__bf16_kernel_active(void);
int kvl__bf16_set_kernel(kvl__bf16_kernel k);
const char *kvl__bf16_kernel_name(kvl__bf16_kernel k);

/* Scratch one matmul call needs, owned by the caller (the backend's activation scratch):
 *   xsplit  >= kvl__bf16_xsplit_elems(T, K) uint16 (the hi/lo pairs, rows padded to 32)
 *   panel   >= kvl__bf16_panel_elems(K) floats (the widened weight panel for T > SMALL_T)
 * Both sized for the largest K the caller will pass. */
#define KVL__BF16_PANEL_FLOATS ((size_t)1 << 22)   /* 16 MB: panels wide enough for sgemm to run at its rate */
size_t kvl__bf16_xsplit_elems(int T, int K);
size_t kvl__bf16_panel_elems(int K);

typedef struct kvl__bf16_exec {
    kvl__pool *pool;      /* NULL: run on the caller only */
    uint16_t *xsplit;
    float *panel;
} kvl__bf16_exec;

void kvl__cpu_matmul_bf16(const kvl__bf16_exec *ex, float *out, const float *in, const uint16_t *W,
                          const float *bias, int T, int K, int N);

#endif
