/* kernels/cpu/matmul_f32.c: float32 matmuls of the forward pass on the model's pool (see
 * matmul_f32.h).  The AVX-512 and AVX2 tiles are compiled with function-level target attributes
 * so the rest of the build stays baseline x86-64. */
#include "matmul_f32.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVL_HAVE_F32_TILES 1
#include <immintrin.h>

#include "simd_reduce.h"
#include "tile_acc.h"
#define KVL_AVX512F __attribute__((target("avx512f")))
#define KVL_AVX2FMA __attribute__((target("avx2,fma")))
#endif

static int g_tiles = -1;   /* -1: not decided yet */

int kvl__f32_tiles_active(void) {
    if (g_tiles < 0) {
        /* a benign race: every thread computes the same answer */
        int k = KVL__F32_TILES_OFF;
#ifdef KVL_HAVE_F32_TILES
        __builtin_cpu_init();
        const char *env = getenv("KVL_CPU_F32_KERNEL");
        /* avx512f / avx2 also check that the OS saves the zmm / ymm state (XCR0) */
        const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        if (env && !strcmp(env, "blas")) k = KVL__F32_TILES_OFF;
        else if (env && !strcmp(env, "avx2")) k = avx2 ? KVL__F32_TILES_AVX2 : KVL__F32_TILES_OFF;
        else if (__builtin_cpu_supports("avx512f")) k = KVL__F32_TILES_AVX512;
        else if (avx2) k = KVL__F32_TILES_AVX2;
#endif
        g_tiles = k;
    }
    return g_tiles;
}

const char *kvl__f32_tiles_name(void) {
    const int k = kvl__f32_tiles_active();
    return k == KVL__F32_TILES_AVX512 ? "AVX-512F" : k == KVL__F32_TILES_AVX2 ? "AVX2+FMA" : "none";
}

#ifdef KVL_HAVE_F32_TILES
/* How far ahead of the tile the weight stream is prefetched, on every input tile of a block:
 * the weights of a decode step come from L3 or DRAM (qwen3-b's are 23 MB in float32), and
 * with a 32 KB lead taken on the first input tile only (the block's later tiles find it in L1),
 * one thread's 16-row matmuls ran at 40-41 GFLOP/s over weights streamed from memory; with an
 * 8 KB lead re-issued on every tile 44-48 (4 rows: 31 -> 34.5, 9 rows: 35 -> 41.6), medians of
 * 40 interleaved runs.  A prefetch of a line already in flight or in L1 costs one load slot;
 * one the core dropped (its miss buffers full) is asked for again. */
#ifndef KVL_F32_PF_BYTES
#define KVL_F32_PF_BYTES 8192
#endif

/* 4 weight rows (n .. n+nr-1, nr <= 4; missing rows are clamped copies whose sums are dropped)
 * x TT input rows (t0 .. t0+TT-1).  acc[4t + r]: input row t times weight row r. */
#define KVL_F32_TILE(TT)                                                                            \
    KVL_AVX512F static void tile_4x##TT(float *out, const float *in, const float *W,                 \
                                         const float *bias, int t0, int K, int N, int n, int nr) {   \
        const int Kf = K & ~15;                                                                      \
        const __mmask16 tail = (__mmask16)((1u << (K & 15)) - 1);                                    \
        const float *w0 = W + (size_t)n * K, *w1 = W + (size_t)(n + (nr > 1 ? 1 : 0)) * K;          \
        const float *w2 = W + (size_t)(n + (nr > 2 ? 2 : nr - 1)) * K;                               \
        const float *w3 = W + (size_t)(n + (nr > 3 ? 3 : nr - 1)) * K;                               \
        const float *x0 = in + (size_t)t0 * K, *x1 = x0 + (TT > 1 ? K : 0);                          \
        const float *x2 = x0 + (TT > 2 ? 2 * K : 0), *x3 = x0 + (TT > 3 ? 3 * K : 0);                \
        KVL__TILE_ACC_DECL(__m512, _mm512_setzero_ps());                                             \
        /* the 4 rows are one contiguous block: prefetch it linearly, KVL_F32_PF_BYTES ahead, at   \
         * the rate the tile consumes it (4 lines a step)                                        */ \
        const char *pf = (const char *)w0 + KVL_F32_PF_BYTES;                                        \
        const char *pf_end = (const char *)(W + (size_t)N * K);                                      \
        for (int k = 0; k < K; k += 16) {                                                            \
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++, pf += 64)                            \
                if (pf < pf_end) _mm_prefetch(pf, _MM_HINT_T0);                                      \
            const __mmask16 m = k < Kf ? (__mmask16)0xFFFF : tail;                                   \
            const __m512 wv0 = _mm512_maskz_loadu_ps(m, w0 + k), wv1 = _mm512_maskz_loadu_ps(m, w1 + k); \
            const __m512 wv2 = _mm512_maskz_loadu_ps(m, w2 + k), wv3 = _mm512_maskz_loadu_ps(m, w3 + k); \
            KVL__TILE_FMA_ROWS(TT, _mm512_fmadd_ps, _mm512_maskz_loadu_ps, m, k, wv0, wv1, wv2, wv3); \
        }                                                                                            \
        const __m512 acc[16] = {KVL__TILE_ACC_LIST};                                                 \
        float s[16];                                                                                 \
        _mm512_storeu_ps(s, kvl__reduce16_ps(acc));                                                  \
        for (int t = 0; t < TT; t++) {                                                               \
            float *o = out + (size_t)(t0 + t) * N + n;                                               \
            for (int r = 0; r < nr; r++) o[r] = s[4 * t + r] + (bias ? bias[n + r] : 0.0f);          \
        }                                                                                            \
    }
KVL_F32_TILE(1)
KVL_F32_TILE(2)
KVL_F32_TILE(3)
KVL_F32_TILE(4)
#undef KVL_F32_TILE

static void tiles_rows_avx512(float *out, const float *in, const float *W, const float *bias, int T,
                              int K, int N, int n0, int n1) {
    for (int n = n0; n < n1; n += 4) {
        const int nr = n1 - n < 4 ? n1 - n : 4;
        for (int t0 = 0; t0 < T; t0 += 4) {   /* each input tile prefetches (KVL_F32_PF_BYTES) */
            switch (T - t0 < 4 ? T - t0 : 4) {
            case 1: tile_4x1(out, in, W, bias, t0, K, N, n, nr); break;
            case 2: tile_4x2(out, in, W, bias, t0, K, N, n, nr); break;
            case 3: tile_4x3(out, in, W, bias, t0, K, N, n, nr); break;
            default: tile_4x4(out, in, W, bias, t0, K, N, n, nr); break;
            }
        }
    }
}

/* AVX2 + FMA: 4 weight rows x up to 3 input rows at 8 lanes (12 accumulators, the 3 input
 * vectors and one weight vector fill the 16 ymm registers).  The 4 rows come from 4 quarters of
 * the part's row range (rows n, n + rs, n + 2rs, n + 3rs), so a thread reads 4 streams in
 * different DRAM pages at once, as the bf16 tiles do (measured there: 18-20 GB/s with adjacent
 * rows, 23-27 with far ones); each row is prefetched KVL_F32_PF_ROW_BYTES ahead, one line every
 * second step, on the first input tile of a block only.  The last K % 8 products are loaded
 * masked (zeros past the row's end), so every row's sum is 8 partial sums, then the tree. */
#ifndef KVL_F32_PF_ROW_BYTES
#define KVL_F32_PF_ROW_BYTES 2048
#endif
#define KVL_F32_A2_COL(TT, r, wv)                                  \
    do {                                                           \
        a0##r = _mm256_fmadd_ps(xv0, (wv), a0##r);                 \
        if ((TT) > 1) a1##r = _mm256_fmadd_ps(xv1, (wv), a1##r);   \
        if ((TT) > 2) a2##r = _mm256_fmadd_ps(xv2, (wv), a2##r);   \
    } while (0)
#define KVL_F32_A2_LOADU(p) _mm256_loadu_ps(p)
#define KVL_F32_A2_LOADM(p) _mm256_maskload_ps((p), tail)
#define KVL_F32_A2_STEP(TT, LOAD)                                    \
    do {                                                             \
        const __m256 xv0 = LOAD(x0 + k);                             \
        const __m256 xv1 = TT > 1 ? LOAD(x1 + k) : xv0;              \
        const __m256 xv2 = TT > 2 ? LOAD(x2 + k) : xv0;              \
        KVL_F32_A2_COL(TT, 0, LOAD(w0 + k));                         \
        KVL_F32_A2_COL(TT, 1, LOAD(w1 + k));                         \
        KVL_F32_A2_COL(TT, 2, LOAD(w2 + k));                         \
        KVL_F32_A2_COL(TT, 3, LOAD(w3 + k));                         \
    } while (0)
#define KVL_F32_A2TILE(TT)                                                                          \
    KVL_AVX2FMA static void a2tile_4x##TT(float *out, const float *in, const float *W,               \
                                           const float *bias, int t0, int K, int N, int n, int rs,   \
                                           int nr, int prefetch) {                                   \
        const float *w0 = W + (size_t)n * K, *w1 = W + (size_t)(n + (nr > 1 ? 1 : 0) * rs) * K;      \
        const float *w2 = W + (size_t)(n + (nr > 2 ? 2 : nr - 1) * rs) * K;                          \
        const float *w3 = W + (size_t)(n + (nr > 3 ? 3 : nr - 1) * rs) * K;                          \
        const float *x0 = in + (size_t)t0 * K, *x1 = x0 + (TT > 1 ? K : 0);                          \
        const float *x2 = x0 + (TT > 2 ? 2 * K : 0);                                                 \
        const int Kf = K & ~7;                                                                       \
        static const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};  \
        const __m256i tail = _mm256_loadu_si256((const __m256i *)(lanes + 8 - (K & 7)));             \
        const char *pf_end = (const char *)(W + (size_t)N * K);                                      \
        KVL__TILE_ACC_DECL(__m256, _mm256_setzero_ps());                                             \
        /* full 8-float steps on plain loads (a masked load costs more on some CPUs), then the   \
         * K % 8 tail once, masked                                                              */ \
        int k = 0;                                                                                   \
        for (; k < Kf; k += 8) {                                                                     \
            if (prefetch && (k & 15) == 0) {                                                         \
                const char *pf_[4] = {(const char *)(w0 + k) + KVL_F32_PF_ROW_BYTES,                 \
                                      (const char *)(w1 + k) + KVL_F32_PF_ROW_BYTES,                 \
                                      (const char *)(w2 + k) + KVL_F32_PF_ROW_BYTES,                 \
                                      (const char *)(w3 + k) + KVL_F32_PF_ROW_BYTES};                \
                _Pragma("GCC unroll 4") for (int r_ = 0; r_ < 4; r_++)                               \
                    if (pf_[r_] < pf_end) _mm_prefetch(pf_[r_], _MM_HINT_T0);                       \
            }                                                                                        \
            KVL_F32_A2_STEP(TT, KVL_F32_A2_LOADU);                                                   \
        }                                                                                            \
        if (k < K) KVL_F32_A2_STEP(TT, KVL_F32_A2_LOADM);                                            \
        const __m256 acc[16] = {KVL__TILE_ACC_LIST};                                                 \
        float s[16];                                                                                 \
        _mm256_storeu_ps(s, kvl__reduce8_ps(acc));                                                   \
        _mm256_storeu_ps(s + 8, kvl__reduce8_ps(acc + 8));                                           \
        for (int t = 0; t < TT; t++)                                                                 \
            for (int r = 0; r < nr; r++)                                                             \
                out[(size_t)(t0 + t) * N + n + r * rs] = s[4 * t + r] + (bias ? bias[n + r * rs] : 0.0f); \
    }
KVL_F32_A2TILE(1)
KVL_F32_A2TILE(2)
KVL_F32_A2TILE(3)
#undef KVL_F32_A2TILE
#undef KVL_F32_A2_COL
#undef KVL_F32_A2_STEP
#undef KVL_F32_A2_LOADU
#undef KVL_F32_A2_LOADM

typedef void (*a2_tile_fn)(float *out, const float *in, const float *W, const float *bias, int t0,
                           int K, int N, int n, int rs, int nr, int prefetch);
static const a2_tile_fn a2_tiles[3] = {a2tile_4x1, a2tile_4x2, a2tile_4x3};

/* Weight rows [n0, n1): blocks of 4 rows q apart (one from each quarter of the range), then the
 * (n1 - n0) % 4 left over adjacent, each block against all T input rows, 3 at a time. */
static void tiles_rows_avx2(float *out, const float *in, const float *W, const float *bias, int T,
                            int K, int N, int n0, int n1) {
    const int q = (n1 - n0) / 4;
    for (int i = 0; i < q; i++)
        for (int t0 = 0; t0 < T; t0 += 3)
            a2_tiles[(T - t0 < 3 ? T - t0 : 3) - 1](out, in, W, bias, t0, K, N, n0 + i, q, 4, t0 == 0);
    const int n = n0 + 4 * q;
    if (n < n1)
        for (int t0 = 0; t0 < T; t0 += 3)
            a2_tiles[(T - t0 < 3 ? T - t0 : 3) - 1](out, in, W, bias, t0, K, N, n, 1, n1 - n, t0 == 0);
}
#endif

int kvl__cpu_matmul_f32_tiles(float *out, const float *in, const float *W, const float *bias,
                              int T, int K, int N, int n0, int n1) {
    if (!kvl__f32_tiles_active() || T > KVL__F32_SMALL_T || T < 1) return -1;
#ifdef KVL_HAVE_F32_TILES
    if (kvl__f32_tiles_active() == KVL__F32_TILES_AVX2) tiles_rows_avx2(out, in, W, bias, T, K, N, n0, n1);
    else tiles_rows_avx512(out, in, W, bias, T, K, N, n0, n1);
    return 0;
#else
    (void)out; (void)in; (void)W; (void)bias; (void)K; (void)N; (void)n0; (void)n1;
    return -1;
#endif
}

typedef struct f32_job {
    float *out;
    const float *in, *W, *bias;
    int T, K, N;
    atomic_int next_blk;   /* tiles: the next unclaimed block of blk_rows weight rows */
    int blk_rows, n_blk;
} f32_job;

/* Blocks a tiles job is cut into per thread: each thread claims the next free block until none
 * is left, so a thread that starts late or loses its core to another (a session's reader, a
 * gRPC handler) leaves its blocks to the other instead of being waited for.  With one half
 * each, a 16-session decode step's caller waited for its worker in 9% of its samples. */
#define KVL_F32_BLOCKS_PER_THREAD 4

static void tiles_part(void *pj, int part, int n_parts) {
    f32_job *j = pj;
    (void)part, (void)n_parts;
    for (int b; (b = atomic_fetch_add_explicit(&j->next_blk, 1, memory_order_relaxed)) < j->n_blk;) {
        const int a = b * j->blk_rows, e = a + j->blk_rows < j->N ? a + j->blk_rows : j->N;
        kvl__cpu_matmul_f32_tiles(j->out, j->in, j->W, j->bias, j->T, j->K, j->N, a, e);
    }
}

/* One row, larger T, or no tiles here: OpenBLAS on each part's rows of W, single-threaded inside the
 * part (the caller has OpenBLAS on one thread: kvl__cpu_matmul_f32's contract). */
static void blas_part(void *pj, int part, int n_parts) {
    const f32_job *j = pj;
    int a, b;
    kvl__pool_part_rows(j->N, part, n_parts, &a, &b);
    if (a >= b) return;
    float *out = j->out + a;
    const float *W = j->W + (size_t)a * j->K;
    const int nb = b - a;
    if (j->bias)
        for (int t = 0; t < j->T; t++) memcpy(out + (size_t)t * j->N, j->bias + a, sizeof(float) * (size_t)nb);
    if (j->T == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, nb, j->K, 1.0f, W, j->K, j->in, 1,
                    j->bias ? 1.0f : 0.0f, out, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->T, nb, j->K, 1.0f, j->in, j->K, W,
                    j->K, j->bias ? 1.0f : 0.0f, out, j->N);
}

/* Below this many multiply-adds a matmul runs on the caller alone: handing half of it to a
 * worker costs more than it saves (as for the bf16 matmuls). */
#define KVL_F32_PARALLEL_MIN_MACS ((size_t)1 << 17)

void kvl__cpu_matmul_f32(kvl__pool *pool, float *out, const float *in, const float *W,
                         const float *bias, int T, int K, int N) {
    if (T < 1 || N < 1) return;
    f32_job j = {out, in, W, bias, T, K, N, 0, N, 1};
    if (pool) {   /* blocks of a multiple of 16 rows, KVL_F32_BLOCKS_PER_THREAD per thread */
        const int nb = kvl__pool_threads(pool) * KVL_F32_BLOCKS_PER_THREAD;
        j.blk_rows = ((N + nb - 1) / nb + 15) & ~15;
        j.n_blk = (N + j.blk_rows - 1) / j.blk_rows;
    }
    atomic_init(&j.next_blk, 0);
    /* a single row goes to sgemv: measured ~7% faster than the 4x1 tile on a 1-session step */
    const kvl__pool_fn fn = T >= 2 && T <= KVL__F32_SMALL_T && kvl__f32_tiles_active() ? tiles_part : blas_part;
    if (pool && (size_t)T * K * N >= KVL_F32_PARALLEL_MIN_MACS) kvl__pool_run(pool, fn, &j);
    else fn(&j, 0, 1);
}

/* The outputs of kvl__cpu_matmul_f32_multi as one tiles job: block b belongs to output i where
 * first_blk[i] <= b < first_blk[i + 1]. */
typedef struct f32_multi_job {
    const float *in;
    int T, K, n, blk_rows;
    kvl__f32_out o[KVL__F32_MULTI_MAX];
    int first_blk[KVL__F32_MULTI_MAX + 1];
    atomic_int next_blk;
} f32_multi_job;

static void multi_part(void *pj, int part, int n_parts) {
    f32_multi_job *j = pj;
    (void)part, (void)n_parts;
    for (int b; (b = atomic_fetch_add_explicit(&j->next_blk, 1, memory_order_relaxed)) < j->first_blk[j->n];) {
        int i = 0;
        while (b >= j->first_blk[i + 1]) i++;
        const kvl__f32_out *o = &j->o[i];
        const int a = (b - j->first_blk[i]) * j->blk_rows, e = a + j->blk_rows < o->N ? a + j->blk_rows : o->N;
        kvl__cpu_matmul_f32_tiles(o->out, j->in, o->W, o->bias, j->T, j->K, o->N, a, e);
    }
}

void kvl__cpu_matmul_f32_multi(kvl__pool *pool, const float *in, int T, int K, const kvl__f32_out *o,
                               int n) {
    int n_tot = 0;
    for (int i = 0; i < n; i++) n_tot += o[i].N > 0 ? o[i].N : 0;
    if (!pool || n < 1 || n > KVL__F32_MULTI_MAX || T < 2 || T > KVL__F32_SMALL_T ||
        !kvl__f32_tiles_active() || (size_t)T * K * n_tot < KVL_F32_PARALLEL_MIN_MACS) {
        /* one at a time: what the tiles' block split cannot change (sgemv's, sgemm's) or a
         * product too small to hand to a worker */
        for (int i = 0; i < n; i++) kvl__cpu_matmul_f32(pool, o[i].out, in, o[i].W, o[i].bias, T, K, o[i].N);
        return;
    }
    f32_multi_job j = {.in = in, .T = T, .K = K, .n = n};
    const int nb = kvl__pool_threads(pool) * KVL_F32_BLOCKS_PER_THREAD;
    j.blk_rows = ((n_tot + nb - 1) / nb + 15) & ~15;
    for (int i = 0; i < n; i++) {
        j.o[i] = o[i];
        const int N = o[i].N > 0 ? o[i].N : 0;
        j.first_blk[i + 1] = j.first_blk[i] + (N + j.blk_rows - 1) / j.blk_rows;
    }
    atomic_init(&j.next_blk, 0);
    kvl__pool_run(pool, multi_part, &j);
}
