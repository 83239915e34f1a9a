/* tests/unit/test_ops_backward.c: every backward kernel of kernels/cpu/ops_backward.h against
 * central finite differences of its forward (double precision), and the float32 kernels
 * against the float64 ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ops_backward.h"

static uint64_t g_rng = 99;
static double urand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}
static double *rnd(size_t n, double scale, double offset) {
    double *p = malloc(sizeof(double) * n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * urand();
    return p;
}
static float *tof(const double *x, size_t n) {
    float *p = malloc(sizeof(float) * n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = (float)x[i];
    return p;
}

/* Loss L = sum(out * G) for a fixed random G, so dL/dout = G.  fwd(x) -> out. */
typedef void (*fwd_fn)(void *ctx, const double *x, double *out);

/* Finite-difference gradient of L w.r.t. x[n] compared with `analytic`. */
static void fd_check(const char *what, fwd_fn f, void *ctx, double *x, size_t n, size_t n_out,
                     const double *G, const double *analytic) {
    double *out = malloc(sizeof(double) * n_out);
    assert_non_null(out);
    const double h = 1e-6;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double k = x[i], lp = 0, lm = 0;
        x[i] = k + h;
        f(ctx, x, out);
        for (size_t j = 0; j < n_out; j++) lp += out[j] * G[j];
        x[i] = k - h;
        f(ctx, x, out);
        for (size_t j = 0; j < n_out; j++) lm += out[j] * G[j];
        x[i] = k;
        double fd = (lp - lm) / (2 * h), d = fd - analytic[i];
        num += d * d;
        den += fd * fd;
    }
    double rel = sqrt(num / (den > 0 ? den : 1));
    print_message("%-28s relative error %.2e\n", what, rel);
    assert_true(den > 0);
    assert_true(rel < 1e-6);
    free(out);
}

static double max_rel_diff_f(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
    return sqrt(num / (den > 0 ? den : 1));
}

/* ---- matmul ---- */
typedef struct { int T, K, N; const double *W, *b, *in; int wrt; } mm_ctx;
static void mm_fwd(void *c, const double *x, double *out) {
    mm_ctx *m = c;
    kvl__cpu_matmul_forward_f64(out, m->wrt == 0 ? x : m->in, m->wrt == 1 ? x : m->W, m->b, m->T, m->K, m->N);
}
static void test_matmul(void **state) {
    (void)state;
    int T = 5, K = 7, N = 6;
    double *in = rnd((size_t)T * K, 1, 0), *W = rnd((size_t)N * K, 1, 0), *b = rnd(N, 1, 0);
    double *G = rnd((size_t)T * N, 1, 0);
    double *din = calloc((size_t)T * K, sizeof(double)), *dW = calloc((size_t)N * K, sizeof(double));
    double *db = calloc(N, sizeof(double));
    kvl__cpu_matmul_backward_f64(din, dW, db, G, in, W, T, K, N);
    mm_ctx c = {T, K, N, W, b, in, 0};
    fd_check("matmul d input", mm_fwd, &c, in, (size_t)T * K, (size_t)T * N, G, din);
    c.wrt = 1;
    fd_check("matmul d weight", mm_fwd, &c, W, (size_t)N * K, (size_t)T * N, G, dW);
    double dbs = 0;
    for (int n = 0; n < N; n++) {
        double e = 0;
        for (int t = 0; t < T; t++) e += G[t * N + n];
        dbs += fabs(e - db[n]);
    }
    assert_true(dbs < 1e-12);
    /* float kernel agrees */
    float *fin = tof(in, (size_t)T * K), *fW = tof(W, (size_t)N * K), *fG = tof(G, (size_t)T * N);
    float *fdin = calloc((size_t)T * K, sizeof(float)), *fdW = calloc((size_t)N * K, sizeof(float));
    kvl__cpu_matmul_backward(fdin, fdW, NULL, fG, fin, fW, T, K, N);
    assert_true(max_rel_diff_f(fdin, din, (size_t)T * K) < 1e-5);
    assert_true(max_rel_diff_f(fdW, dW, (size_t)N * K) < 1e-5);
    free(in); free(W); free(b); free(G); free(din); free(dW); free(db);
    free(fin); free(fW); free(fG); free(fdin); free(fdW);
}

/* ---- rmsnorm ---- */
typedef struct { int T, C; const double *w, *in; int wrt; } rn_ctx;
static void rn_fwd(void *c, const double *x, double *out) {
    rn_ctx *r = c;
    kvl__cpu_rmsnorm_forward_f64(out, r->wrt ? r->in : x, r->wrt ? x : r->w, r->T, r->C, 1e-6);
}
static void test_rmsnorm(void **state) {
    (void)state;
    int T = 4, C = 9;
    double *in = rnd((size_t)T * C, 1, 0), *w = rnd(C, 0.3, 1), *G = rnd((size_t)T * C, 1, 0);
    double *din = calloc((size_t)T * C, sizeof(double)), *dw = calloc(C, sizeof(double));
    kvl__cpu_rmsnorm_backward_f64(din, dw, G, in, w, T, C, 1e-6);
    rn_ctx c = {T, C, w, in, 0};
    fd_check("rmsnorm d input", rn_fwd, &c, in, (size_t)T * C, (size_t)T * C, G, din);
    c.wrt = 1;
    fd_check("rmsnorm d weight", rn_fwd, &c, w, C, (size_t)T * C, G, dw);
    float *fin = tof(in, (size_t)T * C), *fw = tof(w, C), *fG = tof(G, (size_t)T * C);
    float *fdin = calloc((size_t)T * C, sizeof(float));
    kvl__cpu_rmsnorm_backward(fdin, NULL, fG, fin, fw, T, C, 1e-6f);
    assert_true(max_rel_diff_f(fdin, din, (size_t)T * C) < 1e-5);
    free(in); free(w); free(G); free(din); free(dw); free(fin); free(fw); free(fG); free(fdin);
}

/* ---- RoPE ---- */
typedef struct { int T, Hh, D; const int *pos; const kvl_rope_params *rp; } rp_ctx;
static void rp_fwd(void *c, const double *x, double *out) {
    rp_ctx *r = c;
    memcpy(out, x, sizeof(double) * (size_t)r->T * r->Hh * r->D);
    kvl__cpu_rope_forward_f64(out, r->pos, r->T, r->Hh, r->D, r->rp, KVL_ROPE_FORWARD);
}
static void test_rope(void **state) {
    (void)state;
    int T = 3, Hh = 2, D = 8, pos[3] = {0, 5, 77};
    size_t n = (size_t)T * Hh * D;
    /* default, and YaRN (its attention factor makes the gradient the transposed rotation) */
    kvl_rope_params rps[2] = {kvl_rope_default_params(10000.0, D, 4096),
                              kvl_rope_default_params(1e6, D, 64)};
    rps[1].type = KVL_ROPE_YARN; rps[1].factor = 4; rps[1].original_max_position_embeddings = 16;
    for (int k = 0; k < 2; k++) {
        double *x = rnd(n, 1, 0), *G = rnd(n, 1, 0), *d = malloc(sizeof(double) * n);
        memcpy(d, G, sizeof(double) * n);
        kvl__cpu_rope_backward_f64(d, pos, T, Hh, D, &rps[k]);
        rp_ctx c = {T, Hh, D, pos, &rps[k]};
        fd_check("rope", rp_fwd, &c, x, n, n, G, d);
        /* float forward then inverse is the identity */
        float *fx = tof(x, n), *f0 = tof(x, n);
        kvl__cpu_rope_forward(fx, pos, T, Hh, D, &rps[k], KVL_ROPE_FORWARD);
        kvl__cpu_rope_forward(fx, pos, T, Hh, D, &rps[k], KVL_ROPE_INVERSE);
        for (size_t i = 0; i < n; i++) assert_true(fabsf(fx[i] - f0[i]) < 1e-5f);
        free(x); free(G); free(d); free(fx); free(f0);
    }
}

/* ---- SwiGLU ---- */
typedef struct { size_t n; const double *g, *u; int wrt; } sw_ctx;
static void sw_fwd(void *c, const double *x, double *out) {
    sw_ctx *s = c;
    kvl__cpu_swiglu_forward_f64(out, s->wrt ? s->g : x, s->wrt ? x : s->u, s->n);
}
static void test_swiglu(void **state) {
    (void)state;
    size_t n = 17;
    double *g = rnd(n, 3, 0), *u = rnd(n, 1, 0), *G = rnd(n, 1, 0);
    double *dg = calloc(n, sizeof(double)), *du = calloc(n, sizeof(double));
    kvl__cpu_swiglu_backward_f64(dg, du, G, g, u, n);
    sw_ctx c = {n, g, u, 0};
    fd_check("swiglu d gate", sw_fwd, &c, g, n, n, G, dg);
    c.wrt = 1;
    fd_check("swiglu d up", sw_fwd, &c, u, n, n, G, du);
    float *fg = tof(g, n), *fu = tof(u, n), *fG = tof(G, n);
    float *fdg = calloc(n, sizeof(float)), *fdu = calloc(n, sizeof(float));
    kvl__cpu_swiglu_backward(fdg, fdu, fG, fg, fu, n);
    assert_true(max_rel_diff_f(fdg, dg, n) < 1e-5);
    assert_true(max_rel_diff_f(fdu, du, n) < 1e-5);
    free(g); free(u); free(G); free(dg); free(du); free(fg); free(fu); free(fG); free(fdg); free(fdu);
}

/* The float32 forward (8 lanes and a masked tail on AVX2 + FMA, plain C elsewhere) against the
 * float64 one, on lengths that end inside a vector, with gates far enough out that e^-|g|
 * underflows; and each element's value independent of where it sits (a row of a batch gets
 * the bits it gets alone), including in the masked tail. */
static void test_swiglu_forward(void **state) {
    (void)state;
    const size_t ns[] = {1, 7, 8, 9, 31, 771};
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        const size_t n = ns[c];
        double *g = rnd(n, 12, 0), *u = rnd(n, 2, 0), *want = malloc(sizeof(double) * n);
        assert_non_null(want);
        if (n > 2) { g[0] = 95.0; g[1] = -95.0; g[2] = 0.0; }
        kvl__cpu_swiglu_forward_f64(want, g, u, n);
        float *fg = tof(g, n), *fu = tof(u, n), *got = malloc(sizeof(float) * n);
        assert_non_null(got);
        kvl__cpu_swiglu_forward(got, fg, fu, n);
        for (size_t i = 0; i < n; i++)
            if (!(fabs((double)got[i] - want[i]) <= 1e-6 * fabs(want[i]) + 1e-30))
                fail_msg("swiglu n %zu [%zu]: gate %g up %g: %.9g, float64 %.9g", n, i, (double)fg[i],
                         (double)fu[i], (double)got[i], want[i]);
        for (size_t off = 1; off < 4 && off < n; off++) {   /* the same elements from offset `off` */
            float one[800];
            kvl__cpu_swiglu_forward(one, fg + off, fu + off, n - off);
            for (size_t i = off; i < n; i++)
                if (memcmp(&one[i - off], &got[i], sizeof(float)) != 0)
                    fail_msg("swiglu n %zu: element %zu gives %.9g from offset %zu, %.9g from 0", n, i,
                             (double)one[i - off], off, (double)got[i]);
        }
        free(g); free(u); free(want); free(fg); free(fu); free(got);
    }
}

/* ---- attention ---- */
typedef struct { int Tq, Tk, p0, Hq, Hkv, D; const double *q, *k, *v; int wrt; double *scr; } at_ctx;
static void at_fwd(void *c, const double *x, double *out) {
    at_ctx *a = c;
    kvl__cpu_attention_forward_f64(out, NULL, a->wrt == 0 ? x : a->q, a->wrt == 1 ? x : a->k,
                                  a->wrt == 2 ? x : a->v, a->Tq, a->Tk, a->p0, a->Hq, a->Hkv, a->D, a->scr);
}
static void test_attention(void **state) {
    (void)state;
    int Tq = 4, p0 = 5, Tk = p0 + Tq, Hq = 4, Hkv = 2, D = 6;
    size_t nq = (size_t)Tq * Hq * D, nk = (size_t)Tk * Hkv * D;
    double *q = rnd(nq, 1, 0), *k = rnd(nk, 1, 0), *v = rnd(nk, 1, 0), *G = rnd(nq, 1, 0);
    double *out = malloc(sizeof(double) * nq), *probs = malloc(sizeof(double) * (size_t)Hq * Tq * Tk);
    double *scr = malloc(sizeof(double) * (size_t)Tq * Tk);
    kvl__cpu_attention_forward_f64(out, probs, q, k, v, Tq, Tk, p0, Hq, Hkv, D, scr);
    double *dq = calloc(nq, sizeof(double)), *dk = calloc(nk, sizeof(double)), *dv = calloc(nk, sizeof(double));
    kvl__cpu_attention_backward_f64(dq, dk, dv, G, probs, q, k, v, Tq, Tk, p0, Hq, Hkv, D, scr);
    at_ctx c = {Tq, Tk, p0, Hq, Hkv, D, q, k, v, 0, scr};
    fd_check("attention d q", at_fwd, &c, q, nq, nq, G, dq);
    c.wrt = 1;
    fd_check("attention d k (cache)", at_fwd, &c, k, nk, nq, G, dk);
    c.wrt = 2;
    fd_check("attention d v (cache)", at_fwd, &c, v, nk, nq, G, dv);
    /* float: forward (ops.c, probabilities out) + backward agree with double */
    float *fq = tof(q, nq), *fk = tof(k, nk), *fv = tof(v, nk), *fG = tof(G, nq);
    float *fout = malloc(sizeof(float) * nq), *fp = malloc(sizeof(float) * (size_t)Hq * Tq * Tk);
    float *fscr = malloc(sizeof(float) * (size_t)Tq * Tk);
    float *fdq = calloc(nq, sizeof(float)), *fdk = calloc(nk, sizeof(float)), *fdv = calloc(nk, sizeof(float));
    kvl__cpu_attention_forward(fout, fp, fq, fk, fv, Tq, Tk, p0, Hq, Hkv, D, fscr);
    assert_true(max_rel_diff_f(fout, out, nq) < 1e-5);
    kvl__cpu_attention_backward(fdq, fdk, fdv, fG, fp, fq, fk, fv, Tq, Tk, p0, Hq, Hkv, D, fscr);
    assert_true(max_rel_diff_f(fdq, dq, nq) < 1e-5);
    assert_true(max_rel_diff_f(fdk, dk, nk) < 1e-5);
    assert_true(max_rel_diff_f(fdv, dv, nk) < 1e-5);
    free(q); free(k); free(v); free(G); free(out); free(probs); free(scr); free(dq); free(dk); free(dv);
    free(fq); free(fk); free(fv); free(fG); free(fout); free(fp); free(fscr); free(fdq); free(fdk); free(fdv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul), cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu), cmocka_unit_test(test_swiglu_forward),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
