/* tests/unit/test_backend.c: the conformance suite of the compute seam (kvlingo/backend.h).
 *
 * Every backend runs the same checks, through the public model/cache API and through its
 * kvl_backend_ops table directly:
 *   forward     prefill logits, cached K/V and exported pre-norm K/V against the Hugging Face
 *               golden files of qwen3-a (k_norm) and qwen2-c (no k_norm, inverse RoPE export);
 *   decode      prefill T-1 tokens + one decode step == the prefill's last row;
 *   batch       a prefill and a decode in one call == each alone;
 *   truncate    truncate + re-prefill == the first prefill;
 *   atomicity   a bad token id fails and leaves the cache as it was; a cache of another
 *               backend or geometry is refused;
 *   write/read  cache_write then cache_read returns the rows exactly, every plane (rounded to
 *               bf16 on CUDA, whose cache holds the model dtype);
 *   translate   translate-apply of random maps == a float64 reference of the method
 *               (K = RoPE(k_norm(W_K k_s)), V = W_V v_s, Kpre = W_K k_s) computed here, for
 *               qwen2-c -> qwen3-b and for llama3-d (llama3 RoPE, rotated back at export) ->
 *               qwen2-yarn (YaRN frequencies and attention factor in the target's RoPE);
 *   threads     CPU translate-apply split over the model's pool (by layers with single-threaded
 *               OpenBLAS, by rows with threaded OpenBLAS) writes the bytes of the serial loop.
 * The CPU backend runs everywhere, in float32 and with bf16 weights; the CUDA backend where a
 * GPU is present (skipped with the
 * reason otherwise), with bf16 tolerances and the ops it does not implement yet reported. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvlingo/backend.h"
#include "kvlingo/cache.h"
#include "kvlingo/kv_maps.h"
#include "kvlingo/model.h"
#include "kvlingo/safetensors.h"
#include "testutil.h"

typedef struct backend_case {
    kvl_device device;
    const char *name;
    double tol;          /* max |err| <= tol * max |ref| */
    int partial;         /* UNSUPPORTED is an accepted answer for write / translate */
    kvl_weights_dtype weights_dtype;
} backend_case;

/* cpu-bf16: the CPU backend streaming bf16 copies of the float32 models' weights, so against
 * the golden files it carries the bf16 rounding of the weights (as the CUDA case does). */
static const backend_case CASES[] = {
    {KVL_DEVICE_CPU, "cpu", 1e-4, 0, KVL_WEIGHTS_F32},
    {KVL_DEVICE_CUDA, "cuda", 3e-2, 1, KVL_WEIGHTS_AUTO},
    {KVL_DEVICE_CPU, "cpu-bf16", 3e-2, 0, KVL_WEIGHTS_BF16},
};

#define OK(x) do { kvl_status s_ = (x); if (s_ != KVL_OK) fail_msg("%s: %s", #x, kvl_last_error()); } while (0)

static void close_to(const char *what, const float *a, const float *b, size_t n, double tol) {
    double maxerr = 0, maxref = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= maxerr)) { maxerr = e; at = i; }
        if (fabs(b[i]) > maxref) maxref = fabs(b[i]);
    }
    if (!(maxerr <= tol * maxref))
        fail_msg("%s: max |err| %.3g at %zu (got %g want %g) > %.1g * max|ref| %.3g", what, maxerr,
                 at, a[at], b[at], tol, maxref);
}

/* The backend of a case, or skip the test with the reason. */
static const kvl_backend_ops *backend_or_skip(const backend_case *bc) {
    const kvl_backend_ops *ops = NULL;
    if (kvl_backend_for_device(bc->device, &ops) != KVL_OK) {
        printf("skipped: backend %s: %s\n", bc->name, kvl_last_error());
        skip();
    }
    return ops;
}

static kvl_model *load_on(const char *name, const backend_case *bc) {
    char rel[64];
    snprintf(rel, sizeof rel, "models/%s", name);
    kvl_model_params p = kvl_model_default_params();
    p.device = bc->device;
    p.weights_dtype = bc->weights_dtype;
    kvl_model *m = NULL;
    OK(kvl_model_load(kvl__test_path(rel), &p, &m));
    return m;
}

static float *golden(kvl_safetensors *st, const char *name, int64_t *n_out) {
    const kvl_st_tensor *t = kvl_safetensors_find(st, name);
    if (!t) fail_msg("golden tensor %s missing", name);
    float *buf = malloc(sizeof(float) * (size_t)t->n_elements);
    assert_non_null(buf);
    OK(kvl_st_tensor_to_f32(t, buf, (size_t)t->n_elements));
    if (n_out) *n_out = t->n_elements;
    return buf;
}

static int32_t *golden_ids(kvl_safetensors *st, int *n) {
    int64_t ne;
    float *f = golden(st, "prompt0.ids", &ne);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)ne);
    assert_non_null(ids);
    for (int64_t i = 0; i < ne; i++) ids[i] = (int32_t)f[i];
    free(f);
    *n = (int)ne;
    return ids;
}

/* ---- forward, cached and exported K/V against the golden files -------------------------------- */

static void check_forward_golden(const backend_case *bc, const char *name) {
    const kvl_backend_ops *ops = backend_or_skip(bc);
    kvl_model *m = load_on(name, bc);
    assert_ptr_equal(kvl_model_backend(m), ops);
    const kvl_model_config *c = kvl_model_config_get(m);
    char rel[80], what[160];
    snprintf(rel, sizeof rel, "models/%s/golden.safetensors", name);
    kvl_safetensors *st = NULL;
    OK(kvl_safetensors_open(kvl__test_path(rel), &st));
    int T;
    int32_t *ids = golden_ids(st, &T);
    kvl_cache *cache = NULL;
    OK(kvl_model_cache_create(m, NULL, &cache));
    float *logits = malloc(sizeof(float) * (size_t)T * c->vocab_size);
    assert_non_null(logits);
    OK(kvl_model_prefill(m, cache, ids, T, KVL_LOGITS_ALL, logits));
    float *ref = golden(st, "prompt0.logits", NULL);
    snprintf(what, sizeof what, "[%s] %s prompt0.logits", bc->name, name);
    close_to(what, logits, ref, (size_t)T * c->vocab_size, bc->tol);
    free(ref);

    const size_t KD = (size_t)c->n_kv_heads * c->head_dim;
    float *k = malloc(sizeof(float) * T * KD), *v = malloc(sizeof(float) * T * KD);
    float *kt = malloc(sizeof(float) * T * KD);
    assert_true(k && v && kt);
    for (int l = 0; l < c->n_layers; l++) {
        char nm[96];
        OK(kvl_cache_read_kv(cache, l, 0, T, k, v));
        for (int side = 0; side < 2; side++) {   /* golden [Hkv, T, D] -> ours [T, Hkv, D] */
            snprintf(nm, sizeof nm, "prompt0.layer%d.%s_cache", l, side ? "v" : "k");
            float *r = golden(st, nm, NULL);
            for (int h = 0; h < c->n_kv_heads; h++)
                for (int t = 0; t < T; t++)
                    memcpy(kt + ((size_t)t * c->n_kv_heads + h) * c->head_dim,
                           r + ((size_t)h * T + t) * c->head_dim, sizeof(float) * c->head_dim);
            snprintf(what, sizeof what, "[%s] %s %s", bc->name, name, nm);
            close_to(what, side ? v : k, kt, T * KD, bc->tol);
            free(r);
        }
        OK(kvl_cache_read_prenorm(cache, l, 0, T, k, v));
        for (int side = 0; side < 2; side++) {
            snprintf(nm, sizeof nm, "prompt0.layer%d.%s_prenorm", l, side ? "v" : "k");
            float *r = golden(st, nm, NULL);
            snprintf(what, sizeof what, "[%s] %s %s", bc->name, name, nm);
            close_to(what, side ? v : k, r, T * KD, bc->tol);
            free(r);
        }
    }
    free(k); free(v); free(kt); free(logits); free(ids);
    kvl_cache_free(cache);
    kvl_safetensors_close(st);
    kvl_model_free(m);
}

/* ---- decode, batch, truncate, atomicity ---------------------------------------------------------- */

static void check_forward_contract(const backend_case *bc) {
    backend_or_skip(bc);
    kvl_model *m = load_on("qwen3-a", bc);
    const kvl_model_config *c = kvl_model_config_get(m);
    const int V = c->vocab_size, T = 40;
    int32_t ids[40];
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 7919 + 11) % V);
    float *all = malloc(sizeof(float) * (size_t)T * V), *last = malloc(sizeof(float) * V);
    float *a1 = malloc(sizeof(float) * V), *a2 = malloc(sizeof(float) * V);
    assert_true(all && last && a1 && a2);
    kvl_cache *c1 = NULL, *c2 = NULL, *c3 = NULL;
    OK(kvl_model_cache_create(m, NULL, &c1));
    OK(kvl_model_cache_create(m, NULL, &c2));
    OK(kvl_model_cache_create(m, NULL, &c3));
    char what[96];

    /* decode: prefill T-1, decode the last == row T-1 of a full prefill */
    OK(kvl_model_prefill(m, c1, ids, T, KVL_LOGITS_ALL, all));
    OK(kvl_model_prefill(m, c2, ids, T - 1, KVL_LOGITS_NONE, NULL));
    OK(kvl_model_decode(m, c2, ids[T - 1], last));
    snprintf(what, sizeof what, "[%s] decode step vs prefill row", bc->name);
    close_to(what, last, all + (size_t)(T - 1) * V, (size_t)V, bc->tol);

    /* batch: a 5-token prefill (c3) and a decode (c2) in one call == each alone */
    kvl_batch_seq b[2] = {
        {.cache = c3, .tokens = ids, .n_tokens = 5, .logits_mode = KVL_LOGITS_LAST, .logits = a1},
        {.cache = c2, .tokens = &ids[3], .n_tokens = 1, .logits_mode = KVL_LOGITS_LAST, .logits = a2},
    };
    OK(kvl_model_forward(m, b, 2));
    assert_int_equal(kvl_cache_n_tokens(c3), 5);
    assert_int_equal(kvl_cache_n_tokens(c2), T + 1);
    snprintf(what, sizeof what, "[%s] batched prefill vs alone", bc->name);
    close_to(what, a1, all + (size_t)4 * V, (size_t)V, bc->tol);
    kvl_cache *c4 = NULL;
    OK(kvl_model_cache_create(m, NULL, &c4));
    OK(kvl_model_prefill(m, c4, ids, T, KVL_LOGITS_NONE, NULL));
    OK(kvl_model_decode(m, c4, ids[3], last));
    snprintf(what, sizeof what, "[%s] batched decode vs alone", bc->name);
    close_to(what, a2, last, (size_t)V, bc->tol);

    /* truncate + re-prefill reproduces the rows */
    OK(kvl_cache_truncate(c1, T / 2));
    assert_int_equal(kvl_cache_n_tokens(c1), T / 2);
    OK(kvl_model_prefill(m, c1, ids + T / 2, T - T / 2, KVL_LOGITS_LAST, last));
    snprintf(what, sizeof what, "[%s] truncate + re-prefill", bc->name);
    close_to(what, last, all + (size_t)(T - 1) * V, (size_t)V, bc->tol);

    /* atomicity: a bad id fails and changes nothing */
    int32_t bad[3] = {1, V + 5, 2};
    int held = kvl_cache_n_tokens(c1);
    assert_int_equal(kvl_model_prefill(m, c1, bad, 3, KVL_LOGITS_NONE, NULL), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvl_cache_n_tokens(c1), held);
    /* a cache of another geometry is refused */
    kvl_model *other = load_on("qwen3-b", bc);
    kvl_cache *co = NULL;
    OK(kvl_model_cache_create(other, NULL, &co));
    assert_int_equal(kvl_model_prefill(m, co, ids, 2, KVL_LOGITS_NONE, NULL), KVL_ERR_MISMATCH);
    assert_int_equal(kvl_cache_n_tokens(co), 0);
    /* a cache stored by another backend is refused */
    if (bc->device != KVL_DEVICE_CPU) {
        kvl_cache *ch = NULL;
        OK(kvl_cache_create(c, NULL, &ch));
        assert_int_equal(kvl_model_prefill(m, ch, ids, 2, KVL_LOGITS_NONE, NULL), KVL_ERR_MISMATCH);
        kvl_cache_free(ch);
    }
    kvl_cache_free(co);
    kvl_model_free(other);
    kvl_cache_free(c1); kvl_cache_free(c2); kvl_cache_free(c3); kvl_cache_free(c4);
    free(all); free(last); free(a1); free(a2);
    kvl_model_free(m);
}

/* ---- the table directly: write / read every plane ------------------------------------------------ */

/* f rounded to bfloat16 (nearest even) and widened back: what a bf16 cache returns. */
static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;   /* finite inputs only */
    memcpy(&f, &u, 4);
    return f;
}

static void check_write_read(const backend_case *bc) {
    const kvl_backend_ops *ops = backend_or_skip(bc);
    kvl_model *m = load_on("qwen3-a", bc);   /* k_norm model: three planes */
    const kvl_model_config *c = kvl_model_config_get(m);
    void *bm = NULL, *bcache = NULL;
    OK(ops->model_create(kvl_model_weights(m), NULL, &bm));
    OK(ops->cache_create(c, bm, 64, 16, &bcache));
    const int L = c->n_layers, n = 21, t0 = 0;
    const size_t KD = (size_t)c->n_kv_heads * c->head_dim, N = (size_t)L * n * KD;
    float *kp = malloc(sizeof(float) * N), *vv = malloc(sizeof(float) * N);
    float *kr = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * n * KD);
    assert_true(kp && vv && kr && out);
    for (size_t i = 0; i < N; i++) {
        kp[i] = (float)sin(0.1 * (double)i);
        vv[i] = (float)cos(0.07 * (double)i);
        kr[i] = (float)sin(0.03 * (double)i + 1);
    }
    kvl_status s = ops->cache_write(bcache, t0, n, kp, vv, kr);
    if (s == KVL_ERR_UNSUPPORTED && bc->partial) {
        printf("note: backend %s: cache_write not implemented yet: %s\n", bc->name, kvl_last_error());
    } else {
        OK(s);
        const float *src[3] = {kp, vv, kr};
        /* the CUDA cache stores the model dtype, bf16: rows come back rounded to nearest even */
        float *want = malloc(sizeof(float) * n * KD);
        assert_true(want != NULL);
        for (int l = 0; l < L; l++)
            for (int p = 0; p < 3; p++) {
                OK(ops->cache_read(bcache, l, (kvl_cache_plane)p, t0, n, out));
                const float *row = src[p] + (size_t)l * n * KD;
                for (size_t i = 0; i < n * KD; i++)
                    want[i] = bc->device == KVL_DEVICE_CUDA ? bf16_round(row[i]) : row[i];
                assert_memory_equal(out, want, sizeof(float) * n * KD);
            }
        free(want);
        assert_true(ops->cache_bytes(bcache) >= sizeof(float) * 3 * N);
        OK(ops->cache_truncate(bcache, n, 5));
    }
    ops->cache_free(bcache);
    ops->model_free(bm);
    free(kp); free(vv); free(kr); free(out);
    kvl_model_free(m);
}

/* ---- translate-apply against a float64 reference of the method -------------------------------- */

static void check_translate(const backend_case *bc, const char *src_name, const char *dst_name) {
    backend_or_skip(bc);
    kvl_model *ms = load_on(src_name, bc), *mt = load_on(dst_name, bc);
    const kvl_model_config *sc = kvl_model_config_get(ms), *tc = kvl_model_config_get(mt);
    kvl_kv_maps maps;
    OK(kvl_kv_maps_random(sc, tc, 7, &maps));
    const int n = 19, Ls = sc->n_layers, Lt = tc->n_layers, Ht = tc->n_kv_heads, D = tc->head_dim;
    const int ds = sc->n_kv_heads * sc->head_dim, dt = Ht * D;
    int32_t ids[19];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(100 + 13 * i);
    kvl_cache *src = NULL, *dst = NULL;
    OK(kvl_model_cache_create(ms, NULL, &src));
    OK(kvl_model_cache_create(mt, NULL, &dst));
    OK(kvl_model_prefill(ms, src, ids, n, KVL_LOGITS_NONE, NULL));
    kvl_status s = kvl_kv_maps_apply_host(&maps, mt, src, 0, n, dst);
    if (s == KVL_ERR_UNSUPPORTED && bc->partial) {
        printf("note: backend %s: translate-apply not implemented yet: %s\n", bc->name, kvl_last_error());
        assert_int_equal(kvl_cache_n_tokens(dst), 0);
    } else {
        OK(s);
        assert_int_equal(kvl_cache_n_tokens(dst), n);
        assert_memory_equal(kvl_cache_tokens(dst), ids, sizeof ids);
        float *xk = malloc(sizeof(float) * (size_t)n * ds), *xv = malloc(sizeof(float) * (size_t)n * ds);
        float *rk = malloc(sizeof(float) * (size_t)n * dt), *rv = malloc(sizeof(float) * (size_t)n * dt);
        float *rp = malloc(sizeof(float) * (size_t)n * dt);
        float *gk = malloc(sizeof(float) * (size_t)n * dt), *gv = malloc(sizeof(float) * (size_t)n * dt);
        assert_true(xk && xv && rk && rv && rp && gk && gv);
        for (int l = 0; l < Lt; l++) {
            int sl = maps.layer_map[l];
            assert_true(sl >= 0 && sl < Ls);
            OK(kvl_cache_read_prenorm(src, sl, 0, n, xk, xv));
            const float *wk = maps.wk + (size_t)l * dt * ds, *wv = maps.wv + (size_t)l * dt * ds;
            const float *kn = kvl_model_weights(mt)->layers[l].k_norm;
            double inv[512], attn;   /* the target's RoPE (kvlingo/rope.h), one call of n */
            kvl_rope_inv_freq_f64(&tc->rope, n, inv, &attn);
            for (int t = 0; t < n; t++) {
                for (int o = 0; o < dt; o++) {
                    double a = 0, b = 0;
                    for (int i = 0; i < ds; i++) {
                        a += (double)wk[(size_t)o * ds + i] * xk[(size_t)t * ds + i];
                        b += (double)wv[(size_t)o * ds + i] * xv[(size_t)t * ds + i];
                    }
                    rp[(size_t)t * dt + o] = (float)a;
                    rv[(size_t)t * dt + o] = (float)b;
                }
                for (int h = 0; h < Ht; h++) {   /* k_norm (RMSNorm over D) if any, then RoPE at t */
                    const float *x = rp + (size_t)t * dt + (size_t)h * D;
                    float *y = rk + (size_t)t * dt + (size_t)h * D;
                    double ss = 0;
                    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
                    double r = 1.0 / sqrt(ss / D + tc->rms_norm_eps);
                    double nx[256];
                    for (int i = 0; i < D; i++) nx[i] = kn ? kn[i] * (x[i] * r) : x[i];
                    for (int i = 0; i < D / 2; i++) {
                        double ang = t * inv[i], c = attn * cos(ang), sn = attn * sin(ang);
                        y[i] = (float)(nx[i] * c - nx[i + D / 2] * sn);
                        y[i + D / 2] = (float)(nx[i + D / 2] * c + nx[i] * sn);
                    }
                }
            }
            char what[96];
            OK(kvl_cache_read_kv(dst, l, 0, n, gk, gv));
            snprintf(what, sizeof what, "[%s] translated K, layer %d", bc->name, l);
            close_to(what, gk, rk, (size_t)n * dt, bc->tol);
            snprintf(what, sizeof what, "[%s] translated V, layer %d", bc->name, l);
            close_to(what, gv, rv, (size_t)n * dt, bc->tol);
            OK(kvl_cache_read_prenorm(dst, l, 0, n, gk, NULL));   /* Kpre, or K rotated back */
            snprintf(what, sizeof what, "[%s] translated Kpre, layer %d", bc->name, l);
            close_to(what, gk, rp, (size_t)n * dt, bc->tol);
        }
        /* a span that does not start where the target ends is refused, nothing written */
        assert_int_equal(kvl_kv_maps_apply_host(&maps, mt, src, 2, n, dst), KVL_ERR_RANGE);
        assert_int_equal(kvl_cache_n_tokens(dst), n);
        free(xk); free(xv); free(rk); free(rv); free(rp); free(gk); free(gv);
    }
    kvl_kv_maps_free(&maps);
    kvl_cache_free(src);
    kvl_cache_free(dst);
    kvl_model_free(ms);
    kvl_model_free(mt);
}

/* ---- translate-apply on the pool == the serial loop, bit for bit ------------------------------- */

void openblas_set_num_threads(int n);   /* OpenBLAS's own (the CPU backend's BLAS) */

/* A target model on n_threads (1: the serial loop; -1: a cache made without the model, which
 * translates on the backend's process-wide pool), translated into with OpenBLAS on blas
 * threads; every plane of every layer of the span read back into out ([Lt][3][n][dt]). */
static void translate_with_threads(const kvl_model *ms, const kvl_cache *src, const kvl_kv_maps *maps,
                                   int n_threads, int blas, int n, float *out) {
    kvl_model_params p = kvl_model_default_params();
    p.n_threads = n_threads < 0 ? 0 : n_threads;
    p.weights_dtype = KVL_WEIGHTS_F32;
    kvl_model *mt = NULL;
    OK(kvl_model_load(kvl__test_path("models/qwen3-b"), &p, &mt));
    const kvl_model_config *tc = kvl_model_config_get(mt);
    const size_t span = (size_t)n * tc->n_kv_heads * tc->head_dim;
    kvl_cache *dst = NULL;
    if (n_threads < 0) OK(kvl_cache_create(tc, NULL, &dst));
    else OK(kvl_model_cache_create(mt, NULL, &dst));
    openblas_set_num_threads(blas);
    /* two spans: the second starts mid block, after the first */
    OK(kvl_kv_maps_apply_host(maps, mt, src, 0, n - 37, dst));
    OK(kvl_kv_maps_apply_host(maps, mt, src, n - 37, n, dst));
    assert_int_equal(kvl_cache_n_tokens(dst), n);
    for (int l = 0; l < tc->n_layers; l++) {
        float *o = out + (size_t)l * 3 * span;
        OK(kvl_cache_read_kv(dst, l, 0, n, o, o + span));
        OK(kvl_cache_read_prenorm(dst, l, 0, n, o + 2 * span, NULL));
    }
    (void)ms;
    kvl_cache_free(dst);
    kvl_model_free(mt);
}

static void translate_threads(void **st) {
    (void)st;
    kvl_model *ms = load_on("qwen2-c", &CASES[0]);
    kvl_model_params p = kvl_model_default_params();
    kvl_model *probe = NULL;
    OK(kvl_model_load(kvl__test_path("models/qwen3-b"), &p, &probe));
    const kvl_model_config sc = *kvl_model_config_get(ms), tc = *kvl_model_config_get(probe);
    kvl_model_free(probe);
    kvl_kv_maps maps;
    OK(kvl_kv_maps_random(&sc, &tc, 11, &maps));
    const int n = 300;
    int32_t ids[300];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(7 + 31 * i) % sc.vocab_size;
    kvl_cache *src = NULL;
    OK(kvl_model_cache_create(ms, NULL, &src));
    OK(kvl_model_prefill(ms, src, ids, n, KVL_LOGITS_NONE, NULL));
    const size_t total = (size_t)tc.n_layers * 3 * n * tc.n_kv_heads * tc.head_dim;
    float *ref = malloc(sizeof(float) * total), *got = malloc(sizeof(float) * total);
    assert_true(ref && got);
    const int blas[] = {1, 2};   /* the layers split, then the rows split */
    for (int b = 0; b < 2; b++) {
        translate_with_threads(ms, src, &maps, 1, blas[b], n, ref);
        for (int threads = -1; threads <= 7; threads += threads < 2 ? 3 : 5) {   /* -1, 2, 7 */
            memset(got, 0xff, sizeof(float) * total);
            translate_with_threads(ms, src, &maps, threads, blas[b], n, got);   /* 7: > Lt parts */
            for (size_t i = 0; i < total; i++)
                if (memcmp(&got[i], &ref[i], sizeof(float)))
                    fail_msg("translate on %d threads (-1: no model), OpenBLAS on %d: float %zu of [layer][K,V,Kpre]"
                             "[token][dt] is %a, the serial loop's %a", threads, blas[b], i,
                             got[i], ref[i]);
        }
    }
    openblas_set_num_threads(2);
    free(ref); free(got);
    kvl_kv_maps_free(&maps);
    kvl_cache_free(src);
    kvl_model_free(ms);
}

/* ---- translate-apply into a cache of another geometry is refused ------------------------------ */

/* Maps made for qwen3-b (6 layers x 2 x 64) into a qwen3-a cache (4 x 2 x 32): the rows would be
 * written past the cache's blocks.  Refused before anything is written, by the host apply and by
 * the backend's translate_apply itself; so is a layer map naming a source layer that is not there. */
static void translate_other_geometry(void **st) {
    (void)st;
    kvl_model *ms = load_on("qwen2-c", &CASES[0]), *mt = load_on("qwen3-b", &CASES[0]);
    kvl_model *ma = load_on("qwen3-a", &CASES[0]);
    kvl_kv_maps maps;
    OK(kvl_kv_maps_random(kvl_model_config_get(ms), kvl_model_config_get(mt), 7, &maps));
    const int n = 40;
    int32_t ids[40];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(5 + i);
    kvl_cache *src = NULL, *dst = NULL, *ok = NULL;
    OK(kvl_model_cache_create(ms, NULL, &src));
    OK(kvl_model_prefill(ms, src, ids, n, KVL_LOGITS_NONE, NULL));
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = 64;
    OK(kvl_cache_create(kvl_model_config_get(ma), &cp, &dst));
    assert_int_equal(kvl_kv_maps_apply_host(&maps, mt, src, 0, n, dst), KVL_ERR_MISMATCH);
    assert_int_equal(kvl_cache_n_tokens(dst), 0);
    /* the backend's own check, for callers that reach it without the host apply's */
    const kvl_backend_ops *ops = kvl_backend_cpu();
    const size_t per = (size_t)n * maps.src_kv_heads * maps.src_head_dim * maps.src_layers;
    float *k = calloc(per, sizeof(float)), *v = calloc(per, sizeof(float));
    assert_true(k && v);
    void *raw = NULL;
    OK(ops->cache_create(kvl_model_config_get(ma), NULL, 64, 16, &raw));
    const kvl_model_config *tc = kvl_model_config_get(mt);
    kvl_translate_params tp = {&maps, NULL, tc->rms_norm_eps, tc->rope};
    void *prep = NULL;
    OK(ops->translate_prepare(NULL, &tp, &prep));
    assert_int_equal(ops->translate_apply(prep, k, v, 0, n, raw), KVL_ERR_MISMATCH);
    ops->translate_release(prep);
    assert_int_equal(ops->cache_bytes(raw), 0);
    /* the right geometry, a layer map out of range */
    OK(kvl_model_cache_create(mt, NULL, &ok));
    maps.layer_map[1] = maps.src_layers;
    assert_int_equal(kvl_kv_maps_apply_host(&maps, mt, src, 0, n, ok), KVL_ERR_MISMATCH);
    maps.layer_map[1] = -1;
    assert_int_equal(kvl_kv_maps_apply_host(&maps, mt, src, 0, n, ok), KVL_ERR_MISMATCH);
    assert_int_equal(kvl_cache_n_tokens(ok), 0);
    free(k); free(v);
    kvl_kv_maps_free(&maps);
    ops->cache_free(raw);
    kvl_cache_free(ok); kvl_cache_free(dst); kvl_cache_free(src);
    kvl_model_free(ms); kvl_model_free(mt); kvl_model_free(ma);
}

/* ---- every check on every backend ----------------------------------------------------------------- */

#define PER_BACKEND(i)                                                                           \
    static void forward_qwen3_a_##i(void **st) { (void)st; check_forward_golden(&CASES[i], "qwen3-a"); } \
    static void forward_qwen2_c_##i(void **st) { (void)st; check_forward_golden(&CASES[i], "qwen2-c"); } \
    static void contract_##i(void **st) { (void)st; check_forward_contract(&CASES[i]); }          \
    static void write_read_##i(void **st) { (void)st; check_write_read(&CASES[i]); }              \
    static void translate_##i(void **st) { (void)st; check_translate(&CASES[i], "qwen2-c", "qwen3-b"); } \
    static void translate_scaled_##i(void **st) {                                                \
        (void)st; check_translate(&CASES[i], "llama3-d", "qwen2-yarn"); }
PER_BACKEND(0)
PER_BACKEND(1)
PER_BACKEND(2)

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forward_qwen3_a_0), cmocka_unit_test(forward_qwen2_c_0),
        cmocka_unit_test(contract_0),        cmocka_unit_test(write_read_0),
        cmocka_unit_test(translate_0),       cmocka_unit_test(translate_scaled_0),
        cmocka_unit_test(forward_qwen3_a_1), cmocka_unit_test(forward_qwen2_c_1),
        cmocka_unit_test(contract_1),        cmocka_unit_test(write_read_1),
        cmocka_unit_test(translate_1),       cmocka_unit_test(translate_scaled_1),
        cmocka_unit_test(forward_qwen3_a_2), cmocka_unit_test(forward_qwen2_c_2),
        cmocka_unit_test(contract_2),        cmocka_unit_test(write_read_2),
        cmocka_unit_test(translate_2),       cmocka_unit_test(translate_scaled_2),
        cmocka_unit_test(translate_threads), cmocka_unit_test(translate_other_geometry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
