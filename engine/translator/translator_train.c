/* engine/translator/translator_train.c: stage 2, distillation of W_K, W_V with the target frozen
 * (stage 2 of the KV-Lingo method, kvlingo/translator_train.h).  Sampling, teacher and student passes, AdamW
 * with warm-up + cosine decay, gradient clipping, worker threads, checkpoints.  The per-sample
 * forward/backward is translator_core.inc. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops.h"
#include "clock.h"
#include "error.h"
#include "rng.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/translator_train.h"
#include "model_iface.h"
#include "translator_internal.h"

kvl_train_params kvl_train_default_params(void) {
    kvl_train_params p = {.steps = 400, .batch = 16, .prefix_min = 32, .prefix_max = 256,
                          .cont_len = 64, .lr = 1e-3, .min_lr_frac = 0.1, .warmup = -1,
                          .weight_decay = 0.0, .beta1 = 0.9, .beta2 = 0.999, .adam_eps = 1e-8,
                          .clip = 1.0, .seed = 1, .threads = 1, .checkpoint_every = 50,
                          .per_window = 1};
    return p;
}

/* Training samples come from splitmix64 (rng.h), whose state is one integer, so step s's
 * samples depend only on (seed, s). */

typedef struct sample_ref { size_t offset; int prefix; } sample_ref;

typedef struct worker {
    kvl_model *src, *dst;
    int owns_models;
    kvl_cache *cs, *cd;
    const kvl__tnet_f32 *net;   /* the target model's own host weights */
    kvl__tws_f32 *ws;
    float *xk, *xv;          /* [Lt][Pmax][T*Hs*Ds] the maps' inputs */
    float *xs;               /* [2][Ls][Pmax][Hs*Ds] source pre-norm K, V of every layer */
    float *teacher;          /* [Pmax - Pmin + C, V] teacher logits of a window */
    float *gk, *gv;          /* [Lt][Dt][Ds] gradient accumulators */
    /* job of the current step */
    const kvl_translator *tr;
    const int32_t *stream;
    const sample_ref *samples;
    int n_samples, per_window, stride, first, cont;
    double grad_scale;
    double loss_sum;
    long tokens;
    kvl_status status;
    /* the failure's message: kvl_last_error() is per thread, so a worker's is copied here for
     * the calling thread to report */
    char errmsg[512];
} worker;

static void worker_free(worker *w) {
    kvl_cache_free(w->cs);
    kvl_cache_free(w->cd);
    kvl__tws_free_f32(w->ws);
    free(w->xk); free(w->xv); free(w->xs); free(w->teacher); free(w->gk); free(w->gv);
    if (w->owns_models) {
        kvl_model_free(w->src);
        kvl_model_free(w->dst);
    }
}

static kvl_status worker_init(worker *w, const kvl_translator *tr, kvl_model *src, kvl_model *dst,
                              int copy, const kvl_train_params *p) {
    memset(w, 0, sizeof *w);
    kvl_status s;
    if (copy) {
        kvl_model_params mp = {.n_threads = 1};
        w->owns_models = 1;
        if ((s = kvl_model_load(kvl_model_dir(src), &mp, &w->src))) return s;
        if ((s = kvl_model_load(kvl_model_dir(dst), &mp, &w->dst))) return s;
    } else {
        w->src = src;
        w->dst = dst;
    }
    int Pmax = p->prefix_max, C = p->cont_len, Lt = tr->dst_layers, ds = kvl__tr_din(tr);
    kvl_cache_params cp = {.max_tokens = Pmax + C, .block_tokens = 16};
    if ((s = kvl_model_cache_create(w->src, &cp, &w->cs))) return s;
    if ((s = kvl_model_cache_create(w->dst, &cp, &w->cd))) return s;
    w->net = kvl_model_weights(w->dst);
    if ((s = kvl__tws_create_f32(kvl_model_config_get(w->dst), ds, Pmax, C, &w->ws))) return s;
    size_t np = (size_t)Lt * kvl__tr_dt(tr) * ds;
    w->xk = malloc(sizeof(float) * (size_t)Lt * Pmax * ds);
    w->xv = malloc(sizeof(float) * (size_t)Lt * Pmax * ds);
    w->xs = malloc(sizeof(float) * 2 * (size_t)tr->src_layers * Pmax * kvl__tr_ds(tr));
    w->teacher = malloc(sizeof(float) * (size_t)(Pmax - p->prefix_min + C) * kvl_model_config_get(w->dst)->vocab_size);
    w->gk = malloc(sizeof(float) * np);
    w->gv = malloc(sizeof(float) * np);
    if (!w->xk || !w->xv || !w->xs || !w->teacher || !w->gk || !w->gv)
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory for a training worker");
    return KVL_OK;
}

/* One window: samples r[0..k) share the stream offset (and differ in prefix length).  The
 * models are causal, so one teacher pass over the window (logits from the shortest prefix on)
 * and one source pass over the longest prefix serve every sample of the window; then each
 * sample's student forward + backward (gradients into w->gk/gv). */
static kvl_status run_window(worker *w, const sample_ref *r, int k) {
    const kvl_translator *tr = w->tr;
    const int C = w->cont, Lt = tr->dst_layers, Ls = tr->src_layers, ds = kvl__tr_din(tr), V = kvl_model_config_get(w->dst)->vocab_size;
    const int32_t *ids = w->stream + r[0].offset;
    int pmin = r[0].prefix, pmax = r[0].prefix;
    for (int j = 1; j < k; j++) {
        if (r[j].prefix < pmin) pmin = r[j].prefix;
        if (r[j].prefix > pmax) pmax = r[j].prefix;
    }
    kvl_status s;
    /* teacher: the target reads the window natively; logits at positions pmin..pmax+C-1 */
    if ((s = kvl_cache_truncate(w->cd, 0))) return s;
    if ((s = kvl_model_prefill(w->dst, w->cd, ids, pmin, KVL_LOGITS_NONE, NULL))) return s;
    if ((s = kvl_model_prefill(w->dst, w->cd, ids + pmin, pmax - pmin + C, KVL_LOGITS_ALL, w->teacher)))
        return s;
    /* source: prefill of the longest prefix */
    if ((s = kvl_cache_truncate(w->cs, 0))) return s;
    if ((s = kvl_model_prefill(w->src, w->cs, ids, pmax, KVL_LOGITS_NONE, NULL))) return s;
    w->tokens += 2L * pmax + C;
    for (int j = 0; j < k; j++) {
        const int P = r[j].prefix;
        /* pre-norm K/V of every source layer, tokens [0, P); each target layer gathers its taps */
        const size_t per = (size_t)P * kvl__tr_ds(tr);
        for (int l = 0; l < Ls; l++)
            if ((s = kvl_cache_read_prenorm(w->cs, l, 0, P, w->xs + (size_t)l * per,
                                            w->xs + (size_t)(Ls + l) * per)))
                return s;
        for (int l = 0; l < Lt; l++) {
            kvl__tr_gather(tr, l, w->xs, P, w->xk + (size_t)l * P * ds);
            kvl__tr_gather(tr, l, w->xs + (size_t)Ls * per, P, w->xv + (size_t)l * P * ds);
        }
        kvl__tsample_f32 smp = {.n_ctx = P, .n_read = C, .tokens = ids + P,
                               .teacher_logits = w->teacher + (size_t)(P - pmin) * V,
                               .xk = w->xk, .xv = w->xv};
        double loss = kvl__tr_step_f32(w->net, ds, tr->wk, tr->wv, &smp, w->gk, w->gv, w->grad_scale,
                                      w->ws, NULL);
        if (!isfinite(loss))
            return kvl__errorf(KVL_ERR_NUMERIC, "the loss of the sample at stream offset %zu (prefix %d) "
                              "is %g", r[j].offset, P, loss);
        w->loss_sum += loss;
        w->tokens += 2L * C;   /* student forward + backward */
    }
    return KVL_OK;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    size_t np = (size_t)w->tr->dst_layers * kvl__tr_dt(w->tr) * kvl__tr_din(w->tr);
    memset(w->gk, 0, sizeof(float) * np);
    memset(w->gv, 0, sizeof(float) * np);
    w->loss_sum = 0;
    w->tokens = 0;
    w->status = KVL_OK;
    /* windows g = first, first + stride, ... of per_window samples each */
    int nwin = w->n_samples / w->per_window;
    for (int g = w->first; g < nwin && w->status == KVL_OK; g += w->stride)
        w->status = run_window(w, &w->samples[g * w->per_window], w->per_window);
    if (w->status != KVL_OK) snprintf(w->errmsg, sizeof w->errmsg, "%s", kvl_last_error());
    return NULL;
}

/* ---- checkpoints: maps + AdamW moments + step, as safetensors ----------------------------- */

/* What a checkpoint must share with the run resuming it, beyond the seed, for the resumed run to
 * repeat the uninterrupted one: the pair (model hashes), the layout of the maps (layer map and
 * taps: two layouts can have the same number of weights) and how samples are drawn. */
typedef struct ckpt_ident {
    char layer_map[4096];   /* "0,1,1,2" or "0+1,1+2" as in the translator file; cut when longer */
    char sampling[160];
    const char *source_hash, *target_hash;
} ckpt_ident;

static void ckpt_ident_of(ckpt_ident *id, const kvl_translator *tr, const kvl_model *src,
                          const kvl_model *dst, const kvl_train_params *p) {
    size_t len = 0;
    id->layer_map[0] = 0;
    for (int l = 0; l < tr->dst_layers && len < sizeof id->layer_map - 24; l++)
        for (int j = 0; j < tr->taps && len < sizeof id->layer_map - 24; j++)
            len += (size_t)snprintf(id->layer_map + len, sizeof id->layer_map - len,
                                    j ? "+%d" : (l ? ",%d" : "%d"), tr->layer_map[(size_t)l * tr->taps + j]);
    snprintf(id->sampling, sizeof id->sampling, "batch %d, per_window %d, prefix %d..%d, continuation %d",
             p->batch, p->per_window, p->prefix_min, p->prefix_max, p->cont_len);
    id->source_hash = kvl_model_hash(src);
    id->target_hash = kvl_model_hash(dst);
}

static kvl_status save_checkpoint(const char *path, const kvl_translator *tr, const float *m,
                                  const float *v, int step, uint64_t seed, const ckpt_ident *id) {
    size_t np = (size_t)tr->dst_layers * kvl__tr_dt(tr) * kvl__tr_din(tr);
    kvl_st_write_tensor ts[6] = {
        {"wk", KVL_DTYPE_F32, 1, {(int64_t)np}, tr->wk, np * 4},
        {"wv", KVL_DTYPE_F32, 1, {(int64_t)np}, tr->wv, np * 4},
        {"adam_m.k", KVL_DTYPE_F32, 1, {(int64_t)np}, m, np * 4},
        {"adam_m.v", KVL_DTYPE_F32, 1, {(int64_t)np}, m + np, np * 4},
        {"adam_v.k", KVL_DTYPE_F32, 1, {(int64_t)np}, v, np * 4},
        {"adam_v.v", KVL_DTYPE_F32, 1, {(int64_t)np}, v + np, np * 4},
    };
    char sstep[32], sseed[32];
    snprintf(sstep, sizeof sstep, "%d", step);
    snprintf(sseed, sizeof sseed, "%llu", (unsigned long long)seed);
    const char *keys[] = {"format", "step", "seed", "source_hash", "target_hash", "layer_map", "sampling"};
    const char *vals[] = {"kvlingo-translator-checkpoint-1", sstep, sseed, id->source_hash,
                          id->target_hash, id->layer_map, id->sampling};
    return kvl_safetensors_write(path, ts, 6, keys, vals, 7);
}

/* The identity keys of a checkpoint must equal this run's; a checkpoint written before they
 * were recorded lacks them and is taken on its seed and tensor sizes alone. */
static kvl_status check_ident(const kvl_safetensors *st, const char *path, const ckpt_ident *id) {
    static const char *const keys[] = {"source_hash", "target_hash", "layer_map", "sampling"};
    static const char *const what[] = {"source model (hash)", "target model (hash)", "layer map",
                                       "sampling"};
    const char *want[] = {id->source_hash, id->target_hash, id->layer_map, id->sampling};
    for (int i = 0; i < 4; i++) {
        const char *have = kvl_safetensors_metadata(st, keys[i]);
        if (have && strcmp(have, want[i]))
            return kvl__errorf(KVL_ERR_MISMATCH, "%s: the checkpoint's %s is %s, this run's is %s: "
                              "not a checkpoint of this run", path, what[i], have, want[i]);
    }
    return KVL_OK;
}

static kvl_status load_checkpoint(const char *path, kvl_translator *tr, float *m, float *v,
                                  int *step, uint64_t seed, int steps, const ckpt_ident *id) {
    kvl_safetensors *st = NULL;
    kvl_status s = kvl_safetensors_open(path, &st);
    if (s) return s;
    size_t np = (size_t)tr->dst_layers * kvl__tr_dt(tr) * kvl__tr_din(tr);
    const char *names[6] = {"wk", "wv", "adam_m.k", "adam_m.v", "adam_v.k", "adam_v.v"};
    float *dst[6] = {tr->wk, tr->wv, m, m + np, v, v + np};
    kvl__tr_maps_changed(tr);
    const char *fmt = kvl_safetensors_metadata(st, "format"), *sstep = kvl_safetensors_metadata(st, "step");
    const char *sseed = kvl_safetensors_metadata(st, "seed");
    if (!fmt || strcmp(fmt, "kvlingo-translator-checkpoint-1") || !sstep || !sseed)
        s = kvl__errorf(KVL_ERR_FORMAT, "%s: not a translator training checkpoint", path);
    else if (strtoull(sseed, NULL, 10) != seed)
        s = kvl__errorf(KVL_ERR_MISMATCH, "%s: checkpoint was written with seed %s, this run uses %llu",
                       path, sseed, (unsigned long long)seed);
    else
        s = check_ident(st, path, id);
    for (int i = 0; s == KVL_OK && i < 6; i++) {
        const kvl_st_tensor *t = kvl_safetensors_find(st, names[i]);
        if (!t || t->dtype != KVL_DTYPE_F32 || (size_t)t->n_elements != np)
            s = kvl__errorf(KVL_ERR_MISMATCH, "%s: tensor '%s' missing or not %zu float32 values "
                           "(checkpoint of another pair?)", path, names[i], np);
        else
            s = kvl_st_tensor_to_f32(t, dst[i], np);
        /* a corrupted file: NaN maps or moments (or a negative second moment, whose square root
         * is NaN) would train on as NaN maps and be checkpointed over this file */
        for (size_t k = 0; s == KVL_OK && k < np; k++)
            if (!isfinite(dst[i][k]) || (i >= 4 && dst[i][k] < 0))
                s = kvl__errorf(KVL_ERR_NUMERIC, "%s: tensor '%s' element %zu is %g: a corrupted checkpoint",
                               path, names[i], k, dst[i][k]);
    }
    if (s == KVL_OK) {   /* the step indexes the loss history: within [0, steps) */
        char *end;
        errno = 0;
        long at = strtol(sstep, &end, 10);
        if (errno || end == sstep || *end || at < 0 || at > INT_MAX)
            s = kvl__errorf(KVL_ERR_FORMAT, "%s: metadata 'step' = \"%s\" is not a step count", path, sstep);
        else if (at >= steps)
            s = kvl__errorf(KVL_ERR_RANGE, "%s: the checkpoint is at step %ld, at or past this run's %d steps: "
                           "nothing is left to train (raise --steps)", path, at, steps);
        else
            *step = (int)at;
    }
    kvl_safetensors_close(st);
    return s;
}


double kvl_train_lr_at(const kvl_train_params *p, int step) {
    int warmup = p->warmup < 0 ? p->steps / 20 : p->warmup;
    if (step < warmup) return p->lr * (step + 1) / warmup;
    double prog = p->steps > warmup ? (double)(step - warmup) / (p->steps - warmup) : 1.0;
    return p->lr * (p->min_lr_frac + (1 - p->min_lr_frac) * 0.5 * (1 + cos(M_PI * prog)));
}

kvl_status kvl_translator_train(kvl_translator *tr, kvl_model *src, kvl_model *dst,
                                const int32_t *stream, size_t n, const kvl_train_params *pp,
                                double *final_loss) {
    kvl_train_params p = pp ? *pp : kvl_train_default_params();
    kvl_status s = kvl_translator_check(tr, src, dst);
    if (s != KVL_OK) return s;
    if (p.steps < 1 || p.batch < 1 || p.cont_len < 1 || p.prefix_min < 1 || p.prefix_max < p.prefix_min)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "training: bad parameters (steps %d, batch %d, prefix "
                          "%d..%d, continuation %d)", p.steps, p.batch, p.prefix_min, p.prefix_max, p.cont_len);
    if (n < (size_t)(p.prefix_max + p.cont_len) + 1)
        return kvl__errorf(KVL_ERR_RANGE, "training: the token stream (%zu tokens) is shorter than one "
                          "sample (%d)", n, p.prefix_max + p.cont_len);
    if (p.per_window < 1 || p.batch % p.per_window)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "training: batch %d is not a multiple of per_window %d",
                          p.batch, p.per_window);
    if (p.threads < 1) p.threads = 1;
    if (p.threads > 64) p.threads = 64;
    if (p.warmup < 0) p.warmup = p.steps / 20;
    const size_t np = (size_t)tr->dst_layers * kvl__tr_dt(tr) * kvl__tr_din(tr);
    worker *ws = calloc((size_t)p.threads, sizeof *ws);
    float *m = calloc(np * 2, sizeof(float)), *v = calloc(np * 2, sizeof(float));
    sample_ref *samples = malloc(sizeof *samples * (size_t)p.batch);
    pthread_t *th = calloc((size_t)p.threads, sizeof *th);
    double *hist = calloc((size_t)p.steps, sizeof(double));
    if (!ws || !m || !v || !samples || !th || !hist) {
        free(ws); free(m); free(v); free(samples); free(th); free(hist);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    }
    int saved_threads[2] = {0, 0}, blas_was = 0;
    if (p.threads > 1) {
        /* parallel over samples; BLAS single-threaded inside each worker */
        saved_threads[0] = kvl__model_set_threads(src, 1);
        saved_threads[1] = kvl__model_set_threads(dst, 1);
        blas_was = kvl__cpu_set_threads(1);
    }
    int nw = 0;
    for (; nw < p.threads && s == KVL_OK; nw++) s = worker_init(&ws[nw], tr, src, dst, nw > 0, &p);
    int step0 = 0;
    ckpt_ident ident;
    ckpt_ident_of(&ident, tr, src, dst, &p);
    if (s == KVL_OK && p.resume) s = load_checkpoint(p.resume, tr, m, v, &step0, p.seed, p.steps, &ident);
    const double t_start = kvl__now_s();
    const clock_t cpu_start = clock();   /* process CPU time, all threads */
    long tokens_total = 0;
    size_t mem = 0;
    for (int i = 0; i < nw; i++) mem += kvl__tws_bytes_f32(ws[i].ws) + sizeof(float) * np * 2;
    mem += sizeof(float) * np * 4;
    for (int step = step0; s == KVL_OK && step < p.steps; step++) {
        /* samples of this step from generator (seed, step) */
        uint64_t rs = p.seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)step << 17) ^ 0x5851F42D4C957F2Dull;
        for (int j = 0; j < p.batch; j += p.per_window) {
            /* one offset per window, valid for the longest prefix of the range */
            size_t off = (size_t)kvl__rng_below(&rs, (uint64_t)(n - (size_t)(p.prefix_max + p.cont_len) + 1));
            for (int q = 0; q < p.per_window; q++) {
                samples[j + q].prefix = p.prefix_min + (int)kvl__rng_below(&rs, (uint64_t)(p.prefix_max - p.prefix_min + 1));
                samples[j + q].offset = off;
            }
        }
        for (int i = 0; i < nw; i++) {
            worker *w = &ws[i];
            w->tr = tr; w->stream = stream; w->samples = samples; w->n_samples = p.batch;
            w->per_window = p.per_window;
            w->stride = nw; w->first = i; w->cont = p.cont_len; w->grad_scale = 1.0 / p.batch;
        }
        int started[64] = {0};
        for (int i = 1; i < nw; i++) {
            started[i] = pthread_create(&th[i], NULL, worker_main, &ws[i]) == 0;
            if (!started[i]) {
                ws[i].status = KVL_ERR_INTERNAL;
                snprintf(ws[i].errmsg, sizeof ws[i].errmsg, "training: cannot start worker thread %d", i);
            }
        }
        worker_main(&ws[0]);
        for (int i = 1; i < nw; i++) if (started[i]) pthread_join(th[i], NULL);
        double loss = 0;
        for (int i = 0; i < nw && s == KVL_OK; i++) {
            s = ws[i].status;
            if (s == KVL_ERR_NUMERIC)   /* a sample's loss is not finite: the maps have diverged */
                kvl__errorf(s, "training diverged at step %d of %d: %s; no checkpoint was written at "
                            "or after this step", step + 1, p.steps, ws[i].errmsg);
            else if (s != KVL_OK)
                kvl__errorf(s, "%s", ws[i].errmsg);   /* the worker's message, on this thread */
            loss += ws[i].loss_sum;
            tokens_total += ws[i].tokens;
            if (i > 0)
                for (size_t k = 0; k < np; k++) { ws[0].gk[k] += ws[i].gk[k]; ws[0].gv[k] += ws[i].gv[k]; }
        }
        if (s != KVL_OK) break;
        loss /= p.batch;
        hist[step] = loss;
        /* global-norm clipping, then AdamW (Loshchilov & Hutter 2019, decoupled decay) */
        double gn = 0;
        for (size_t k = 0; k < np; k++) gn += (double)ws[0].gk[k] * ws[0].gk[k] + (double)ws[0].gv[k] * ws[0].gv[k];
        gn = sqrt(gn);
        if (!isfinite(gn)) {   /* NaN would pass the clip (gn > clip is false) into every map */
            s = kvl__errorf(KVL_ERR_NUMERIC, "training diverged at step %d of %d: the gradient norm is %g "
                           "(loss %g); the maps keep step %d's values, no checkpoint was written at or "
                           "after this step", step + 1, p.steps, gn, loss, step);
            break;
        }
        double cs = p.clip > 0 && gn > p.clip ? p.clip / gn : 1.0;
        double lr = kvl_train_lr_at(&p, step);
        double bc1 = 1 - pow(p.beta1, step + 1), bc2 = 1 - pow(p.beta2, step + 1);
        int nonfinite = 0;
        for (int side = 0; side < 2; side++) {
            float *W = side ? tr->wv : tr->wk, *g = side ? ws[0].gv : ws[0].gk;
            float *mm = m + side * np, *vv = v + side * np;
            for (size_t k = 0; k < np; k++) {
                double gk = g[k] * cs;
                mm[k] = (float)(p.beta1 * mm[k] + (1 - p.beta1) * gk);
                vv[k] = (float)(p.beta2 * vv[k] + (1 - p.beta2) * gk * gk);
                double upd = (mm[k] / bc1) / (sqrt(vv[k] / bc2) + p.adam_eps);
                W[k] = (float)(W[k] - lr * (upd + p.weight_decay * W[k]));
                nonfinite |= !isfinite(W[k]) || !isfinite(vv[k]);
            }
        }
        kvl__tr_maps_changed(tr);
        if (nonfinite) {   /* an update overflowed float: neither checkpointed nor returned as trained */
            s = kvl__errorf(KVL_ERR_NUMERIC, "training diverged at step %d of %d: the update made a map or "
                           "an AdamW moment non-finite (lr %g, gradient norm %g); no checkpoint was "
                           "written at or after this step", step + 1, p.steps, lr, gn);
            break;
        }
        double el = kvl__now_s() - t_start;
        if (p.checkpoint && ((step + 1) % p.checkpoint_every == 0 || step + 1 == p.steps))
            s = save_checkpoint(p.checkpoint, tr, m, v, step + 1, p.seed, &ident);
        if (s == KVL_OK && p.progress &&
            p.progress(p.user, step + 1, p.steps, loss, el > 0 ? tokens_total / el : 0, el, mem))
            s = kvl__errorf(KVL_ERR_CANCELLED, "training cancelled at step %d", step + 1);
    }
    if (s == KVL_OK) {
        int from = p.steps - (p.steps >= 10 ? p.steps / 10 : 1);   /* the last 10% of steps, at least one */
        if (from < step0) from = step0;
        double fl = 0;
        int cnt = 0;
        for (int k = from; k < p.steps; k++, cnt++) fl += hist[k];
        fl = cnt ? fl / cnt : 0;
        if (final_loss) *final_loss = fl;
        /* a run started from an already trained translator keeps the earlier run's record */
        const char *prev = kvl_translator_metadata(tr, "training");
        size_t cap = 640 + (prev ? strlen(prev) : 0);
        char *json = malloc(cap);
        if (!json) {
            s = kvl__errorf(KVL_ERR_NOMEM, "out of memory");
            goto out;
        }
        int jl = snprintf(json, cap, "{\"steps\":%d,\"batch\":%d,\"prefix_min\":%d,\"prefix_max\":%d,"
                 "\"cont_len\":%d,\"lr\":%g,\"min_lr_frac\":%g,\"warmup\":%d,\"weight_decay\":%g,"
                 "\"clip\":%g,\"seed\":%llu,\"threads\":%d,\"per_window\":%d,\"final_kl\":%.5f,"
                 "\"seconds\":%.1f,\"cpu_seconds\":%.1f}",
                 p.steps, p.batch, p.prefix_min, p.prefix_max, p.cont_len, p.lr, p.min_lr_frac,
                 p.warmup, p.weight_decay, p.clip, (unsigned long long)p.seed, p.threads, p.per_window, fl,
                 kvl__now_s() - t_start, (double)(clock() - cpu_start) / CLOCKS_PER_SEC);
        if (prev) snprintf(json + jl - 1, cap - (size_t)jl + 1, ",\"continued_from\":%s}", prev);
        s = kvl_translator_set_meta(tr, "training", json);
        free(json);
    }
out:
    for (int i = 0; i < nw; i++) worker_free(&ws[i]);
    if (p.threads > 1) {
        kvl__model_set_threads(src, saved_threads[0]);
        kvl__model_set_threads(dst, saved_threads[1]);
        kvl__cpu_set_threads(blas_was);   /* the caller's BLAS threads (stage 1, apply) */
    }
    free(ws); free(m); free(v); free(samples); free(th); free(hist);
    return s;
}
