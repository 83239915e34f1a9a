/* kernels/cpu/matmul_bf16.c: bf16-weight matmuls with float32 accumulation (see matmul_bf16.h).
 *
 * Small T: a register tile of 4 weight rows x up to 4 input rows (on AVX-512 the last tile takes
 * 5 or 6 where 1 or 2 rows are left over: wide_block); each weight vector is loaded once per tile
 * and multiplied by every input row of the tile, so a decode step (T = 1) reads
 * each weight byte exactly once and T <= 32 re-reads a 4-row block (<= 80 KB) from L2, not
 * memory.  The AVX-512 and AVX2 kernels are compiled with function-level target attributes so
 * the rest of the build stays baseline x86-64. */
#include "matmul_bf16.h"
#include "matmul_bf16_amx.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVL_HAVE_X86_KERNELS 1
#include <immintrin.h>

#include "simd_reduce.h"
#include "tile_acc.h"
#define KVL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define KVL_AVX2 __attribute__((target("avx2,fma")))
#endif

/* ---- kernel choice ------------------------------------------------------------------------ */

static int cpu_has_avx512(void) {
#ifdef KVL_HAVE_X86_KERNELS
    __builtin_cpu_init();
    /* avx512f / avx512bw also check that the OS saves the zmm state (XCR0) */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

static int cpu_has_avx2fma(void) {
#ifdef KVL_HAVE_X86_KERNELS
    __builtin_cpu_init();
    /* avx2 also checks that the OS saves the ymm state (XCR0) */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static int kernel_available(kvl__bf16_kernel k) {
    return k == KVL__BF16_KERNEL_PORTABLE || (k == KVL__BF16_KERNEL_AVX512 && cpu_has_avx512()) ||
           (k == KVL__BF16_KERNEL_AVX2 && cpu_has_avx2fma()) ||
           (k == KVL__BF16_KERNEL_AMX && cpu_has_avx512() && kvl__amx_usable());
}

static kvl__bf16_kernel g_kernel = KVL__BF16_KERNEL_AUTO;

kvl__bf16_kernel kvl__bf16_kernel_active(void) {
    if (g_kernel == KVL__BF16_KERNEL_AUTO) {
        /* a benign race: every thread computes the same answer */
        const char *env = getenv("KVL_CPU_BF16_KERNEL");
        kvl__bf16_kernel k = kernel_available(KVL__BF16_KERNEL_AMX) ? KVL__BF16_KERNEL_AMX
                             : cpu_has_avx512()                     ? KVL__BF16_KERNEL_AVX512
                             : cpu_has_avx2fma()                    ? KVL__BF16_KERNEL_AVX2
                                                                    : KVL__BF16_KERNEL_PORTABLE;
        if (env && !strcmp(env, "portable")) k = KVL__BF16_KERNEL_PORTABLE;
        if (env && !strcmp(env, "avx512") && cpu_has_avx512()) k = KVL__BF16_KERNEL_AVX512;
        if (env && !strcmp(env, "avx2") && cpu_has_avx2fma()) k = KVL__BF16_KERNEL_AVX2;
        g_kernel = k;
    }
    return g_kernel;
}

int kvl__bf16_set_kernel(kvl__bf16_kernel k) {
    kvl__bf16_kernel old = kvl__bf16_kernel_active();
    if (!kernel_available(k)) return -1;
    g_kernel = k;
    return (int)old;
}

const char *kvl__bf16_kernel_name(kvl__bf16_kernel k) {
    return k == KVL__BF16_KERNEL_AMX        ? "amx"
           : k == KVL__BF16_KERNEL_AVX512   ? "avx512"
           : k == KVL__BF16_KERNEL_AVX2     ? "avx2"
           : k == KVL__BF16_KERNEL_PORTABLE ? "portable"
                                            : "auto";
}

#ifdef KVL_HAVE_X86_KERNELS
/* 8 bf16 at p widened to float32 (exact), for the AVX2 tiles */
#define KVL_WIDEN8(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#endif

/* ---- small T ------------------------------------------------------------------------------ */

size_t kvl__bf16_panel_elems(int K) {
    return (size_t)K > KVL__BF16_PANEL_FLOATS ? (size_t)K : KVL__BF16_PANEL_FLOATS;
}

/* Portable: each weight row widened 16 at a time (exact) and multiplied by every input row in
 * 16 float lanes, so the row is read from memory once and from L1 for the other T - 1 rows. */
static void small_rows_portable(float *out, const float *in, const uint16_t *W, const float *bias,
                                int T, int K, int N, int n0, int n1) {
    for (int n = n0; n < n1; n++) {
        const uint16_t *w = W + (size_t)n * K;
        for (int t = 0; t < T; t++) {
            const float *x = in + (size_t)t * K;
            float lanes[16] = {0};
            int k = 0;
            for (; k + 16 <= K; k += 16)
                for (int l = 0; l < 16; l++) lanes[l] += kvl__bf16_to_f32(w[k + l]) * x[k + l];
            for (; k < K; k++) lanes[k & 15] += kvl__bf16_to_f32(w[k]) * x[k];
            float s = 0.0f;
            for (int l = 0; l < 16; l++) s += lanes[l];
            out[(size_t)t * N + n] = s + (bias ? bias[n] : 0.0f);
        }
    }
}

#ifdef KVL_HAVE_X86_KERNELS
/* A tile's 4 weight rows are rs rows apart: wide_rows hands each tile one row from each quarter
 * of its range, so a thread reads 4 streams in different DRAM pages at once.  Four adjacent rows
 * are one stream to the memory controller, and a 4-stream read runs faster than one stream here
 * (the read probe of bench_runtime): a 1536 x 8960 bf16 product on 2 threads streamed 18-20
 * GB/s with adjacent rows, 23-27 GB/s with far ones.  Each row is prefetched KVL_PF_BYTES ahead
 * at the rate it is consumed (rows of 1-3 KB are too short for the hardware streamer to ramp
 * up); past a row's end that is the start of the row the next tile takes. */
#ifndef KVL_PF_BYTES
#define KVL_PF_BYTES 2048
#endif
/* The tiles' prefetch of their 4 weight rows, KVL_PF_BYTES ahead of step k: one line of each
 * row every 32 elements (a macro, not a function: an inline helper lost the prefetches). */
#define KVL__PF_ROWS4(prefetch, k, w0, w1, w2, w3, pf_end)                                         \
    do {                                                                                             \
        if ((prefetch) && ((k) & 31) == 0) {                                                         \
            const char *pf_[4] = {(const char *)((w0) + (k)) + KVL_PF_BYTES,                         \
                                  (const char *)((w1) + (k)) + KVL_PF_BYTES,                         \
                                  (const char *)((w2) + (k)) + KVL_PF_BYTES,                         \
                                  (const char *)((w3) + (k)) + KVL_PF_BYTES};                        \
            _Pragma("GCC unroll 4") for (int r_ = 0; r_ < 4; r_++)                                   \
                if (pf_[r_] < (pf_end)) _mm_prefetch(pf_[r_], _MM_HINT_T0);                         \
        }                                                                                            \
    } while (0)
/* 1 <= T <= KVL__BF16_WIDE_T: 4 weight rows x TT float32 input rows, each weight vector widened
 * to float32 in registers (exact: a bf16 is the top half of a float32) and multiplied by the
 * exact inputs with FMA.  One FMA per 16 products where vdpbf16ps of a hi/lo bf16 split of the
 * inputs takes two instructions per 32 at half the FMA's throughput: measured faster for a
 * 16-session batch (1.3-1.4x), and for a single decode row too (1.0-1.2x on the 0.5B and
 * 1.5B shapes). */
/* One 16-lane weight vector widened to float32: the full 16 or, at the row's end, the `m` lanes. */
KVL_AVX512 static inline __m512 widen16(const uint16_t *p, int full, __mmask16 m) {
    __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define KVL_WTILE(TT)                                                                               \
    KVL_AVX512 static void wtile_4x##TT(float *out, const float *in, const uint16_t *W,              \
                                         const float *bias, int t0, int K, int N, int n, int rs,     \
                                         int nr, int prefetch) {                                     \
        const int Kf = K & ~15;                                                                      \
        const __mmask16 tail = (__mmask16)((1u << (K & 15)) - 1);                                    \
        const uint16_t *w0 = W + (size_t)n * K, *w1 = W + (size_t)(n + (nr > 1 ? rs : 0)) * K;      \
        const uint16_t *w2 = W + (size_t)(n + (nr > 2 ? 2 * rs : 0)) * K;                            \
        const uint16_t *w3 = W + (size_t)(n + (nr > 3 ? 3 * rs : 0)) * K;                            \
        const float *x0 = in + (size_t)t0 * K, *x1 = x0 + (TT > 1 ? K : 0);                          \
        const float *x2 = x0 + (TT > 2 ? 2 * K : 0), *x3 = x0 + (TT > 3 ? 3 * K : 0);                \
        const float *x4 = x0 + (TT > 4 ? 4 * K : 0), *x5 = x0 + (TT > 5 ? 5 * K : 0);                \
        KVL__TILE_ACC_DECL(__m512, _mm512_setzero_ps());                                             \
        KVL__TILE_ACC_DECL_HI(__m512, _mm512_setzero_ps());                                          \
        const char *pf_end = (const char *)(W + (size_t)N * K);                                      \
        for (int k = 0; k < K; k += 16) {                                                            \
            /* 32 bytes of each row a step: one line of each, every other step */                    \
            KVL__PF_ROWS4(prefetch, k, w0, w1, w2, w3, pf_end);                                      \
            const int full = k < Kf;                                                                 \
            const __mmask16 m = full ? (__mmask16)0xFFFF : tail;                                     \
            const __m512 wv0 = widen16(w0 + k, full, m), wv1 = widen16(w1 + k, full, m);             \
            const __m512 wv2 = widen16(w2 + k, full, m), wv3 = widen16(w3 + k, full, m);             \
            KVL__TILE_FMA_ROWS(TT, _mm512_fmadd_ps, _mm512_maskz_loadu_ps, m, k, wv0, wv1, wv2, wv3); \
            KVL__TILE_FMA_ROWS_HI(TT, _mm512_fmadd_ps, _mm512_maskz_loadu_ps, m, k, wv0, wv1, wv2, wv3); \
        }                                                                                            \
        const __m512 acc[16] = {KVL__TILE_ACC_LIST};                                                 \
        float s[24];                                                                                 \
        _mm512_storeu_ps(s, kvl__reduce16_ps(acc));                                                  \
        if (TT > 4) {   /* rows 4-5 in the same reduction tree, beside 8 zero vectors: the same sums */ \
            const __m512 z = _mm512_setzero_ps();                                                    \
            const __m512 hi[16] = {KVL__TILE_ACC_LIST_HI, z, z, z, z, z, z, z, z};                   \
            _mm512_mask_storeu_ps(s + 16, 0xFF, kvl__reduce16_ps(hi));                               \
        }                                                                                            \
        for (int t = 0; t < TT; t++)                                                                 \
            for (int r = 0; r < nr; r++)                                                             \
                out[(size_t)(t0 + t) * N + n + r * rs] = s[4 * t + r] + (bias ? bias[n + r * rs] : 0.0f); \
    }
KVL_WTILE(1)
KVL_WTILE(2)
KVL_WTILE(3)
KVL_WTILE(4)
KVL_WTILE(5)
KVL_WTILE(6)
#undef KVL_WTILE

/* AVX2 + FMA, 1 <= T <= KVL__BF16_WIDE_T: the widening tiles above at 8 lanes, 4 weight rows x
 * up to 3 input rows (12 accumulators, the 3 input vectors and one widened weight vector fill
 * the 16 ymm registers).  The last K % 8 products are added in scalar code after the
 * reduction: AVX2 has no masked 16-bit load. */
/* Weight vector `wv` (row r, a literal 0..3) times the TT <= 3 input vectors xv0..xv2. */
#define KVL_A2_COL(TT, r, wv)                                      \
    do {                                                           \
        a0##r = _mm256_fmadd_ps(xv0, (wv), a0##r);                 \
        if ((TT) > 1) a1##r = _mm256_fmadd_ps(xv1, (wv), a1##r);   \
        if ((TT) > 2) a2##r = _mm256_fmadd_ps(xv2, (wv), a2##r);   \
    } while (0)
#define KVL_A2TILE(TT)                                                                              \
    KVL_AVX2 static void a2tile_4x##TT(float *out, const float *in, const uint16_t *W,               \
                                        const float *bias, int t0, int K, int N, int n, int rs,      \
                                        int nr, int prefetch) {                                      \
        const int Kf = K & ~7;                                                                       \
        const uint16_t *w[4];                                                                        \
        for (int r = 0; r < 4; r++) w[r] = W + (size_t)(n + (r < nr ? r : nr - 1) * rs) * K;         \
        const uint16_t *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];                               \
        const float *x[3] = {in + (size_t)t0 * K, in + (size_t)(t0 + (TT > 1)) * K,                  \
                             in + (size_t)(t0 + (TT > 2 ? 2 : 0)) * K};                              \
        const float *x0 = x[0], *x1 = x[1], *x2 = x[2];                                              \
        KVL__TILE_ACC_DECL(__m256, _mm256_setzero_ps());                                             \
        const char *pf_end = (const char *)(W + (size_t)N * K);                                      \
        for (int k = 0; k < Kf; k += 8) {                                                            \
            /* 16 bytes of each row a step: one line of each, every fourth step */                   \
            KVL__PF_ROWS4(prefetch, k, w0, w1, w2, w3, pf_end);                                      \
            const __m256 xv0 = _mm256_loadu_ps(x0 + k);                                              \
            const __m256 xv1 = TT > 1 ? _mm256_loadu_ps(x1 + k) : xv0;                               \
            const __m256 xv2 = TT > 2 ? _mm256_loadu_ps(x2 + k) : xv0;                               \
            KVL_A2_COL(TT, 0, KVL_WIDEN8(w0 + k));                                                   \
            KVL_A2_COL(TT, 1, KVL_WIDEN8(w1 + k));                                                   \
            KVL_A2_COL(TT, 2, KVL_WIDEN8(w2 + k));                                                   \
            KVL_A2_COL(TT, 3, KVL_WIDEN8(w3 + k));                                                   \
        }                                                                                            \
        const __m256 acc[16] = {KVL__TILE_ACC_LIST};                                                 \
        float s[16];                                                                                 \
        _mm256_storeu_ps(s, kvl__reduce8_ps(acc));                                                   \
        _mm256_storeu_ps(s + 8, kvl__reduce8_ps(acc + 8));                                           \
        for (int k = Kf; k < K; k++)                                                                 \
            for (int t = 0; t < TT; t++)                                                             \
                for (int r = 0; r < 4; r++) s[4 * t + r] += kvl__bf16_to_f32(w[r][k]) * x[t][k];    \
        for (int t = 0; t < TT; t++)                                                                 \
            for (int r = 0; r < nr; r++)                                                             \
                out[(size_t)(t0 + t) * N + n + r * rs] = s[4 * t + r] + (bias ? bias[n + r * rs] : 0.0f); \
    }
KVL_A2TILE(1)
KVL_A2TILE(2)
KVL_A2TILE(3)
#undef KVL_A2TILE
#undef KVL_A2_COL

/* One tile: out rows t0.. (as many as the tile takes) x weight rows n, n + rs, .. (nr of them);
 * prefetch on the first tile of a 4-row block only (later tiles find the block in cache). */
typedef void (*wide_tile_fn)(float *out, const float *in, const uint16_t *W, const float *bias,
                             int t0, int K, int N, int n, int rs, int nr, int prefetch);
static const wide_tile_fn tiles_avx512[] = {wtile_4x1, wtile_4x2, wtile_4x3, wtile_4x4, wtile_4x5, wtile_4x6};
static const wide_tile_fn tiles_avx2[] = {a2tile_4x1, a2tile_4x2, a2tile_4x3};

/* One block of weight rows against all T input rows: tiles of `rows` input rows, and the last
 * T % rows left over, merged into the tile before them where the form has a tile that tall
 * (tiles[i] takes i + 1 rows; `merge_max`: the tallest).  Why: every tile widens the block's
 * weights again, so a tile of 1 row costs about what one of 4 does, while a tile of 5 or 6
 * runs at a lower rate per row than one of 4 (likely its larger reduction; not measured
 * apart).  Measured (AVX-512 on Zen 4, 2 threads, 256 x 768 and 768 x 256 bf16 products,
 * minimum of 400 interleaved runs), this against plain 4-row tiles: 5 rows -13%, 6 -9%, 9 (a
 * switch's turn: 8 new tokens and the last sampled one) -7%, 10 -5%, 13 -5%, 17 -3 to -5%, 16
 * and 32 the same; tiles of up to 6 rows
 * throughout, split evenly, lost 3-8% at 16 and 32.  Every output is the same products summed
 * in the same order whatever tile it falls in. */
static void wide_block(const wide_tile_fn *tiles, int rows, int merge_max, float *out, const float *in,
                       const uint16_t *W, const float *bias, int T, int K, int N, int n, int rs,
                       int nr) {
    const int r = T % rows, last = T > rows && r && rows + r <= merge_max ? rows + r : r;
    const int full = T - last;
    for (int t0 = 0; t0 < full; t0 += rows) tiles[rows - 1](out, in, W, bias, t0, K, N, n, rs, nr, t0 == 0);
    if (last) tiles[last - 1](out, in, W, bias, full, K, N, n, rs, nr, full == 0);
}

/* Weight rows [n0, n1) in blocks of 4 (rows q apart: one from each quarter of the range, then the
 * n % 4 left adjacent), each block against all T input rows (wide_block). */
static void wide_rows(int avx2, float *out, const float *in, const uint16_t *W, const float *bias,
                      int T, int K, int N, int n0, int n1) {
    const wide_tile_fn *tiles = avx2 ? tiles_avx2 : tiles_avx512;
    const int rows = avx2 ? 3 : 4, merge_max = avx2 ? 3 : 6;
    const int q = (n1 - n0) / 4;
    for (int i = 0; i < q; i++) wide_block(tiles, rows, merge_max, out, in, W, bias, T, K, N, n0 + i, q, 4);
    const int n = n0 + 4 * q;
    if (n < n1) wide_block(tiles, rows, merge_max, out, in, W, bias, T, K, N, n, 1, n1 - n);
}
#endif

/* ---- the parallel parts ------------------------------------------------------------------- */

typedef struct mm_job {
    float *out;
    const float *in;
    const uint16_t *W;
    const float *bias;
    float *panel;
    int T, K, N, n0, nb;   /* panel jobs: rows [n0, n0+nb) of W */
    kvl__bf16_kernel kernel;
} mm_job;

static void small_part(void *pj, int part, int n_parts) {
    const mm_job *j = pj;
    int a, b;
    kvl__pool_part_rows(j->N, part, n_parts, &a, &b);
    if (a >= b) return;
    small_rows_portable(j->out, j->in, j->W, j->bias, j->T, j->K, j->N, a, b);
}

#ifdef KVL_HAVE_X86_KERNELS
static void wide_part(void *pj, int part, int n_parts) {
    const mm_job *j = pj;
    int a, b;
    kvl__pool_part_rows(j->N, part, n_parts, &a, &b);
    if (a >= b) return;
    const int avx2 = j->kernel == KVL__BF16_KERNEL_AVX2;
    wide_rows(avx2, j->out, j->in, j->W, j->bias, j->T, j->K, j->N, a, b);
}

/* The weight rows [n0, N) the AMX tiles leave (N % 32 of them), on the AVX-512 tiles. */
static void amx_tail(const mm_job *j, int n0) {
    wide_rows(0, j->out, j->in, j->W, j->bias, j->T, j->K, j->N, n0, j->N);
}
#endif

/* Rows [a, b) of the panel [n0, n0 + nb): widened, then multiplied into out[:, n0+a .. n0+b). */
static void panel_part(void *pj, int part, int n_parts) {
    const mm_job *j = pj;
    int a, b;
    kvl__pool_part_rows(j->nb, part, n_parts, &a, &b);
    if (a >= b) return;
    float *panel = j->panel + (size_t)a * j->K, *out = j->out + j->n0 + a;
    kvl__bf16_to_f32_n(panel, j->W + (size_t)(j->n0 + a) * j->K, (size_t)(b - a) * j->K);
    if (j->bias)
        for (int t = 0; t < j->T; t++)
            memcpy(out + (size_t)t * j->N, j->bias + j->n0 + a, sizeof(float) * (size_t)(b - a));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->T, b - a, j->K, 1.0f, j->in, j->K, panel,
                j->K, j->bias ? 1.0f : 0.0f, out, j->N);
}

/* Below this many multiply-adds a matmul runs on the caller alone: waking a worker (and, on a
 * loaded machine, waiting for it to be scheduled) costs more than the product of a small model. */
#define KVL_PARALLEL_MIN_MACS ((size_t)1 << 18)

static void run_parts(const kvl__bf16_exec *ex, kvl__pool_fn fn, mm_job *j, size_t macs) {
    if (ex->pool && macs >= KVL_PARALLEL_MIN_MACS) kvl__pool_run(ex->pool, fn, j);
    else fn(j, 0, 1);
}

void kvl__cpu_matmul_bf16(const kvl__bf16_exec *ex, float *out, const float *in, const uint16_t *W,
                          const float *bias, int T, int K, int N) {
    mm_job j = {.out = out, .in = in, .W = W, .bias = bias, .panel = ex->panel,
                .T = T, .K = K, .N = N, .kernel = kvl__bf16_kernel_active()};
#ifdef KVL_HAVE_X86_KERNELS
    /* on AMX tiles: the float32 panels below would write and re-read twice the bytes; a shape
     * they refuse (K not a multiple of 32) falls through to the widening tiles or the panels */
    if (j.kernel == KVL__BF16_KERNEL_AMX && T >= KVL__BF16_AMX_MIN_T &&
        kvl__amx_matmul_bf16(ex->pool, out, in, W, bias, T, K, N, ex->panel,
                             sizeof(float) * kvl__bf16_panel_elems(K)) == 0) {
        if (N % 32) amx_tail(&j, N & ~31);
        return;
    }
    if (j.kernel != KVL__BF16_KERNEL_PORTABLE && T <= KVL__BF16_WIDE_T) {
        run_parts(ex, wide_part, &j, (size_t)T * K * N);
        return;
    }
#endif
    if (T <= KVL__BF16_SMALL_T && j.kernel == KVL__BF16_KERNEL_PORTABLE) {
        /* reads the bf16 weights once; each row is reused from L1 for every input row */
        run_parts(ex, small_part, &j, (size_t)T * K * N);
        return;
    }
    /* portable prefill: compute-bound, so widen panels that stay in cache and let sgemm work,
     * each part on its own rows of the panel (OpenBLAS single-threaded inside the part) */
    int nb = (int)(KVL__BF16_PANEL_FLOATS / (size_t)K);
    if (nb < 1) nb = 1;   /* K > 2^20: one row per panel (kvl__bf16_panel_elems sized for it) */
    for (int n0 = 0; n0 < N; n0 += nb) {
        j.n0 = n0;
        j.nb = N - n0 < nb ? N - n0 : nb;
        run_parts(ex, panel_part, &j, (size_t)T * K * j.nb);
    }
}

#ifdef KVL_HAVE_X86_KERNELS
/* kvl__cpu_matmul_bf16_multi's job: each part runs its own rows of every output. */
typedef struct mm_multi_job {
    const float *in;
    int T, K, n;
    kvl__bf16_kernel kernel;
    kvl__bf16_out o[KVL__BF16_MULTI_MAX];
} mm_multi_job;

static void multi_wide_part(void *pj, int part, int n_parts) {
    const mm_multi_job *j = pj;
    const int avx2 = j->kernel == KVL__BF16_KERNEL_AVX2;
    for (int i = 0; i < j->n; i++) {
        const kvl__bf16_out *o = &j->o[i];
        int a, b;
        kvl__pool_part_rows(o->N, part, n_parts, &a, &b);
        if (a < b)
            wide_rows(avx2, o->out, j->in, o->W, o->bias, j->T, j->K, o->N, a, b);
    }
}
#endif

void kvl__cpu_matmul_bf16_multi(const kvl__bf16_exec *ex, const float *in, int T, int K,
                                const kvl__bf16_out *o, int n) {
#ifdef KVL_HAVE_X86_KERNELS
    const kvl__bf16_kernel k = kvl__bf16_kernel_active();
    const int wide = k != KVL__BF16_KERNEL_PORTABLE && T <= KVL__BF16_WIDE_T &&
                     !(k == KVL__BF16_KERNEL_AMX && T >= KVL__BF16_AMX_MIN_T);
    if (wide && T >= 1 && n >= 1 && n <= KVL__BF16_MULTI_MAX) {
        mm_multi_job j = {.in = in, .T = T, .K = K, .n = n, .kernel = k};
        size_t macs = 0;
        for (int i = 0; i < n; i++) {
            j.o[i] = o[i];
            macs += (size_t)T * K * (size_t)(o[i].N > 0 ? o[i].N : 0);
        }
        if (ex->pool && macs >= KVL_PARALLEL_MIN_MACS) kvl__pool_run(ex->pool, multi_wide_part, &j);
        else multi_wide_part(&j, 0, 1);
        return;
    }
#endif
    for (int i = 0; i < n; i++) kvl__cpu_matmul_bf16(ex, o[i].out, in, o[i].W, o[i].bias, T, K, o[i].N);
}
