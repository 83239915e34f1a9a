/* kernels/cpu/matmul_f32.h: nn.Linear over float32 weights for the CPU backend's forward pass
 * in float32 mode, on the model's own thread pool.
 *
 *   out[T,N] = in[T,K] @ W[N,K]^T + bias[N]     all float32, row-major, W as the checkpoint has it
 *
 * Why not OpenBLAS sgemm for every T: at decode sizes (a batch of a few dozen rows) sgemm packs the
 * whole [N,K] weight matrix into its panel layout on every call and then multiplies: measured
 * here, the packing cost as much as the product, and its threads waiting between calls (with
 * sched_yield) took a quarter of a 16-session decode step.  So for 2 <= T <= KVL__F32_SMALL_T (32), where
 * the CPU has AVX-512F, a register tile of 4 weight rows x up to 4 input rows reads each weight
 * vector once per tile and multiplies it by every input row of the tile; the 16 sums of a tile
 * are reduced together by a transpose-and-add tree (45 instructions, not 16 horizontal sums).
 * Where it has AVX2 and FMA but not AVX-512F, the same at 8 lanes, 4 weight rows (taken from 4
 * quarters of the part's rows: 4 streams a thread) x up to 3 input rows.
 * One row (sgemv), larger T (prefill), or a CPU with neither: OpenBLAS sgemm on each
 * part's rows of W, single-threaded inside the part.  Either way the rows of W are split over
 * the model's pool, 16 outputs at a time, so the forward pass runs on one set of threads:
 * OpenBLAS's own threads, which wait for work by spinning with sched_yield for ~0.1 s after
 * each call, measured here taking half a core from the decode steps that followed a prefill.
 * Results agree with sgemm within float32 summation-order rounding (16 partial sums per dot
 * product, then the tree).  Private to kernels/cpu (and its tests, through kvl_cpu_kernels_iface). */
#ifndef KVL_KERNELS_CPU_MATMUL_F32_H
#define KVL_KERNELS_CPU_MATMUL_F32_H

#include "pool.h"

#define KVL__F32_SMALL_T 32   /* most input rows the tiles take (measured: as fast as sgemm at
                                 * 32 rows, 0.55-0.7x of it at 64) */

#define KVL__F32_TILES_OFF 0      /* every call goes to OpenBLAS */
#define KVL__F32_TILES_AVX512 1   /* 4 x 4 tiles at 16 lanes */
#define KVL__F32_TILES_AVX2 2     /* 4 x 3 tiles at 8 lanes, AVX2 + FMA */

/* Which tiles run here, decided once a process from the CPU's features (and the OS's saving of
 * their registers): AVX-512F first, else AVX2 + FMA, else off.  KVL_CPU_F32_KERNEL in the
 * environment overrides it: "blas" turns the tiles off, "avx2" takes the AVX2 tiles where the
 * CPU has them (off where it does not).  Returns a KVL__F32_TILES_* value. */
int kvl__f32_tiles_active(void);

/* "AVX-512F", "AVX2+FMA" or "none": kvl__f32_tiles_active()'s tiles, for descriptions. */
const char *kvl__f32_tiles_name(void);

/* out[T,N] = in[T,K] W[N,K]^T (+ bias[N] when bias is not NULL).  pool: the threads to split N
 * over (NULL: the caller alone).  OpenBLAS must be on one thread (openblas_set_num_threads(1))
 * while this runs on a pool: its parts call it concurrently.  out must not alias in or W.
 * Calls on one pool must not overlap (kvl__pool_run). */
void kvl__cpu_matmul_f32(kvl__pool *pool, float *out, const float *in, const float *W,
                         const float *bias, int T, int K, int N);

/* One input times several weight matrices of the same K, as one job on the pool: a layer's
 * q/k/v projections, its gate and up.  Each handed to the pool on its own, a 16-session decode
 * step ran 49 pool jobs, and the pool's hand-offs and its threads' waits for each other were
 * 12% of the step; as one job (31 a step) the small k and v products also split evenly.
 * Measured: p50 inter-token 2.28 ms against 2.34 at 16 sessions of qwen3-b (medians of six
 * interleaved bench_batch runs).
 *   out_i[T, N_i] = in[T, K] W_i[N_i, K]^T (+ bias_i)   for i < n <= KVL__F32_MULTI_MAX
 * Every output gets exactly the bits kvl__cpu_matmul_f32 gives it (the tiles' sums do not depend
 * on how rows are cut into blocks); where the tiles do not run (T = 1, T > KVL__F32_SMALL_T,
 * no pool) it is kvl__cpu_matmul_f32 on each output in turn.  Same contract otherwise. */
#define KVL__F32_MULTI_MAX 3
typedef struct kvl__f32_out {
    float *out;
    const float *W, *bias;   /* bias may be NULL */
    int N;
} kvl__f32_out;
void kvl__cpu_matmul_f32_multi(kvl__pool *pool, const float *in, int T, int K, const kvl__f32_out *o,
                               int n);

/* The tiles alone, on the caller, for rows [n0, n1) of W (n0 a multiple of 4): what
 * kvl__cpu_matmul_f32 runs per part; tests compare it with sgemm.  Returns -1 (and does nothing)
 * where kvl__f32_tiles_active() is 0 or T > KVL__F32_SMALL_T. */
int kvl__cpu_matmul_f32_tiles(float *out, const float *in, const float *W, const float *bias,
                              int T, int K, int N, int n0, int n1);

#endif
