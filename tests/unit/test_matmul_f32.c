/* tests/unit/test_matmul_f32.c: the float32 matmuls of the CPU backend's forward pass
 * (kernels/cpu/matmul_f32.h).
 *   tiles    kvl__cpu_matmul_f32 against a float64 reference on ragged shapes: K with and
 *            without a 16-float tail, N not a multiple of 4 or 16, T from 1 (sgemv on each
 *            part) across every 4-row tile count to the tiles' limit and past it (sgemm on
 *            each part), with and without bias, on the caller alone and on 2- and 3-thread
 *            pools (parts whose row ranges are empty included);
 *   blas     with the tiles turned off (KVL_CPU_F32_KERNEL=blas in a child run of this program)
 *            the same cases pass through OpenBLAS alone;
 *   avx2     with the AVX2 + FMA tiles chosen (KVL_CPU_F32_KERNEL=avx2 in a child run) the same
 *            cases pass on a CPU with AVX-512 too, so both tile sets are tested wherever AVX2 is;
 *   parts    a part's rows only are written: the tiles on [n0, n1) leave the other outputs as
 *            they were; the tiles alone on T = 1 (the 4x1 tile) are right too;
 *   multi    several outputs of one input as one job: each bit-identical to its own call. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "matmul_f32.h"
#include "pool.h"
#include "testutil.h"

void openblas_set_num_threads(int n);   /* OpenBLAS's own: one thread while parts call it */

static uint64_t rng_state = 777;
static float urand(void) {   /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

static void run_case(kvl__pool *pool, int T, int K, int N, int with_bias) {
    float *W = malloc(sizeof(float) * (size_t)N * K), *in = malloc(sizeof(float) * (size_t)T * K);
    float *out = malloc(sizeof(float) * (size_t)T * N), *bias = malloc(sizeof(float) * (size_t)N);
    assert_true(W && in && out && bias);
    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = urand() * 0.05f;
    for (size_t i = 0; i < (size_t)T * K; i++) in[i] = urand() * 3.0f;
    for (int i = 0; i < N; i++) bias[i] = urand();
    for (size_t i = 0; i < (size_t)T * N; i++) out[i] = NAN;   /* every output must be written */
    kvl__cpu_matmul_f32(pool, out, in, W, with_bias ? bias : NULL, T, K, N);
    double maxerr = 0, maxabs = 0;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = with_bias ? bias[n] : 0.0, a = with_bias ? fabs(bias[n]) : 0.0;
            for (int k = 0; k < K; k++) {
                s += (double)in[(size_t)t * K + k] * W[(size_t)n * K + k];
                a += fabs((double)in[(size_t)t * K + k] * W[(size_t)n * K + k]);
            }
            double e = fabs(out[(size_t)t * N + n] - s);
            if (!(e <= maxerr)) maxerr = e;   /* NaN too */
            if (a > maxabs) maxabs = a;
        }
    /* float32 accumulation: a few ulps of the largest sum of |terms| */
    if (!(maxerr <= 4e-7 * maxabs * sqrt((double)K) / 4 + 1e-6))
        fail_msg("tiles %s T=%d K=%d N=%d bias=%d pool=%d threads: max err %.3g (sum |terms| %.3g)",
                 kvl__f32_tiles_name(), T, K, N, with_bias,
                 pool ? kvl__pool_threads(pool) : 0, maxerr, maxabs);
    free(W); free(in); free(out); free(bias);
}

static void shapes(void **st) {
    (void)st;
    openblas_set_num_threads(1);
    kvl__pool *p2 = NULL, *p3 = NULL;
    assert_int_equal(kvl__pool_create(2, &p2), KVL_OK);
    assert_int_equal(kvl__pool_create(3, &p3), KVL_OK);
    kvl__pool *pools[] = {NULL, p2, p3};
    const int Ts[] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, KVL__F32_SMALL_T, KVL__F32_SMALL_T + 1, 70};
    const int KN[][2] = {{16, 4}, {20, 5}, {37, 13}, {256, 768}, {768, 256}, {64, 1}, {100, 4099}};
    for (size_t s = 0; s < sizeof KN / sizeof KN[0]; s++)
        for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
            for (int p = 0; p < 3; p++) run_case(pools[p], Ts[t], KN[s][0], KN[s][1], (int)(s + t + p) & 1);
    kvl__pool_free(p2);
    kvl__pool_free(p3);
}

static void part_rows_only(void **st) {
    (void)st;
    const int T = 6, K = 40, N = 30, n0 = 8, n1 = 21;
    float W[N * K], in[T * K], out[T * N];
    for (int i = 0; i < N * K; i++) W[i] = urand();
    for (int i = 0; i < T * K; i++) in[i] = urand();
    for (int i = 0; i < T * N; i++) out[i] = 1234.5f;
    if (kvl__cpu_matmul_f32_tiles(out, in, W, NULL, T, K, N, n0, n1) != 0) {
        assert_false(kvl__f32_tiles_active());
        skip();
    }
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            const float o = out[t * N + n];
            if (n < n0 || n >= n1) {
                if (o != 1234.5f) fail_msg("row %d col %d outside [%d, %d) was written: %g", t, n, n0, n1, o);
            } else {
                double s = 0;
                for (int k = 0; k < K; k++) s += (double)in[t * K + k] * W[n * K + k];
                if (fabs(o - s) > 1e-4) fail_msg("row %d col %d: %g, want %g", t, n, o, s);
            }
        }
    assert_int_equal(kvl__cpu_matmul_f32_tiles(out, in, W, NULL, KVL__F32_SMALL_T + 1, K, N, 0, N), -1);
    float one[N];
    assert_int_equal(kvl__cpu_matmul_f32_tiles(one, in, W, NULL, 1, K, N, 0, N), 0);
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int k = 0; k < K; k++) s += (double)in[k] * W[n * K + k];
        if (fabs(one[n] - s) > 1e-4) fail_msg("T=1 tile col %d: %g, want %g", n, one[n], s);
    }
}

/* kvl__cpu_matmul_f32_multi: each output bit-identical to its own kvl__cpu_matmul_f32 call,
 * for 2 and 3 outputs of ragged sizes, on the caller and on pools, every T path. */
static void multi(void **st) {
    (void)st;
    openblas_set_num_threads(1);
    kvl__pool *p2 = NULL, *p3 = NULL;
    assert_int_equal(kvl__pool_create(2, &p2), KVL_OK);
    assert_int_equal(kvl__pool_create(3, &p3), KVL_OK);
    kvl__pool *pools[] = {NULL, p2, p3};
    const int Ts[] = {1, 2, 5, 9, 16, KVL__F32_SMALL_T, KVL__F32_SMALL_T + 1};
    const int Ks[] = {256, 37};
    const int Ns[][3] = {{256, 128, 128}, {100, 36, 5}, {768, 768, 0}, {4, 900, 17}};
    for (size_t k = 0; k < 2; k++)
        for (size_t c = 0; c < sizeof Ns / sizeof Ns[0]; c++)
            for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
                for (int p = 0; p < 3; p++) {
                    const int T = Ts[t], K = Ks[k], n = Ns[c][2] ? 3 : 2;
                    float *in = malloc(sizeof(float) * (size_t)T * K);
                    assert_non_null(in);
                    for (size_t i = 0; i < (size_t)T * K; i++) in[i] = urand();
                    kvl__f32_out o[3];
                    float *want[3], *bias[3];
                    for (int i = 0; i < n; i++) {
                        const int N = Ns[c][i];
                        float *W = malloc(sizeof(float) * (size_t)N * K), *b = bias[i] = malloc(sizeof(float) * (size_t)N);
                        float *out = malloc(sizeof(float) * (size_t)T * N);
                        want[i] = malloc(sizeof(float) * (size_t)T * N);
                        assert_true(W && b && out && want[i]);
                        for (size_t e = 0; e < (size_t)N * K; e++) W[e] = urand() * 0.05f;
                        for (int e = 0; e < N; e++) b[e] = urand();
                        o[i] = (kvl__f32_out){out, W, (i + (int)t) & 1 ? b : NULL, N};
                        kvl__cpu_matmul_f32(pools[p], want[i], in, W, o[i].bias, T, K, N);
                        for (size_t e = 0; e < (size_t)T * N; e++) out[e] = NAN;
                    }
                    kvl__cpu_matmul_f32_multi(pools[p], in, T, K, o, n);
                    for (int i = 0; i < n; i++) {
                        if (memcmp(o[i].out, want[i], sizeof(float) * (size_t)T * o[i].N))
                            fail_msg("multi T=%d K=%d output %d of %d (N=%d) pool=%d: differs from its own call",
                                     T, K, i, n, o[i].N, pools[p] ? kvl__pool_threads(pools[p]) : 0);
                        free(o[i].out);
                        free((void *)o[i].W);
                        free(want[i]);
                        free(bias[i]);
                    }
                    free(in);
                }
    kvl__pool_free(p2);
    kvl__pool_free(p3);
}

/* The same shapes with the tiles off, in a child process (the choice is made once a process). */
static void blas_only(void **st) {
    (void)st;
    if (getenv("KVL_CPU_F32_KERNEL")) skip();   /* this is the child */
    int rc = kvl__test_rerun_self_with("KVL_CPU_F32_KERNEL", "blas");
    if (rc != 0) fail_msg("this program run again with KVL_CPU_F32_KERNEL=blas failed (status %d)", rc);
}

/* The same shapes on the AVX2 + FMA tiles, in a child process; on a CPU without them the child
 * runs the OpenBLAS path again. */
static void avx2_only(void **st) {
    (void)st;
    if (getenv("KVL_CPU_F32_KERNEL")) skip();   /* this is the child */
    int rc = kvl__test_rerun_self_with("KVL_CPU_F32_KERNEL", "avx2");
    if (rc != 0) fail_msg("this program run again with KVL_CPU_F32_KERNEL=avx2 failed (status %d)", rc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shapes),
        cmocka_unit_test(part_rows_only),
        cmocka_unit_test(multi),
        cmocka_unit_test(blas_only),
        cmocka_unit_test(avx2_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
