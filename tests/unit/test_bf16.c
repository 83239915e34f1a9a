/* tests/unit/test_bf16.c: the CPU backend's bf16 weights (KVL_WEIGHTS_BF16, kvlingo/model.h).
 *   kernels   kvl__cpu_matmul_bf16, AMX / AVX-512 / AVX2 (where the CPU has them) and portable,
 *             against a float64 reference of the same arithmetic (bf16 weights; hi/lo-split
 *             inputs for the AMX prefill tiles, exact inputs elsewhere), on
 *             ragged shapes (K tails, odd N, T across the decode / widening-tile / panel
 *             boundaries), with and without a thread pool;
 *   multi     kvl__cpu_matmul_bf16_multi gives each output the bits of its own call;
 *   rows      on the widening tiles a row's outputs do not depend on the tile it falls in: every
 *             row of a T-row product has the bits of that row multiplied alone;
 *   dtypes    AUTO resolves to the checkpoint's dtype (bf16 for qwen3-b, f32 for the float32
 *             and float16 checkpoints and for random models); parse / name;
 *   greedy    qwen3-b (bf16 on disk) gives the same greedy continuation with bf16 weights in
 *             memory (both kernels) as in float32; a float32 model in bf16 mode stays close. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/shapes.h"
#include "matmul_bf16.h"
#include "matmul_bf16_amx.h"
#include "testutil.h"

#define OK(x) do { kvl_status s_ = (x); if (s_ != KVL_OK) fail_msg("%s: %s", #x, kvl_last_error()); } while (0)

static uint64_t rng_state = 12345;
static float urand(void) {   /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

/* An input as the AMX tiles multiply it: hi = bf16(x), lo = bf16(x - hi), hi + lo. */
static double split_hi_lo(float x) {
    float hi = kvl__bf16_to_f32(kvl__f32_to_bf16(x));
    return (double)hi + kvl__bf16_to_f32(kvl__f32_to_bf16(x - hi));
}

/* out_ref[T,N] in float64: W bf16 widened, inputs exact (every kernel but AMX multiplies those)
 * or, with split, as their hi/lo bf16 pair. */
static void reference(double *ref, const float *in, const uint16_t *W, const float *bias, int T, int K,
                      int N, int split) {
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0.0;
            for (int k = 0; k < K; k++) {
                double xv = split ? split_hi_lo(in[(size_t)t * K + k]) : in[(size_t)t * K + k];
                s += (double)kvl__bf16_to_f32(W[(size_t)n * K + k]) * xv;
            }
            ref[(size_t)t * N + n] = s;
        }
}

static void run_case(kvl__bf16_kernel kern, kvl__pool *pool, int T, int K, int N, int with_bias) {
    uint16_t *W = malloc(sizeof(uint16_t) * (size_t)N * K);
    float *in = malloc(sizeof(float) * (size_t)T * K), *out = malloc(sizeof(float) * (size_t)T * N);
    float *bias = malloc(sizeof(float) * (size_t)N);
    double *ref = malloc(sizeof(double) * (size_t)T * N);
    float *panel = malloc(sizeof(float) * kvl__bf16_panel_elems(K));
    assert_true(W && in && out && bias && ref && panel);
    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = kvl__f32_to_bf16(urand() * 0.05f);
    for (size_t i = 0; i < (size_t)T * K; i++) in[i] = urand() * 3.0f;
    for (int i = 0; i < N; i++) bias[i] = urand();
    kvl__bf16_exec ex = {pool, panel};
    kvl__cpu_matmul_bf16(&ex, out, in, W, with_bias ? bias : NULL, T, K, N);
    /* AMX takes T >= KVL__BF16_AMX_MIN_T with K % 32 == 0, the AVX-512 tiles the rest */
    const int split = kern == KVL__BF16_KERNEL_AMX && T >= KVL__BF16_AMX_MIN_T && K % 32 == 0 && N >= 32;
    reference(ref, in, W, with_bias ? bias : NULL, T, K, N, split);
    double maxerr = 0, maxref = 0;
    for (size_t i = 0; i < (size_t)T * N; i++) {
        double e = fabs(out[i] - ref[i]);
        if (!(e <= maxerr)) maxerr = e;
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    }
    /* float32 accumulation over K terms: a few ulps of the largest partial sums */
    if (!(maxerr <= 1e-5 * maxref + 1e-6))
        fail_msg("%s T=%d K=%d N=%d bias=%d pool=%d: max err %.3g (max ref %.3g)",
                 kvl__bf16_kernel_name(kern), T, K, N, with_bias, pool != NULL, maxerr, maxref);
    free(W); free(in); free(out); free(bias); free(ref); free(panel);
}

void openblas_set_num_threads(int n);   /* OpenBLAS's own: one thread while pool parts call it */

/* Make `k` the active kernel: 1, or 0 with a note when this CPU lacks it. */
static int select_kernel(kvl__bf16_kernel k) {
    if (kvl__bf16_set_kernel(k) >= 0) return 1;
    printf("note: %s kernel not available on this CPU, not tested\n", kvl__bf16_kernel_name(k));
    return 0;
}

static void test_kernels(void **st) {
    (void)st;
    openblas_set_num_threads(1);
    kvl__pool *pool = NULL;
    OK(kvl__pool_create(2, &pool));
    const int shapes[][3] = {{1, 64, 16}, {1, 37, 13}, {1, 1536, 67}, {2, 20, 5}, {3, 100, 33},
                             {4, 128, 4}, {5, 257, 21}, {16, 96, 50}, {17, 64, 40}, {32, 40, 7},
                             {33, 20, 5}, {40, 600, 20}, {70, 200, 35}, {130, 33, 9},
                             /* the AMX tiles: K % 32 == 0, one 16-row input block (T <= 16), T > 32,
                              * N tails, odd 16-row blocks */
                             {7, 64, 32}, {9, 1536, 67}, {12, 128, 96}, {6, 64, 32},
                             {33, 64, 32}, {40, 96, 70}, {64, 1536, 64}, {100, 256, 97}, {49, 32, 48}};
    kvl__bf16_kernel kernels[] = {KVL__BF16_KERNEL_PORTABLE, KVL__BF16_KERNEL_AVX512, KVL__BF16_KERNEL_AVX2,
                                  KVL__BF16_KERNEL_AMX};
    int saved = (int)kvl__bf16_kernel_active();
    for (int k = 0; k < 4; k++) {
        if (!select_kernel(kernels[k])) continue;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int b = 0; b < 2; b++) {
                run_case(kernels[k], NULL, shapes[i][0], shapes[i][1], shapes[i][2], b);
                run_case(kernels[k], pool, shapes[i][0], shapes[i][1], shapes[i][2], b);
            }
    }
    kvl__bf16_set_kernel((kvl__bf16_kernel)saved);
    kvl__pool_free(pool);
}

/* kvl__cpu_matmul_bf16_multi: each output bit-identical to its own kvl__cpu_matmul_bf16 call,
 * on every kernel the CPU has, 2 and 3 outputs of ragged sizes, on the caller and on a pool,
 * T from decode through the widening tiles' limit and past it. */
static void test_multi(void **st) {
    (void)st;
    openblas_set_num_threads(1);
    kvl__pool *pool = NULL;
    OK(kvl__pool_create(2, &pool));
    const int Ts[] = {1, 2, 5, 9, 16, KVL__BF16_WIDE_T, KVL__BF16_WIDE_T + 1};
    const int Ns[][3] = {{256, 128, 128}, {100, 36, 5}, {768, 768, 0}, {4, 900, 17}};
    const int K = 96;
    float *panel = malloc(sizeof(float) * kvl__bf16_panel_elems(K));
    assert_non_null(panel);
    kvl__bf16_kernel kernels[] = {KVL__BF16_KERNEL_PORTABLE, KVL__BF16_KERNEL_AVX512, KVL__BF16_KERNEL_AVX2,
                                  KVL__BF16_KERNEL_AMX};
    int saved = (int)kvl__bf16_kernel_active();
    for (int k = 0; k < 4; k++) {
        if (kvl__bf16_set_kernel(kernels[k]) < 0) continue;
        for (size_t c = 0; c < sizeof Ns / sizeof Ns[0]; c++)
            for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
                for (int p = 0; p < 2; p++) {
                    const int T = Ts[t], n = Ns[c][2] ? 3 : 2;
                    kvl__bf16_exec ex = {p ? pool : NULL, panel};
                    float *in = malloc(sizeof(float) * (size_t)T * K), *want[3], *bias[3];
                    assert_non_null(in);
                    for (size_t i = 0; i < (size_t)T * K; i++) in[i] = urand();
                    kvl__bf16_out o[3];
                    for (int i = 0; i < n; i++) {
                        const int N = Ns[c][i];
                        uint16_t *W = malloc(sizeof(uint16_t) * (size_t)N * K);
                        bias[i] = malloc(sizeof(float) * (size_t)N);
                        want[i] = malloc(sizeof(float) * (size_t)T * N);
                        float *out = malloc(sizeof(float) * (size_t)T * N);
                        assert_true(W && bias[i] && want[i] && out);
                        for (size_t e = 0; e < (size_t)N * K; e++) W[e] = kvl__f32_to_bf16(urand() * 0.05f);
                        for (int e = 0; e < N; e++) bias[i][e] = urand();
                        o[i] = (kvl__bf16_out){out, W, (i + (int)t) & 1 ? bias[i] : NULL, N};
                        kvl__cpu_matmul_bf16(&ex, want[i], in, W, o[i].bias, T, K, N);
                        for (size_t e = 0; e < (size_t)T * N; e++) out[e] = NAN;
                    }
                    kvl__cpu_matmul_bf16_multi(&ex, in, T, K, o, n);
                    for (int i = 0; i < n; i++) {
                        if (memcmp(o[i].out, want[i], sizeof(float) * (size_t)T * o[i].N))
                            fail_msg("multi %s T=%d output %d of %d (N=%d) pool=%d: differs from its own call",
                                     kvl__bf16_kernel_name(kernels[k]), T, i, n, o[i].N, p);
                        free(o[i].out);
                        free((void *)o[i].W);
                        free(want[i]);
                        free(bias[i]);
                    }
                    free(in);
                }
    }
    kvl__bf16_set_kernel((kvl__bf16_kernel)saved);
    free(panel);
    kvl__pool_free(pool);
}

/* The widening tiles take T rows 4 at a time on AVX-512 (the 1 or 2 left over merged into a tile
 * of 5 or 6 rows), 3 at a time on AVX2: each output is the same products summed in the same
 * order in any tile, so every row of a T-row product equals, bit for bit, that row multiplied
 * alone (a 1-row tile). */
static void test_rows_any_tile(void **st) {
    (void)st;
    openblas_set_num_threads(1);
    kvl__pool *pool = NULL;
    OK(kvl__pool_create(2, &pool));
    /* a K tail, a ragged N (a block of fewer than 4 weight rows), and T * K * N from 5 rows up
     * past the size that goes to the pool (KVL_PARALLEL_MIN_MACS, 2^18) */
    const int K = 260, N = 205;
    uint16_t *W = malloc(sizeof(uint16_t) * (size_t)N * K);
    float *all = malloc(sizeof(float) * 32 * K), *out = malloc(sizeof(float) * 32 * N);
    float *one = malloc(sizeof(float) * N), *bias = malloc(sizeof(float) * N);
    float *panel = malloc(sizeof(float) * kvl__bf16_panel_elems(K));
    assert_true(W && all && out && one && bias && panel);
    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = kvl__f32_to_bf16(urand() * 0.05f);
    for (size_t i = 0; i < (size_t)32 * K; i++) all[i] = urand() * 3.0f;
    for (int i = 0; i < N; i++) bias[i] = urand();
    kvl__bf16_kernel kernels[] = {KVL__BF16_KERNEL_AVX512, KVL__BF16_KERNEL_AVX2};
    const int Ts[] = {5, 6, 7, 9, 10, 13, 14, 16, 17, 32};
    int saved = (int)kvl__bf16_kernel_active();
    for (int k = 0; k < 2; k++) {
        if (!select_kernel(kernels[k])) continue;
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
            for (int p = 0; p < 2; p++) {
                const int T = Ts[ti];
                /* inputs of exactly T rows (and of one), so a tile reading past them is caught
                 * under AddressSanitizer */
                float *in = malloc(sizeof(float) * (size_t)T * K), *row = malloc(sizeof(float) * K);
                assert_true(in && row);
                memcpy(in, all, sizeof(float) * (size_t)T * K);
                kvl__bf16_exec ex = {p ? pool : NULL, panel};
                kvl__cpu_matmul_bf16(&ex, out, in, W, bias, T, K, N);
                for (int t = 0; t < T; t++) {
                    memcpy(row, in + (size_t)t * K, sizeof(float) * K);
                    kvl__cpu_matmul_bf16(&ex, one, row, W, bias, 1, K, N);
                    if (memcmp(one, out + (size_t)t * N, sizeof(float) * N) != 0)
                        fail_msg("%s T=%d pool=%d: row %d differs from the row multiplied alone",
                                 kvl__bf16_kernel_name(kernels[k]), T, p, t);
                }
                free(in);
                free(row);
            }
    }
    kvl__bf16_set_kernel((kvl__bf16_kernel)saved);
    kvl__pool_free(pool);
    free(W); free(all); free(out); free(one); free(bias); free(panel);
}

/* The AMX call straight: a scratch that holds 32 rows makes a 100-row input four passes; shapes
 * the tiles do not take are refused with nothing written. */
static void test_amx_passes(void **st) {
    (void)st;
    if (!kvl__amx_usable()) {
        printf("note: amx kernel not available on this CPU, not tested\n");
        assert_int_equal(kvl__amx_matmul_bf16(NULL, NULL, NULL, NULL, NULL, 64, 64, 64, NULL, 0), -1);
        return;
    }
    const int T = 100, K = 64, N = 70;
    uint16_t W[70 * 64];
    float in[100 * 64], out[100 * 70], bias[70];
    double ref[100 * 70];
    for (int i = 0; i < N * K; i++) W[i] = kvl__f32_to_bf16(urand() * 0.05f);
    for (int i = 0; i < T * K; i++) in[i] = urand() * 3.0f;
    for (int i = 0; i < N; i++) bias[i] = urand();
    size_t bytes = kvl__amx_pack_bytes(32, K) + 63;
    void *pack = malloc(bytes);
    assert_non_null(pack);
    for (int i = 0; i < T * N; i++) out[i] = -12345.0f;
    assert_int_equal(kvl__amx_matmul_bf16(NULL, out, in, W, bias, T, K, N, pack, bytes), 0);
    reference(ref, in, W, bias, T, K, N, 1);
    double maxerr = 0, maxref = 0;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            if (n >= 64) {   /* the caller's columns: untouched */
                assert_true(out[t * N + n] == -12345.0f);
                continue;
            }
            double e = fabs(out[t * N + n] - ref[t * N + n]);
            if (!(e <= maxerr)) maxerr = e;
            if (fabs(ref[t * N + n]) > maxref) maxref = fabs(ref[t * N + n]);
        }
    if (!(maxerr <= 1e-5 * maxref + 1e-6)) fail_msg("amx passes: max err %.3g (max ref %.3g)", maxerr, maxref);
    /* K % 32 != 0, N < 32, a scratch under 32 rows: refused */
    assert_int_equal(kvl__amx_matmul_bf16(NULL, out, in, W, bias, T, 48, 40, pack, bytes), -1);
    assert_int_equal(kvl__amx_matmul_bf16(NULL, out, in, W, bias, T, K, 16, pack, bytes), -1);
    assert_int_equal(kvl__amx_matmul_bf16(NULL, out, in, W, bias, T, K, N, pack, kvl__amx_pack_bytes(32, K) - 1), -1);
    free(pack);
}

static void test_rounding(void **st) {
    (void)st;
    assert_int_equal(kvl__f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(kvl__f32_to_bf16(1.00390625f), 0x3f80);        /* tie -> even */
    assert_int_equal(kvl__f32_to_bf16(1.01171875f), 0x3f82);        /* tie -> even (up) */
    assert_int_equal(kvl__f32_to_bf16(-2.0f), 0xc000);
    assert_true(isnan(kvl__bf16_to_f32(kvl__f32_to_bf16(NAN))));
    assert_true(isinf(kvl__bf16_to_f32(kvl__f32_to_bf16(INFINITY))));
}

static kvl_model *load(const char *name, kvl_weights_dtype d) {
    char rel[64];
    snprintf(rel, sizeof rel, "models/%s", name);
    kvl_model_params p = kvl_model_default_params();
    p.n_threads = 2;
    p.weights_dtype = d;
    kvl_model *m = NULL;
    OK(kvl_model_load(kvl__test_path(rel), &p, &m));
    return m;
}

static void test_dtypes(void **st) {
    (void)st;
    kvl_weights_dtype d;
    OK(kvl_weights_dtype_parse("bf16", &d));
    assert_int_equal(d, KVL_WEIGHTS_BF16);
    OK(kvl_weights_dtype_parse("f32", &d));
    assert_int_equal(d, KVL_WEIGHTS_F32);
    assert_int_equal(kvl_weights_dtype_parse("fp8", &d), KVL_ERR_INVALID_ARG);
    assert_string_equal(kvl_weights_dtype_name(KVL_WEIGHTS_BF16), "bf16");
    const char *names[] = {"qwen3-a", "qwen3-b", "qwen2-c"};
    const kvl_weights_dtype want[] = {KVL_WEIGHTS_F32, KVL_WEIGHTS_BF16, KVL_WEIGHTS_F32};
    for (int i = 0; i < 3; i++) {
        kvl_model *m = load(names[i], KVL_WEIGHTS_AUTO);
        assert_int_equal(kvl_model_weights_dtype(m), want[i]);
        kvl_model_free(m);
    }
    kvl_model *m = load("qwen3-a", KVL_WEIGHTS_BF16);
    assert_int_equal(kvl_model_weights_dtype(m), KVL_WEIGHTS_BF16);
    kvl_model_free(m);
    kvl_model_config cfg;
    OK(kvl_shape_config("tiny", &cfg));
    kvl_model_params p = kvl_model_default_params();
    OK(kvl_model_create_random(&cfg, 1, &p, &m));
    assert_int_equal(kvl_model_weights_dtype(m), KVL_WEIGHTS_F32);
    kvl_model_free(m);
    p.weights_dtype = (kvl_weights_dtype)7;
    assert_int_equal(kvl_model_create_random(&cfg, 1, &p, &m), KVL_ERR_INVALID_ARG);
}

/* Greedy continuation of `n` tokens after a prompt; max |logit difference| against `ref_logits`
 * of the same steps when given. */
static void greedy(kvl_model *m, const int32_t *prompt, int np, int n, int32_t *out, float *logits_out) {
    const kvl_model_config *c = kvl_model_config_get(m);
    kvl_cache *cache = NULL;
    OK(kvl_model_cache_create(m, NULL, &cache));
    float *lg = malloc(sizeof(float) * c->vocab_size);
    assert_non_null(lg);
    OK(kvl_model_prefill(m, cache, prompt, np, KVL_LOGITS_LAST, lg));
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int v = 1; v < c->vocab_size; v++) best = lg[v] > lg[best] ? v : best;
        out[i] = best;
        if (logits_out) memcpy(logits_out + (size_t)i * c->vocab_size, lg, sizeof(float) * c->vocab_size);
        OK(kvl_model_decode(m, cache, best, lg));
    }
    free(lg);
    kvl_cache_free(cache);
}

static void test_greedy(void **st) {
    (void)st;
    const int32_t prompts[3][6] = {{725, 732, 1553, 623, 11, 290}, {39, 918, 78, 845, 13, 40},
                                   {1, 298, 743, 383, 1325, 594}};
    const int N = 48;
    kvl_model *f = load("qwen3-b", KVL_WEIGHTS_F32), *b = load("qwen3-b", KVL_WEIGHTS_BF16);
    int saved = (int)kvl__bf16_kernel_active();
    for (int p = 0; p < 3; p++) {
        int32_t gf[48], gb[48], gp[48];
        greedy(f, prompts[p], 6, N, gf, NULL);
        greedy(b, prompts[p], 6, N, gb, NULL);
        kvl__bf16_set_kernel(KVL__BF16_KERNEL_PORTABLE);
        greedy(b, prompts[p], 6, N, gp, NULL);
        kvl__bf16_set_kernel((kvl__bf16_kernel)saved);
        for (int i = 0; i < N; i++) {
            if (gb[i] != gf[i]) fail_msg("qwen3-b prompt %d token %d: bf16 %d, f32 %d", p, i, gb[i], gf[i]);
            if (gp[i] != gf[i]) fail_msg("qwen3-b prompt %d token %d: bf16 portable %d, f32 %d", p, i, gp[i], gf[i]);
        }
    }
    kvl_model_free(f);
    kvl_model_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding),
        cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_multi),
        cmocka_unit_test(test_rows_any_tile),
        cmocka_unit_test(test_amx_passes),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
