/* tests/unit/test_golden.c: parity with Hugging Face transformers on the shipped models.
 *
 * golden.safetensors (models/<m>/, computed by transformers 5.17 in float32) holds, for three
 * prompts: ids, logits at every position (prompt0) or the last one, the per-layer cache (k after
 * k_norm and RoPE, v) as [Hkv, T, D], the pre-norm k/v as [T, Hkv*D], and greedy continuations.
 * The models with RoPE scaling (llama3-d: llama3, qwen2-yarn: yarn; transformers 5.23) add a
 * long prompt3 (6,000 / 3,000 tokens, where the scaling moves the logits): last_logits and
 * greedy32 are checked too.
 * Tolerance: max |err| <= 1e-4 * max |reference|. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/safetensors.h"
#include "testutil.h"

static const char *MODELS[] = {"qwen3-a", "qwen3-b", "qwen2-c", "llama3-d", "qwen2-yarn"};

typedef struct golden {
    kvl_model *model;
    kvl_safetensors *st;
} golden;

static float *tensor_f32(kvl_safetensors *st, const char *name, int64_t *n_out) {
    const kvl_st_tensor *t = kvl_safetensors_find(st, name);
    if (!t) fail_msg("golden tensor %s missing", name);
    float *buf = malloc(sizeof(float) * (size_t)t->n_elements);
    assert_non_null(buf);
    assert_int_equal(kvl_st_tensor_to_f32(t, buf, (size_t)t->n_elements), KVL_OK);
    if (n_out) *n_out = t->n_elements;
    return buf;
}

static int32_t *tensor_ids(kvl_safetensors *st, const char *name, int *n_out) {
    int64_t n;
    float *f = tensor_f32(st, name, &n);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    assert_non_null(ids);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)f[i];
    free(f);
    *n_out = (int)n;
    return ids;
}

/* max |a-b| <= tol * max |b| */
static void assert_close(const char *what, const float *a, const float *b, size_t n, double tol) {
    double maxerr = 0, maxref = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (e > maxerr) { maxerr = e; at = i; }
        if (fabs(b[i]) > maxref) maxref = fabs(b[i]);
    }
    print_message("%s: max |err| / max |ref| = %.2g\n", what, maxref > 0 ? maxerr / maxref : maxerr);
    if (!(maxerr <= tol * maxref))
        fail_msg("%s: max |err| %.3g at %zu (got %g want %g) > %.1g * max|ref| %.3g", what, maxerr, at,
                 a[at], b[at], tol, maxref);
}

static void load(golden *g, const char *name) {
    char dir[512], gpath[600];
    snprintf(dir, sizeof dir, "%s", kvl__test_path("models"));
    strncat(dir, "/", sizeof dir - strlen(dir) - 1);
    strncat(dir, name, sizeof dir - strlen(dir) - 1);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    kvl_status s = kvl_model_load(dir, NULL, &g->model);
    if (s != KVL_OK) fail_msg("load %s: %s", dir, kvl_last_error());
    s = kvl_safetensors_open(gpath, &g->st);
    if (s != KVL_OK) fail_msg("open %s: %s", gpath, kvl_last_error());
}

static void unload(golden *g) {
    kvl_safetensors_close(g->st);
    kvl_model_free(g->model);
}

static void check_prompt0(const char *name) {
    golden g;
    load(&g, name);
    const kvl_model_config *c = kvl_model_config_get(g.model);
    int T;
    int32_t *ids = tensor_ids(g.st, "prompt0.ids", &T);
    kvl_cache *cache;
    assert_int_equal(kvl_cache_create(c, NULL, &cache), KVL_OK);
    float *logits = malloc(sizeof(float) * (size_t)T * c->vocab_size);
    assert_non_null(logits);
    kvl_status s = kvl_model_prefill(g.model, cache, ids, T, KVL_LOGITS_ALL, logits);
    if (s != KVL_OK) fail_msg("prefill: %s", kvl_last_error());
    float *ref = tensor_f32(g.st, "prompt0.logits", NULL);
    char what[128];
    snprintf(what, sizeof what, "%s prompt0.logits", name);
    assert_close(what, logits, ref, (size_t)T * c->vocab_size, 1e-4);
    free(ref);

    size_t KD = (size_t)c->n_kv_heads * c->head_dim;
    float *k = malloc(sizeof(float) * T * KD), *v = malloc(sizeof(float) * T * KD);
    float *kt = malloc(sizeof(float) * T * KD);
    assert_true(k && v && kt);
    for (int l = 0; l < c->n_layers; l++) {
        char nm[128];
        assert_int_equal(kvl_cache_read_kv(cache, l, 0, T, k, v), KVL_OK);
        /* golden cache layout [Hkv, T, D] -> ours [T, Hkv, D] */
        for (int side = 0; side < 2; side++) {
            snprintf(nm, sizeof nm, "prompt0.layer%d.%s_cache", l, side ? "v" : "k");
            float *r = tensor_f32(g.st, nm, NULL);
            for (int h = 0; h < c->n_kv_heads; h++)
                for (int t = 0; t < T; t++)
                    memcpy(kt + ((size_t)t * c->n_kv_heads + h) * c->head_dim,
                           r + ((size_t)h * T + t) * c->head_dim, sizeof(float) * c->head_dim);
            snprintf(what, sizeof what, "%s %s", name, nm);
            assert_close(what, side ? v : k, kt, T * KD, 1e-4);
            free(r);
        }
        assert_int_equal(kvl_cache_read_prenorm(cache, l, 0, T, k, v), KVL_OK);
        snprintf(nm, sizeof nm, "prompt0.layer%d.k_prenorm", l);
        float *r = tensor_f32(g.st, nm, NULL);
        snprintf(what, sizeof what, "%s %s", name, nm);
        assert_close(what, k, r, T * KD, 1e-4);
        free(r);
        snprintf(nm, sizeof nm, "prompt0.layer%d.v_prenorm", l);
        r = tensor_f32(g.st, nm, NULL);
        snprintf(what, sizeof what, "%s %s", name, nm);
        assert_close(what, v, r, T * KD, 1e-4);
        free(r);
    }
    free(k); free(v); free(kt);
    free(logits);
    free(ids);
    kvl_cache_free(cache);
    unload(&g);
}

static void check_greedy(const char *name) {
    golden g;
    load(&g, name);
    const kvl_model_config *c = kvl_model_config_get(g.model);
    float *logits = malloc(sizeof(float) * c->vocab_size);
    assert_non_null(logits);
    int n_prompts = kvl_safetensors_find(g.st, "prompt3.ids") ? 4 : 3;
    for (int p = 0; p < n_prompts; p++) {
        char nm[64];
        int T, n_ref;
        snprintf(nm, sizeof nm, "prompt%d.ids", p);
        int32_t *ids = tensor_ids(g.st, nm, &T);
        snprintf(nm, sizeof nm, "prompt%d.greedy32", p);
        int32_t *ref = tensor_ids(g.st, nm, &n_ref);
        kvl_cache *cache;
        assert_int_equal(kvl_cache_create(c, NULL, &cache), KVL_OK);
        assert_int_equal(kvl_model_prefill(g.model, cache, ids, T, KVL_LOGITS_LAST, logits), KVL_OK);
        if (p > 0) {
            snprintf(nm, sizeof nm, "prompt%d.last_logits", p);
            float *r = tensor_f32(g.st, nm, NULL);
            char what[128];
            snprintf(what, sizeof what, "%s %s", name, nm);
            assert_close(what, logits, r, c->vocab_size, 1e-4);
            free(r);
        }
        int n = 0;
        int32_t out[32];
        while (n < 32) {
            int best = 0;
            for (int i = 1; i < c->vocab_size; i++) if (logits[i] > logits[best]) best = i;
            out[n++] = best;
            if (kvl_model_is_eos(g.model, best)) break;
            assert_int_equal(kvl_model_decode(g.model, cache, best, logits), KVL_OK);
        }
        if (n != n_ref) fail_msg("%s prompt%d: greedy gave %d tokens, reference %d", name, p, n, n_ref);
        for (int i = 0; i < n; i++)
            if (out[i] != ref[i]) fail_msg("%s prompt%d: greedy token %d is %d, reference %d", name, p, i, out[i], ref[i]);
        kvl_cache_free(cache);
        free(ids);
        free(ref);
    }
    free(logits);
    unload(&g);
}

static void test_prompt0_qwen3_a(void **st) { (void)st; check_prompt0(MODELS[0]); }
static void test_prompt0_qwen3_b(void **st) { (void)st; check_prompt0(MODELS[1]); }
static void test_prompt0_qwen2_c(void **st) { (void)st; check_prompt0(MODELS[2]); }
static void test_greedy_qwen3_a(void **st) { (void)st; check_greedy(MODELS[0]); }
static void test_greedy_qwen3_b(void **st) { (void)st; check_greedy(MODELS[1]); }
static void test_greedy_qwen2_c(void **st) { (void)st; check_greedy(MODELS[2]); }
static void test_prompt0_llama3_d(void **st) { (void)st; check_prompt0(MODELS[3]); }
static void test_prompt0_qwen2_yarn(void **st) { (void)st; check_prompt0(MODELS[4]); }
static void test_greedy_llama3_d(void **st) { (void)st; check_greedy(MODELS[3]); }
static void test_greedy_qwen2_yarn(void **st) { (void)st; check_greedy(MODELS[4]); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt0_qwen3_a), cmocka_unit_test(test_prompt0_qwen3_b),
        cmocka_unit_test(test_prompt0_qwen2_c), cmocka_unit_test(test_greedy_qwen3_a),
        cmocka_unit_test(test_greedy_qwen3_b),  cmocka_unit_test(test_greedy_qwen2_c),
        cmocka_unit_test(test_prompt0_llama3_d), cmocka_unit_test(test_prompt0_qwen2_yarn),
        cmocka_unit_test(test_greedy_llama3_d),  cmocka_unit_test(test_greedy_qwen2_yarn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
