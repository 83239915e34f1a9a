/* tests/unit/test_attention_decode.c: decode attention read in place from cache blocks
 * (kernels/cpu/attention_decode.c) against the reference attention of a gathered context
 * (kvl__cpu_attention_forward with one query at the last position) and a float64 reference:
 *   - head_dim 64 and 128 (the fixed-size paths) and 48 / 80 (the generic path), on the AVX-512
 *     form where the CPU has it (else the AVX2 form), again on the AVX2 form
 *     (KVL_CPU_DECODE=avx2) and on the portable forms (KVL_CPU_DECODE=portable), each in a
 *     child run of this program;
 *   - GQA groups of 1, 2, 4, 6 and 7 query heads per KV head, and each head of a group run
 *     alone giving the same bits;
 *   - contexts that end inside a block, on a block boundary, and shorter than one block;
 *   - block sizes 16 and 7 (odd rows), with the K/V head picked by head_off;
 *   - large-magnitude scores (softmax max subtraction);
 *   - the per-group entry point equals the whole-layer one head group by head group;
 * and causal prefill attention of a chunk of query rows read in place from the blocks
 * (kvl__cpu_attention_prefill_group) against the same two references: chunks starting at 0, mid
 * block and on a block boundary, ragged block sizes, GQA 1/2/4 (and 3, 6: tiles that do not
 * fill the lanes), head_dim 20/36/48/64/80/128, and a chunk run as one call or tile by tile;
 * and every case again over a bf16 cache (keys and values rounded to bf16, stored as bf16):
 * the bf16 entry points against the float32 ones on the same rounded values and against the
 * float64 reference (prefill where kvl__cpu_attention_prefill_bf16_vectorised says it runs). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "matmul_bf16.h"
#include "ops.h"
#include "testutil.h"

/* bf16 blocks holding the rounded copies of float blocks kb[nb] of bt rows of `row` */
static uint16_t **bf16_blocks(float **kb, int nb, int bt, int row) {
    uint16_t **o = malloc(sizeof(uint16_t *) * (size_t)nb);
    assert_non_null(o);
    for (int b = 0; b < nb; b++) {
        o[b] = malloc(sizeof(uint16_t) * (size_t)bt * row);
        assert_non_null(o[b]);
        kvl__bf16_from_f32(o[b], kb[b], (size_t)bt * row);
    }
    return o;
}

static void free_blocks(void **b, int nb) {
    for (int i = 0; i < nb; i++) free(b[i]);
    free(b);
}

static float round_bf16(float x) { return kvl__bf16_to_f32(kvl__f32_to_bf16(x)); }

static uint64_t rng_state = 777;
static float urand(void) {   /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

/* One case: Tk tokens of Hkv*D keys/values split into blocks of bt tokens. */
static void run_case_kv(int Tk, int Hq, int Hkv, int D, int bt, float qscale, int bf16) {
    const int row = Hkv * D, QD = Hq * D, group = Hq / Hkv;
    const int nb = (Tk + bt - 1) / bt;
    float *k = malloc(sizeof(float) * (size_t)Tk * row), *v = malloc(sizeof(float) * (size_t)Tk * row);
    float *q = malloc(sizeof(float) * QD);
    float *out = malloc(sizeof(float) * QD), *ref = malloc(sizeof(float) * QD);
    float *out_g = malloc(sizeof(float) * QD);
    float *scratch = malloc(sizeof(float) * (size_t)group * Tk);
    float *ref_scratch = malloc(sizeof(float) * kvl__cpu_attention_scratch(1, Tk));
    float **kb = malloc(sizeof(float *) * nb), **vb = malloc(sizeof(float *) * nb);
    assert_non_null(k); assert_non_null(v); assert_non_null(q); assert_non_null(out);
    assert_non_null(ref); assert_non_null(out_g); assert_non_null(scratch);
    assert_non_null(ref_scratch); assert_non_null(kb); assert_non_null(vb);
    for (size_t i = 0; i < (size_t)Tk * row; i++) { k[i] = urand(); v[i] = urand(); }
    if (bf16)   /* the references see what a bf16 cache holds */
        for (size_t i = 0; i < (size_t)Tk * row; i++) { k[i] = round_bf16(k[i]); v[i] = round_bf16(v[i]); }
    for (int i = 0; i < QD; i++) q[i] = urand() * qscale;
    /* blocks: separate allocations with bt rows each, as the cache holds them */
    for (int b = 0; b < nb; b++) {
        kb[b] = malloc(sizeof(float) * (size_t)bt * row);
        vb[b] = malloc(sizeof(float) * (size_t)bt * row);
        assert_non_null(kb[b]); assert_non_null(vb[b]);
        int n = Tk - b * bt < bt ? Tk - b * bt : bt;
        memcpy(kb[b], k + (size_t)b * bt * row, sizeof(float) * (size_t)n * row);
        memcpy(vb[b], v + (size_t)b * bt * row, sizeof(float) * (size_t)n * row);
    }
    kvl__cpu_attention_decode_blocks(out, q, (const float *const *)kb, (const float *const *)vb, bt,
                                     Tk, Hq, Hkv, D, scratch);
    kvl__cpu_attention_forward(ref, NULL, q, k, v, 1, Tk, Tk - 1, Hq, Hkv, D, ref_scratch);
    if (bf16) {   /* out_g: the bf16 kernel over the same values */
        uint16_t **kh = bf16_blocks(kb, nb, bt, row), **vh = bf16_blocks(vb, nb, bt, row);
        for (int g = 0; g < Hkv; g++)
            kvl__cpu_attention_decode_group_bf16(out_g + (size_t)g * group * D, q + (size_t)g * group * D,
                                                 (const uint16_t *const *)kh, (const uint16_t *const *)vh,
                                                 bt, row, g * D, Tk, group, D, scratch);
        free_blocks((void **)kh, nb);
        free_blocks((void **)vh, nb);
    } else {
        for (int g = 0; g < Hkv; g++)
            kvl__cpu_attention_decode_group(out_g + (size_t)g * group * D, q + (size_t)g * group * D,
                                            (const float *const *)kb, (const float *const *)vb, bt, row,
                                            g * D, Tk, group, D, scratch);
    }
    /* each head alone (a group of 1 on the same KV head) gives its bits in the group: the
     * AVX-512 form shares key and value loads among up to 4 heads, never the arithmetic */
    for (int h = 0; h < Hq && group > 1; h++) {
        const int g = h / group;
        float one[128];
        if (bf16) {
            uint16_t **kh = bf16_blocks(kb, nb, bt, row), **vh = bf16_blocks(vb, nb, bt, row);
            kvl__cpu_attention_decode_group_bf16(one, q + (size_t)h * D, (const uint16_t *const *)kh,
                                                 (const uint16_t *const *)vh, bt, row, g * D, Tk, 1, D,
                                                 scratch);
            free_blocks((void **)kh, nb);
            free_blocks((void **)vh, nb);
        } else {
            kvl__cpu_attention_decode_group(one, q + (size_t)h * D, (const float *const *)kb,
                                            (const float *const *)vb, bt, row, g * D, Tk, 1, D, scratch);
        }
        if (memcmp(one, out_g + (size_t)h * D, sizeof(float) * (size_t)D))
            fail_msg("Tk=%d D=%d group=%d%s: head %d alone differs from the head in its group", Tk, D,
                     group, bf16 ? " bf16" : "", h);
    }
    double max_err = 0, max_err64 = 0;
    for (int h = 0; h < Hq; h++) {
        const int g = h / group;
        /* float64 reference */
        double *p = malloc(sizeof(double) * Tk), m = -INFINITY, sum = 0;
        assert_non_null(p);
        for (int j = 0; j < Tk; j++) {
            double s = 0;
            for (int d = 0; d < D; d++) s += (double)q[h * D + d] * k[(size_t)j * row + g * D + d];
            p[j] = s / sqrt((double)D);
            if (p[j] > m) m = p[j];
        }
        for (int j = 0; j < Tk; j++) { p[j] = exp(p[j] - m); sum += p[j]; }
        for (int d = 0; d < D; d++) {
            double o = 0;
            for (int j = 0; j < Tk; j++) o += p[j] / sum * v[(size_t)j * row + g * D + d];
            double e = fabs(o - out[h * D + d]);
            if (e > max_err64) max_err64 = e;
            e = fabs((double)ref[h * D + d] - out[h * D + d]);
            if (e > max_err) max_err = e;
            if (bf16 ? !(fabs((double)out_g[h * D + d] - out[h * D + d]) <= 2e-5)
                     : out[h * D + d] != out_g[h * D + d])
                fail_msg("Tk=%d D=%d group=%d%s: per-group output differs at head %d dim %d (%g, %g)",
                         Tk, D, group, bf16 ? " bf16" : "", h, d, out_g[h * D + d], out[h * D + d]);
        }
        free(p);
    }
    if (max_err > 2e-5 || max_err64 > 2e-5)
        fail_msg("Tk=%d Hq=%d Hkv=%d D=%d bt=%d: max error %.3g against the gathered reference, "
                 "%.3g against float64", Tk, Hq, Hkv, D, bt, max_err, max_err64);
    for (int b = 0; b < nb; b++) { free(kb[b]); free(vb[b]); }
    free(kb); free(vb); free(k); free(v); free(q); free(out); free(ref); free(out_g);
    free(scratch); free(ref_scratch);
}

static void run_case(int Tk, int Hq, int Hkv, int D, int bt, float qscale) {
    run_case_kv(Tk, Hq, Hkv, D, bt, qscale, 0);
    run_case_kv(Tk, Hq, Hkv, D, bt, qscale, 1);   /* over a bf16 cache */
}

/* One prefill case: a chunk of n query rows at positions [p0, p0 + n) over Tk = p0 + n keys. */
static void run_prefill_case_kv(int p0, int n, int Hq, int Hkv, int D, int bt, float qscale, int bf16) {
    const int Tk = p0 + n, row = Hkv * D, QD = Hq * D, group = Hq / Hkv;
    const int nb = (Tk + bt - 1) / bt;
    float *k = malloc(sizeof(float) * (size_t)Tk * row), *v = malloc(sizeof(float) * (size_t)Tk * row);
    float *q = malloc(sizeof(float) * (size_t)n * QD);
    float *out = malloc(sizeof(float) * (size_t)n * QD), *out_t = malloc(sizeof(float) * (size_t)n * QD);
    float *ref = malloc(sizeof(float) * (size_t)n * QD);
    float *scratch = malloc(sizeof(float) * kvl__cpu_attention_prefill_scratch(Tk, D));
    float *ref_scratch = malloc(sizeof(float) * kvl__cpu_attention_scratch(n, Tk));
    float **kb = malloc(sizeof(float *) * nb), **vb = malloc(sizeof(float *) * nb);
    double *p = malloc(sizeof(double) * Tk);
    assert_non_null(k); assert_non_null(v); assert_non_null(q); assert_non_null(out);
    assert_non_null(out_t); assert_non_null(ref); assert_non_null(scratch);
    assert_non_null(ref_scratch); assert_non_null(kb); assert_non_null(vb); assert_non_null(p);
    for (size_t i = 0; i < (size_t)Tk * row; i++) { k[i] = urand(); v[i] = urand(); }
    if (bf16)
        for (size_t i = 0; i < (size_t)Tk * row; i++) { k[i] = round_bf16(k[i]); v[i] = round_bf16(v[i]); }
    for (size_t i = 0; i < (size_t)n * QD; i++) q[i] = urand() * qscale;
    for (int b = 0; b < nb; b++) {
        kb[b] = malloc(sizeof(float) * (size_t)bt * row);
        vb[b] = malloc(sizeof(float) * (size_t)bt * row);
        assert_non_null(kb[b]); assert_non_null(vb[b]);
        int m = Tk - b * bt < bt ? Tk - b * bt : bt;
        memcpy(kb[b], k + (size_t)b * bt * row, sizeof(float) * (size_t)m * row);
        memcpy(vb[b], v + (size_t)b * bt * row, sizeof(float) * (size_t)m * row);
        /* rows of the last block past the context hold garbage the kernel must not read */
        for (size_t i = (size_t)m * row; i < (size_t)bt * row; i++) kb[b][i] = vb[b][i] = NAN;
    }
    const int tile = kvl__cpu_attention_prefill_rows(group);
    for (int g = 0; g < Hkv; g++) {
        const size_t h0 = (size_t)g * group * D;
        kvl__cpu_attention_prefill_group(out + h0, q + h0, QD, (const float *const *)kb,
                                         (const float *const *)vb, bt, row, g * D, p0, n, group, D,
                                         scratch);
        for (int i0 = 0; i0 < n; i0 += tile) {   /* as the backend splits a chunk over threads */
            const int r = n - i0 < tile ? n - i0 : tile;
            const size_t off = (size_t)i0 * QD + h0;
            if (bf16) {   /* out_t: the bf16 kernel, tile by tile, over the same values */
                uint16_t **kh = bf16_blocks(kb, nb, bt, row), **vh = bf16_blocks(vb, nb, bt, row);
                kvl__cpu_attention_prefill_group_bf16(out_t + off, q + off, QD,
                                                      (const uint16_t *const *)kh,
                                                      (const uint16_t *const *)vh, bt, row, g * D,
                                                      p0 + i0, r, group, D, scratch);
                free_blocks((void **)kh, nb);
                free_blocks((void **)vh, nb);
            } else {
                kvl__cpu_attention_prefill_group(out_t + off, q + off, QD, (const float *const *)kb,
                                                 (const float *const *)vb, bt, row, g * D, p0 + i0, r,
                                                 group, D, scratch);
            }
        }
    }
    kvl__cpu_attention_forward(ref, NULL, q, k, v, n, Tk, p0, Hq, Hkv, D, ref_scratch);
    double max_err = 0, max_err64 = 0;
    for (int i = 0; i < n; i++) {
        const int vis = p0 + i + 1;
        for (int h = 0; h < Hq; h++) {
            const int g = h / group;
            const float *qh = q + (size_t)i * QD + (size_t)h * D;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < vis; j++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)qh[d] * k[(size_t)j * row + g * D + d];
                p[j] = s / sqrt((double)D);
                if (p[j] > m) m = p[j];
            }
            for (int j = 0; j < vis; j++) { p[j] = exp(p[j] - m); sum += p[j]; }
            for (int d = 0; d < D; d++) {
                const size_t at = (size_t)i * QD + (size_t)h * D + d;
                double o = 0;
                for (int j = 0; j < vis; j++) o += p[j] / sum * v[(size_t)j * row + g * D + d];
                double e = fabs(o - out[at]);
                if (!(e <= max_err64)) max_err64 = e;   /* NaN counts as an error */
                e = fabs((double)ref[at] - out[at]);
                if (!(e <= max_err)) max_err = e;
                if (bf16 ? !(fabs((double)out_t[at] - out[at]) <= 2e-5) : out[at] != out_t[at])
                    fail_msg("prefill p0=%d n=%d D=%d group=%d%s: tile-by-tile output differs at row "
                             "%d head %d dim %d", p0, n, D, group, bf16 ? " bf16" : "", i, h, d);
            }
        }
    }
    if (!(max_err <= 2e-5) || !(max_err64 <= 2e-5))
        fail_msg("prefill p0=%d n=%d Hq=%d Hkv=%d D=%d bt=%d: max error %.3g against the gathered "
                 "reference, %.3g against float64", p0, n, Hq, Hkv, D, bt, max_err, max_err64);
    for (int b = 0; b < nb; b++) { free(kb[b]); free(vb[b]); }
    free(kb); free(vb); free(k); free(v); free(q); free(out); free(out_t); free(ref);
    free(scratch); free(ref_scratch); free(p);
}

static void run_prefill_case(int p0, int n, int Hq, int Hkv, int D, int bt, float qscale) {
    run_prefill_case_kv(p0, n, Hq, Hkv, D, bt, qscale, 0);
    if (kvl__cpu_attention_prefill_bf16_vectorised(D))   /* elsewhere the backend gathers */
        run_prefill_case_kv(p0, n, Hq, Hkv, D, bt, qscale, 1);
}

static void test_prefill(void **state) {
    (void)state;
    /* (p0, n): from an empty cache, mid block, on a block boundary, a short chunk over a long
     * context, one row, a chunk longer than a tile */
    const int cases[][2] = {{0, 9}, {0, 37}, {5, 9}, {16, 16}, {301, 9}, {200, 1}, {23, 40}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int p0 = cases[c][0], n = cases[c][1];
        run_prefill_case(p0, n, 4, 2, 64, 16, 1.0f);    /* qwen3-b */
        run_prefill_case(p0, n, 8, 2, 128, 16, 1.0f);   /* group of 4 */
        run_prefill_case(p0, n, 2, 2, 64, 7, 1.0f);     /* no GQA, odd block size */
        run_prefill_case(p0, n, 4, 2, 48, 16, 1.0f);
        run_prefill_case(p0, n, 6, 2, 80, 7, 1.0f);     /* group of 3: 15 of 16 lanes */
        run_prefill_case(p0, n, 4, 1, 128, 5, 1.0f);    /* group of 4 on one KV head */
        run_prefill_case(p0, n, 8, 2, 20, 16, 1.0f);    /* llama3-d: head_dim not a multiple of 16 */
        run_prefill_case(p0, n, 6, 2, 36, 7, 1.0f);
    }
    run_prefill_case(40, 20, 12, 2, 64, 16, 1.0f);      /* group of 6: 2 rows a tile */
    run_prefill_case(70, 12, 4, 2, 64, 16, 40.0f);      /* large scores */
}

static void test_fixed_dims(void **state) {
    (void)state;
    const int tks[] = {1, 3, 15, 16, 17, 64, 301};
    for (size_t i = 0; i < sizeof tks / sizeof tks[0]; i++) {
        run_case(tks[i], 4, 2, 64, 16, 1.0f);    /* qwen3-b: 4 query heads on 2 KV heads */
        run_case(tks[i], 8, 2, 128, 16, 1.0f);   /* group of 4 */
        run_case(tks[i], 2, 2, 64, 7, 1.0f);     /* no GQA, odd block size */
        run_case(tks[i], 14, 2, 64, 16, 1.0f);   /* Qwen2.5-0.5B: groups of 7 (heads 2+2+2+1 a pass) */
    }
}

static void test_generic_dims(void **state) {
    (void)state;
    const int tks[] = {1, 5, 16, 33, 200};
    for (size_t i = 0; i < sizeof tks / sizeof tks[0]; i++) {
        run_case(tks[i], 4, 2, 48, 16, 1.0f);
        run_case(tks[i], 6, 3, 80, 7, 1.0f);
        run_case(tks[i], 8, 2, 32, 16, 1.0f);    /* head_dim 32, groups of 4: 4 heads a pass */
        run_case(tks[i], 12, 2, 16, 7, 1.0f);    /* head_dim 16, groups of 6: 4 + 2 */
    }
}

static void test_large_scores(void **state) {
    (void)state;
    run_case(129, 4, 2, 64, 16, 40.0f);   /* scores ~ +-100: exp overflows without the max */
    run_case(50, 4, 1, 48, 16, 40.0f);
}

/* Every case again on the portable decode forms, in a child process (the choice is made once
 * a process). */
static void test_portable(void **st) {
    (void)st;
    if (getenv("KVL_CPU_DECODE")) skip();   /* this is the child */
    int rc = kvl__test_rerun_self_with("KVL_CPU_DECODE", "portable");
    if (rc != 0) fail_msg("this program run again with KVL_CPU_DECODE=portable failed (status %d)", rc);
}

/* Every case again on the AVX2 decode form, in a child process: on an AVX-512 CPU it is not the
 * default, and on one without AVX2 the child runs the portable forms again. */
static void test_avx2(void **st) {
    (void)st;
    if (getenv("KVL_CPU_DECODE")) skip();   /* this is the child */
    int rc = kvl__test_rerun_self_with("KVL_CPU_DECODE", "avx2");
    if (rc != 0) fail_msg("this program run again with KVL_CPU_DECODE=avx2 failed (status %d)", rc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_dims),
        cmocka_unit_test(test_generic_dims),
        cmocka_unit_test(test_large_scores),
        cmocka_unit_test(test_prefill),
        cmocka_unit_test(test_portable),
        cmocka_unit_test(test_avx2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
