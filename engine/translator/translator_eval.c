/* engine/translator/translator_eval.c: evaluation of a translator against re-prefill on the target, under
 * the fixed evaluation protocol (see kvl_translator_evaluate in kvlingo/translator_train.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kvlingo/translator_train.h"
#include "model_iface.h"
#include "translator_internal.h"

kvl_eval_params kvl_eval_default_params(void) {
    kvl_eval_params p = {.prefix_len = 256, .cont_len = 64, .samples = 200, .turns = 0,
                         .turn_len = 64, .sessions = 20, .reverse = NULL};
    return p;
}

/* log-softmax value of row[target] and the argmax. */
static double logprob(const float *row, int V, int target, int *argmax) {
    float m = row[0];
    int am = 0;
    for (int j = 1; j < V; j++)
        if (row[j] > m) { m = row[j]; am = j; }
    double s = 0;
    for (int j = 0; j < V; j++) s += exp((double)row[j] - m);
    if (argmax) *argmax = am;
    return (double)row[target] - m - log(s);
}

/* KL(p || q) of two logit rows. */
static double kl_rows(const float *p, const float *q, int V) {
    float mp = p[0], mq = q[0];
    for (int j = 1; j < V; j++) { if (p[j] > mp) mp = p[j]; if (q[j] > mq) mq = q[j]; }
    double sp = 0, sq = 0;
    for (int j = 0; j < V; j++) { sp += exp((double)p[j] - mp); sq += exp((double)q[j] - mq); }
    double lzp = mp + log(sp), lzq = mq + log(sq), kl = 0;
    for (int j = 0; j < V; j++) {
        double lp = p[j] - lzp, lq = q[j] - lzq;
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

typedef struct eval_bufs {
    kvl_cache *src, *nat, *trc, *none;
    float *lnat, *ltr, *lnone;     /* [C, V] */
    float *ka, *va, *kb, *vb;      /* [P, Dt] */
} eval_bufs;

static void bufs_free(eval_bufs *b) {
    kvl_cache_free(b->src); kvl_cache_free(b->nat); kvl_cache_free(b->trc); kvl_cache_free(b->none);
    free(b->lnat); free(b->ltr); free(b->lnone);
    free(b->ka); free(b->va); free(b->kb); free(b->vb);
}

/* The multi-turn parameters, checked before any sample runs.  Turn 0 scores turn_len - 1
 * tokens and each turn's perplexity averages over the sessions: fewer would divide 0 by 0 (a
 * NaN perplexity in the figures). */
static kvl_status turn_params_check(const kvl_eval_params *p) {
    if (p->turns > KVL_EVAL_MAX_TURNS)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "eval: at most %d turns", KVL_EVAL_MAX_TURNS);
    if (p->turn_len < 2 || p->sessions < 1 || p->turn_len > (1 << 20) || p->sessions > (1 << 20))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "eval: multi-turn needs turn_len in [2, %d] (got %d) and "
                          "sessions in [1, %d] (got %d)", 1 << 20, p->turn_len, 1 << 20, p->sessions);
    return KVL_OK;
}

/* Multi-turn sessions (see the header): accumulates per-turn NLL into r. */
static kvl_status eval_turns(const kvl_translator *tr, kvl_model *src, kvl_model *dst,
                             const int32_t *stream, size_t n, const kvl_eval_params *p,
                             kvl_eval_result *r) {
    const int K = p->turns, TL = p->turn_len, total = K * TL;   /* turn_params_check: <= 64 x 2^20 */
    if ((size_t)total + 1 > n)
        return kvl__errorf(KVL_ERR_RANGE, "eval: %zu tokens are too few for a session of %d turns of %d",
                          n, K, TL);
    if (p->reverse) {
        kvl_status s = kvl_translator_check(p->reverse, dst, src);
        if (s) return kvl__error_prefix(s, "eval: reverse translator");
    }
    kvl_model *mod[2] = {src, dst};
    kvl_cache *ret[2] = {NULL, NULL}, *nat[2] = {NULL, NULL};
    kvl_cache_params cp = {.max_tokens = total + 1, .block_tokens = 16};
    int V = kvl_model_config_get(dst)->vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)TL * V), *ln = malloc(sizeof(float) * (size_t)TL * V);
    double nll_t[KVL_EVAL_MAX_TURNS] = {0}, nll_r[KVL_EVAL_MAX_TURNS] = {0};
    kvl_status s = lg && ln ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    for (int m = 0; s == KVL_OK && m < 2; m++) {
        if ((s = kvl_model_cache_create(mod[m], &cp, &ret[m]))) break;
        s = kvl_model_cache_create(mod[m], &cp, &nat[m]);
    }
    for (int ss = 0; s == KVL_OK && ss < p->sessions; ss++) {
        size_t base = ((size_t)ss * total) % (n - (size_t)total);
        const int32_t *ids = stream + base;
        for (int m = 0; m < 2; m++) { kvl_cache_truncate(ret[m], 0); kvl_cache_truncate(nat[m], 0); }
        for (int t = 0; s == KVL_OK && t < K; t++) {
            int h = t % 2;   /* turn 0 on the source, then alternating */
            int upto = t * TL > 0 ? t * TL - 1 : 0;   /* cache covers [0, upto) before the turn */
            int first = upto, cnt = t == 0 ? TL - 1 : TL;   /* read [first, first+cnt) */
            kvl_cache *rc = ret[h];
            int have = kvl_cache_n_tokens(rc);
            if (have < upto) {
                const kvl_translator *x = h == 1 ? tr : p->reverse;
                if (x) s = kvl_translator_translate_span(x, ret[1 - h], have, upto, rc);
                else s = kvl_model_prefill(mod[h], rc, ids + have, upto - have, KVL_LOGITS_NONE, NULL);
                if (s) break;
            }
            if ((s = kvl_model_prefill(mod[h], rc, ids + first, cnt, KVL_LOGITS_ALL, lg))) break;
            /* re-prefill reference: the holder reads everything natively */
            int hn = kvl_cache_n_tokens(nat[h]);
            if (hn < upto && (s = kvl_model_prefill(mod[h], nat[h], ids + hn, upto - hn, KVL_LOGITS_NONE, NULL)))
                break;
            if ((s = kvl_model_prefill(mod[h], nat[h], ids + first, cnt, KVL_LOGITS_ALL, ln))) break;
            for (int i = 0; i < cnt; i++) {
                int y = ids[first + i + 1];
                nll_t[t] -= logprob(lg + (size_t)i * V, V, y, NULL);
                nll_r[t] -= logprob(ln + (size_t)i * V, V, y, NULL);
            }
            r->turn_model[t] = h;
        }
        if (s == KVL_OK && p->progress) p->progress(p->user, "sessions", ss + 1, p->sessions);
    }
    if (s == KVL_OK) {
        r->turns = K;
        for (int t = 0; t < K; t++) {
            double cnt = (double)p->sessions * (t == 0 ? TL - 1 : TL);
            r->turn_ppl_translated[t] = exp(nll_t[t] / cnt);
            r->turn_ppl_reprefill[t] = exp(nll_r[t] / cnt);
        }
    }
    for (int m = 0; m < 2; m++) { kvl_cache_free(ret[m]); kvl_cache_free(nat[m]); }
    free(lg);
    free(ln);
    return s;
}

kvl_status kvl_translator_evaluate(const kvl_translator *tr, kvl_model *src, kvl_model *dst,
                                   const int32_t *stream, size_t n, const kvl_eval_params *pp,
                                   kvl_eval_result *r) {
    kvl_eval_params p = pp ? *pp : kvl_eval_default_params();
    memset(r, 0, sizeof *r);
    kvl_status s = kvl_translator_check(tr, src, dst);
    if (s != KVL_OK) return s;
    const int P = p.prefix_len, C = p.cont_len, V = kvl_model_config_get(dst)->vocab_size, Lt = tr->dst_layers;
    const int dt = kvl__tr_dt(tr);
    if (p.turns > 0 && (s = turn_params_check(&p))) return s;
    if (p.samples == 0 && p.turns > 0) {   /* multi-turn figures only */
        r->n_layers = 0;
        return eval_turns(tr, src, dst, stream, n, &p, r);
    }
    if (P < 2 || C < 1 || p.samples < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "eval: prefix %d (>= 2), continuation %d, samples %d", P, C, p.samples);
    if (Lt > KVL_EVAL_MAX_LAYERS) return kvl__errorf(KVL_ERR_UNSUPPORTED, "eval: more than %d layers", KVL_EVAL_MAX_LAYERS);
    const size_t stride = (size_t)P + C;
    int N = 0;
    while (N < p.samples && (size_t)(N + 1) * stride <= n) N++;
    if (N == 0)
        return kvl__errorf(KVL_ERR_RANGE, "eval: %zu tokens are too few for one sample of %zu", n, stride);
    eval_bufs b = {0};
    kvl_cache_params cp = {.max_tokens = (int)stride, .block_tokens = 16};
    if ((s = kvl_model_cache_create(src, &cp, &b.src)) || (s = kvl_model_cache_create(dst, &cp, &b.nat)) ||
        (s = kvl_model_cache_create(dst, &cp, &b.trc)) || (s = kvl_model_cache_create(dst, &cp, &b.none))) {
        bufs_free(&b);
        return s;
    }
    b.lnat = malloc(sizeof(float) * (size_t)C * V);
    b.ltr = malloc(sizeof(float) * (size_t)C * V);
    b.lnone = malloc(sizeof(float) * (size_t)C * V);
    b.ka = malloc(sizeof(float) * (size_t)P * dt); b.va = malloc(sizeof(float) * (size_t)P * dt);
    b.kb = malloc(sizeof(float) * (size_t)P * dt); b.vb = malloc(sizeof(float) * (size_t)P * dt);
    if (!b.lnat || !b.ltr || !b.lnone || !b.ka || !b.va || !b.kb || !b.vb) {
        bufs_free(&b);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    }
    double nll_nat = 0, nll_tr = 0, nll_none = 0, kl = 0;
    double kerr[KVL_EVAL_MAX_LAYERS] = {0}, knorm[KVL_EVAL_MAX_LAYERS] = {0};
    double verr[KVL_EVAL_MAX_LAYERS] = {0}, vnorm[KVL_EVAL_MAX_LAYERS] = {0};
    long agree = 0, count = 0;
    for (int i = 0; i < N && s == KVL_OK; i++) {
        const int32_t *w = stream + (size_t)i * stride;
        kvl_cache_truncate(b.src, 0); kvl_cache_truncate(b.nat, 0);
        kvl_cache_truncate(b.trc, 0); kvl_cache_truncate(b.none, 0);
        /* native: cache over prefix[0, P-1), then read prefix[P-1], cont[0, C-1) */
        if ((s = kvl_model_prefill(dst, b.nat, w, P - 1, KVL_LOGITS_NONE, NULL))) break;
        if ((s = kvl_model_prefill(dst, b.nat, w + P - 1, C, KVL_LOGITS_ALL, b.lnat))) break;
        /* translated: the source's prefix span through the translator */
        if ((s = kvl_model_prefill(src, b.src, w, P - 1, KVL_LOGITS_NONE, NULL))) break;
        if ((s = kvl_translator_translate_span(tr, b.src, 0, P - 1, b.trc))) break;
        if ((s = kvl_model_prefill(dst, b.trc, w + P - 1, C, KVL_LOGITS_ALL, b.ltr))) break;
        /* no context: the same C tokens from position 0 */
        if ((s = kvl_model_prefill(dst, b.none, w + P - 1, C, KVL_LOGITS_ALL, b.lnone))) break;
        for (int t = 0; t < C; t++) {
            int y = w[P + t], an, at;
            const float *rn = b.lnat + (size_t)t * V, *rt = b.ltr + (size_t)t * V;
            nll_nat -= logprob(rn, V, y, &an);
            nll_tr -= logprob(rt, V, y, &at);
            nll_none -= logprob(b.lnone + (size_t)t * V, V, y, NULL);
            kl += kl_rows(rn, rt, V);
            agree += an == at;
            count++;
        }
        for (int l = 0; l < Lt && s == KVL_OK; l++) {
            if ((s = kvl_cache_read_prenorm(b.nat, l, 0, P - 1, b.ka, b.va))) break;
            if ((s = kvl_cache_read_prenorm(b.trc, l, 0, P - 1, b.kb, b.vb))) break;
            for (size_t j = 0; j < (size_t)(P - 1) * dt; j++) {
                double dk = (double)b.kb[j] - b.ka[j], dv = (double)b.vb[j] - b.va[j];
                kerr[l] += dk * dk; knorm[l] += (double)b.ka[j] * b.ka[j];
                verr[l] += dv * dv; vnorm[l] += (double)b.va[j] * b.va[j];
            }
        }
        if (s == KVL_OK && p.progress) p.progress(p.user, "samples", i + 1, N);
    }
    bufs_free(&b);
    if (s != KVL_OK) return s;
    r->samples = N;
    r->kl = kl / count;
    r->ppl_native = exp(nll_nat / count);
    r->ppl_translated = exp(nll_tr / count);
    r->ppl_no_context = exp(nll_none / count);
    r->top1_agreement = (double)agree / count;
    double gap = log(r->ppl_no_context) - log(r->ppl_native);
    r->context_gain_recovered = gap != 0 ? (log(r->ppl_no_context) - log(r->ppl_translated)) / gap : 0;
    r->n_layers = Lt;
    for (int l = 0; l < Lt; l++) {
        r->k_rel_err[l] = knorm[l] > 0 ? sqrt(kerr[l] / knorm[l]) : 0;
        r->v_rel_err[l] = vnorm[l] > 0 ? sqrt(verr[l] / vnorm[l]) : 0;
    }
    if (p.turns > 0) s = eval_turns(tr, src, dst, stream, n, &p, r);
    return s;
}

char *kvl_eval_result_json(const kvl_eval_result *r, const kvl_eval_params *p) {
    size_t cap = 1024 + (size_t)r->n_layers * 64 + (size_t)r->turns * 128, len = 0;
    char *j = malloc(cap);
    if (!j) return NULL;
    if (r->samples == 0) {   /* multi-turn only */
        len += (size_t)snprintf(j + len, cap - len, "{\"samples\": 0");
        goto turns;
    }
    len += (size_t)snprintf(j + len, cap - len,
                            "{\"kl\": %.6f, \"ppl_native\": %.4f, \"ppl_translated\": %.4f, "
                            "\"ppl_no_context\": %.4f, \"top1_agreement\": %.4f, "
                            "\"context_gain_recovered\": %.4f, \"samples\": %d, \"prefix_len\": %d, "
                            "\"cont_len\": %d, \"k_rel_err\": [", r->kl, r->ppl_native,
                            r->ppl_translated, r->ppl_no_context, r->top1_agreement,
                            r->context_gain_recovered, r->samples, p ? p->prefix_len : 0,
                            p ? p->cont_len : 0);
    for (int l = 0; l < r->n_layers; l++)
        len += (size_t)snprintf(j + len, cap - len, "%s%.4f", l ? ", " : "", r->k_rel_err[l]);
    len += (size_t)snprintf(j + len, cap - len, "], \"v_rel_err\": [");
    for (int l = 0; l < r->n_layers; l++)
        len += (size_t)snprintf(j + len, cap - len, "%s%.4f", l ? ", " : "", r->v_rel_err[l]);
    len += (size_t)snprintf(j + len, cap - len, "]");
turns:
    if (r->turns > 0) {
        len += (size_t)snprintf(j + len, cap - len, ", \"turn_len\": %d, \"sessions\": %d, \"turns\": [",
                                p ? p->turn_len : 0, p ? p->sessions : 0);
        for (int t = 0; t < r->turns; t++)
            len += (size_t)snprintf(j + len, cap - len, "%s{\"turn\": %d, \"model\": \"%s\", "
                                    "\"ppl_translated\": %.4f, \"ppl_reprefill\": %.4f, \"ratio\": %.4f}",
                                    t ? ", " : "", t, r->turn_model[t] ? "target" : "source",
                                    r->turn_ppl_translated[t], r->turn_ppl_reprefill[t],
                                    r->turn_ppl_translated[t] / r->turn_ppl_reprefill[t]);
        len += (size_t)snprintf(j + len, cap - len, "]");
    }
    snprintf(j + len, cap - len, "}");
    return j;
}
