/* tests/unit/test_model.c: model loading errors, cache behaviour, batched forward equivalence,
 * the bf16 KV cache, sampling. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <unistd.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/sampling.h"
#include "testutil.h"

static void expect_load_error(const char *dir, kvl_status want, const char *n1, const char *n2) {
    kvl_model *m = NULL;
    kvl_status s = kvl_model_load(dir, NULL, &m);
    if (s != want) fail_msg("load %s: status %d (%s), want %d", dir, s, kvl_last_error(), want);
    assert_null(m);
    if (n1 && !strstr(kvl_last_error(), n1)) fail_msg("message '%s' lacks '%s'", kvl_last_error(), n1);
    if (n2 && !strstr(kvl_last_error(), n2)) fail_msg("message '%s' lacks '%s'", kvl_last_error(), n2);
}

static void test_load_errors(void **st) {
    (void)st;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", kvl__test_tmpdir());
    /* missing tensor */
    assert_int_equal(kvl__test_write_tiny_model(dir, "Qwen3ForCausalLM", 64, 32, 2, 4, 2, 8, 48, 1e4, 1,
                                               "model.layers.1.self_attn.k_norm.weight", NULL), 0);
    expect_load_error(dir, KVL_ERR_NOT_FOUND, "model.layers.1.self_attn.k_norm.weight", "missing");
    /* wrong shape */
    assert_int_equal(kvl__test_write_tiny_model(dir, "Qwen2ForCausalLM", 64, 32, 2, 4, 2, 8, 48, 1e4, 1,
                                               NULL, "model.layers.0.mlp.up_proj.weight"), 0);
    expect_load_error(dir, KVL_ERR_MISMATCH, "model.layers.0.mlp.up_proj.weight", "[49, 32]");
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    /* a NaN weight: the last float of the file is model.norm.weight's last element (written
     * last); named at load, not as NaN logits at the first turn */
    assert_int_equal(kvl__test_write_tiny_model(dir, "Qwen3ForCausalLM", 64, 32, 2, 4, 2, 8, 48, 1e4, 1,
                                               NULL, NULL), 0);
    {
        size_t len = 0;
        char *bytes = kvl__test_read_file(p, &len);
        assert_non_null(bytes);
        const float nan = NAN;
        memcpy(bytes + len - sizeof nan, &nan, sizeof nan);
        assert_int_equal(kvl__test_write_file(p, bytes, len), 0);
        free(bytes);
    }
    expect_load_error(dir, KVL_ERR_NUMERIC, "model.norm.weight", "element 31 is NaN");
    /* no weights at all */
    remove(p);
    expect_load_error(dir, KVL_ERR_NOT_FOUND, dir, NULL);
    /* no config */
    snprintf(p, sizeof p, "%s/config.json", dir);
    remove(p);
    expect_load_error(dir, KVL_ERR_IO, "config.json", NULL);
    /* bad JSON */
    assert_int_equal(kvl__test_write_file(p, "{\"architectures\": [", 19), 0);
    expect_load_error(dir, KVL_ERR_FORMAT, "config.json", "JSON");
    remove(p);
    rmdir(dir);
}

/* Prefill of n tokens == prefill of n-k then k decodes == batched decode next to another session. */
static void test_incremental_and_batched(void **st) {
    (void)st;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", kvl__test_tmpdir());
    const char *archs[] = {"Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"};
    for (int a = 0; a < 3; a++) {
        assert_int_equal(kvl__test_write_tiny_model(dir, archs[a], 64, 32, 2, 4, 2, 8, 48, 1e4, 7 + a, NULL, NULL), 0);
        kvl_model *m;
        assert_int_equal(kvl_model_load(dir, NULL, &m), KVL_OK);
        const kvl_model_config *c = kvl_model_config_get(m);
        int32_t toks[40];
        for (int i = 0; i < 40; i++) toks[i] = (i * 37 + 5) % 63;
        kvl_cache_params cp = kvl_cache_default_params();
        cp.max_tokens = 64;
        cp.block_tokens = 8;   /* spans cross block boundaries */
        kvl_cache *c1, *c2, *c3;
        assert_int_equal(kvl_cache_create(c, &cp, &c1), KVL_OK);
        assert_int_equal(kvl_cache_create(c, &cp, &c2), KVL_OK);
        assert_int_equal(kvl_cache_create(c, &cp, &c3), KVL_OK);
        float *full = malloc(sizeof(float) * 40 * 64), *inc = malloc(sizeof(float) * 64), *b2 = malloc(sizeof(float) * 2 * 64);
        assert_int_equal(kvl_model_prefill(m, c1, toks, 40, KVL_LOGITS_ALL, full), KVL_OK);
        assert_int_equal(kvl_model_prefill(m, c2, toks, 33, KVL_LOGITS_NONE, NULL), KVL_OK);
        assert_int_equal(kvl_model_prefill(m, c3, toks, 20, KVL_LOGITS_NONE, NULL), KVL_OK);
        for (int t = 33; t < 40; t++) {
            /* c2 decodes token t while c3 (a different session) decodes in the same batch */
            kvl_batch_seq b[2] = {
                {.cache = c2, .tokens = &toks[t], .n_tokens = 1, .logits_mode = KVL_LOGITS_LAST, .logits = inc},
                {.cache = c3, .tokens = &toks[t - 13], .n_tokens = 1, .logits_mode = KVL_LOGITS_LAST, .logits = b2},
            };
            assert_int_equal(kvl_model_forward(m, b, 2), KVL_OK);
            for (int v = 0; v < 64; v++) assert_float_equal(inc[v], full[t * 64 + v], 2e-4);
        }
        /* prenorm readback matches between the two paths */
        float k1[40 * 16], k2[40 * 16];
        assert_int_equal(kvl_cache_read_prenorm(c1, 1, 0, 40, k1, NULL), KVL_OK);
        assert_int_equal(kvl_cache_read_prenorm(c2, 1, 0, 40, k2, NULL), KVL_OK);
        for (int i = 0; i < 40 * 16; i++) assert_float_equal(k1[i], k2[i], 1e-4);
        /* truncate and recompute */
        assert_int_equal(kvl_cache_truncate(c1, 10), KVL_OK);
        assert_int_equal(kvl_cache_n_tokens(c1), 10);
        assert_int_equal(kvl_model_prefill(m, c1, toks + 10, 30, KVL_LOGITS_LAST, inc), KVL_OK);
        for (int v = 0; v < 64; v++) assert_float_equal(inc[v], full[39 * 64 + v], 2e-4);
        /* errors: capacity, bad id, same cache twice; the cache is unchanged after each */
        int32_t big[30] = {0};
        assert_int_equal(kvl_model_prefill(m, c1, big, 30, KVL_LOGITS_NONE, NULL), KVL_ERR_RANGE);
        assert_int_equal(kvl_cache_n_tokens(c1), 40);
        int32_t bad = 64;
        assert_int_equal(kvl_model_decode(m, c3, bad, inc), KVL_ERR_INVALID_ARG);
        assert_non_null(strstr(kvl_last_error(), "vocabulary"));
        kvl_batch_seq twice[2] = {{.cache = c3, .tokens = toks, .n_tokens = 1},
                                  {.cache = c3, .tokens = toks, .n_tokens = 1}};
        assert_int_equal(kvl_model_forward(m, twice, 2), KVL_ERR_INVALID_ARG);
        assert_int_equal(kvl_cache_n_tokens(c3), 27);
        assert_int_equal(kvl_cache_truncate(c3, 28), KVL_ERR_RANGE);
        free(full); free(inc); free(b2);
        kvl_cache_free(c1); kvl_cache_free(c2); kvl_cache_free(c3);
        kvl_model_free(m);
    }
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir); remove(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir); remove(p);
    rmdir(dir);
}

/* A bf16 KV cache (kvl_model_params.kv_dtype): half the bytes of a float32 one; logits within
 * bf16 rounding of the float32 cache's after a prefill that crosses blocks, decode steps
 * alone and batched, and a re-read of the cache; the pre-norm K/V read back equal the float32
 * cache's rounded to bf16; the CUDA device refuses it (on a machine with a GPU: here the load
 * stops earlier, at the device check).  Shipped models (head_dim 64: the
 * vectorised prefill and decode) and llama3-d (head_dim 20: the gather and portable forms). */
/* A prefill chunk's last rows that fill at most 4 of a tile's 16 query vectors attend by the
 * decode kernel (kernels/cpu/backend_cpu.c): a switch's 9-token turn at group 2 (a tile of 8
 * rows, then 1), 10 tokens (8, then 2), 2 tokens (both rows), on qwen3-b (head_dim 64, group 2:
 * the AVX-512 kernels where the CPU has them), over float32 and bf16 caches; each row's
 * logits equal those of the same positions in one whole prefill. */
static void test_chunk_tail_rows(void **st) {
    (void)st;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/qwen3-b", KVL_SOURCE_DIR);
    for (int kv = 0; kv < 2; kv++) {
        kvl_model_params mp = kvl_model_default_params();
        mp.weights_dtype = KVL_WEIGHTS_F32;
        mp.kv_dtype = kv ? KVL_KV_BF16 : KVL_KV_F32;
        kvl_model *m;
        assert_int_equal(kvl_model_load(dir, &mp, &m), KVL_OK);
        const int V = kvl_model_config_get(m)->vocab_size, N = 150;
        int32_t toks[150];
        for (int i = 0; i < N; i++) toks[i] = (i * 131 + 17) % V;
        kvl_cache_params cp = kvl_cache_default_params();
        cp.max_tokens = 160;
        kvl_cache *whole, *part;
        assert_int_equal(kvl_model_cache_create(m, &cp, &whole), KVL_OK);
        assert_int_equal(kvl_model_cache_create(m, &cp, &part), KVL_OK);
        float *full = malloc(sizeof(float) * (size_t)N * V), *rows = malloc(sizeof(float) * 10 * (size_t)V);
        assert_non_null(full);
        assert_non_null(rows);
        assert_int_equal(kvl_model_prefill(m, whole, toks, N, KVL_LOGITS_ALL, full), KVL_OK);
        const int chunks[][2] = {{131, 9}, {140, 10}, {41, 2}};   /* {context before, chunk} */
        for (int c = 0; c < 3; c++) {
            const int p0 = chunks[c][0], n = chunks[c][1];
            assert_int_equal(kvl_cache_truncate(part, 0), KVL_OK);
            assert_int_equal(kvl_model_prefill(m, part, toks, p0, KVL_LOGITS_NONE, NULL), KVL_OK);
            assert_int_equal(kvl_model_prefill(m, part, toks + p0, n, KVL_LOGITS_ALL, rows), KVL_OK);
            for (int i = 0; i < n; i++) {
                double err = 0, mag = 0;
                for (int v = 0; v < V; v++) {
                    const double e = fabs((double)rows[(size_t)i * V + v] - full[(size_t)(p0 + i) * V + v]);
                    if (!(e <= err)) err = e;
                    if (fabs(full[(size_t)(p0 + i) * V + v]) > mag) mag = fabs(full[(size_t)(p0 + i) * V + v]);
                }
                if (!(err <= 1e-4 * (mag > 1 ? mag : 1)))
                    fail_msg("kv %s: chunk of %d after %d, row %d: logits differ by %g from one prefill (max |logit| %g)",
                             kv ? "bf16" : "f32", n, p0, i, err, mag);
            }
        }
        free(full);
        free(rows);
        kvl_cache_free(whole);
        kvl_cache_free(part);
        kvl_model_free(m);
    }
}

/* block_tokens at the edges: one block as large as the cache takes, a block count that wrapped
 * past INT_MAX is refused (it made a cache with no block table that a prefill wrote through), and
 * a block boundary at the span's end (block_tokens 5, prefill 5 then 5) gives one prefill's logits. */
static void test_block_tokens_edges(void **st) {
    (void)st;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/qwen3-a", KVL_SOURCE_DIR);
    kvl_model *m;
    assert_int_equal(kvl_model_load(dir, NULL, &m), KVL_OK);
    const int V = kvl_model_config_get(m)->vocab_size;
    int32_t toks[10];
    for (int i = 0; i < 10; i++) toks[i] = (i * 37 + 3) % V;
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = 10;
    kvl_cache *c = NULL;
    cp.block_tokens = 2147483647;
    assert_int_equal(kvl_model_cache_create(m, &cp, &c), KVL_ERR_INVALID_ARG);
    cp.block_tokens = 65537;
    assert_int_equal(kvl_model_cache_create(m, &cp, &c), KVL_ERR_INVALID_ARG);
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    assert_true(a && b);
    cp.max_tokens = 10;
    const int sizes[] = {65536, 5, 1};
    for (int k = 0; k < 3; k++) {
        cp.block_tokens = sizes[k];
        assert_int_equal(kvl_model_cache_create(m, &cp, &c), KVL_OK);
        assert_int_equal(kvl_model_prefill(m, c, toks, 5, KVL_LOGITS_NONE, NULL), KVL_OK);
        assert_int_equal(kvl_model_prefill(m, c, toks + 5, 5, KVL_LOGITS_LAST, a), KVL_OK);
        assert_int_equal(kvl_cache_n_tokens(c), 10);
        assert_int_equal(kvl_model_decode(m, c, toks[0], NULL), KVL_ERR_RANGE);   /* at capacity */
        assert_int_equal(kvl_cache_truncate(c, 0), KVL_OK);
        assert_int_equal(kvl_model_prefill(m, c, toks, 10, KVL_LOGITS_LAST, b), KVL_OK);
        for (int v = 0; v < V; v++)
            if (!(fabsf(a[v] - b[v]) <= 1e-4f * (fabsf(b[v]) > 1 ? fabsf(b[v]) : 1)))
                fail_msg("block_tokens %d: logit %d: %g after 5+5, %g after 10", sizes[k], v, a[v], b[v]);
        kvl_cache_free(c);
    }
    free(a);
    free(b);
    kvl_model_free(m);
}

static void test_kv_bf16(void **st) {
    (void)st;
    const char *names[] = {"qwen3-b", "qwen2-c", "llama3-d"};
    for (int mi = 0; mi < 3; mi++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/models/%s", KVL_SOURCE_DIR, names[mi]);
        kvl_model_params p32 = kvl_model_default_params(), p16 = p32;
        p32.weights_dtype = p16.weights_dtype = KVL_WEIGHTS_F32;
        p16.kv_dtype = KVL_KV_BF16;
        kvl_model *m32, *m16;
        assert_int_equal(kvl_model_load(dir, &p32, &m32), KVL_OK);
        assert_int_equal(kvl_model_load(dir, &p16, &m16), KVL_OK);
        assert_int_equal(kvl_model_kv_dtype(m16), KVL_KV_BF16);
        const kvl_model_config *c = kvl_model_config_get(m32);
        const int V = c->vocab_size, KD = c->n_kv_heads * c->head_dim, N = 70;
        int32_t toks[80];
        for (int i = 0; i < 80; i++) toks[i] = (i * 131 + 17) % V;
        kvl_cache_params cp = kvl_cache_default_params();
        cp.max_tokens = 128;
        kvl_cache *a, *b, *b2;
        assert_int_equal(kvl_model_cache_create(m32, &cp, &a), KVL_OK);
        assert_int_equal(kvl_model_cache_create(m16, &cp, &b), KVL_OK);
        assert_int_equal(kvl_model_cache_create(m16, &cp, &b2), KVL_OK);
        float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
        float *lb2 = malloc(sizeof(float) * V);
        float *ka = malloc(sizeof(float) * N * KD), *kb = malloc(sizeof(float) * N * KD);
        assert_non_null(la); assert_non_null(lb); assert_non_null(lb2);
        assert_non_null(ka); assert_non_null(kb);
        assert_int_equal(kvl_model_prefill(m32, a, toks, N, KVL_LOGITS_LAST, la), KVL_OK);
        assert_int_equal(kvl_model_prefill(m16, b, toks, N, KVL_LOGITS_LAST, lb), KVL_OK);
        assert_int_equal(kvl_model_prefill(m16, b2, toks, 40, KVL_LOGITS_NONE, NULL), KVL_OK);
        assert_true(kvl_cache_bytes(b) * 2 == kvl_cache_bytes(a));
        for (int step = 0; step <= 6; step++) {
            double max_d = 0, scale = 0;
            for (int v = 0; v < V; v++) {
                max_d = fmax(max_d, fabs((double)la[v] - lb[v]));
                scale = fmax(scale, fabs((double)la[v]));
            }
            /* bf16 keeps 8 significant bits: K/V rounded by <= 2^-9 relative */
            if (!(max_d <= 0.02 * (scale > 1 ? scale : 1)))
                fail_msg("%s step %d: logits differ by %g (largest %g)", names[mi], step, max_d, scale);
            if (step == 6) break;
            const int32_t t = toks[N + step];
            assert_int_equal(kvl_model_decode(m32, a, t, la), KVL_OK);
            /* b decodes next to b2 (another session, mid-prefill) in one batch */
            kvl_batch_seq bs[2] = {
                {.cache = b, .tokens = &toks[N + step], .n_tokens = 1, .logits_mode = KVL_LOGITS_LAST, .logits = lb},
                {.cache = b2, .tokens = &toks[40 + 5 * step], .n_tokens = 5, .logits_mode = KVL_LOGITS_LAST, .logits = lb2},
            };
            assert_int_equal(kvl_model_forward(m16, bs, 2), KVL_OK);
        }
        /* pre-norm K/V read back: the float32 cache's values rounded to bf16 (the same forward
         * up to the attention's rounding, which moves later layers: compare layer 0) */
        assert_int_equal(kvl_cache_read_prenorm(a, 0, 0, N, ka, NULL), KVL_OK);
        assert_int_equal(kvl_cache_read_prenorm(b, 0, 0, N, kb, NULL), KVL_OK);
        for (int t = 0; t < N; t++) {
            /* without k_norm the pre-norm key is the cached key rotated back: RoPE mixes each
             * pair of dims, so the rounding is relative to the row's scale, not the element's */
            double rmax = 0;
            for (int i = 0; i < KD; i++) rmax = fmax(rmax, fabs((double)ka[t * KD + i]));
            for (int i = t * KD; i < (t + 1) * KD; i++)
                if (!(fabs((double)kb[i] - ka[i]) <= 1e-5 + rmax * (1.0 / 128)))
                    fail_msg("%s: pre-norm key %d read back as %g from bf16, %g from float32",
                             names[mi], i, kb[i], ka[i]);
        }
        free(la); free(lb); free(lb2); free(ka); free(kb);
        kvl_cache_free(a); kvl_cache_free(b); kvl_cache_free(b2);
        kvl_model_free(m32);
        kvl_model_free(m16);
    }
    /* a bf16 KV cache on the CUDA device is refused up front, with a message naming it */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/qwen3-b", KVL_SOURCE_DIR);
    kvl_model_params pc = kvl_model_default_params();
    pc.device = KVL_DEVICE_CUDA;
    pc.kv_dtype = KVL_KV_BF16;
    kvl_model *mc = NULL;
    kvl_status s = kvl_model_load(dir, &pc, &mc);
    assert_int_not_equal(s, KVL_OK);   /* here: no GPU, or the bf16 cache refused */
    assert_null(mc);
    if (s == KVL_ERR_UNSUPPORTED && strstr(kvl_last_error(), "kv dtype"))
        assert_non_null(strstr(kvl_last_error(), "bf16"));
    kvl_kv_dtype d;
    assert_int_equal(kvl_kv_dtype_parse("f16", &d), KVL_ERR_INVALID_ARG);
    assert_non_null(strstr(kvl_last_error(), "f16"));
}

/* kvl_cache_read_prenorm_bf16: every layer's pre-norm K/V at once, equal bit for bit to the
 * float32 read of each layer rounded to nearest even, for a model with k_norm (the Kpre plane)
 * and two without (keys rotated back), float32 and bf16 caches, on a 2-thread model's pool and
 * on a cache made from the geometry alone, over ranges across chunks and blocks; bad
 * arguments are refused. */
static void test_prenorm_bf16(void **st) {
    (void)st;
    const char *names[] = {"qwen3-b", "qwen2-c", "llama3-d"};
    for (int mi = 0; mi < 3; mi++)
        for (int form = 0; form < 3; form++) {   /* model f32, model bf16, geometry only (f32) */
            char dir[4096];
            snprintf(dir, sizeof dir, "%s/models/%s", KVL_SOURCE_DIR, names[mi]);
            kvl_model_params mp = kvl_model_default_params();
            mp.n_threads = 2;
            mp.kv_dtype = form == 1 ? KVL_KV_BF16 : KVL_KV_F32;
            kvl_model *m;
            assert_int_equal(kvl_model_load(dir, &mp, &m), KVL_OK);
            const kvl_model_config *c = kvl_model_config_get(m);
            const int N = 300, L = c->n_layers, KD = c->n_kv_heads * c->head_dim;
            kvl_cache_params cp = kvl_cache_default_params();
            cp.max_tokens = 320;
            kvl_cache *kc;
            if (form == 2) assert_int_equal(kvl_cache_create(c, &cp, &kc), KVL_OK);
            else assert_int_equal(kvl_model_cache_create(m, &cp, &kc), KVL_OK);
            int32_t toks[300];
            for (int i = 0; i < N; i++) toks[i] = (i * 131 + 17) % c->vocab_size;
            assert_int_equal(kvl_model_prefill(m, kc, toks, N, KVL_LOGITS_NONE, NULL), KVL_OK);
            const int ranges[3][2] = {{0, 300}, {37, 251}, {299, 300}};
            uint16_t *k16 = malloc(sizeof(uint16_t) * L * N * KD), *v16 = malloc(sizeof(uint16_t) * L * N * KD);
            float *k = malloc(sizeof(float) * N * KD), *v = malloc(sizeof(float) * N * KD);
            assert_non_null(k16); assert_non_null(v16); assert_non_null(k); assert_non_null(v);
            for (int r = 0; r < 3; r++) {
                const int t0 = ranges[r][0], t1 = ranges[r][1], n = t1 - t0;
                assert_int_equal(kvl_cache_read_prenorm_bf16(kc, t0, t1, k16, v16), KVL_OK);
                for (int l = 0; l < L; l++) {
                    assert_int_equal(kvl_cache_read_prenorm(kc, l, t0, t1, k, v), KVL_OK);
                    for (int i = 0; i < n * KD; i++) {
                        const size_t at = (size_t)l * n * KD + i;
                        if (k16[at] != kvl_f32_to_bf16(k[i]) || v16[at] != kvl_f32_to_bf16(v[i]))
                            fail_msg("%s form %d [%d, %d) layer %d element %d: %04x %04x, want %04x %04x",
                                     names[mi], form, t0, t1, l, i, k16[at], v16[at], kvl_f32_to_bf16(k[i]),
                                     kvl_f32_to_bf16(v[i]));
                    }
                }
            }
            assert_int_equal(kvl_cache_read_prenorm_bf16(kc, 5, 5, NULL, NULL), KVL_OK);
            assert_int_equal(kvl_cache_read_prenorm_bf16(kc, 0, N, k16, NULL), KVL_ERR_INVALID_ARG);
            assert_int_equal(kvl_cache_read_prenorm_bf16(kc, 0, N + 1, k16, v16), KVL_ERR_RANGE);
            assert_int_equal(kvl_cache_read_prenorm_bf16(kc, 10, 9, k16, v16), KVL_ERR_RANGE);
            free(k16); free(v16); free(k); free(v);
            kvl_cache_free(kc);
            kvl_model_free(m);
        }
}

static void test_sampling(void **st) {
    (void)st;
    float logits[6] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.9f};
    kvl_sampler *s;
    kvl_sampler_params p = kvl_sampler_default_params();
    assert_int_equal(kvl_sampler_create(&p, &s), KVL_OK);
    int32_t tok;
    float lp;
    assert_int_equal(kvl_sampler_sample(s, logits, 6, &tok, &lp), KVL_OK);
    assert_int_equal(tok, 1);   /* first of the tied maxima, as torch.argmax */
    assert_true(lp < 0 && lp > -2);
    kvl_sampler_free(s);
    /* top-k 2 only ever returns 1 or 2; same seed -> same stream */
    p.temperature = 1.0f; p.top_k = 2; p.seed = 42;
    kvl_sampler *s1, *s2;
    assert_int_equal(kvl_sampler_create(&p, &s1), KVL_OK);
    assert_int_equal(kvl_sampler_create(&p, &s2), KVL_OK);
    int count[6] = {0};
    for (int i = 0; i < 400; i++) {
        int32_t a, b;
        assert_int_equal(kvl_sampler_sample(s1, logits, 6, &a, NULL), KVL_OK);
        assert_int_equal(kvl_sampler_sample(s2, logits, 6, &b, NULL), KVL_OK);
        assert_int_equal(a, b);
        count[a]++;
    }
    assert_int_equal(count[1] + count[2], 400);
    assert_true(count[1] > 120 && count[2] > 120);
    kvl_sampler_free(s1); kvl_sampler_free(s2);
    /* top-p 0.5: the smallest set reaching 0.5 is {1, 2} */
    p.top_k = 0; p.top_p = 0.5f;
    assert_int_equal(kvl_sampler_create(&p, &s), KVL_OK);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(kvl_sampler_sample(s, logits, 6, &tok, NULL), KVL_OK);
        assert_true(tok == 1 || tok == 2);
    }
    logits[4] = NAN;
    assert_int_equal(kvl_sampler_sample(s, logits, 6, &tok, NULL), KVL_ERR_NUMERIC);
    kvl_sampler_free(s);
    p.top_p = 1.5f;
    assert_int_equal(kvl_sampler_create(&p, &s), KVL_ERR_INVALID_ARG);
    p.top_p = 1.0f; p.temperature = -1;
    assert_int_equal(kvl_sampler_create(&p, &s), KVL_ERR_INVALID_ARG);
}

/* kvl_logprob and kvl_log_softmax (float lanes, double sums) against log-softmax in double, on
 * vocabularies that end inside and on a 16-lane step and span several 1024-term blocks, with
 * logits far apart (terms that underflow), all equal, and one -inf. */
static void test_logprob(void **st) {
    (void)st;
    const int vocabs[] = {1, 7, 16, 17, 1024, 1025, 4096, 151936};
    uint64_t r = 99;
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        const int n = vocabs[v];
        float *lg = malloc(sizeof(float) * (size_t)n);
        assert_non_null(lg);
        for (int mode = 0; mode < 3; mode++) {
            for (int i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                const float u = (float)((r >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
                lg[i] = mode == 0 ? u * 8.0f : mode == 1 ? 3.25f : u * 120.0f;
            }
            if (n > 3) lg[n / 3] = -INFINITY;
            double m = -INFINITY, sum = 0;
            for (int i = 0; i < n; i++) m = lg[i] > m ? lg[i] : m;
            for (int i = 0; i < n; i++) sum += exp((double)lg[i] - m);
            for (int id = 0; id < n; id += n / 5 + 1) {
                if (isinf(lg[id])) continue;
                const double want = (double)lg[id] - m - log(sum), got = kvl_logprob(lg, n, id);
                if (!(fabs(got - want) <= 1e-5 + 1e-6 * fabs(want)))
                    fail_msg("vocab %d mode %d id %d: %.9g, log-softmax in double %.9g", n, mode, id, got, want);
            }
            /* the whole log-softmax in place: every entry, and the same sums as kvl_logprob */
            float *ls = malloc(sizeof(float) * (size_t)n);
            assert_non_null(ls);
            memcpy(ls, lg, sizeof(float) * (size_t)n);
            kvl_log_softmax(ls, n);
            for (int i = 0; i < n; i++) {
                if (isinf(lg[i])) {
                    if (!(isinf(ls[i]) && ls[i] < 0)) fail_msg("vocab %d: a -inf logit gave %g", n, (double)ls[i]);
                    continue;
                }
                const double want = (double)lg[i] - m - log(sum);
                if (!(fabs((double)ls[i] - want) <= 1e-5 + 1e-6 * fabs(want)))
                    fail_msg("vocab %d mode %d: log_softmax[%d] %.9g, in double %.9g", n, mode, i,
                             (double)ls[i], want);
                if (ls[i] != (float)kvl_logprob(lg, n, i))
                    fail_msg("vocab %d mode %d: log_softmax[%d] %.9g, kvl_logprob %.9g", n, mode, i,
                             (double)ls[i], kvl_logprob(lg, n, i));
                if (n > 5000) i += 997;   /* the large vocabulary: a sample of its entries */
            }
            free(ls);
            /* an id outside the vocabulary reads nothing past logits: NaN */
            if (!isnan(kvl_logprob(lg, n, n)) || !isnan(kvl_logprob(lg, n, -1)) ||
                !isnan(kvl_logprob(lg, n, INT32_MAX)))
                fail_msg("vocab %d: an id outside [0, %d) gave a number", n, n);
        }
        free(lg);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_incremental_and_batched),
        cmocka_unit_test(test_chunk_tail_rows),
        cmocka_unit_test(test_block_tokens_edges),
        cmocka_unit_test(test_kv_bf16),
        cmocka_unit_test(test_prenorm_bf16),
        cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_logprob),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
