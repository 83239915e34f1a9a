/* kernels/cpu/translate_avx512.c: translate-apply's fused rows on AVX-512F (see
 * translate_avx512.h).  Compiled with a function-level target attribute, so the rest of the build
 * stays baseline x86-64; chosen at run time.
 *
 * Why: the portable path runs one sgemm per layer and side into two [n, dt] scratch matrices
 * and reads them back for k_norm, RoPE and the writes, and OpenBLAS packs and zeroes for every
 * call, while a source has only 64-256 features per token.  Here the maps are transposed once per
 * layer ([ds, dt]), a panel of 64 or 128 output features of 3-6 tokens is summed in registers
 * (each weight vector loaded once for all the tokens, each source feature broadcast), and k_norm,
 * RoPE and the block writes run on the panel while it is in L1.  Measured on a 2-core AMD EPYC
 * (Zen 4), qwen3-a -> qwen3-b, kvl_translator_translate_span with OpenBLAS on one thread,
 * medians of 150: 256 tokens 0.78-0.83 against 0.87-1.11 ms, 2048 tokens 6.5-8.0 against
 * 8.2-8.6 ms.  At 2048 tokens the products are most of it: 12.6 M FMA instructions of 16
 * lanes, 2.4 ms on two such cores at one a cycle; hence the bf16 form (AVX512_BF16), which
 * multiplies a pair of source features per instruction: kvl_translator_translate_span at 2048
 * tokens 3.2-3.4 against 4.1 ms (the same host, a later build). */
#include "translate_avx512.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "matmul_bf16.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVL_TR_AVX512 1
#include <immintrin.h>
#define KVL_AVX512F __attribute__((target("avx512f")))
/* the bf16 intrinsics (__m512bh, _mm512_dpbf16_ps) arrived in GCC 10 and clang 9 */
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define KVL_TR_AVX512BF16 1
#endif
#endif

int kvl__translate_avx512_usable(int D, int dt) {
#ifdef KVL_TR_AVX512
    static int cpu = -1;   /* a benign race: every thread computes the same answer */
    if (cpu < 0) {
        __builtin_cpu_init();
        const char *env = getenv("KVL_CPU_TRANSLATE");
        cpu = !(env && !strcmp(env, "portable")) && __builtin_cpu_supports("avx512f");
    }
    return cpu && (D == 32 || D == 64 || D == 128) && dt > 0 && dt % 64 == 0;
#else
    (void)D, (void)dt;
    return 0;
#endif
}

int kvl__translate_bf16_usable(int D, int dt, int ds) {
#ifdef KVL_TR_AVX512BF16
    static int cpu = -1;   /* a benign race, as above */
    if (cpu < 0) {
        __builtin_cpu_init();
        const char *env = getenv("KVL_CPU_TRANSLATE");
        cpu = !(env && (!strcmp(env, "portable") || !strcmp(env, "f32"))) &&
              __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    }
    return cpu && kvl__translate_avx512_usable(D, dt) && ds > 0 && ds % 2 == 0;
#else
    (void)D, (void)dt, (void)ds;
    return 0;
#endif
}

void kvl__translate_transpose(float *wT, const float *W, int dt, int ds) {
    /* in 16 x 16 blocks, so both sides are read and written a cache line at a time */
    for (int i0 = 0; i0 < dt; i0 += 16)
        for (int j0 = 0; j0 < ds; j0 += 16) {
            const int ie = i0 + 16 < dt ? i0 + 16 : dt, je = j0 + 16 < ds ? j0 + 16 : ds;
            for (int i = i0; i < ie; i++)
                for (int j = j0; j < je; j++) wT[(size_t)j * dt + i] = W[(size_t)i * ds + j];
        }
}

#ifdef KVL_TR_AVX512

/* Accumulators a<r><v>: token row r (0..5) times output vector v (0..7) of the panel; a form
 * uses R * NV <= 24 of them.  Named variables, not an array: GCC keeps an array indexed in a
 * loop in memory (tile_acc.h). */
#define TR_ACC_ROW(r)                                                                          \
    __m512 a##r##0 = z, a##r##1 = z, a##r##2 = z, a##r##3 = z, a##r##4 = z, a##r##5 = z,        \
           a##r##6 = z, a##r##7 = z
#define TR_FMA_ROW(r, v) \
    if (R > (r)) a##r##v = _mm512_fmadd_ps(b##r, w_, a##r##v)
#define TR_FMA(v)                                                                  \
    do {                                                                           \
        if (NV > (v)) {                                                            \
            __m512 w_ = _mm512_loadu_ps(w + 16 * (v));                             \
            __asm__("" : "+v"(w_)); /* one load for every row, not one per FMA */  \
            TR_FMA_ROW(0, v); TR_FMA_ROW(1, v); TR_FMA_ROW(2, v);                  \
            TR_FMA_ROW(3, v); TR_FMA_ROW(4, v); TR_FMA_ROW(5, v);                  \
        }                                                                          \
    } while (0)
#define TR_STORE_ROW(r)                                                                        \
    do {                                                                                       \
        if (R > (r)) {                                                                         \
            float *o_ = out + (r) * 128;                                                       \
            _mm512_storeu_ps(o_, a##r##0);                                                     \
            _mm512_storeu_ps(o_ + 16, a##r##1);                                                \
            _mm512_storeu_ps(o_ + 32, a##r##2);                                                \
            _mm512_storeu_ps(o_ + 48, a##r##3);                                                \
            if (NV > 4) {                                                                      \
                _mm512_storeu_ps(o_ + 64, a##r##4);                                            \
                _mm512_storeu_ps(o_ + 80, a##r##5);                                            \
                _mm512_storeu_ps(o_ + 96, a##r##6);                                            \
                _mm512_storeu_ps(o_ + 112, a##r##7);                                           \
            }                                                                                  \
        }                                                                                      \
    } while (0)
#define TR_BCAST(r) const __m512 b##r = R > (r) ? _mm512_set1_ps(x[(r) * ds + j]) : z

/* out[r][0, 16*NV) = sum_j x[r*ds + j] * W[col + .][j] for the R rows of x: the same products
 * in the same order (j ascending, STEP features a step) for every row, panel and R; and
 * panel_rows##SFX, the same for r (1..R) rows, R a constant of the form.  WROW: where the
 * panel's maps of step j start (the maps' layout); BCAST / FMA: one row's broadcast source
 * features and their products with one maps vector; ZDECL: what BCAST needs declared. */
#define KVL_TR_PANEL(SFX, ATTR, XT, WT, STEP, WROW, BCAST, FMA, ZDECL)                           \
    static inline __attribute__((always_inline)) ATTR void panel_dot##SFX(                      \
        float *out /* [6][128] */, const XT *x, const int R, const int NV, const WT *wm, int ds, \
        int dt, int col) {                                                                      \
        const __m512 z = _mm512_setzero_ps();                                                   \
        ZDECL;                                                                                  \
        TR_ACC_ROW(0); TR_ACC_ROW(1); TR_ACC_ROW(2); TR_ACC_ROW(3); TR_ACC_ROW(4); TR_ACC_ROW(5); \
        for (int j = 0; j < ds; j += STEP) {                                                    \
            const WT *w = WROW;                                                                 \
            BCAST(0); BCAST(1); BCAST(2); BCAST(3); BCAST(4); BCAST(5);                         \
            FMA(0); FMA(1); FMA(2); FMA(3); FMA(4); FMA(5); FMA(6); FMA(7);                     \
        }                                                                                       \
        TR_STORE_ROW(0); TR_STORE_ROW(1); TR_STORE_ROW(2);                                      \
        TR_STORE_ROW(3); TR_STORE_ROW(4); TR_STORE_ROW(5);                                      \
    }                                                                                           \
    static inline __attribute__((always_inline)) ATTR void panel_rows##SFX(                     \
        float *out, const XT *x, int r, const int R, const int NV, const WT *wm, int ds, int dt, \
        int col) {                                                                              \
        if (r == R) { panel_dot##SFX(out, x, R, NV, wm, ds, dt, col); return; }                 \
        switch (r) {                                                                            \
        case 1: panel_dot##SFX(out, x, 1, NV, wm, ds, dt, col); break;                          \
        case 2: panel_dot##SFX(out, x, 2, NV, wm, ds, dt, col); break;                          \
        case 3: panel_dot##SFX(out, x, 3, NV, wm, ds, dt, col); break;                          \
        case 4: panel_dot##SFX(out, x, 4, NV, wm, ds, dt, col); break;                          \
        default: panel_dot##SFX(out, x, 5, NV, wm, ds, dt, col); break;                         \
        }                                                                                       \
    }
/* float32: wm = the layer's maps transposed, [ds][dt] */
KVL_TR_PANEL(, KVL_AVX512F, float, float, 1, wm + (size_t)j * dt + col, TR_BCAST, TR_FMA, (void)0)

#ifdef KVL_TR_AVX512BF16
/* bf16 products (AVX512_BF16): x holds bf16 source rows, wP a layer's maps as bf16 pairs
 * (wP[j/2][i][j%2] = W[i][j], the translator's kvl_kv_maps.wkP); one VDPBF16PS adds x[j] W[i][j] +
 * x[j+1] W[i][j+1] to lane i in float32, so a pair of source features costs what one costs in
 * panel_dot.  Needs ds even. */
#define KVL_AVX512BF16 __attribute__((target("avx512f,avx512bf16")))
#define TRB_FMA(v)                                                                          \
    do {                                                                                    \
        if (NV > (v)) {                                                                     \
            __m512bh w_ = (__m512bh)_mm512_loadu_si512(w + 32 * (v));                       \
            __asm__("" : "+v"(w_));                                                         \
            if (R > 0) a0##v = _mm512_dpbf16_ps(a0##v, b0, w_);                             \
            if (R > 1) a1##v = _mm512_dpbf16_ps(a1##v, b1, w_);                             \
            if (R > 2) a2##v = _mm512_dpbf16_ps(a2##v, b2, w_);                             \
            if (R > 3) a3##v = _mm512_dpbf16_ps(a3##v, b3, w_);                             \
            if (R > 4) a4##v = _mm512_dpbf16_ps(a4##v, b4, w_);                             \
            if (R > 5) a5##v = _mm512_dpbf16_ps(a5##v, b5, w_);                             \
        }                                                                                   \
    } while (0)
#define TRB_BCAST(r)                                                                        \
    __m512bh b##r = (__m512bh)zi;                                                           \
    if (R > (r)) {                                                                          \
        uint32_t p_;                                                                        \
        memcpy(&p_, x + (size_t)(r) * ds + j, sizeof p_);                                   \
        b##r = (__m512bh)_mm512_set1_epi32((int)p_);                                        \
    }

/* bf16: wm = the layer's maps as bf16 pairs, [ds/2][dt][2] */
KVL_TR_PANEL(_bf16, KVL_AVX512BF16, uint16_t, uint16_t, 2, wm + ((size_t)(j / 2) * dt + col) * 2, TRB_BCAST,
             TRB_FMA, const __m512i zi = _mm512_setzero_si512())
#endif

/* n floats at dst (float32 or bf16 by the cache) */
static inline void put_row(const kvl__kv_blocks *c, void *dst, const float *src, int n) {
    if (c->bf16) kvl__bf16_from_f32(dst, src, (size_t)n);
    else memcpy(dst, src, sizeof(float) * (size_t)n);
}

/* The Kpre plane's rows: nothing reads them until the span is exported onward, so on a float32
 * cache they are streamed past the caches (no read-for-ownership of the line, and the K / V
 * rows the turn's forward reads next stay in L2 / L3).  Ordered by the sfence at the end of
 * the part (kvl__translate_rows_avx512). */
static inline __attribute__((always_inline)) KVL_AVX512F void put_row_stream(const kvl__kv_blocks *c,
                                                                          void *dst, const float *src,
                                                                          int n) {
    if (c->bf16 || ((uintptr_t)dst & 63) || (n & 15)) {
        put_row(c, dst, src, n);
        return;
    }
    for (int i = 0; i < n; i += 16) _mm512_stream_ps((float *)dst + i, _mm512_loadu_ps(src + i));
}

/* A K or V row: streamed past the caches for a span too large to stay cached (stream), else
 * stored as usual. */
static inline __attribute__((always_inline)) KVL_AVX512F void put_kv(const kvl__kv_blocks *c, void *dst,
                                                                  const float *src, int n, int stream) {
    if (stream) put_row_stream(c, dst, src, n);
    else put_row(c, dst, src, n);
}

/* The keys of one panel row: pre [P] (W_K x, the Kpre plane) -> k_norm per head -> RoPE with
 * the token's cos / sin [D/2] -> the K plane; as fused_rows in translate_cpu.c. */
static inline __attribute__((always_inline)) KVL_AVX512F void key_epilogue(
    float *k /* [P] out */, const float *pre, int P, const int D, const float *kn, float eps,
    const float *cs, const float *sn) {
    const int hv = D / 32;   /* vectors in half a head */
    for (int h = 0; h < P / D; h++) {
        const float *x = pre + h * D;
        float *y = k + h * D;
        __m512 xv[8];
        for (int q = 0; q < 2 * hv; q++) xv[q] = _mm512_loadu_ps(x + 16 * q);
        if (kn) {   /* Qwen3RMSNorm: variance in float32 over head_dim */
            __m512 ss = _mm512_mul_ps(xv[0], xv[0]);
            for (int q = 1; q < 2 * hv; q++) ss = _mm512_fmadd_ps(xv[q], xv[q], ss);
            const __m512 r = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(ss) / (float)D + eps));
            for (int q = 0; q < 2 * hv; q++)
                xv[q] = _mm512_mul_ps(_mm512_loadu_ps(kn + 16 * q), _mm512_mul_ps(xv[q], r));
        }
        for (int q = 0; q < hv; q++) {   /* rotate_half RoPE */
            const __m512 c = _mm512_loadu_ps(cs + 16 * q), s = _mm512_loadu_ps(sn + 16 * q);
            const __m512 x1 = xv[q], x2 = xv[q + hv];
            _mm512_storeu_ps(y + 16 * q, _mm512_fmsub_ps(x1, c, _mm512_mul_ps(x2, s)));
            _mm512_storeu_ps(y + 16 * (q + hv), _mm512_fmadd_ps(x2, c, _mm512_mul_ps(x1, s)));
        }
    }
}

/* The rows of one target layer: keys (the maps' products, the Kpre plane, k_norm + RoPE, the K
 * plane), then values, a panel of P = 16 * NV output features at a time so that the panel's maps
 * stay in L1 over the rows.  Made twice by KVL_TR_ROWS_FORM: float32 source rows and maps
 * (panel_rows), and bf16 ones (panel_rows_bf16), each under its own target attribute. */
#define KVL_TR_ROWS_FORM(NAME, ATTR, XT, WT, PANEL)                                                \
    static inline __attribute__((always_inline)) ATTR void NAME(                                   \
        kvl__kv_blocks *c, int l, int t0, const XT *xk, const XT *xv, int ds, const WT *wk,       \
        const WT *wv, int dt, const int D, const float *kn, float eps, const float *rcos,          \
        const float *rsin, int a, int b, int stream, const int R, const int NV) {                  \
        const int P = 16 * NV, half = D / 2;                                                       \
        float pre[6 * 128], kk[128];                                                               \
        for (int col = 0; col < dt; col += P) {                                                    \
            for (int t = a; t < b; t += R) {                                                       \
                const int r = b - t < R ? b - t : R;                                               \
                PANEL(pre, xk + (size_t)t * ds, r, R, NV, wk, ds, dt, col);                        \
                for (int i = 0; i < r; i++) {                                                      \
                    const int tt = t + i;                                                          \
                    const float *p = pre + i * 128;                                                \
                    if (c->planes == 3)                                                            \
                        put_row_stream(c, (char *)kvl__kv_blocks_slot(c, l, KVL_PLANE_KPRE, t0 + tt) + \
                                              (size_t)col * (c->bf16 ? 2 : 4), p, P);              \
                    key_epilogue(kk, p, P, D, kn, eps, rcos + (size_t)tt * half,                   \
                                 rsin + (size_t)tt * half);                                        \
                    put_kv(c, (char *)kvl__kv_blocks_slot(c, l, KVL_PLANE_K, t0 + tt) +            \
                                  (size_t)col * (c->bf16 ? 2 : 4), kk, P, stream);                 \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int col = 0; col < dt; col += P) {                                                    \
            for (int t = a; t < b; t += R) {                                                       \
                const int r = b - t < R ? b - t : R;                                               \
                PANEL(pre, xv + (size_t)t * ds, r, R, NV, wv, ds, dt, col);                        \
                for (int i = 0; i < r; i++)                                                        \
                    put_kv(c, (char *)kvl__kv_blocks_slot(c, l, KVL_PLANE_V, t0 + t + i) +         \
                                  (size_t)col * (c->bf16 ? 2 : 4), pre + i * 128, P, stream);      \
            }                                                                                      \
        }                                                                                          \
    }
KVL_TR_ROWS_FORM(rows_form, KVL_AVX512F, float, float, panel_rows)
#ifdef KVL_TR_AVX512BF16
KVL_TR_ROWS_FORM(rows_form_bf16, KVL_AVX512BF16, uint16_t, uint16_t, panel_rows_bf16)
#endif

/* Panels of 64 features (4 vectors) 6 tokens at a time for head_dim 32 and 64; of 128 features
 * (8 vectors, one whole head) 3 tokens at a time for head_dim 128: 24 accumulators, and per
 * source feature 4 + 6 or 8 + 3 loads against 24 FMAs.  The sfence orders the streamed rows
 * (Kpre, and K / V with `stream`) before the part reports done.  (The entry points of translate_avx512.h, made once per
 * form of the rows.) */
#define KVL_TR_ROWS_ENTRY(NAME, ATTR, XT, FORM)                                                    \
    ATTR void NAME(kvl__kv_blocks *c, int l, int t0, const XT *xk, const XT *xv, int ds,          \
                   const XT *wk, const XT *wv, int dt, int D, const float *kn, float eps,         \
                   const float *rcos, const float *rsin, int a, int b, int stream) {              \
        if (D == 32)                                                                               \
            FORM(c, l, t0, xk, xv, ds, wk, wv, dt, 32, kn, eps, rcos, rsin, a, b, stream, 6, 4);   \
        else if (D == 64)                                                                          \
            FORM(c, l, t0, xk, xv, ds, wk, wv, dt, 64, kn, eps, rcos, rsin, a, b, stream, 6, 4);   \
        else if (D == 128)                                                                         \
            FORM(c, l, t0, xk, xv, ds, wk, wv, dt, 128, kn, eps, rcos, rsin, a, b, stream, 3, 8);  \
        _mm_sfence();                                                                              \
    }
KVL_TR_ROWS_ENTRY(kvl__translate_rows_avx512, KVL_AVX512F, float, rows_form)
#ifdef KVL_TR_AVX512BF16
KVL_TR_ROWS_ENTRY(kvl__translate_rows_avx512_bf16, KVL_AVX512BF16, uint16_t, rows_form_bf16)
#endif

#else

void kvl__translate_rows_avx512(kvl__kv_blocks *c, int l, int t0, const float *xk,
                                const float *xv, int ds, const float *wkT, const float *wvT,
                                int dt, int D, const float *kn, float eps, const float *rcos,
                                const float *rsin, int a, int b, int stream) {
    (void)c, (void)l, (void)t0, (void)xk, (void)xv, (void)ds, (void)wkT, (void)wvT, (void)dt;
    (void)D, (void)kn, (void)eps, (void)rcos, (void)rsin, (void)a, (void)b, (void)stream;
}

#endif

#ifndef KVL_TR_AVX512BF16
/* no bf16 intrinsics in this compiler: kvl__translate_bf16_usable answers 0, so nothing calls this */
void kvl__translate_rows_avx512_bf16(kvl__kv_blocks *c, int l, int t0, const uint16_t *xk,
                                     const uint16_t *xv, int ds, const uint16_t *wkP,
                                     const uint16_t *wvP, int dt, int D, const float *kn, float eps,
                                     const float *rcos, const float *rsin, int a, int b, int stream) {
    (void)c, (void)l, (void)t0, (void)xk, (void)xv, (void)ds, (void)wkP, (void)wvP, (void)dt;
    (void)D, (void)kn, (void)eps, (void)rcos, (void)rsin, (void)a, (void)b, (void)stream;
}
#endif
