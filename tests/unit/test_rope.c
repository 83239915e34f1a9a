/* tests/unit/test_rope.c: RoPE frequencies of every scaling type (kvlingo/rope.h) against the
 * formulas transformers publishes in modeling_rope_utils.py (_compute_default_rope_parameters,
 * _compute_linear_scaling_rope_parameters, _compute_dynamic_ntk_parameters,
 * _compute_yarn_parameters, _compute_llama3_parameters), written out here again in double
 * precision straight from those functions; plus anchor values for published configurations
 * (Llama 3.1's llama3 scaling, Qwen2.5's YaRN) computed by Python from the same formulas, and the
 * rotation angles the CPU kernels build at positions past the original context; and `dynamic`
 * through a whole (tiny random) model, below and past max_position_embeddings. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include <stdlib.h>
#include <unistd.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/rope.h"
#include "ops.h"
#include "testutil.h"

#define PI 3.14159265358979323846

/* ---- the reference formulas (double) --------------------------------------------------------- */

static void ref_default(double base, int dim, double *inv) {
    for (int i = 0; i < dim / 2; i++) inv[i] = 1.0 / pow(base, (double)(2 * i) / dim);
}

static void ref_inv_freq(const kvl_rope_params *r, int seq_len, double *inv, double *attn) {
    const int dim = r->dim, half = dim / 2;
    *attn = 1.0;
    switch (r->type) {
    case KVL_ROPE_DEFAULT: ref_default(r->theta, dim, inv); return;
    case KVL_ROPE_LINEAR:
        ref_default(r->theta, dim, inv);
        for (int i = 0; i < half; i++) inv[i] /= r->factor;
        return;
    case KVL_ROPE_DYNAMIC: {
        double M = r->max_position_embeddings, S = seq_len > M ? seq_len : M;
        double base = r->theta * pow(r->factor * S / M - (r->factor - 1), (double)dim / (dim - 2));
        ref_default(base, dim, inv);
        return;
    }
    case KVL_ROPE_YARN: {
        double orig = r->original_max_position_embeddings, base = r->theta;
        double bf = r->beta_fast > 0 ? r->beta_fast : 32, bs = r->beta_slow > 0 ? r->beta_slow : 1;
        double lo = floor(dim * log(orig / (bf * 2 * PI)) / (2 * log(base)));
        double hi = ceil(dim * log(orig / (bs * 2 * PI)) / (2 * log(base)));
        lo = lo > 0 ? lo : 0;
        hi = hi < dim - 1 ? hi : dim - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            double pos_freq = pow(base, (double)(2 * i) / dim);
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrapolation_factor = 1 - ramp;
            inv[i] = 1 / (r->factor * pos_freq) * (1 - extrapolation_factor) +
                     1 / pos_freq * extrapolation_factor;
        }
        *attn = 0.1 * log(r->factor) + 1.0;
        return;
    }
    case KVL_ROPE_LLAMA3: {
        double orig = r->original_max_position_embeddings;
        double low_wl = orig / r->low_freq_factor, high_wl = orig / r->high_freq_factor;
        ref_default(r->theta, dim, inv);
        for (int i = 0; i < half; i++) {
            double wl = 2 * PI / inv[i];
            if (wl < high_wl) continue;
            if (wl > low_wl) { inv[i] /= r->factor; continue; }
            double s = (orig / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
            inv[i] = (1 - s) * inv[i] / r->factor + s * inv[i];
        }
        return;
    }
    }
}

/* our float32 and float64 frequencies against the reference; then the CPU table's cos/sin at
 * positions through and past the original context */
static void check_type(const kvl_rope_params *r, int seq_len, const int *pos, int n_pos) {
    float f[512], fa;
    double d[512], da, ref[512], ra;
    kvl_rope_inv_freq(r, seq_len, f, &fa);
    kvl_rope_inv_freq_f64(r, seq_len, d, &da);
    ref_inv_freq(r, seq_len, ref, &ra);
    const char *name = kvl_rope_type_name(r->type);
    double worst = 0;
    for (int i = 0; i < r->dim / 2; i++) {
        double ef = fabs(f[i] - ref[i]) / ref[i], ed = fabs(d[i] - ref[i]) / ref[i];
        if (ef > worst) worst = ef;
        if (ef > 2e-6) fail_msg("%s inv_freq[%d] float32 %.9g, reference %.9g", name, i, f[i], ref[i]);
        if (ed > 1e-12) fail_msg("%s inv_freq[%d] float64 %.17g, reference %.17g", name, i, d[i], ref[i]);
    }
    if (fabs(fa - ra) > 1e-7 || fabs(da - ra) > 1e-15)
        fail_msg("%s attention factor %.9g / %.17g, reference %.17g", name, fa, da, ra);
    print_message("%-8s D=%d seq_len %d: max rel err of float32 inv_freq %.2g, attention factor %.6f\n",
                  name, r->dim, seq_len, worst, fa);
    /* the table at each position, as one call ending at that position */
    for (int k = 0; k < n_pos; k++) {
        if (r->type == KVL_ROPE_DYNAMIC) ref_inv_freq(r, pos[k] + 1, ref, &ra);
        float cs[512], sn[512];
        kvl__cpu_rope_angles(cs, sn, pos[k], r->dim, r);
        for (int i = 0; i < r->dim / 2; i++) {
            double ang = pos[k] * ref[i];
            /* float32 rounding of an angle of size |ang|: a few ulps */
            double tol = 1e-6 + 4e-7 * ang;
            if (fabs(cs[i] - ra * cos(ang)) > tol * ra || fabs(sn[i] - ra * sin(ang)) > tol * ra)
                fail_msg("%s pos %d pair %d: cos/sin %.7g %.7g, reference %.7g %.7g", name, pos[k], i,
                         cs[i], sn[i], ra * cos(ang), ra * sin(ang));
        }
    }
}

static void test_default_bit_exact(void **st) {
    (void)st;
    /* the default path is transformers' float32 expression, bit for bit */
    kvl_rope_params r = kvl_rope_default_params(1e6, 64, 32768);
    float f[32];
    kvl_rope_inv_freq(&r, 0, f, NULL);
    for (int i = 0; i < 32; i++) assert_true(f[i] == 1.0f / powf(1e6f, (float)(2 * i) / 64.0f));
    int pos[] = {0, 1, 4095, 40000};
    check_type(&r, 0, pos, 4);
}

static void test_linear(void **st) {
    (void)st;
    kvl_rope_params r = kvl_rope_default_params(1e4, 64, 4096);
    r.type = KVL_ROPE_LINEAR;
    r.factor = 4;
    int pos[] = {0, 7, 4095, 4096, 16383};
    check_type(&r, 0, pos, 5);
    float f[32];
    kvl_rope_inv_freq(&r, 0, f, NULL);
    assert_true(fabs(f[5] - 0.059284342641541386) < 1e-8);   /* Python: 1e4 ** -(10/64) / 4 */
}

static void test_dynamic(void **st) {
    (void)st;
    kvl_rope_params r = kvl_rope_default_params(1e4, 64, 4096);
    r.type = KVL_ROPE_DYNAMIC;
    r.factor = 2;
    int pos[] = {0, 100, 4095, 4096, 9999, 20000};
    check_type(&r, 0, pos, 6);        /* at or below max_position_embeddings: the default */
    check_type(&r, 10000, pos, 6);    /* seq_len 10000 > 4096: a larger base */
    float f[32], g[32];
    kvl_rope_inv_freq(&r, 10000, f, NULL);
    assert_true(fabs(f[10] - 0.03630385701404375) / 0.0363 < 2e-6);  /* Python, same formula */
    assert_true(fabs(f[31] - 3.434421394706348e-05) / 3.43e-5 < 2e-6);
    /* no change below the original context */
    kvl_rope_params d = kvl_rope_default_params(1e4, 64, 4096);
    kvl_rope_inv_freq(&r, 4000, f, NULL);
    kvl_rope_inv_freq(&d, 4000, g, NULL);
    for (int i = 0; i < 32; i++) assert_true(f[i] == g[i]);
}

static void test_yarn(void **st) {
    (void)st;
    /* Qwen2.5's long-context setting: theta 1e6, head_dim 128, factor 4 over 32768 */
    kvl_rope_params r = kvl_rope_default_params(1e6, 128, 131072);
    r.type = KVL_ROPE_YARN;
    r.factor = 4;
    r.original_max_position_embeddings = 32768;
    r.truncate = 1;
    int pos[] = {0, 1, 32767, 32768, 100000, 131071};
    check_type(&r, 0, pos, 6);
    float f[64], a;
    kvl_rope_inv_freq(&r, 0, f, &a);
    /* Python from _compute_yarn_parameters: ramp over dims [23, 40], attention 1 + 0.1 ln 4 */
    const int at[] = {0, 10, 20, 30, 40, 63};
    const double want[] = {1.0, 0.1154781984689458, 0.01333521432163324, 0.0010643609812470017,
                           4.445698525097307e-05, 3.102344401879299e-07};
    for (int k = 0; k < 6; k++) assert_true(fabs(f[at[k]] - want[k]) / want[k] < 2e-6);
    assert_true(fabs(a - 1.138629436111989) < 1e-6);
    /* the shipped qwen2-yarn: theta 1e6, head_dim 32, factor 4 over 1024 */
    kvl_rope_params q = kvl_rope_default_params(1e6, 32, 4096);
    q.type = KVL_ROPE_YARN; q.factor = 4; q.original_max_position_embeddings = 1024; q.truncate = 1;
    int qpos[] = {0, 1023, 1024, 2999, 4095};
    check_type(&q, 0, qpos, 5);
}

static void test_llama3(void **st) {
    (void)st;
    /* Llama 3.1: theta 5e5, head_dim 128, factor 8, low 1, high 4, original 8192 */
    kvl_rope_params r = kvl_rope_default_params(5e5, 128, 131072);
    r.type = KVL_ROPE_LLAMA3;
    r.factor = 8; r.low_freq_factor = 1; r.high_freq_factor = 4;
    r.original_max_position_embeddings = 8192;
    int pos[] = {0, 1, 8191, 8192, 60000, 131071};
    check_type(&r, 0, pos, 6);
    float f[64];
    kvl_rope_inv_freq(&r, 0, f, NULL);
    /* Python from _compute_llama3_parameters: 28 kept, 29..34 smoothed, 35 on divided by 8 */
    const int at[] = {0, 20, 28, 29, 31, 33, 34, 35, 36, 63};
    const double want[] = {1.0, 0.016560440080994446, 0.0032114459947525913, 0.002166570763503359,
                           0.0008567514129196321, 0.00031269375038406517, 0.00017850781276799638,
                           9.556212353964683e-05, 7.78465527393245e-05, 3.068925988914511e-07};
    for (int k = 0; k < 10; k++) assert_true(fabs(f[at[k]] - want[k]) / want[k] < 2e-6);
    /* the shipped llama3-d: Llama 3.2's parameters (factor 32, original 8192), head_dim 20 */
    kvl_rope_params d = kvl_rope_default_params(5e5, 20, 131072);
    d.type = KVL_ROPE_LLAMA3; d.factor = 32; d.low_freq_factor = 1; d.high_freq_factor = 4;
    d.original_max_position_embeddings = 8192;
    int dpos[] = {0, 8191, 8192, 5999, 100000};
    check_type(&d, 0, dpos, 5);
}

static void test_shipped_configs(void **st) {
    (void)st;
    char p[4096];
    kvl_model_config c;
    snprintf(p, sizeof p, "%s/models/llama3-d/config.json", KVL_SOURCE_DIR);
    assert_int_equal(kvl_config_load(p, &c), KVL_OK);
    assert_int_equal(c.rope.type, KVL_ROPE_LLAMA3);
    assert_true(c.rope.theta == 5e5 && c.rope.factor == 32 && c.rope.low_freq_factor == 1 &&
                c.rope.high_freq_factor == 4 && c.rope.original_max_position_embeddings == 8192);
    assert_int_equal(c.rope.dim, 20);
    snprintf(p, sizeof p, "%s/models/qwen2-yarn/config.json", KVL_SOURCE_DIR);
    assert_int_equal(kvl_config_load(p, &c), KVL_OK);
    assert_int_equal(c.rope.type, KVL_ROPE_YARN);
    assert_true(c.rope.theta == 1e6 && c.rope.factor == 4 && c.rope.original_max_position_embeddings == 1024);
    assert_true(c.rope.truncate == 1 && c.rope.beta_fast == 0 && c.rope.attention_factor == 0);
}

/* A tiny random Llama in a fresh directory; `scaling` (may be NULL) is put into its config as
 * "rope_scaling", theta overrides the base. */
static kvl_model *tiny_llama(char *dir, size_t cap, double theta, const char *scaling) {
    snprintf(dir, cap, "%s", kvl__test_tmpdir());
    assert_int_equal(kvl__test_write_tiny_model(dir, "LlamaForCausalLM", 64, 32, 2, 4, 2, 8, 48, theta, 5,
                                                NULL, NULL), 0);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *cfg = kvl__test_read_file(path, &len);
    assert_non_null(cfg);
    if (scaling) {
        char *end = strrchr(cfg, '}');
        assert_non_null(end);
        *end = '\0';
        char out[4096];
        snprintf(out, sizeof out, "%s, \"rope_scaling\": %s}", cfg, scaling);
        assert_int_equal(kvl__test_write_file(path, out, strlen(out)), 0);
    }
    free(cfg);
    kvl_model *m;
    if (kvl_model_load(dir, NULL, &m) != KVL_OK) fail_msg("load %s: %s", dir, kvl_last_error());
    return m;
}

static void rm_model(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir); unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir); unlink(p);
    rmdir(dir);
}

static void prefill_last(kvl_model *m, const int32_t *ids, int n, float *logits) {
    kvl_cache *c;
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = 2048;   /* past max_position_embeddings, as the scaling is for */
    assert_int_equal(kvl_model_cache_create(m, &cp, &c), KVL_OK);
    if (kvl_model_prefill(m, c, ids, n, KVL_LOGITS_LAST, logits) != KVL_OK)
        fail_msg("prefill %d: %s", n, kvl_last_error());
    kvl_cache_free(c);
}

/* dynamic at the model level: a prefill within max_position_embeddings (1024) is the default
 * RoPE's; a prefill of S > 1024 tokens is the default RoPE with the base transformers'
 * _compute_dynamic_ntk_parameters derives for seq_len S. */
static void test_dynamic_model(void **st) {
    (void)st;
    char da[4200], dd[4200], dt[4200];
    const double theta = 1e4, f = 2;
    const int S = 1100, M = 1024, D = 8;
    kvl_model *a = tiny_llama(da, sizeof da, theta, NULL);
    kvl_model *d = tiny_llama(dd, sizeof dd, theta, "{\"type\": \"dynamic\", \"factor\": 2.0}");
    double base = theta * pow(f * S / M - (f - 1), (double)D / (D - 2));
    kvl_model *t = tiny_llama(dt, sizeof dt, base, NULL);
    int32_t *ids = malloc(sizeof(int32_t) * S);
    float la[64], ld[64], lt[64];
    assert_non_null(ids);
    for (int i = 0; i < S; i++) ids[i] = (int32_t)((i * 7 + 3) % 63);
    prefill_last(a, ids, 600, la);
    prefill_last(d, ids, 600, ld);
    assert_memory_equal(la, ld, sizeof la);
    prefill_last(d, ids, S, ld);
    prefill_last(t, ids, S, lt);
    prefill_last(a, ids, S, la);
    double err = 0, ref = 0, moved = 0;
    for (int i = 0; i < 64; i++) {
        err = fmax(err, fabs(ld[i] - lt[i]));
        ref = fmax(ref, fabs(lt[i]));
        moved = fmax(moved, fabs(ld[i] - la[i]));
    }
    print_message("dynamic S=%d: max |logit - default(base %.6g)| / max = %.2g (default theta: %.2g)\n",
                  S, base, err / ref, moved / ref);
    assert_true(err <= 1e-4 * ref);
    assert_true(moved > 10 * err);   /* the scaling did change the logits */
    free(ids);
    kvl_model_free(a); kvl_model_free(d); kvl_model_free(t);
    rm_model(da); rm_model(dd); rm_model(dt);
}

/* The key export of a model without k_norm rotates the cached keys back with tables made once
 * per range for all layers: bit for bit what the per-position inverse gives, over ranges that
 * change between reads (the tables are rebuilt) and in any layer order.  qwen2-yarn: its
 * attention factor is not 1, so the inverse's 1/a scale is checked too. */
static void test_export_prenorm_tables(void **st) {
    (void)st;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/models/qwen2-yarn", KVL_SOURCE_DIR);
    kvl_model *m;
    if (kvl_model_load(dir, NULL, &m) != KVL_OK) fail_msg("load %s: %s", dir, kvl_last_error());
    const kvl_model_config *mc = kvl_model_config_get(m);
    assert_false(mc->qk_norm);
    const int N = 40, row = mc->n_kv_heads * mc->head_dim;
    int32_t ids[40];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 37 + 11) % 4000);
    kvl_cache *c;
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = 64;
    cp.block_tokens = 16;   /* ranges cross blocks */
    assert_int_equal(kvl_model_cache_create(m, &cp, &c), KVL_OK);
    assert_int_equal(kvl_model_prefill(m, c, ids, N, KVL_LOGITS_NONE, NULL), KVL_OK);
    float *got = malloc(sizeof(float) * (size_t)N * row), *want = malloc(sizeof(float) * (size_t)N * row);
    int *pos = malloc(sizeof(int) * (size_t)N);
    assert_non_null(got); assert_non_null(want); assert_non_null(pos);
    /* {layer, t0, t1}: a whole span layer by layer, then ranges and layers out of order */
    int reads[64][3], nr = 0;
    for (int l = 0; l < mc->n_layers; l++) reads[nr][0] = l, reads[nr][1] = 0, reads[nr++][2] = N;
    const int odd[][3] = {{1, 5, 30}, {0, 5, 30}, {1, 0, N}, {mc->n_layers - 1, 5, 30}, {0, 5, 30}, {0, 39, 40}};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) memcpy(reads[nr++], odd[i], sizeof odd[i]);
    for (int r = 0; r < nr; r++) {
        const int l = reads[r][0], t0 = reads[r][1], t1 = reads[r][2], n = t1 - t0;
        assert_int_equal(kvl_cache_read_prenorm(c, l, t0, t1, got, NULL), KVL_OK);
        assert_int_equal(kvl_cache_read_kv(c, l, t0, t1, want, NULL), KVL_OK);
        for (int i = 0; i < n; i++) pos[i] = t0 + i;
        kvl__cpu_rope_forward(want, pos, n, mc->n_kv_heads, mc->head_dim, &mc->rope, KVL_ROPE_INVERSE);
        if (memcmp(got, want, sizeof(float) * (size_t)n * row))
            fail_msg("read %d (layer %d, [%d, %d)): pre-norm keys differ from the per-position inverse",
                     r, l, t0, t1);
    }
    free(got); free(want); free(pos);
    kvl_cache_free(c);
    kvl_model_free(m);
}

/* A model's cached RoPE tables (kvl__rope_cache) give the rows kvl__cpu_rope_table computes on
 * the spot, bit for bit, for every type (dynamic included: its frequencies change only past
 * max_position_embeddings, where the tables end); spans that reach past the tables, or
 * positions not in order, are computed, and a table capped by its byte budget ends there. */
static void check_cached(const kvl_rope_params *r, int D) {
    kvl__rope_cache rc;
    kvl__rope_cache_create(r, D, &rc);
    const int half = D / 2;
    const size_t cap = KVL__ROPE_CACHE_BYTES / (sizeof(float) * 2 * (size_t)half);
    const int want_n = (size_t)r->max_position_embeddings < cap ? r->max_position_embeddings : (int)cap;
    assert_int_equal(rc.n_pos, want_n);
    const int n = 300;
    int *pos = malloc(sizeof(int) * n);
    float *a = malloc(sizeof(float) * 4 * n * half), *b = a + 2 * n * half;
    assert_non_null(pos);
    assert_non_null(a);
    /* [0, 300), the tables' last 300 rows, 300 rows ending 7 past them, scattered positions */
    const int starts[] = {0, rc.n_pos - n, rc.n_pos - n + 7, -1};
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < n; i++)
            pos[i] = starts[s] >= 0 ? starts[s] + i : (int)(((unsigned)i * 2654435761u) % (unsigned)rc.n_pos);
        kvl__cpu_rope_table_cached(&rc, a, a + n * half, pos, n, D, r);
        kvl__cpu_rope_table(b, b + n * half, pos, n, D, r);
        if (memcmp(a, b, sizeof(float) * 2 * n * half))
            fail_msg("rope type %d, D %d, start %d: cached rows differ from computed ones", r->type, D, starts[s]);
    }
    kvl__cpu_rope_table_cached(NULL, a, a + n * half, pos, n, D, r);   /* no tables: computed */
    assert_memory_equal(a, b, sizeof(float) * 2 * n * half);
    /* the tables themselves: rows [0, 300) and the last 300, as computed */
    for (int s2 = 0; s2 < 2; s2++) {
        const int p0 = s2 ? rc.n_pos - n : 0;
        for (int i = 0; i < n; i++) pos[i] = p0 + i;
        kvl__cpu_rope_table(b, b + n * half, pos, n, D, r);
        assert_memory_equal(rc.cos + (size_t)p0 * half, b, sizeof(float) * n * half);
        assert_memory_equal(rc.sin + (size_t)p0 * half, b + n * half, sizeof(float) * n * half);
    }
    assert_true(kvl__rope_cache_covers(&rc, r, D, rc.n_pos - n, n));
    assert_false(kvl__rope_cache_covers(&rc, r, D, rc.n_pos - n, n + 1));
    assert_false(kvl__rope_cache_covers(&rc, r, D + 2, 0, n));
    /* other parameters (a theta of another model of the same geometry): not these tables, and
     * a lookup computes the other model's rows */
    kvl_rope_params o = *r;
    o.theta *= 2;
    assert_false(kvl__rope_cache_covers(&rc, &o, D, 0, n));
    for (int i = 0; i < n; i++) pos[i] = i;
    kvl__cpu_rope_table_cached(&rc, a, a + n * half, pos, n, D, &o);
    kvl__cpu_rope_table(b, b + n * half, pos, n, D, &o);
    assert_memory_equal(a, b, sizeof(float) * 2 * n * half);
    free(pos);
    free(a);
    kvl__rope_cache_free(&rc);
    assert_null(rc.cos);
}

static void test_rope_cache(void **st) {
    (void)st;
    kvl_rope_params r = kvl_rope_default_params(1e6, 64, 4096);
    check_cached(&r, 64);
    r.type = KVL_ROPE_LINEAR; r.factor = 4;
    check_cached(&r, 64);
    r = kvl_rope_default_params(1e4, 64, 4096);
    r.type = KVL_ROPE_DYNAMIC; r.factor = 2;
    check_cached(&r, 64);
    r = kvl_rope_default_params(1e6, 128, 131072);   /* capped: 8 MB / (4 x 128) = 16384 rows */
    r.type = KVL_ROPE_YARN; r.factor = 4; r.original_max_position_embeddings = 32768; r.truncate = 1;
    check_cached(&r, 128);
    r = kvl_rope_default_params(5e5, 20, 131072);
    r.type = KVL_ROPE_LLAMA3; r.factor = 32; r.low_freq_factor = 1; r.high_freq_factor = 4;
    r.original_max_position_embeddings = 8192;
    check_cached(&r, 20);
    /* no max_position_embeddings: no tables, every lookup computed */
    kvl__rope_cache rc;
    r = kvl_rope_default_params(1e4, 32, 0);
    kvl__rope_cache_create(&r, 32, &rc);
    assert_int_equal(rc.n_pos, 0);
    assert_null(rc.cos);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_cache),
        cmocka_unit_test(test_default_bit_exact), cmocka_unit_test(test_linear),
        cmocka_unit_test(test_dynamic),           cmocka_unit_test(test_yarn),
        cmocka_unit_test(test_llama3),            cmocka_unit_test(test_shipped_configs),
        cmocka_unit_test(test_dynamic_model),     cmocka_unit_test(test_export_prenorm_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
