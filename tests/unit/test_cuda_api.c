/* tests/unit/test_cuda_api.c: the CUDA backend's contract that holds on any machine: clean
 * errors without a GPU (or without a CUDA build), the published shapes, random models, and the
 * host reference of the translation (kvlingo/kv_maps.h) checked by identity maps: translating
 * a model's own span with W = I and s(l) = l must reproduce its cache (keys through k_norm and
 * RoPE, values, pre-norm keys).  GPU parity lives in test_cuda_parity.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvlingo/cache.h"
#include "kvlingo/cuda.h"
#include "kvlingo/kv_maps.h"
#include "kvlingo/model.h"
#include "kvlingo/shapes.h"
#include "testutil.h"

static int g_fail = 0;
#define CHECK(cond, ...) do { if (!(cond)) { g_fail++; printf("FAIL %s:%d: ", __FILE__, __LINE__); \
    printf(__VA_ARGS__); printf("\n"); } } while (0)

static double max_rel_err(const float *a, const float *b, size_t n) {
    double me = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (e > me || e != e) me = e;
        if (fabs(b[i]) > mr) mr = fabs(b[i]);
    }
    return mr > 0 ? me / mr : me;
}

static void test_no_device(void) {
    int n = -1;
    kvl_status s = kvl_cuda_probe(&n);
    printf("cuda built: %d, probe: %s (%s), devices %d\n", kvl_cuda_built(), kvl_strerror(s), kvl_last_error(), n);
    if (!kvl_cuda_built()) CHECK(s == KVL_ERR_UNSUPPORTED, "stub probe gave %d", s);
    if (s == KVL_OK) return;   /* a GPU is here: test_cuda_parity covers it */
    CHECK(s == KVL_ERR_UNSUPPORTED || s == KVL_ERR_DEVICE, "probe status %d", s);
    CHECK(n == 0, "devices %d", n);
    CHECK(strlen(kvl_last_error()) > 0, "probe gave no message");
    kvl_model_params mp = kvl_model_default_params();
    CHECK(mp.device == KVL_DEVICE_CPU, "default device is not cpu");
    mp.device = KVL_DEVICE_CUDA;
    kvl_model *m = (kvl_model *)1;
    kvl_status ls = kvl_model_load(kvl__test_path("models/qwen3-a"), &mp, &m);
    CHECK(ls == s && m == NULL, "load --device cuda gave %d (probe %d)", ls, s);
    CHECK(strstr(kvl_last_error(), "cuda") != NULL, "message '%s' does not name cuda", kvl_last_error());
    mp.device = KVL_DEVICE_CPU;
    CHECK(kvl_model_load(kvl__test_path("models/qwen3-a"), &mp, &m) == KVL_OK, "cpu load failed");
    kvl_cuda_model *cm = (kvl_cuda_model *)1;
    kvl_status cs = kvl_cuda_model_create(kvl_model_weights(m), NULL, &cm);
    CHECK(cs == KVL_ERR_UNSUPPORTED || cs == KVL_ERR_DEVICE, "cuda model create gave %d", cs);
    CHECK(cm == NULL, "out not cleared");
    kvl_model_config cfg;
    kvl_shape_config("tiny", &cfg);
    cs = kvl_cuda_model_create_random(&cfg, 1, NULL, &cm);
    CHECK(cs == KVL_ERR_UNSUPPORTED || cs == KVL_ERR_DEVICE, "random cuda model gave %d", cs);
    double gbps = -1;
    CHECK(kvl_cuda_copy_bandwidth(1 << 20, 1, &gbps) != KVL_OK, "copy bandwidth without a GPU");
    kvl_cuda_model_free(NULL);
    kvl_cuda_cache_free(NULL);
    kvl_cuda_translator_free(NULL);
    kvl_model_free(m);
}

/* Geometry is checked before the device is probed, so these hold on any machine: a config
 * whose RoPE was left unset would otherwise upload an uninitialised frequency table. */
static void test_bad_geometry(void) {
    if (!kvl_cuda_built()) return;   /* the stub answers UNSUPPORTED to everything */
    kvl_model_config cfg;
    kvl_shape_config("tiny", &cfg);
    kvl_cuda_model *cm = (kvl_cuda_model *)1;
    cfg.rope.dim = 0;
    kvl_status s = kvl_cuda_model_create_random(&cfg, 1, NULL, &cm);
    CHECK(s == KVL_ERR_INVALID_ARG && cm == NULL, "rope dim 0 gave %d: %s", s, kvl_last_error());
    CHECK(strstr(kvl_last_error(), "RoPE dim") != NULL, "message '%s'", kvl_last_error());
    cfg.rope.dim = 2 * cfg.head_dim;
    CHECK(kvl_cuda_model_create_random(&cfg, 1, NULL, &cm) == KVL_ERR_INVALID_ARG, "rope dim 2D accepted");
    kvl_shape_config("tiny", &cfg);
    cfg.head_dim = 20;
    cfg.rope.dim = 20;
    CHECK(kvl_cuda_model_create_random(&cfg, 1, NULL, &cm) == KVL_ERR_UNSUPPORTED, "head_dim 20 accepted");
    kvl_shape_config("tiny", &cfg);
    cfg.n_heads = 18;
    cfg.n_kv_heads = 2;   /* GQA group 9 */
    CHECK(kvl_cuda_model_create_random(&cfg, 1, NULL, &cm) == KVL_ERR_UNSUPPORTED, "GQA group 9 accepted");
}

static void test_shapes(void) {
    static const struct { const char *name; double params; } want[] = {
        {"qwen2.5-0.5b", 494.0e6}, {"qwen2.5-1.5b", 1543.7e6}, {"qwen3-4b", 4022.5e6}, {"qwen3-8b", 8190.7e6},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kvl_model_config c;
        CHECK(kvl_shape_config(want[i].name, &c) == KVL_OK, "shape %s", want[i].name);
        double p = (double)kvl_config_param_count(&c);
        printf("shape %-14s %2d layers, %2d/%d heads, D %3d: %.1fM parameters\n", want[i].name,
               c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, p / 1e6);
        CHECK(fabs(p / want[i].params - 1.0) < 0.01, "%s: %.1fM parameters, published %.1fM",
              want[i].name, p / 1e6, want[i].params / 1e6);
    }
    kvl_model_config c;
    CHECK(kvl_shape_config("qwen9-xl", &c) == KVL_ERR_NOT_FOUND, "unknown shape accepted");
}

static void test_random_model(void) {
    kvl_model_config c;
    kvl_shape_config("tiny", &c);
    kvl_model *m = NULL;
    CHECK(kvl_model_create_random(&c, 7, NULL, &m) == KVL_OK, "random model: %s", kvl_last_error());
    if (!m) return;
    kvl_cache *cache;
    CHECK(kvl_cache_create(&c, NULL, &cache) == KVL_OK, "cache");
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = (i * 37) % c.vocab_size;
    float *logits = malloc(sizeof(float) * c.vocab_size);
    CHECK(kvl_model_prefill(m, cache, ids, 12, KVL_LOGITS_LAST, logits) == KVL_OK, "prefill: %s", kvl_last_error());
    int finite = 1;
    for (int i = 0; i < c.vocab_size; i++) finite &= isfinite(logits[i]) != 0;
    CHECK(finite, "random model logits not finite");
    free(logits);
    kvl_cache_free(cache);
    kvl_model_free(m);
}

/* W = I, s(l) = l on a model onto itself; span [t0, T) after a native prefix of t0 tokens. */
static void identity_translate(const char *name, int t0) {
    kvl_model *m = NULL;
    char dir[512];
    snprintf(dir, sizeof dir, "models/%s", name);
    if (kvl_model_load(kvl__test_path(dir), NULL, &m) != KVL_OK) { CHECK(0, "load %s", name); return; }
    const kvl_model_config *c = kvl_model_config_get(m);
    const int T = 24, L = c->n_layers;
    const size_t kd = (size_t)c->n_kv_heads * c->head_dim;
    int32_t ids[24];
    for (int i = 0; i < T; i++) ids[i] = (i * 131 + 7) % c->vocab_size;
    kvl_cache *src, *dst;
    kvl_cache_create(c, NULL, &src);
    kvl_cache_create(c, NULL, &dst);
    CHECK(kvl_model_prefill(m, src, ids, T, KVL_LOGITS_NONE, NULL) == KVL_OK, "prefill src");
    if (t0 > 0) CHECK(kvl_model_prefill(m, dst, ids, t0, KVL_LOGITS_NONE, NULL) == KVL_OK, "prefill dst");
    kvl_kv_maps mp;
    CHECK(kvl_kv_maps_random(c, c, 3, &mp) == KVL_OK, "maps");
    for (int l = 0; l < L; l++) {
        mp.layer_map[l] = l;
        for (size_t i = 0; i < kd; i++)
            for (size_t j = 0; j < kd; j++) {
                mp.wk[((size_t)l * kd + i) * kd + j] = i == j;
                mp.wv[((size_t)l * kd + i) * kd + j] = i == j;
            }
    }
    kvl_status s = kvl_kv_maps_apply_host(&mp, m, src, t0, T, dst);
    CHECK(s == KVL_OK, "%s apply: %s", name, kvl_last_error());
    CHECK(kvl_cache_n_tokens(dst) == T, "dst holds %d", kvl_cache_n_tokens(dst));
    CHECK(kvl_kv_maps_apply_host(&mp, m, src, 0, 4, dst) == KVL_ERR_RANGE, "misplaced span accepted");
    float *a = malloc(sizeof(float) * T * kd), *b = malloc(sizeof(float) * T * kd);
    float *a2 = malloc(sizeof(float) * T * kd), *b2 = malloc(sizeof(float) * T * kd);
    double worst = 0;
    for (int l = 0; l < L && s == KVL_OK; l++) {
        kvl_cache_read_kv(src, l, 0, T, a, a2);
        kvl_cache_read_kv(dst, l, 0, T, b, b2);
        double e1 = max_rel_err(b, a, T * kd), e2 = max_rel_err(b2, a2, T * kd);
        kvl_cache_read_prenorm(src, l, 0, T, a, NULL);
        kvl_cache_read_prenorm(dst, l, 0, T, b, NULL);
        double e3 = max_rel_err(b, a, T * kd);
        worst = fmax(worst, fmax(e1, fmax(e2, e3)));
    }
    printf("identity translation %s (span [%d, %d)): max rel err %.3g\n", name, t0, T, worst);
    CHECK(worst <= 1e-5, "%s identity translation differs: %.3g", name, worst);
    free(a); free(b); free(a2); free(b2);
    kvl_kv_maps_free(&mp);
    kvl_cache_free(src);
    kvl_cache_free(dst);
    kvl_model_free(m);
}

int main(void) {
    test_no_device();
    test_bad_geometry();
    test_shapes();
    test_random_model();
    identity_translate("qwen3-a", 0);    /* k_norm target: Kpre plane, norm, RoPE */
    identity_translate("qwen2-c", 5);    /* no k_norm: inverse RoPE on the source side, offset span */
    identity_translate("qwen3-b", 9);
    printf("%s: %d failure(s)\n", g_fail ? "FAILED" : "OK", g_fail);
    return g_fail ? 1 : 0;
}
