/* tests/unit/test_translator_grad.c: gradient check of stage-2 training (relative error below 1e-4).
 * On tiny random target models in double precision (with q/k norm like Qwen3, with biases and
 * no norm like Qwen2, and YaRN RoPE with one or two kv heads), the analytic gradients of the loss with respect to every entry of
 * W_K and W_V (backward through the whole frozen target, attention into the translated cache,
 * RoPE, k_norm) must match central finite differences to a relative error <= 1e-4. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "translator_internal.h"

static uint64_t g_rng;
static double urand(void) {   /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}
static double *rnd(size_t n, double scale, double offset) {
    double *p = malloc(sizeof(double) * n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * urand();
    return p;
}

typedef struct tiny {
    kvl__tnet_f64 net;
    kvl__tlayer_f64 layers[3];
    double *bufs[64];
    int nb;
} tiny;

static const double *keep(tiny *t, double *p) { t->bufs[t->nb++] = p; return p; }

/* hkv: kv heads (2: GQA, 1: MQA); yarn: YaRN RoPE, whose attention factor scales cos and sin
 * (the RoPE backward must scale by it too) */
static void tiny_init(tiny *t, int qk_norm, int bias, int hkv, int yarn) {
    memset(t, 0, sizeof *t);
    kvl_model_config *c = &t->net.cfg;
    c->n_layers = 2; c->hidden_size = 16; c->n_heads = 4; c->n_kv_heads = hkv; c->head_dim = 8;
    c->intermediate_size = 24; c->vocab_size = 40; c->rms_norm_eps = 1e-6; c->rope_theta = 10000.0;
    c->rope = kvl_rope_default_params(10000.0, 8, 4096);
    if (yarn) {
        c->rope.type = KVL_ROPE_YARN;
        c->rope.factor = 4.0;
        c->rope.original_max_position_embeddings = 1024;
        c->rope.beta_fast = 32;
        c->rope.beta_slow = 1;
        c->rope.truncate = 1;
    }
    c->qk_norm = qk_norm;
    const int H = 16, QD = 32, KD = hkv * 8, F = 24, V = 40, D = 8;
    double s = 1.0 / sqrt((double)H);
    t->net.embed = keep(t, rnd((size_t)V * H, 1.0, 0));
    t->net.final_norm = keep(t, rnd(H, 0.2, 1.0));
    t->net.lm_head = keep(t, rnd((size_t)V * H, 1.0, 0));
    for (int l = 0; l < 2; l++) {
        kvl__tlayer_f64 *w = &t->layers[l];
        w->attn_norm = keep(t, rnd(H, 0.2, 1.0));
        w->wq = keep(t, rnd((size_t)QD * H, 2 * s, 0));
        w->wk = keep(t, rnd((size_t)KD * H, 2 * s, 0));
        w->wv = keep(t, rnd((size_t)KD * H, s, 0));
        if (bias) {
            w->bq = keep(t, rnd(QD, 0.3, 0));
            w->bk = keep(t, rnd(KD, 0.3, 0));
            w->bv = keep(t, rnd(KD, 0.3, 0));
        }
        if (qk_norm) {
            w->q_norm = keep(t, rnd(D, 0.2, 1.0));
            w->k_norm = keep(t, rnd(D, 0.2, 1.0));
        }
        w->wo = keep(t, rnd((size_t)H * QD, s, 0));
        w->mlp_norm = keep(t, rnd(H, 0.2, 1.0));
        w->w_gate = keep(t, rnd((size_t)F * H, s, 0));
        w->w_up = keep(t, rnd((size_t)F * H, s, 0));
        w->w_down = keep(t, rnd((size_t)H * F, 1.0 / sqrt((double)F), 0));
    }
    t->net.layers = t->layers;
}

static void tiny_free(tiny *t) {
    for (int i = 0; i < t->nb; i++) free(t->bufs[i]);
}

static void check_case(int qk_norm, int bias, int hkv, int yarn, int Pc) {
    g_rng = 12345 + qk_norm * 7 + bias * 13 + (hkv != 2) * 17 + yarn * 19;
    tiny t;
    tiny_init(&t, qk_norm, bias, hkv, yarn);
    const int L = 2, KD = hkv * 8, ds = 12, C = 5, V = 40;
    const size_t np = (size_t)L * KD * ds;
    double *wk = rnd(np, 0.4, 0), *wv = rnd(np, 0.4, 0);
    double *xk = rnd((size_t)L * Pc * ds, 1.0, 0), *xv = rnd((size_t)L * Pc * ds, 1.0, 0);
    double *teacher = rnd((size_t)C * V, 3.0, 0);
    int32_t tokens[5] = {3, 17, 0, 39, 22};
    kvl__tsample_f64 smp = {.n_ctx = Pc, .n_read = C, .tokens = tokens, .teacher_logits = teacher,
                           .xk = xk, .xv = xv};
    kvl__tws_f64 *ws = NULL;
    assert_int_equal(kvl__tws_create_f64(&t.net.cfg, ds, Pc, C, &ws), KVL_OK);
    double *gk = calloc(np, sizeof(double)), *gv = calloc(np, sizeof(double));
    assert_non_null(gk);
    assert_non_null(gv);
    double loss = kvl__tr_step_f64(&t.net, ds, wk, wv, &smp, gk, gv, 1.0, ws, NULL);
    assert_true(isfinite(loss) && loss > 0);
    double num = 0, den = 0, worst = 0;
    const double h = 1e-5;
    for (int side = 0; side < 2; side++) {
        double *W = side ? wv : wk, *G = side ? gv : gk;
        for (size_t i = 0; i < np; i++) {
            double keepw = W[i];
            W[i] = keepw + h;
            double lp = kvl__tr_step_f64(&t.net, ds, wk, wv, &smp, NULL, NULL, 1.0, ws, NULL);
            W[i] = keepw - h;
            double lm = kvl__tr_step_f64(&t.net, ds, wk, wv, &smp, NULL, NULL, 1.0, ws, NULL);
            W[i] = keepw;
            double fd = (lp - lm) / (2 * h);
            double d = fabs(fd - G[i]);
            num += d * d;
            den += G[i] * G[i];
            double rel = d / fmax(fmax(fabs(fd), fabs(G[i])), 1e-6);
            if (rel > worst) worst = rel;
        }
    }
    double rel = sqrt(num / den);
    print_message("qk_norm=%d bias=%d kv_heads=%d yarn=%d prefix=%d: loss %.6f, |grad| %.3e, relative "
                  "error (norm) %.2e, worst element %.2e\n", qk_norm, bias, hkv, yarn, Pc, loss, sqrt(den),
                  rel, worst);
    assert_true(den > 0);
    assert_true(rel <= 1e-4);
    assert_true(worst <= 1e-4);
    kvl__tws_free_f64(ws);
    free(gk); free(gv); free(wk); free(wv); free(xk); free(xv); free(teacher);
    tiny_free(&t);
}

static void test_grad_qwen3_like(void **state) { (void)state; check_case(1, 0, 2, 0, 7); }
static void test_grad_qwen2_like(void **state) { (void)state; check_case(0, 1, 2, 0, 7); }
/* multi-query attention, YaRN, q/k norm with biases, and a one-token translated prefix */
static void test_grad_mqa_yarn_one_token(void **state) { (void)state; check_case(1, 1, 1, 1, 1); }
static void test_grad_yarn_gqa(void **state) { (void)state; check_case(0, 1, 2, 1, 6); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_qwen3_like),
        cmocka_unit_test(test_grad_qwen2_like),
        cmocka_unit_test(test_grad_mqa_yarn_one_token),
        cmocka_unit_test(test_grad_yarn_gqa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
