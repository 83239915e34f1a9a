/* tests/unit/test_cuda_parity.c: CUDA backend against the CPU path on the three shipped models.
 * Prints 'SKIPPED: no CUDA device' and passes where no GPU is usable.
 *
 * Per model and dtype (bf16 weights: tolerance 2e-2 x max|ref|; f32: 1e-4 x max|ref|):
 *   - prefill logits at every position of golden prompt0, and the K/V cache of every layer;
 *   - decode: 8 teacher-forced steps after prompt0, logits against the CPU's at each step
 *     (through the CUDA graph), and the same without the graph;
 *   - greedy continuations of the three golden prompts equal to transformers' (greedy32);
 *   - span export (read_prenorm) against the CPU cache.
 * Translation (random maps, kvlingo/kv_maps.h): CUDA fused kernel vs the host reference for
 * qwen3-a -> qwen3-b (pre-norm keys from the Kpre plane), qwen2-c -> qwen3-a (keys through the
 * inverse RoPE), qwen3-b -> qwen2-c (target without k_norm), plus an offset span.  The host
 * reference translates the source span exported from GPU memory, so only the translation is
 * compared; tolerance 3e-2 x max|ref| in bf16 (bf16 maps and outputs), 1e-4 in f32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvlingo/cache.h"
#include "kvlingo/cuda.h"
#include "kvlingo/kv_maps.h"
#include "kvlingo/model.h"
#include "kvlingo/safetensors.h"
#include "testutil.h"

static int g_fail = 0;
#define CHECK(cond, ...) do { if (!(cond)) { g_fail++; printf("FAIL %s:%d: ", __FILE__, __LINE__); \
    printf(__VA_ARGS__); printf("\n"); fflush(stdout); } } while (0)
#define OKS(call) do { kvl_status s_ = (call); if (s_ != KVL_OK) { g_fail++; \
    printf("FAIL %s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, kvl_strerror(s_), kvl_last_error()); \
    fflush(stdout); goto out; } } while (0)

static const char *MODELS[] = {"qwen3-a", "qwen3-b", "qwen2-c"};

static double rel_err(const float *a, const float *ref, size_t n) {
    double me = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]);
        if (e > me || e != e) me = e;
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    return mr > 0 ? me / mr : me;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

static int32_t *golden_ids(kvl_safetensors *st, const char *name, int *n_out) {
    const kvl_st_tensor *t = kvl_safetensors_find(st, name);
    if (!t) return NULL;
    float *f = malloc(sizeof(float) * (size_t)t->n_elements);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)t->n_elements);
    kvl_st_tensor_to_f32(t, f, (size_t)t->n_elements);
    for (int64_t i = 0; i < t->n_elements; i++) ids[i] = (int32_t)f[i];
    free(f);
    *n_out = (int)t->n_elements;
    return ids;
}

static kvl_model *load_host(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    kvl_model *m = NULL;
    if (kvl_model_load(kvl__test_path(rel), NULL, &m) != KVL_OK) printf("load %s: %s\n", name, kvl_last_error());
    return m;
}

static void model_parity(const char *name, kvl_cuda_dtype dt) {
    const double tol = dt == KVL_CUDA_F32 ? 1e-4 : 2e-2;
    const char *dn = dt == KVL_CUDA_F32 ? "f32" : "bf16";
    kvl_model *hm = load_host(name);
    kvl_safetensors *st = NULL;
    kvl_cuda_model *cm = NULL, *cm_nograph = NULL;
    kvl_cache *hc = NULL;
    kvl_cuda_cache *cc = NULL, *cc2 = NULL;
    float *hl = NULL, *cl = NULL, *hk = NULL, *ck = NULL;
    int32_t *ids = NULL;
    if (!hm) { g_fail++; return; }
    const kvl_model_config *c = kvl_model_config_get(hm);
    const int V = c->vocab_size;
    const size_t kd = (size_t)c->n_kv_heads * c->head_dim;
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", kvl_model_dir(hm));
    OKS(kvl_safetensors_open(gpath, &st));
    kvl_cuda_params cp = kvl_cuda_default_params();
    cp.dtype = dt;
    OKS(kvl_cuda_model_create(kvl_model_weights(hm), &cp, &cm));
    cp.use_graph = 0;
    OKS(kvl_cuda_model_create(kvl_model_weights(hm), &cp, &cm_nograph));
    int T;
    ids = golden_ids(st, "prompt0.ids", &T);
    CHECK(ids != NULL, "prompt0.ids");
    if (!ids) goto out;
    const int STEPS = 8;
    hl = malloc(sizeof(float) * (size_t)T * V);
    cl = malloc(sizeof(float) * (size_t)T * V);
    hk = malloc(sizeof(float) * (size_t)(T + STEPS) * kd);
    ck = malloc(sizeof(float) * (size_t)(T + STEPS) * kd);
    OKS(kvl_cache_create(c, NULL, &hc));
    OKS(kvl_cuda_cache_create(cm, T + 64, &cc));
    OKS(kvl_cuda_cache_create(cm_nograph, T + 64, &cc2));
    OKS(kvl_model_prefill(hm, hc, ids, T, KVL_LOGITS_ALL, hl));
    int32_t am = -1;
    OKS(kvl_cuda_prefill(cm, cc, ids, T, KVL_LOGITS_ALL, cl, &am));
    double e = rel_err(cl, hl, (size_t)T * V);
    printf("%s %s prefill logits [%d x %d]: max rel err %.3g\n", name, dn, T, V, e);
    CHECK(e <= tol, "%s %s prefill logits err %.3g > %.1g", name, dn, e, tol);
    CHECK(am == argmax(hl + (size_t)(T - 1) * V, V), "%s %s prefill argmax %d vs cpu %d", name, dn, am,
          argmax(hl + (size_t)(T - 1) * V, V));
    OKS(kvl_cuda_prefill(cm_nograph, cc2, ids, T, KVL_LOGITS_NONE, NULL, NULL));
    /* decode, teacher-forced on the CPU's greedy tokens */
    int32_t tok = argmax(hl + (size_t)(T - 1) * V, V);
    double ed = 0, ed2 = 0;
    for (int s = 0; s < STEPS; s++) {
        int32_t a1 = -1, a2 = -1;
        OKS(kvl_model_decode(hm, hc, tok, hl));
        OKS(kvl_cuda_decode(cm, cc, tok, cl, &a1));
        ed = fmax(ed, rel_err(cl, hl, V));
        CHECK(a1 == argmax(cl, V), "decode argmax kernel %d vs host argmax %d", a1, argmax(cl, V));
        OKS(kvl_cuda_decode(cm_nograph, cc2, tok, cl, &a2));
        ed2 = fmax(ed2, rel_err(cl, hl, V));
        tok = argmax(hl, V);
    }
    printf("%s %s decode logits (%d steps): max rel err %.3g (graph), %.3g (no graph)\n", name, dn,
           STEPS, ed, ed2);
    CHECK(ed <= tol && ed2 <= tol, "%s %s decode logits err %.3g / %.3g > %.1g", name, dn, ed, ed2, tol);
    /* caches after prefill + decode, every layer */
    int Tn = T + STEPS;
    double ek = 0, ev = 0, ep = 0;
    for (int l = 0; l < c->n_layers; l++) {
        OKS(kvl_cache_read_kv(hc, l, 0, Tn, hk, NULL));
        OKS(kvl_cuda_cache_read_kv(cc, l, 0, Tn, ck, NULL));
        ek = fmax(ek, rel_err(ck, hk, Tn * kd));
        OKS(kvl_cache_read_kv(hc, l, 0, Tn, NULL, hk));
        OKS(kvl_cuda_cache_read_kv(cc, l, 0, Tn, NULL, ck));
        ev = fmax(ev, rel_err(ck, hk, Tn * kd));
        OKS(kvl_cache_read_prenorm(hc, l, 0, Tn, hk, NULL));
        OKS(kvl_cuda_cache_read_prenorm(cc, l, 0, Tn, ck, NULL));
        ep = fmax(ep, rel_err(ck, hk, Tn * kd));
    }
    printf("%s %s cache: K %.3g, V %.3g, pre-norm K %.3g (max rel err over layers)\n", name, dn, ek, ev, ep);
    double ctol = dt == KVL_CUDA_F32 ? 1e-4 : 3e-2;
    CHECK(ek <= ctol && ev <= ctol && ep <= ctol, "%s %s cache err K %.3g V %.3g Kpre %.3g > %.1g", name,
          dn, ek, ev, ep, ctol);
    /* greedy continuations of the golden prompts, as transformers generated them */
    for (int p = 0; p < 3; p++) {
        char nm[64];
        int Tp, n_ref;
        snprintf(nm, sizeof nm, "prompt%d.ids", p);
        int32_t *pid = golden_ids(st, nm, &Tp);
        snprintf(nm, sizeof nm, "prompt%d.greedy32", p);
        int32_t *ref = golden_ids(st, nm, &n_ref);
        kvl_cuda_cache *gc = NULL;
        int32_t out[32];
        int n = 0, same = 1;
        if (!pid || !ref || kvl_cuda_cache_create(cm, Tp + 40, &gc) != KVL_OK) {
            CHECK(0, "greedy setup %s prompt%d", name, p);
        } else if (kvl_cuda_prefill(cm, gc, pid, Tp, KVL_LOGITS_NONE, NULL, &out[0]) == KVL_OK) {
            n = 1;
            while (n < 32 && !kvl_model_is_eos(hm, out[n - 1])) {
                if (kvl_cuda_decode(cm, gc, out[n - 1], NULL, &out[n]) != KVL_OK) break;
                n++;
            }
            same = n == n_ref;
            for (int i = 0; same && i < n; i++) same = out[i] == ref[i];
            printf("%s %s greedy prompt%d: %d tokens, %s transformers\n", name, dn, p, n,
                   same ? "equal to" : "DIFFERENT from");
            CHECK(same, "%s %s greedy prompt%d differs", name, dn, p);
        }
        kvl_cuda_cache_free(gc);
        free(pid);
        free(ref);
    }
out:
    free(hl); free(cl); free(hk); free(ck); free(ids);
    kvl_cuda_cache_free(cc);
    kvl_cuda_cache_free(cc2);
    kvl_cache_free(hc);
    kvl_cuda_model_free(cm);
    kvl_cuda_model_free(cm_nograph);
    kvl_safetensors_close(st);
    kvl_model_free(hm);
}

/* Span [t0, T) of src translated into dst (which holds t0 native tokens), CUDA vs host. */
static void translate_parity(const char *sname, const char *tname, int t0, kvl_cuda_dtype dt) {
    const double tol = dt == KVL_CUDA_F32 ? 1e-4 : 3e-2;
    const char *dn = dt == KVL_CUDA_F32 ? "f32" : "bf16";
    kvl_model *hs = load_host(sname), *ht = load_host(tname);
    kvl_cuda_model *cs = NULL, *ct = NULL;
    kvl_cache *hsc = NULL, *htc = NULL;
    kvl_cuda_cache *csc = NULL, *ctc = NULL;
    kvl_cuda_translator *tr = NULL;
    kvl_kv_maps mp = {0};
    float *a = NULL, *b = NULL;
    if (!hs || !ht) { g_fail++; goto out; }
    const kvl_model_config *sc = kvl_model_config_get(hs), *tc = kvl_model_config_get(ht);
    const int T = 37;
    int32_t ids[37];
    for (int i = 0; i < T; i++) ids[i] = (i * 211 + 13) % sc->vocab_size;
    kvl_cuda_params cp = kvl_cuda_default_params();
    cp.dtype = dt;
    OKS(kvl_cuda_model_create(kvl_model_weights(hs), &cp, &cs));
    OKS(kvl_cuda_model_create(kvl_model_weights(ht), &cp, &ct));
    OKS(kvl_kv_maps_random(sc, tc, 11, &mp));
    OKS(kvl_cuda_translator_create(&mp, sc, ct, &tr));
    OKS(kvl_cache_create(sc, NULL, &hsc));
    OKS(kvl_cache_create(tc, NULL, &htc));
    OKS(kvl_cuda_cache_create(cs, T, &csc));
    OKS(kvl_cuda_cache_create(ct, T + 4, &ctc));
    OKS(kvl_cuda_prefill(cs, csc, ids, T, KVL_LOGITS_NONE, NULL, NULL));
    {
        /* the host reference reads the very span the GPU holds (exported from GPU memory), so
         * the comparison measures the translation alone, not the source model's bf16 drift */
        const size_t ks = (size_t)sc->n_kv_heads * sc->head_dim, Ls = sc->n_layers;
        float *kp = malloc(sizeof(float) * Ls * T * ks), *vv = malloc(sizeof(float) * Ls * T * ks);
        float *kq = malloc(sizeof(float) * Ls * T * ks);
        kvl_status es = kp && vv && kq ? KVL_OK : KVL_ERR_NOMEM;
        for (size_t l = 0; l < Ls && es == KVL_OK; l++) {
            es = kvl_cuda_cache_read_kv(csc, (int)l, 0, T, kp + l * T * ks, vv + l * T * ks);
            if (es == KVL_OK) es = kvl_cuda_cache_read_prenorm(csc, (int)l, 0, T, kq + l * T * ks, NULL);
        }
        if (es == KVL_OK) es = kvl_cache_append(hsc, T, ids, kp, vv, sc->qk_norm ? kq : NULL);
        free(kp); free(vv); free(kq);
        OKS(es);
    }
    if (t0 > 0) {
        OKS(kvl_model_prefill(ht, htc, ids, t0, KVL_LOGITS_NONE, NULL));
        OKS(kvl_cuda_prefill(ct, ctc, ids, t0, KVL_LOGITS_NONE, NULL, NULL));
    }
    OKS(kvl_kv_maps_apply_host(&mp, ht, hsc, t0, T, htc));
    size_t bytes = 0;
    OKS(kvl_cuda_translate(tr, csc, t0, T, ctc, &bytes));
    CHECK(kvl_cuda_cache_n_tokens(ctc) == T, "target holds %d", kvl_cuda_cache_n_tokens(ctc));
    CHECK(kvl_cuda_translate(tr, csc, 0, 3, ctc, NULL) == KVL_ERR_RANGE, "misplaced span accepted");
    const size_t kt = (size_t)tc->n_kv_heads * tc->head_dim;
    a = malloc(sizeof(float) * T * kt);
    b = malloc(sizeof(float) * T * kt);
    double ek = 0, ev = 0, ep = 0;
    for (int l = 0; l < tc->n_layers; l++) {
        OKS(kvl_cache_read_kv(htc, l, t0, T, a, NULL));
        OKS(kvl_cuda_cache_read_kv(ctc, l, t0, T, b, NULL));
        ek = fmax(ek, rel_err(b, a, (T - t0) * kt));
        OKS(kvl_cache_read_kv(htc, l, t0, T, NULL, a));
        OKS(kvl_cuda_cache_read_kv(ctc, l, t0, T, NULL, b));
        ev = fmax(ev, rel_err(b, a, (T - t0) * kt));
        OKS(kvl_cache_read_prenorm(htc, l, t0, T, a, NULL));
        OKS(kvl_cuda_cache_read_prenorm(ctc, l, t0, T, b, NULL));
        ep = fmax(ep, rel_err(b, a, (T - t0) * kt));
    }
    printf("translate %s -> %s %s span [%d, %d): K %.3g, V %.3g, pre-norm K %.3g; %zu bytes\n", sname,
           tname, dn, t0, T, ek, ev, ep, bytes);
    CHECK(ek <= tol && ev <= tol && ep <= tol, "translate %s -> %s %s: K %.3g V %.3g Kpre %.3g > %.1g",
          sname, tname, dn, ek, ev, ep, tol);
out:
    free(a); free(b);
    kvl_kv_maps_free(&mp);
    kvl_cuda_translator_free(tr);
    kvl_cuda_cache_free(csc);
    kvl_cuda_cache_free(ctc);
    kvl_cache_free(hsc);
    kvl_cache_free(htc);
    kvl_cuda_model_free(cs);
    kvl_cuda_model_free(ct);
    kvl_model_free(hs);
    kvl_model_free(ht);
}

int main(void) {
    int n = 0;
    kvl_status s = kvl_cuda_probe(&n);
    if (s != KVL_OK) {
        printf("SKIPPED: no CUDA device (%s: %s)\n", kvl_strerror(s), kvl_last_error());
        return 0;
    }
    char name[256];
    kvl_cuda_device_name(name, sizeof name, NULL);
    printf("device: %s (%d visible)\n", name, n);
    for (int d = 0; d < 2; d++) {
        kvl_cuda_dtype dt = d ? KVL_CUDA_F32 : KVL_CUDA_BF16;
        for (int i = 0; i < 3; i++) model_parity(MODELS[i], dt);
        translate_parity("qwen3-a", "qwen3-b", 0, dt);
        translate_parity("qwen2-c", "qwen3-a", 0, dt);
        translate_parity("qwen3-b", "qwen2-c", 0, dt);
        translate_parity("qwen2-c", "qwen3-b", 11, dt);
    }
    printf("%s: %d failure(s)\n", g_fail ? "FAILED" : "OK", g_fail);
    return g_fail ? 1 : 0;
}
