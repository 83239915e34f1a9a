/* engine/translator/translator_ridge.c: stage 1, closed-form ridge regression per target layer and side
 * from the source's pre-norm K/V to the target's (stage 1 of the KV-Lingo method, kvlingo/translator_train.h).
 *
 * With X [Ds, N] the source features and Y [Dt, N] the target features of the same N tokens,
 * W = Y X^T (X X^T + lambda I)^-1.  Only the Gram matrices G = X X^T [Ds, Ds] and
 * B = Y X^T [Dt, Ds] are kept (streamed over windows, accumulated in double), so memory does
 * not grow with N.  The solve is (G + lambda I) W^T = B^T by Cholesky (LAPACKE_dposv).
 * lambda is chosen per layer and side by the held-out squared error, which the held-out Gram
 * matrices give in closed form: ||W Xh - Yh||^2 = tr(W Gh W^T) - 2 tr(W Bh^T) + tr(Yh Yh^T). */
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "error.h"
#include "kvlingo/translator_train.h"
#include "model_iface.h"
#include "translator_internal.h"

kvl_ridge_params kvl_ridge_default_params(void) {
    kvl_ridge_params p = {.window = 256, .train_tokens = 65536, .heldout_tokens = 16384, .verbose = 0};
    return p;
}

typedef struct gram {
    double *G, *B;      /* [Lt][2 sides][Ds*Ds], [Lt][2][Dt*Ds]  (side 0 = K, 1 = V) */
    double *yy;         /* [Lt][2] sum of squared targets */
} gram;

static kvl_status gram_alloc(gram *g, int Lt, int ds, int dt) {
    g->G = calloc((size_t)Lt * 2 * ds * ds, sizeof(double));
    g->B = calloc((size_t)Lt * 2 * dt * ds, sizeof(double));
    g->yy = calloc((size_t)Lt * 2, sizeof(double));
    if (!g->G || !g->B || !g->yy) return kvl__errorf(KVL_ERR_NOMEM, "out of memory for Gram matrices");
    return KVL_OK;
}
static void gram_free(gram *g) { free(g->G); free(g->B); free(g->yy); }

/* Run both models on one window and add its tokens to g. */
static kvl_status accumulate(const kvl_translator *tr, kvl_model *src, kvl_model *dst, kvl_cache *cs,
                             kvl_cache *cd, const int32_t *ids, int W, float *Y,
                             float *tG, float *tB, float *Xsrc, float *Xall, gram *g) {
    const int Lt = tr->dst_layers, Ls = tr->src_layers, ds = kvl__tr_din(tr), dt = kvl__tr_dt(tr);
    const size_t per = (size_t)W * kvl__tr_ds(tr);
    kvl_status s;
    if ((s = kvl_cache_truncate(cs, 0)) || (s = kvl_cache_truncate(cd, 0))) return s;
    if ((s = kvl_model_prefill(src, cs, ids, W, KVL_LOGITS_NONE, NULL))) return s;
    if ((s = kvl_model_prefill(dst, cd, ids, W, KVL_LOGITS_NONE, NULL))) return s;
    /* every source layer once, [Ls][W][Hs*Ds] per side; each target layer gathers its taps */
    for (int l = 0; l < Ls; l++)
        if ((s = kvl_cache_read_prenorm(cs, l, 0, W, Xsrc + (size_t)l * per, Xsrc + (size_t)(Ls + l) * per)))
            return s;
    for (int l = 0; l < Lt; l++) {
        float *Xs[2] = {Xall, Xall + (size_t)W * ds}, *Ys[2] = {Y, Y + (size_t)W * dt};
        kvl__tr_gather(tr, l, Xsrc, W, Xs[0]);
        kvl__tr_gather(tr, l, Xsrc + (size_t)Ls * per, W, Xs[1]);
        if ((s = kvl_cache_read_prenorm(cd, l, 0, W, Ys[0], Ys[1]))) return s;
        for (int side = 0; side < 2; side++) {
            /* G += X^T X over the window's rows (X row-major [W, ds]); B += Y^T X */
            cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, ds, W, 1.0f, Xs[side], ds, 0.0f, tG, ds);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dt, ds, W, 1.0f, Ys[side], dt,
                        Xs[side], ds, 0.0f, tB, ds);
            double *G = g->G + ((size_t)l * 2 + side) * ds * ds;
            double *B = g->B + ((size_t)l * 2 + side) * dt * ds;
            for (int i = 0; i < ds; i++)
                for (int j = i; j < ds; j++) {
                    G[(size_t)i * ds + j] += tG[(size_t)i * ds + j];
                    if (j != i) G[(size_t)j * ds + i] += tG[(size_t)i * ds + j];
                }
            for (size_t i = 0; i < (size_t)dt * ds; i++) B[i] += tB[i];
            double yy = 0;
            for (size_t i = 0; i < (size_t)W * dt; i++) yy += (double)Ys[side][i] * Ys[side][i];
            g->yy[l * 2 + side] += yy;
        }
    }
    return KVL_OK;
}

/* Solve for one (layer, side) over the alpha grid; writes the best W into w_out [dt*ds]. */
static kvl_status solve_one(const double *G, const double *B, const double *Gh, const double *Bh,
                            double yyh, int ds, int dt, float *w_out, double *best_alpha,
                            double *best_rel) {
    static const double alphas[] = {1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0};
    double *A = malloc(sizeof(double) * ds * ds), *Bt = malloc(sizeof(double) * ds * dt);
    double *WH = malloc(sizeof(double) * dt * ds);
    if (!A || !Bt || !WH) {
        free(A); free(Bt); free(WH);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    }
    double trace = 0;
    for (int i = 0; i < ds; i++) trace += G[(size_t)i * ds + i];
    double scale = trace / ds > 0 ? trace / ds : 1.0;
    double best = INFINITY;
    for (size_t a = 0; a < sizeof alphas / sizeof alphas[0]; a++) {
        memcpy(A, G, sizeof(double) * ds * ds);
        for (int i = 0; i < ds; i++) A[(size_t)i * ds + i] += alphas[a] * scale;
        for (int i = 0; i < dt; i++)
            for (int j = 0; j < ds; j++) Bt[(size_t)j * dt + i] = B[(size_t)i * ds + j];
        lapack_int info = LAPACKE_dposv(LAPACK_ROW_MAJOR, 'U', ds, dt, A, ds, Bt, dt);
        if (info != 0) continue;   /* not positive definite at this lambda: try a larger one */
        /* Bt now holds W^T [ds, dt]; held-out error tr(W Gh W^T) - 2 tr(W Bh^T) + yy */
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dt, ds, ds, 1.0, Bt, dt, Gh, ds, 0.0, WH, ds);
        double e = yyh;
        for (int i = 0; i < dt; i++)
            for (int j = 0; j < ds; j++) {
                double wij = Bt[(size_t)j * dt + i];
                e += WH[(size_t)i * ds + j] * wij - 2.0 * wij * Bh[(size_t)i * ds + j];
            }
        if (e < best) {
            best = e;
            *best_alpha = alphas[a];
            for (int i = 0; i < dt; i++)
                for (int j = 0; j < ds; j++) w_out[(size_t)i * ds + j] = (float)Bt[(size_t)j * dt + i];
        }
    }
    free(A); free(Bt); free(WH);
    if (!isfinite(best))
        return kvl__errorf(KVL_ERR_NUMERIC, "ridge: the Gram matrix is not positive definite for any lambda");
    *best_rel = yyh > 0 ? sqrt(fmax(best, 0) / yyh) : 0;
    return KVL_OK;
}

kvl_status kvl_translator_fit_ridge(kvl_translator *tr, kvl_model *src, kvl_model *dst,
                                    const int32_t *stream, size_t n, const kvl_ridge_params *pp) {
    kvl_ridge_params p = pp ? *pp : kvl_ridge_default_params();
    kvl_status s = kvl_translator_check(tr, src, dst);
    if (s != KVL_OK) return s;
    const int W = p.window > 0 ? p.window : 256, Lt = tr->dst_layers;
    const int ds = kvl__tr_din(tr), dt = kvl__tr_dt(tr);
    long n_win = (long)(n / (size_t)W);
    long n_held = p.heldout_tokens / W, n_train = p.train_tokens / W;
    if (n_held < 1) n_held = 1;
    if (n_train < 1) n_train = 1;
    if (n_win < 2)
        return kvl__errorf(KVL_ERR_RANGE, "ridge: the token stream (%zu tokens) is shorter than two "
                          "windows of %d", n, W);
    if (n_held + n_train > n_win) {   /* short stream: keep a quarter held out */
        n_held = n_win / 4 > 0 ? n_win / 4 : 1;
        n_train = n_win - n_held;
    }
    gram g = {0}, h = {0};
    kvl_cache *cs = NULL, *cd = NULL;
    kvl_cache_params cp = {.max_tokens = W, .block_tokens = 16};
    float *Y = malloc(sizeof(float) * (size_t)W * dt * 2), *Xall = malloc(sizeof(float) * W * ds * 2);
    float *Xsrc = malloc(sizeof(float) * (size_t)W * kvl__tr_ds(tr) * tr->src_layers * 2);
    float *tG = malloc(sizeof(float) * ds * ds), *tB = malloc(sizeof(float) * dt * ds);
    if (!Y || !Xall || !Xsrc || !tG || !tB) s = kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    if (s == KVL_OK) s = gram_alloc(&g, Lt, ds, dt);
    if (s == KVL_OK) s = gram_alloc(&h, Lt, ds, dt);
    if (s == KVL_OK) s = kvl_model_cache_create(src, &cp, &cs);
    if (s == KVL_OK) s = kvl_model_cache_create(dst, &cp, &cd);
    for (long i = 0; s == KVL_OK && i < n_train; i++) {
        s = accumulate(tr, src, dst, cs, cd, stream + (size_t)i * W, W, Y, tG, tB, Xsrc, Xall, &g);
        if (p.verbose && (i % 32 == 31 || i == n_train - 1))
            fprintf(stderr, "stage 1: Gram matrices %ld/%ld windows\n", i + 1, n_train);
    }
    for (long i = 0; s == KVL_OK && i < n_held; i++)
        s = accumulate(tr, src, dst, cs, cd, stream + (size_t)(n_win - 1 - i) * W, W, Y, tG, tB, Xsrc, Xall, &h);
    /* solve and record the choice */
    size_t jcap = (size_t)Lt * 160 + 256, jl = 0;
    char *json = malloc(jcap);
    if (!json && s == KVL_OK) s = kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    if (s == KVL_OK)
        jl += (size_t)snprintf(json, jcap, "{\"train_tokens\":%ld,\"heldout_tokens\":%ld,\"layers\":[",
                               n_train * W, n_held * W);
    for (int l = 0; s == KVL_OK && l < Lt; l++) {
        double alpha[2] = {0, 0}, rel[2] = {0, 0};
        for (int side = 0; s == KVL_OK && side < 2; side++) {
            size_t gi = ((size_t)l * 2 + side) * ds * ds, bi = ((size_t)l * 2 + side) * dt * ds;
            float *w = side ? kvl_translator_wv(tr, l) : kvl_translator_wk(tr, l);
            s = solve_one(g.G + gi, g.B + bi, h.G + gi, h.B + bi, h.yy[l * 2 + side], ds, dt, w,
                          &alpha[side], &rel[side]);
        }
        if (s == KVL_OK)
            jl += (size_t)snprintf(json + jl, jcap - jl, "%s{\"k_alpha\":%g,\"k_rel_err\":%.4f,"
                                   "\"v_alpha\":%g,\"v_rel_err\":%.4f}", l ? "," : "", alpha[0],
                                   rel[0], alpha[1], rel[1]);
        if (s == KVL_OK && p.verbose) {
            char taps[64];
            size_t tl = 0;
            for (int j = 0; j < tr->taps && tl < sizeof taps - 12; j++)
                tl += (size_t)snprintf(taps + tl, sizeof taps - tl, j ? "+%d" : "%d",
                                       tr->layer_map[(size_t)l * tr->taps + j]);
            fprintf(stderr, "stage 1: layer %d <- source layer %s: K alpha %g held-out rel err %.4f, "
                    "V alpha %g rel err %.4f\n", l, taps, alpha[0], rel[0], alpha[1], rel[1]);
        }
    }
    if (s == KVL_OK) {
        snprintf(json + jl, jcap - jl, "]}");
        s = kvl_translator_set_meta(tr, "stage1", json);
    }
    free(json);
    free(Y); free(Xall); free(Xsrc); free(tG); free(tB);
    gram_free(&g);
    gram_free(&h);
    kvl_cache_free(cs);
    kvl_cache_free(cd);
    return s;
}
