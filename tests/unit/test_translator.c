/* tests/unit/test_translator.c: translator file round trip, bad input (another pair, wrong
 * geometry, corrupt file, NaN/Inf), apply against a hand computation, and identity translators
 * reproducing the native cache (Qwen3 through Kpre + k_norm, Qwen2 through inverse RoPE). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvlingo/cache.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/translator.h"
#include "kvlingo/translator_train.h"
#include "testutil.h"
#include "translator_internal.h"

typedef struct fixture {
    char dir[4096];
    kvl_model *a, *a2, *b, *c;   /* a: Qwen3 2 layers; a2: same geometry, other weights;
                                    b: Qwen3 3 layers, head_dim 16; c: Qwen2 2 layers, 1 kv head */
} fixture;

static kvl_model *load_tiny(const char *root, const char *name, const char *arch, int H, int L,
                            int Hq, int Hkv, int D, int F, double theta, unsigned seed) {
    char d[4200];
    snprintf(d, sizeof d, "%s/%s", root, name);
    assert_int_equal(mkdir(d, 0755), 0);
    assert_int_equal(kvl__test_write_tiny_model(d, arch, 64, H, L, Hq, Hkv, D, F, theta, seed, NULL, NULL), 0);
    kvl_model *m = NULL;
    kvl_model_params p = kvl_model_default_params();
    p.n_threads = 1;
    assert_int_equal(kvl_model_load(d, &p, &m), KVL_OK);
    return m;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s", kvl__test_tmpdir());
    f->a = load_tiny(f->dir, "a", "Qwen3ForCausalLM", 32, 2, 4, 2, 8, 48, 10000.0, 1);
    f->a2 = load_tiny(f->dir, "a2", "Qwen3ForCausalLM", 32, 2, 4, 2, 8, 48, 10000.0, 2);
    f->b = load_tiny(f->dir, "b", "Qwen3ForCausalLM", 48, 3, 4, 2, 16, 64, 1e6, 3);
    f->c = load_tiny(f->dir, "c", "Qwen2ForCausalLM", 24, 2, 3, 1, 8, 40, 10000.0, 4);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    kvl_model_free(f->a); kvl_model_free(f->a2); kvl_model_free(f->b); kvl_model_free(f->c);
    free(f);
    return 0;
}

static void assert_error_has(const char *needle) {
    if (!strstr(kvl_last_error(), needle)) fail_msg("error \"%s\" lacks \"%s\"", kvl_last_error(), needle);
}

static void fill_random(kvl_translator *tr, unsigned seed) {
    kvl_translator_geometry g;
    kvl_translator_get_geometry(tr, &g);
    size_t n = (size_t)g.dst_kv_heads * g.dst_head_dim * g.src_kv_heads * g.src_head_dim;
    uint64_t s = seed;
    for (int l = 0; l < g.dst_layers; l++) {
        float *k = kvl_translator_wk(tr, l), *v = kvl_translator_wv(tr, l);
        for (size_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            k[i] = (float)((double)(s >> 40) / (double)(1ull << 24) - 0.5);
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            v[i] = (float)((double)(s >> 40) / (double)(1ull << 24) - 0.5);
        }
    }
}

static const char *tmpfile_path(fixture *f, const char *name) {
    static char p[8][4200];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", f->dir, name);
    return p[k];
}

static void test_round_trip(void **state) {
    fixture *f = *state;
    kvl_translator *tr = NULL, *back = NULL;
    assert_int_equal(kvl_translator_create(f->a, f->b, NULL, &tr), KVL_OK);
    fill_random(tr, 7);
    assert_int_equal(kvl_translator_set_meta(tr, "eval", "{\"kl\": 0.5}"), KVL_OK);
    assert_int_equal(kvl_translator_set_meta(tr, "eval_prefix128", "{\"kl\": 0.25}"), KVL_OK);
    const char *path = tmpfile_path(f, "ab.safetensors");
    assert_int_equal(kvl_translator_save(tr, path, KVL_DTYPE_F32), KVL_OK);
    assert_int_equal(kvl_translator_load(path, &back), KVL_OK);
    assert_int_equal(kvl_translator_check(back, f->a, f->b), KVL_OK);
    kvl_translator_geometry g;
    kvl_translator_get_geometry(back, &g);
    assert_int_equal(g.src_layers, 2);
    assert_int_equal(g.dst_layers, 3);
    assert_int_equal(g.dst_head_dim, 16);
    assert_int_equal(g.dst_qk_norm, 1);
    /* default layer map round(l (Ls-1)/(Lt-1)) = 0, 1 (0.5 rounds up), 1 */
    assert_int_equal(kvl_translator_layer_map(back, 0), 0);
    assert_int_equal(kvl_translator_layer_map(back, 2), 1);
    size_t n = 32 * 16;
    for (int l = 0; l < 3; l++) {
        assert_memory_equal(kvl_translator_wk(tr, l), kvl_translator_wk(back, l), n * sizeof(float));
        assert_memory_equal(kvl_translator_wv(tr, l), kvl_translator_wv(back, l), n * sizeof(float));
    }
    assert_string_equal(kvl_translator_metadata(back, "eval"), "{\"kl\": 0.5}");
    /* figures stored under any key survive a load */
    assert_string_equal(kvl_translator_metadata(back, "eval_prefix128"), "{\"kl\": 0.25}");
    assert_string_equal(kvl_translator_source_name(back), "a");
    assert_string_equal(kvl_translator_target_name(back), "b");
    assert_string_equal(kvl_translator_source_hash(back), kvl_model_hash(f->a));
    assert_string_equal(kvl_translator_target_hash(back), kvl_model_hash(f->b));
    kvl_translator_free(back);
    /* bf16: values within bf16 rounding (relative 2^-8) */
    const char *p16 = tmpfile_path(f, "ab16.safetensors");
    assert_int_equal(kvl_translator_save(tr, p16, KVL_DTYPE_BF16), KVL_OK);
    assert_int_equal(kvl_translator_load(p16, &back), KVL_OK);
    for (size_t i = 0; i < n; i++) {
        float x = kvl_translator_wk(tr, 1)[i], y = kvl_translator_wk(back, 1)[i];
        assert_true(fabsf(x - y) <= fabsf(x) * (1.0f / 256) + 1e-30f);
    }
    kvl_translator_free(back);
    kvl_translator_free(tr);
}

static void test_wrong_pair(void **state) {
    fixture *f = *state;
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(f->a, f->b, NULL, &tr), KVL_OK);
    /* same geometry, other weights: the hash tells them apart */
    assert_int_equal(kvl_translator_check(tr, f->a2, f->b), KVL_ERR_MISMATCH);
    assert_error_has("trained for source model 'a'");
    /* other geometry */
    assert_int_equal(kvl_translator_check(tr, f->c, f->b), KVL_ERR_MISMATCH);
    assert_error_has("source geometry");
    assert_int_equal(kvl_translator_check(tr, f->a, f->a), KVL_ERR_MISMATCH);
    assert_error_has("target geometry");
    assert_int_equal(kvl_translator_check(tr, f->b, f->a), KVL_ERR_MISMATCH);
    /* apply into a cache of another geometry */
    kvl_cache *cc = NULL;
    assert_int_equal(kvl_cache_create(kvl_model_config_get(f->a), NULL, &cc), KVL_OK);
    float k[2 * 16] = {0}, v[2 * 16] = {0};
    assert_int_equal(kvl_translator_apply(tr, k, v, 0, 1, NULL, cc), KVL_ERR_MISMATCH);
    kvl_cache_free(cc);
    /* a layer map outside the source */
    kvl_translator *bad = NULL;
    int map[3] = {0, 5, 1};
    assert_int_equal(kvl_translator_create(f->a, f->b, map, &bad), KVL_ERR_INVALID_ARG);
    kvl_translator_free(tr);
}

/* Save tr after setting metadata key=value, then expect load to fail with status + needle. */
static void expect_load_fail(fixture *f, const char *key, const char *value, kvl_status st,
                             const char *needle) {
    kvl_translator *tr = NULL, *back = NULL;
    assert_int_equal(kvl_translator_create(f->a, f->b, NULL, &tr), KVL_OK);
    fill_random(tr, 3);
    assert_int_equal(kvl_translator_set_meta(tr, key, value), KVL_OK);
    const char *path = tmpfile_path(f, "bad.safetensors");
    assert_int_equal(kvl_translator_save(tr, path, KVL_DTYPE_F32), KVL_OK);
    assert_int_equal(kvl_translator_load(path, &back), st);
    assert_null(back);
    assert_error_has(needle);
    kvl_translator_free(tr);
}

static void test_corrupt(void **state) {
    fixture *f = *state;
    expect_load_fail(f, "format", "something-else", KVL_ERR_FORMAT, "not a kvlingo translator");
    expect_load_fail(f, "target_head_dim", "8", KVL_ERR_MISMATCH, "layers.0.k.weight");
    expect_load_fail(f, "source_layers", "x", KVL_ERR_FORMAT, "source_layers");
    expect_load_fail(f, "layer_map", "0,7,1", KVL_ERR_FORMAT, "layer_map");
    expect_load_fail(f, "layer_map", "0,1", KVL_ERR_FORMAT, "layer_map");
    /* truncated file */
    kvl_translator *tr = NULL, *back = NULL;
    assert_int_equal(kvl_translator_create(f->a, f->b, NULL, &tr), KVL_OK);
    const char *path = tmpfile_path(f, "good.safetensors");
    assert_int_equal(kvl_translator_save(tr, path, KVL_DTYPE_F32), KVL_OK);
    size_t len = 0;
    char *bytes = kvl__test_read_file(path, &len);
    assert_non_null(bytes);
    const char *cut = tmpfile_path(f, "cut.safetensors");
    assert_int_equal(kvl__test_write_file(cut, bytes, len / 2), 0);
    assert_int_equal(kvl_translator_load(cut, &back), KVL_ERR_FORMAT);
    /* garbage */
    memset(bytes, 0x5a, len);
    assert_int_equal(kvl__test_write_file(cut, bytes, len), 0);
    assert_int_equal(kvl_translator_load(cut, &back), KVL_ERR_FORMAT);
    free(bytes);
    /* missing file */
    assert_int_equal(kvl_translator_load(tmpfile_path(f, "nope.safetensors"), &back), KVL_ERR_IO);
    /* a safetensors file with one tensor missing */
    float w[32 * 16] = {0};
    kvl_st_write_tensor t = {"layers.0.k.weight", KVL_DTYPE_F32, 2, {32, 16}, w, sizeof w};
    const char *keys[] = {"format", "source_layers", "source_kv_heads", "source_head_dim", "target_layers",
                          "target_kv_heads", "target_head_dim", "target_qk_norm"};
    const char *vals[] = {"kvlingo-translator-1", "2", "2", "8", "1", "2", "16", "0"};
    const char *miss = tmpfile_path(f, "missing.safetensors");
    assert_int_equal(kvl_safetensors_write(miss, &t, 1, keys, vals, 8), KVL_OK);
    assert_int_equal(kvl_translator_load(miss, &back), KVL_ERR_FORMAT);
    assert_error_has("layers.0.v.weight");
    /* a geometry whose map width overflows an int (256 taps x 4096 kv heads x 4096 head_dim
     * wrapped to 0 floats, and a 1-D tensor then filled that empty map) is refused before any
     * allocation, naming the sizes */
    float w1[1024] = {0};
    kvl_st_write_tensor t1[2] = {{"layers.0.k.weight", KVL_DTYPE_F32, 1, {1024}, w1, sizeof w1},
                                 {"layers.0.v.weight", KVL_DTYPE_F32, 1, {1024}, w1, sizeof w1}};
    const char *keys9[] = {"format", "source_layers", "source_kv_heads", "source_head_dim", "target_layers",
                           "target_kv_heads", "target_head_dim", "target_qk_norm", "source_taps"};
    const char *wrap[] = {"kvlingo-translator-1", "256", "4096", "4096", "1", "16", "4096", "0", "256"};
    const char *wp = tmpfile_path(f, "wrap.safetensors");
    assert_int_equal(kvl_safetensors_write(wp, t1, 2, keys9, wrap, 9), KVL_OK);
    assert_int_equal(kvl_translator_load(wp, &back), KVL_ERR_FORMAT);
    assert_error_has("wrap.safetensors");
    assert_error_has("256 taps x 4096 kv heads");
    /* a 1-D tensor where a map is due: a shape error naming the tensor */
    const char *small[] = {"kvlingo-translator-1", "1", "32", "32", "1", "1", "2", "0", "1"};
    assert_int_equal(kvl_safetensors_write(wp, t1, 2, keys9, small, 9), KVL_OK);
    assert_int_equal(kvl_translator_load(wp, &back), KVL_ERR_MISMATCH);
    assert_error_has("layers.0.k.weight");
    kvl_translator_free(tr);
}

static void test_nan_inf(void **state) {
    fixture *f = *state;
    kvl_translator *tr = NULL, *back = NULL;
    assert_int_equal(kvl_translator_create(f->a, f->b, NULL, &tr), KVL_OK);
    fill_random(tr, 5);
    kvl_translator_wk(tr, 1)[17] = NAN;
    const char *path = tmpfile_path(f, "nan.safetensors");
    assert_int_equal(kvl_translator_save(tr, path, KVL_DTYPE_F32), KVL_OK);
    assert_int_equal(kvl_translator_load(path, &back), KVL_ERR_NUMERIC);
    assert_error_has("layers.1.k.weight");
    assert_error_has("NaN");
    kvl_translator_wk(tr, 1)[17] = 0;
    kvl_translator_wv(tr, 2)[3] = -INFINITY;
    assert_int_equal(kvl_translator_save(tr, path, KVL_DTYPE_BF16), KVL_OK);
    assert_int_equal(kvl_translator_load(path, &back), KVL_ERR_NUMERIC);
    assert_error_has("layers.2.v.weight");
    assert_error_has("Inf");
    kvl_translator_free(tr);
}

/* apply against the formulas written out by hand */
static void test_apply_by_hand(void **state) {
    fixture *f = *state;
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(f->a, f->b, NULL, &tr), KVL_OK);
    fill_random(tr, 11);
    const int n = 3, Ls = 2, ds = 16, dt = 32, D = 16, Ht = 2, Lt = 3, t0 = 0;
    float ks[2 * 3 * 16], vs[2 * 3 * 16];
    for (int i = 0; i < Ls * n * ds; i++) { ks[i] = sinf(0.37f * i); vs[i] = cosf(0.11f * i); }
    kvl_cache *cb = NULL;
    assert_int_equal(kvl_cache_create(kvl_model_config_get(f->b), NULL, &cb), KVL_OK);
    assert_int_equal(kvl_translator_apply(tr, ks, vs, 1, n, NULL, cb), KVL_ERR_RANGE);
    int32_t ids[3] = {5, 6, 7};
    assert_int_equal(kvl_translator_apply(tr, ks, vs, t0, n, ids, cb), KVL_OK);
    assert_int_equal(kvl_cache_n_tokens(cb), n);
    const kvl_model_config *cfg = kvl_model_config_get(f->b);
    float kg[3 * 32], vg[3 * 32], kp[3 * 32];
    for (int l = 0; l < Lt; l++) {
        int sl = kvl_translator_layer_map(tr, l);
        const float *Wk = kvl_translator_wk(tr, l), *Wv = kvl_translator_wv(tr, l);
        assert_int_equal(kvl_cache_read_kv(cb, l, 0, n, kg, vg), KVL_OK);
        assert_int_equal(kvl_cache_read_prenorm(cb, l, 0, n, kp, NULL), KVL_OK);
        /* k_norm weights: the tiny writer stores them in the model file; read via the file */
        char p[4300];
        snprintf(p, sizeof p, "%s/b/model.safetensors", f->dir);
        kvl_safetensors *st = NULL;
        assert_int_equal(kvl_safetensors_open(p, &st), KVL_OK);
        char nm[96];
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_norm.weight", l);
        const kvl_st_tensor *kn = kvl_safetensors_find(st, nm);
        assert_non_null(kn);
        float knw[16];
        assert_int_equal(kvl_st_tensor_to_f32(kn, knw, 16), KVL_OK);
        kvl_safetensors_close(st);
        for (int t = 0; t < n; t++) {
            double pre[32], v[32];
            for (int i = 0; i < dt; i++) {
                pre[i] = v[i] = 0;
                for (int j = 0; j < ds; j++) {
                    pre[i] += (double)Wk[i * ds + j] * ks[(sl * n + t) * ds + j];
                    v[i] += (double)Wv[i * ds + j] * vs[(sl * n + t) * ds + j];
                }
                assert_float_equal(kp[t * dt + i], pre[i], 1e-4);
                assert_float_equal(vg[t * dt + i], v[i], 1e-4);
            }
            for (int h = 0; h < Ht; h++) {
                double *x = pre + h * D, ss = 0, y[16];
                for (int i = 0; i < D; i++) ss += x[i] * x[i];
                double r = 1.0 / sqrt(ss / D + cfg->rms_norm_eps);
                for (int i = 0; i < D; i++) y[i] = knw[i] * x[i] * r;
                int pos = t0 + t;
                for (int i = 0; i < D / 2; i++) {
                    double ang = pos * pow(cfg->rope_theta, -2.0 * i / D);
                    double a = y[i] * cos(ang) - y[i + D / 2] * sin(ang);
                    double b = y[i + D / 2] * cos(ang) + y[i] * sin(ang);
                    assert_float_equal(kg[t * dt + h * D + i], a, 1e-4);
                    assert_float_equal(kg[t * dt + h * D + i + D / 2], b, 1e-4);
                }
            }
        }
    }
    /* the same span into a bf16 KV cache (a model loaded with kv_dtype bf16): every plane reads
     * back as the float32 cache's values rounded to bf16 (K rounded after k_norm and RoPE) */
    kvl_model_params p16 = kvl_model_default_params();
    p16.n_threads = 1;
    p16.kv_dtype = KVL_KV_BF16;
    char bdir[4200];
    snprintf(bdir, sizeof bdir, "%s/b", f->dir);
    kvl_model *b16 = NULL;
    kvl_cache *c16 = NULL;
    assert_int_equal(kvl_model_load(bdir, &p16, &b16), KVL_OK);
    assert_int_equal(kvl_model_cache_create(b16, NULL, &c16), KVL_OK);
    assert_int_equal(kvl_translator_apply(tr, ks, vs, t0, n, ids, c16), KVL_OK);
    for (int l = 0; l < Lt; l++) {
        float k16[3 * 32], v16[3 * 32], p16r[3 * 32];
        assert_int_equal(kvl_cache_read_kv(cb, l, 0, n, kg, vg), KVL_OK);
        assert_int_equal(kvl_cache_read_prenorm(cb, l, 0, n, kp, NULL), KVL_OK);
        assert_int_equal(kvl_cache_read_kv(c16, l, 0, n, k16, v16), KVL_OK);
        assert_int_equal(kvl_cache_read_prenorm(c16, l, 0, n, p16r, NULL), KVL_OK);
        for (int i = 0; i < n * dt; i++) {
            assert_float_equal(k16[i], kvl_bf16_to_f32(kvl_f32_to_bf16(kg[i])), 0);
            assert_float_equal(v16[i], kvl_bf16_to_f32(kvl_f32_to_bf16(vg[i])), 0);
            assert_float_equal(p16r[i], kvl_bf16_to_f32(kvl_f32_to_bf16(kp[i])), 0);
        }
    }
    kvl_cache_free(c16);
    kvl_model_free(b16);
    kvl_cache_free(cb);
    kvl_translator_free(tr);
}

/* Multi-layer maps (taps): defaults, bad maps, file round trip, and apply.  A 2-tap map
 * [W | 0] must give exactly the cache of the 1-tap map W on tap 0, and [0 | W] that of W on
 * tap 1: the gather order and the weight layout agree on every backend path. */
static void fill_lcg(float *w, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float)((double)(*s >> 40) / (double)(1ull << 24) - 0.5);
    }
}

static kvl_translator *tap_case(fixture *f, const kvl_translator *t2, int tap) {
    /* a 1-tap translator reading tap `tap` of t2 with t2's block `tap` of each map */
    int map[3];
    for (int l = 0; l < 3; l++) map[l] = kvl_translator_layer_source(t2, l, tap);
    kvl_translator *t1 = NULL;
    assert_int_equal(kvl_translator_create(f->a, f->b, map, &t1), KVL_OK);
    const int dt = 2 * 16, ds = 2 * 8;
    for (int l = 0; l < 3; l++)
        for (int side = 0; side < 2; side++) {
            const float *w2 = side ? kvl_translator_wv((kvl_translator *)t2, l) : kvl_translator_wk((kvl_translator *)t2, l);
            float *w1 = side ? kvl_translator_wv(t1, l) : kvl_translator_wk(t1, l);
            for (int i = 0; i < dt; i++)
                for (int j = 0; j < ds; j++) w1[i * ds + j] = w2[(size_t)i * 2 * ds + tap * ds + j];
        }
    return t1;
}

static void test_taps(void **state) {
    fixture *f = *state;
    kvl_translator *t2 = NULL, *back = NULL, *bad = NULL;
    /* a: 2 layers, b: 3 layers -> every target layer reads source layers 0 and 1 */
    assert_int_equal(kvl_translator_create_taps(f->a, f->b, 2, NULL, &t2), KVL_OK);
    assert_int_equal(kvl_translator_taps(t2), 2);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(kvl_translator_layer_source(t2, l, 0), 0);
        assert_int_equal(kvl_translator_layer_source(t2, l, 1), 1);
    }
    assert_int_equal(kvl_translator_layer_source(t2, 0, 2), -1);
    assert_string_equal(kvl_translator_metadata(t2, "layer_map"), "0+1,0+1,0+1");
    assert_int_equal(kvl_translator_create_taps(f->a, f->b, 3, NULL, &bad), KVL_ERR_INVALID_ARG);
    assert_error_has("taps");
    int desc[6] = {1, 0, 0, 1, 0, 1};
    assert_int_equal(kvl_translator_create_taps(f->a, f->b, 2, desc, &bad), KVL_ERR_INVALID_ARG);
    assert_null(bad);
    /* round trip */
    uint64_t st = 11;
    const size_t n = (size_t)2 * 16 * 2 * 2 * 8;   /* [Ht*Dt, 2*Hs*Ds] */
    for (int l = 0; l < 3; l++) {
        fill_lcg(kvl_translator_wk(t2, l), n, &st);
        fill_lcg(kvl_translator_wv(t2, l), n, &st);
    }
    const char *path = tmpfile_path(f, "taps.safetensors");
    assert_int_equal(kvl_translator_save(t2, path, KVL_DTYPE_F32), KVL_OK);
    assert_int_equal(kvl_translator_load(path, &back), KVL_OK);
    assert_int_equal(kvl_translator_check(back, f->a, f->b), KVL_OK);
    assert_int_equal(kvl_translator_taps(back), 2);
    assert_int_equal(kvl_translator_layer_source(back, 2, 1), 1);
    for (int l = 0; l < 3; l++)
        assert_memory_equal(kvl_translator_wk(t2, l), kvl_translator_wk(back, l), n * sizeof(float));
    kvl_translator_free(back);
    /* bad maps in a file: a repeated tap, one tap where the file says two, a tap past the source */
    const char *badmaps[] = {"0+0,0+1,0+1", "0,1,1", "0+1,0+1,0+2", "0+1,0+1"};
    for (int i = 0; i < 4; i++) {
        kvl_translator *w = NULL;
        assert_int_equal(kvl_translator_create_taps(f->a, f->b, 2, NULL, &w), KVL_OK);
        assert_int_equal(kvl_translator_set_meta(w, "layer_map", badmaps[i]), KVL_OK);
        const char *bp = tmpfile_path(f, "taps_bad.safetensors");
        assert_int_equal(kvl_translator_save(w, bp, KVL_DTYPE_F32), KVL_OK);
        assert_int_equal(kvl_translator_load(bp, &back), KVL_ERR_FORMAT);
        assert_error_has("layer_map");
        kvl_translator_free(w);
    }
    /* apply: with the other tap's columns zeroed, a 2-tap map gives the 1-tap map's cache */
    const int P = 9;
    int32_t ids[9];
    for (int i = 0; i < P; i++) ids[i] = (i * 5 + 2) % 64;
    kvl_cache *src = NULL;
    assert_int_equal(kvl_cache_create(kvl_model_config_get(f->a), NULL, &src), KVL_OK);
    assert_int_equal(kvl_model_prefill(f->a, src, ids, P, KVL_LOGITS_NONE, NULL), KVL_OK);
    for (int tap = 0; tap < 2; tap++) {
        kvl_translator *half = NULL;
        assert_int_equal(kvl_translator_load(path, &half), KVL_OK);
        for (int l = 0; l < 3; l++)   /* zero the other tap's columns */
            for (int side = 0; side < 2; side++) {
                float *w = side ? kvl_translator_wv(half, l) : kvl_translator_wk(half, l);
                for (int i = 0; i < 32; i++) memset(w + (size_t)i * 32 + (1 - tap) * 16, 0, 16 * sizeof(float));
            }
        kvl_translator *one = tap_case(f, half, tap);
        kvl_cache *c2 = NULL, *c1 = NULL;
        assert_int_equal(kvl_model_cache_create(f->b, NULL, &c2), KVL_OK);
        assert_int_equal(kvl_model_cache_create(f->b, NULL, &c1), KVL_OK);
        assert_int_equal(kvl_translator_translate_span(half, src, 0, 4, c2), KVL_OK);
        assert_int_equal(kvl_translator_translate_span(half, src, 4, P, c2), KVL_OK);
        assert_int_equal(kvl_translator_translate_span(one, src, 0, P, c1), KVL_OK);
        float k2[9 * 32], v2[9 * 32], k1[9 * 32], v1[9 * 32];
        for (int l = 0; l < 3; l++) {
            assert_int_equal(kvl_cache_read_kv(c2, l, 0, P, k2, v2), KVL_OK);
            assert_int_equal(kvl_cache_read_kv(c1, l, 0, P, k1, v1), KVL_OK);
            for (int i = 0; i < P * 32; i++) {
                assert_float_equal(k2[i], k1[i], 1e-5);
                assert_float_equal(v2[i], v1[i], 1e-5);
            }
        }
        kvl_cache_free(c2); kvl_cache_free(c1);
        kvl_translator_free(one); kvl_translator_free(half);
    }
    kvl_cache_free(src);
    kvl_translator_free(t2);
}

/* x rounded to bf16 (nearest even) when `on` */
static float rb16(float x, int on) { return on ? kvl_bf16_to_f32(kvl_f32_to_bf16(x)) : x; }

/* Every layer's K, V (and with k_norm the Kpre plane) of tokens [0, n) the same, byte for byte,
 * in caches x and y. */
static void assert_same_cache(const kvl_cache *x, const kvl_cache *y, int Lt, int n, int dt, int qk) {
    float *a = malloc(sizeof(float) * 3 * n * dt), *b = malloc(sizeof(float) * 3 * n * dt);
    assert_non_null(a); assert_non_null(b);
    for (int l = 0; l < Lt; l++) {
        assert_int_equal(kvl_cache_read_kv(x, l, 0, n, a, a + (size_t)n * dt), KVL_OK);
        assert_int_equal(kvl_cache_read_kv(y, l, 0, n, b, b + (size_t)n * dt), KVL_OK);
        if (qk) {
            assert_int_equal(kvl_cache_read_prenorm(x, l, 0, n, a + (size_t)2 * n * dt, NULL), KVL_OK);
            assert_int_equal(kvl_cache_read_prenorm(y, l, 0, n, b + (size_t)2 * n * dt, NULL), KVL_OK);
        }
        assert_memory_equal(a, b, sizeof(float) * (size_t)(qk ? 3 : 2) * n * dt);
    }
    free(a); free(b);
}

/* A cache like form's of fused_case (0, 3: made from the geometry; 1: m2's; 2: m16's). */
static kvl_cache *form_cache(int form, const kvl_model_config *cfg, kvl_model *m2, kvl_model *m16) {
    kvl_cache *c = NULL;
    if (form == 0 || form == 3) assert_int_equal(kvl_cache_create(cfg, NULL, &c), KVL_OK);
    else assert_int_equal(kvl_model_cache_create(form == 1 ? m2 : m16, NULL, &c), KVL_OK);
    return c;
}

/* kvl_translator_apply_bf16 of bf16 rows writes the bytes kvl_translator_apply writes for the
 * same rows widened, span after span (offsets past 0, ragged lengths), with the target layers
 * reading the source layers crossed over (the rows' offsets follow the layer map): with bf16
 * products (on an AVX512_BF16 CPU the direct path, on every form of cache: the process pool, a
 * model's pool and RoPE tables, a bf16 cache) and without them (the widening one); bad
 * arguments leave the cache as it was. */
static void bf16_rows_case(kvl_translator *tr, int form, const kvl_model_config *cfg, kvl_model *m2,
                           kvl_model *m16, const float *ks, const float *vs, int Ls, int N, int ds,
                           const int *pieces, int Lt, int dt, int qk, int products) {
    kvl_translator_set_bf16_products(tr, products);
    int *map = tr->layer_map, keep[2] = {map[0], map[1]};
    map[0] = keep[1];
    map[1] = keep[0];
    kvl_cache *cw = form_cache(form, cfg, m2, m16), *c16 = form_cache(form, cfg, m2, m16);
    for (int i = 0, t0 = 0; i < 3; t0 += pieces[i++]) {
        const int n = pieces[i];
        const size_t m = (size_t)Ls * n * ds;
        uint16_t *r16 = malloc(sizeof(uint16_t) * 2 * m);
        float *w = malloc(sizeof(float) * 2 * m);
        assert_non_null(r16); assert_non_null(w);
        for (int l = 0; l < Ls; l++)
            for (size_t j = 0; j < (size_t)n * ds; j++) {
                const size_t o = (size_t)l * n * ds + j, at = ((size_t)l * N + t0) * ds + j;
                r16[o] = kvl_f32_to_bf16(ks[at]);
                r16[m + o] = kvl_f32_to_bf16(vs[at]);
            }
        for (size_t j = 0; j < 2 * m; j++) w[j] = kvl_bf16_to_f32(r16[j]);
        assert_int_equal(kvl_translator_apply(tr, w, w + m, t0, n, NULL, cw), KVL_OK);
        assert_int_equal(kvl_translator_apply_bf16(tr, NULL, r16 + m, t0, n, NULL, c16), KVL_ERR_INVALID_ARG);
        assert_int_equal(kvl_translator_apply_bf16(tr, r16, r16 + m, t0 + 1, n, NULL, c16), KVL_ERR_RANGE);
        assert_int_equal(kvl_cache_n_tokens(c16), t0);
        assert_int_equal(kvl_translator_apply_bf16(tr, r16, r16 + m, t0, n, NULL, c16), KVL_OK);
        free(r16); free(w);
    }
    assert_same_cache(cw, c16, Lt, N, dt, qk);
    kvl_cache_free(cw); kvl_cache_free(c16);
    map[0] = keep[0];
    map[1] = keep[1];
}

/* Spans on the fused rows (AVX-512 CPUs, head_dim 32 / 64 / 128, translate_avx512.h; a
 * translator's spans of any length), appended to one cache: every plane of every token equals
 * the method computed by hand in double (k_t = RoPE(k_norm(W_K k_s)), v_t = W_V v_s), across
 * chunk and panel boundaries, in row groups of 6 (3 at head_dim 128) with ragged last groups,
 * on a model's 2-thread pool and on the process pool; a bf16 cache reads back as those values
 * rounded; with bf16 products, the method on the maps and rows rounded to bf16. */
static void fused_case(fixture *f, const char *name, const char *arch, int H, int Hq, int Hkv,
                       int D, unsigned seed) {
    kvl_model_params mp = kvl_model_default_params();
    mp.n_threads = 2;
    kvl_model *m = load_tiny(f->dir, name, arch, H, 2, Hq, Hkv, D, 96, 1e6, seed);
    char mdir[4200];
    snprintf(mdir, sizeof mdir, "%s/%s", f->dir, name);
    kvl_model *m2 = NULL, *m16 = NULL;
    assert_int_equal(kvl_model_load(mdir, &mp, &m2), KVL_OK);
    mp.kv_dtype = KVL_KV_BF16;
    assert_int_equal(kvl_model_load(mdir, &mp, &m16), KVL_OK);
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(f->a, m, NULL, &tr), KVL_OK);
    fill_random(tr, seed + 7);
    const kvl_model_config *cfg = kvl_model_config_get(m);
    const int Ls = 2, Lt = 2, ds = 16, dt = Hkv * D, pieces[3] = {5, 150, 131}, N = 286;
    const int qk = cfg->qk_norm;
    float *ks = malloc(sizeof(float) * Ls * N * ds), *vs = malloc(sizeof(float) * Ls * N * ds);
    /* kg, vg, kp: [Lt][N][dt] of the float32 caches; k16, v16, p16: one layer of the bf16 one */
    float *kg = malloc(sizeof(float) * Lt * N * dt), *vg = malloc(sizeof(float) * Lt * N * dt);
    float *kp = calloc((size_t)Lt * N * dt, sizeof(float)), *k16 = malloc(sizeof(float) * N * dt);
    float *v16 = malloc(sizeof(float) * N * dt), *p16 = malloc(sizeof(float) * N * dt);
    assert_non_null(ks); assert_non_null(vs); assert_non_null(kg); assert_non_null(vg);
    assert_non_null(kp); assert_non_null(k16); assert_non_null(v16); assert_non_null(p16);
    for (int i = 0; i < Ls * N * ds; i++) { ks[i] = sinf(0.37f * i + 0.1f); vs[i] = cosf(0.11f * i); }
    /* the k_norm weights, from the model file */
    float knw[2][128];
    if (qk) {
        char p[4300];
        snprintf(p, sizeof p, "%s/model.safetensors", mdir);
        kvl_safetensors *st = NULL;
        assert_int_equal(kvl_safetensors_open(p, &st), KVL_OK);
        for (int l = 0; l < Lt; l++) {
            char nm[96];
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_norm.weight", l);
            const kvl_st_tensor *kn = kvl_safetensors_find(st, nm);
            assert_non_null(kn);
            assert_int_equal(kvl_st_tensor_to_f32(kn, knw[l], (size_t)D), KVL_OK);
        }
        kvl_safetensors_close(st);
    }
    /* bf16 products (form 3) where this CPU takes them: the reference then rounds the maps and
     * the source rows to bf16 as they do (the products are exact, the sums float32); the
     * translator says so exactly where the CPU has AVX512_BF16 and no KVL_CPU_TRANSLATE */
    int bf_cpu = 0;
#if defined(__x86_64__)
    bf_cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16") &&
             !getenv("KVL_CPU_TRANSLATE");
#endif
    kvl_translator_set_bf16_products(tr, 1);
    assert_int_equal(kvl_translator_bf16_products(tr, m), bf_cpu);
    kvl_translator_set_bf16_products(tr, 0);
    assert_int_equal(kvl_translator_bf16_products(tr, m), 0);
    for (int form = 0; form < 4; form++) {   /* process pool, a 2-thread model's pool, bf16 cache, bf16 products */
        kvl_cache *cb = NULL;
        const int rb = form == 3 && bf_cpu;
        for (int products = 0; products < 2; products++)
            bf16_rows_case(tr, form, cfg, m2, m16, ks, vs, Ls, N, ds, pieces, Lt, dt, qk, products);
        kvl_translator_set_bf16_products(tr, form == 3);
        cb = form_cache(form, cfg, m2, m16);
        for (int i = 0, t0 = 0; i < 3; t0 += pieces[i++]) {
            /* the span's rows of every source layer, [Ls][n][ds] */
            const int n = pieces[i];
            float *sk = malloc(sizeof(float) * Ls * n * ds), *sv = malloc(sizeof(float) * Ls * n * ds);
            assert_non_null(sk); assert_non_null(sv);
            for (int l = 0; l < Ls; l++) {
                memcpy(sk + (size_t)l * n * ds, ks + ((size_t)l * N + t0) * ds, sizeof(float) * n * ds);
                memcpy(sv + (size_t)l * n * ds, vs + ((size_t)l * N + t0) * ds, sizeof(float) * n * ds);
            }
            assert_int_equal(kvl_translator_apply(tr, sk, sv, t0, n, NULL, cb), KVL_OK);
            free(sk); free(sv);
        }
        assert_int_equal(kvl_cache_n_tokens(cb), N);
        for (int l = 0; l < Lt; l++) {
            const int sl = kvl_translator_layer_map(tr, l);
            const float *Wk = kvl_translator_wk(tr, l), *Wv = kvl_translator_wv(tr, l);
            float *kl = kg + (size_t)l * N * dt, *vl = vg + (size_t)l * N * dt;
            float *pl = kp + (size_t)l * N * dt;
            if (form == 2) {   /* bf16: the float32 cache's values, rounded */
                assert_int_equal(kvl_cache_read_kv(cb, l, 0, N, k16, v16), KVL_OK);
                if (qk) assert_int_equal(kvl_cache_read_prenorm(cb, l, 0, N, p16, NULL), KVL_OK);
                for (int i = 0; i < N * dt; i++) {
                    assert_float_equal(k16[i], kvl_bf16_to_f32(kvl_f32_to_bf16(kl[i])), 0);
                    assert_float_equal(v16[i], kvl_bf16_to_f32(kvl_f32_to_bf16(vl[i])), 0);
                    if (qk) assert_float_equal(p16[i], kvl_bf16_to_f32(kvl_f32_to_bf16(pl[i])), 0);
                }
                continue;
            }
            assert_int_equal(kvl_cache_read_kv(cb, l, 0, N, kl, vl), KVL_OK);
            if (qk) assert_int_equal(kvl_cache_read_prenorm(cb, l, 0, N, pl, NULL), KVL_OK);
            for (int t = 0; t < N; t++) {
                double pre[256], v[256];
                for (int i = 0; i < dt; i++) {
                    pre[i] = v[i] = 0;
                    for (int j = 0; j < ds; j++) {
                        pre[i] += (double)rb16(Wk[i * ds + j], rb) * rb16(ks[((size_t)sl * N + t) * ds + j], rb);
                        v[i] += (double)rb16(Wv[i * ds + j], rb) * rb16(vs[((size_t)sl * N + t) * ds + j], rb);
                    }
                    if (qk) assert_float_equal(pl[(size_t)t * dt + i], pre[i], 1e-4);
                    assert_float_equal(vl[(size_t)t * dt + i], v[i], 1e-4);
                }
                for (int h = 0; h < Hkv; h++) {
                    double *x = pre + h * D, y[128];
                    double r = 1.0;
                    if (qk) {
                        double ss = 0;
                        for (int i = 0; i < D; i++) ss += x[i] * x[i];
                        r = 1.0 / sqrt(ss / D + cfg->rms_norm_eps);
                    }
                    for (int i = 0; i < D; i++) y[i] = (qk ? knw[l][i] : 1.0) * x[i] * r;
                    for (int i = 0; i < D / 2; i++) {
                        double ang = t * pow(cfg->rope_theta, -2.0 * i / D);
                        double a = y[i] * cos(ang) - y[i + D / 2] * sin(ang);
                        double b = y[i + D / 2] * cos(ang) + y[i] * sin(ang);
                        assert_float_equal(kl[(size_t)t * dt + h * D + i], a, 2e-4);
                        assert_float_equal(kl[(size_t)t * dt + h * D + i + D / 2], b, 2e-4);
                    }
                }
            }
        }
        kvl_cache_free(cb);
    }
    /* maps written after an apply: the next apply reads the new ones (the transposes a
     * translator keeps for the fused rows are made again), bit for bit what a translator
     * created with them gives */
    {
        const int n = 9;
        kvl_translator *t2 = NULL;
        assert_int_equal(kvl_translator_create(f->a, m2, NULL, &t2), KVL_OK);
        fill_random(t2, seed + 99);
        kvl_cache *cc[3] = {NULL, NULL, NULL};
        float *out[3];
        for (int i = 0; i < 3; i++) {
            assert_int_equal(kvl_model_cache_create(m2, NULL, &cc[i]), KVL_OK);
            assert_non_null(out[i] = malloc(sizeof(float) * 2 * n * dt));
        }
        assert_int_equal(kvl_translator_apply(tr, ks, vs, 0, n, NULL, cc[0]), KVL_OK);
        fill_random(tr, seed + 99);
        assert_int_equal(kvl_translator_apply(tr, ks, vs, 0, n, NULL, cc[1]), KVL_OK);
        assert_int_equal(kvl_translator_apply(t2, ks, vs, 0, n, NULL, cc[2]), KVL_OK);
        for (int i = 0; i < 3; i++)
            assert_int_equal(kvl_cache_read_kv(cc[i], 1, 0, n, out[i], out[i] + n * dt), KVL_OK);
        assert_memory_equal(out[1], out[2], sizeof(float) * 2 * n * dt);
        assert_memory_not_equal(out[0], out[1], sizeof(float) * 2 * n * dt);
        for (int i = 0; i < 3; i++) { kvl_cache_free(cc[i]); free(out[i]); }
        kvl_translator_free(t2);
    }
    /* kvl_translator_translate_span (which reads the span as bf16 where the products are bf16)
     * writes what the float32 read of each layer and kvl_translator_apply write */
    {
        const kvl_model_config *sc = kvl_model_config_get(f->a);
        const int n = 150, sds = sc->n_kv_heads * sc->head_dim;
        int32_t ids[150];
        for (int i = 0; i < n; i++) ids[i] = (i * 37 + 5) % sc->vocab_size;
        kvl_cache *src = NULL;
        assert_int_equal(kvl_model_cache_create(f->a, NULL, &src), KVL_OK);
        assert_int_equal(kvl_model_prefill(f->a, src, ids, n, KVL_LOGITS_NONE, NULL), KVL_OK);
        float *rk = malloc(sizeof(float) * Ls * n * sds), *rv = malloc(sizeof(float) * Ls * n * sds);
        assert_non_null(rk); assert_non_null(rv);
        for (int l = 0; l < Ls; l++)
            assert_int_equal(kvl_cache_read_prenorm(src, l, 0, n, rk + (size_t)l * n * sds, rv + (size_t)l * n * sds),
                             KVL_OK);
        for (int products = 0; products < 2; products++) {
            kvl_translator_set_bf16_products(tr, products);
            kvl_cache *cs = NULL, *ca = NULL;
            assert_int_equal(kvl_model_cache_create(m2, NULL, &cs), KVL_OK);
            assert_int_equal(kvl_model_cache_create(m2, NULL, &ca), KVL_OK);
            assert_int_equal(kvl_translator_translate_span(tr, src, 0, n, cs), KVL_OK);
            assert_int_equal(kvl_translator_apply(tr, rk, rv, 0, n, ids, ca), KVL_OK);
            assert_same_cache(cs, ca, Lt, n, dt, qk);
            kvl_cache_free(cs); kvl_cache_free(ca);
        }
        free(rk); free(rv);
        kvl_cache_free(src);
    }
    free(ks); free(vs); free(kg); free(vg); free(kp); free(k16); free(v16); free(p16);
    kvl_translator_free(tr);
    kvl_model_free(m); kvl_model_free(m2); kvl_model_free(m16);
}

static void test_apply_fused(void **state) {
    fixture *f = *state;
    fused_case(f, "f32", "Qwen3ForCausalLM", 64, 4, 2, 32, 21);   /* 64-feature panels */
    fused_case(f, "f64", "Qwen3ForCausalLM", 64, 2, 2, 64, 22);   /* 2 heads a panel */
    fused_case(f, "f128", "Qwen3ForCausalLM", 64, 2, 1, 128, 23); /* 128-feature panels */
    fused_case(f, "q64", "Qwen2ForCausalLM", 128, 2, 2, 64, 24);  /* no k_norm, 2 planes */
}

/* A span whose translated K / V reach the streaming bound (4 MB: written past the caches) holds
 * the very bytes the same span applied in pieces under it holds, bf16 products or not. */
static void test_apply_streamed(void **state) {
    fixture *f = *state;
    kvl_model *m = load_tiny(f->dir, "wide", "Qwen3ForCausalLM", 64, 2, 4, 4, 128, 96, 1e6, 31);
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(f->a, m, NULL, &tr), KVL_OK);
    fill_random(tr, 77);
    const int Ls = 2, Lt = 2, ds = 16, dt = 4 * 128, n = 600, piece = 150;   /* 4.9 MB whole, 1.2 a piece */
    float *ks = malloc(sizeof(float) * Ls * n * ds), *vs = malloc(sizeof(float) * Ls * n * ds);
    float *pk = malloc(sizeof(float) * Ls * piece * ds), *pv = malloc(sizeof(float) * Ls * piece * ds);
    assert_true(ks && vs && pk && pv);
    for (int i = 0; i < Ls * n * ds; i++) { ks[i] = sinf(0.29f * i + 0.3f); vs[i] = cosf(0.13f * i); }
    for (int products = 0; products < 2; products++) {
        kvl_translator_set_bf16_products(tr, products);
        kvl_cache *whole = NULL, *parts = NULL;
        assert_int_equal(kvl_model_cache_create(m, NULL, &whole), KVL_OK);
        assert_int_equal(kvl_model_cache_create(m, NULL, &parts), KVL_OK);
        assert_int_equal(kvl_translator_apply(tr, ks, vs, 0, n, NULL, whole), KVL_OK);
        for (int t0 = 0; t0 < n; t0 += piece) {
            for (int l = 0; l < Ls; l++) {
                memcpy(pk + (size_t)l * piece * ds, ks + ((size_t)l * n + t0) * ds, sizeof(float) * piece * ds);
                memcpy(pv + (size_t)l * piece * ds, vs + ((size_t)l * n + t0) * ds, sizeof(float) * piece * ds);
            }
            assert_int_equal(kvl_translator_apply(tr, pk, pv, t0, piece, NULL, parts), KVL_OK);
        }
        assert_same_cache(whole, parts, Lt, n, dt, 1);
        kvl_cache_free(whole); kvl_cache_free(parts);
    }
    free(ks); free(vs); free(pk); free(pv);
    kvl_translator_free(tr);
    kvl_model_free(m);
}

/* A model translated into itself with W = I must reproduce the native continuation logits. */
static void identity_case(kvl_model *m) {
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(m, m, NULL, &tr), KVL_OK);
    kvl_translator_geometry g;
    kvl_translator_get_geometry(tr, &g);
    int d = g.dst_kv_heads * g.dst_head_dim;
    for (int l = 0; l < g.dst_layers; l++)
        for (int i = 0; i < d; i++) kvl_translator_wk(tr, l)[i * d + i] = kvl_translator_wv(tr, l)[i * d + i] = 1;
    const int P = 20, C = 6, V = 64;
    int32_t ids[26];
    for (int i = 0; i < P + C; i++) ids[i] = (i * 7 + 3) % V;
    kvl_cache *src = NULL, *nat = NULL, *trc = NULL;
    assert_int_equal(kvl_cache_create(kvl_model_config_get(m), NULL, &src), KVL_OK);
    assert_int_equal(kvl_cache_create(kvl_model_config_get(m), NULL, &nat), KVL_OK);
    assert_int_equal(kvl_cache_create(kvl_model_config_get(m), NULL, &trc), KVL_OK);
    float ln[6 * 64], lt[6 * 64];
    assert_int_equal(kvl_model_prefill(m, src, ids, P, KVL_LOGITS_NONE, NULL), KVL_OK);
    assert_int_equal(kvl_translator_translate_span(tr, src, 0, 12, trc), KVL_OK);
    assert_int_equal(kvl_translator_translate_span(tr, src, 12, P, trc), KVL_OK);   /* two spans */
    assert_int_equal(kvl_model_prefill(m, trc, ids + P, C, KVL_LOGITS_ALL, lt), KVL_OK);
    assert_int_equal(kvl_model_prefill(m, nat, ids, P, KVL_LOGITS_NONE, NULL), KVL_OK);
    assert_int_equal(kvl_model_prefill(m, nat, ids + P, C, KVL_LOGITS_ALL, ln), KVL_OK);
    for (int i = 0; i < C * V; i++) assert_float_equal(lt[i], ln[i], 1e-3);
    assert_int_equal(kvl_translator_translate_span(tr, src, 0, P, trc), KVL_ERR_RANGE);
    kvl_cache_free(src); kvl_cache_free(nat); kvl_cache_free(trc);
    kvl_translator_free(tr);
}

/* Every case again on the portable form (one sgemm per layer and side, then the rows), in a
 * child process (the choice is made once a process): on an AVX-512 CPU the fused rows take every
 * span a translator applies, so the portable form runs only here. */
static void test_portable(void **state) {
    (void)state;
    if (getenv("KVL_CPU_TRANSLATE")) skip();   /* this is the child */
    int rc = kvl__test_rerun_self_with("KVL_CPU_TRANSLATE", "portable");
    if (rc != 0) fail_msg("this program run again with KVL_CPU_TRANSLATE=portable failed (status %d)", rc);
}

static void test_identity_qwen3(void **state) { identity_case(((fixture *)*state)->a); }
static void test_identity_qwen2(void **state) { identity_case(((fixture *)*state)->c); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip), cmocka_unit_test(test_wrong_pair),
        cmocka_unit_test(test_corrupt), cmocka_unit_test(test_nan_inf),
        cmocka_unit_test(test_apply_by_hand), cmocka_unit_test(test_identity_qwen3),
        cmocka_unit_test(test_identity_qwen2), cmocka_unit_test(test_taps),
        cmocka_unit_test(test_apply_fused), cmocka_unit_test(test_portable),
        cmocka_unit_test(test_apply_streamed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
