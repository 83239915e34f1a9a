/* router/guard.c: quality guardrail (see guard.h). */
#include "guard.h"
#include "log.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "error.h"
#include "nodecall.h"

#define MAX_PAIRS KVR_GUARD_MAX_PAIRS
#define QUEUE_MAX 8

typedef struct pair {
    kvr_pair_status st;
    double acc;                   /* sampling accumulator: shadow when it crosses 1           */
    double disabled_at;           /* kvl__now_s() when the budget disabled it                 */
    double cooldown_s;            /* how long it stays disabled before its probation           */
    int probation;                /* re-enabled on trial: every switch shadowed until judged  */
} pair;

typedef struct job {
    int node;
    char sid[KVR_ID_MAX];
    char src[KVR_NAME_MAX], dst[KVR_NAME_MAX];
    int32_t *tokens;
    int n;
    float *translated;
    int vocab;
} job;

struct kvr_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pair pairs[MAX_PAIRS];
    int n_pairs;
    double fraction, budget, alpha;
    long min_samples;
    double retry_s;               /* first cooldown of a disabled pair; 0: disabled for good  */
    kvr_registry *reg;
    kvr_metrics *metrics;
    job queue[QUEUE_MAX];
    int q_head, q_len;
    int stop;
    int started;
    pthread_t worker;
    unsigned long long counter;
};

double kvr_kl_logprobs(const float *p, const float *q, int n) {
    double kl = 0;
    for (int i = 0; i < n; i++) {
        if (!(p[i] > -1e30f)) continue;          /* p = 0 (or NaN): no contribution */
        double lq = q[i] > -80.0f ? q[i] : -80.0;  /* bounded: a zero in q is a large, finite KL */
        kl += exp(p[i]) * (p[i] - lq);
    }
    return kl > 0 ? kl : 0;
}

double kvr_entropy_logprobs(const float *lp, int n) {
    double h = 0;
    for (int i = 0; i < n; i++)
        if (lp[i] > -1e30f) h -= exp(lp[i]) * lp[i];
    return h;
}

static pair *find_locked(kvr_guard *g, const char *src, const char *dst, int create) {
    for (int i = 0; i < g->n_pairs; i++)
        if (!strcmp(g->pairs[i].st.source, src) && !strcmp(g->pairs[i].st.target, dst))
            return &g->pairs[i];
    if (!create || g->n_pairs >= MAX_PAIRS) return NULL;   /* the fleet's models make fewer pairs */
    pair *p = &g->pairs[g->n_pairs++];
    memset(p, 0, sizeof *p);
    snprintf(p->st.source, sizeof p->st.source, "%s", src);
    snprintf(p->st.target, sizeof p->st.target, "%s", dst);
    p->st.enabled = 1;
    p->st.budget = g->budget;
    /* the first translated switch of a pair is always shadowed: early evidence matters most */
    p->acc = g->fraction > 0 ? 1.0 - g->fraction : 0;
    char labels[160];   /* the pair's KL histogram shows (empty) from its discovery on */
    snprintf(labels, sizeof labels, "source=\"%s\",target=\"%s\"", src, dst);
    kvr_metrics_observe_zero(g->metrics, "kvlingo_router_shadow_kl_nats", labels);
    return p;
}

static void *worker_main(void *arg);

kvl_status kvr_guard_create(const kvr_config *cfg, kvr_registry *reg, kvr_metrics *m,
                            kvr_guard **out) {
    *out = NULL;
    kvr_guard *g = calloc(1, sizeof *g);
    if (!g) return kvl__errorf(KVL_ERR_NOMEM, "guard");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->reg = reg;
    g->metrics = m;
    kvr_guard_configure(g, cfg);
    if (pthread_create(&g->worker, NULL, worker_main, g)) {
        kvr_guard_free(g);
        return kvl__errorf(KVL_ERR_INTERNAL, "guard: cannot start the worker thread");
    }
    g->started = 1;
    *out = g;
    return KVL_OK;
}

void kvr_guard_free(kvr_guard *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (g->started) pthread_join(g->worker, NULL);
    for (int i = 0; i < g->q_len; i++) {
        job *j = &g->queue[(g->q_head + i) % QUEUE_MAX];
        free(j->tokens);
        free(j->translated);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

void kvr_guard_configure(kvr_guard *g, const kvr_config *cfg) {
    pthread_mutex_lock(&g->mu);
    g->fraction = cfg->shadow_fraction;
    g->budget = cfg->kl_budget;
    g->alpha = cfg->kl_alpha;
    g->min_samples = cfg->kl_min_samples;
    g->retry_s = cfg->kl_retry_s;
    for (int i = 0; i < g->n_pairs; i++) {
        kvr_pair_status *st = &g->pairs[i].st;
        st->budget = g->budget;
        if (!st->enabled && !strcmp(st->reason, "kl_budget") && st->moving_kl <= st->budget) {
            st->enabled = 1;
            st->reason[0] = 0;
            kvl__svc_log_text("info", "guardrail: pair %s->%s re-enabled (moving KL %.4f <= budget %.4f)",
                    st->source, st->target, st->moving_kl, st->budget);
        }
    }
    pthread_mutex_unlock(&g->mu);
}

/* A pair the budget disabled comes back on probation once its cooldown has passed: translated
 * again, every switch of it shadowed until min_samples samples judge it afresh (a circuit
 * breaker's half-open state).  Without it a pair stayed off for good once disabled, since a
 * disabled pair translates nothing and so gets no sample that could bring its moving KL down:
 * a burst of bad samples (a hard stretch of text, or inputs chosen to score badly) would have
 * switched translation off for every tenant until an operator stepped in. */
static void probation_check_locked(kvr_guard *g, pair *p) {
    kvr_pair_status *st = &p->st;
    if (st->enabled || g->retry_s <= 0 || strcmp(st->reason, "kl_budget")) return;
    if (kvl__now_s() < p->disabled_at + fmax(p->cooldown_s, g->retry_s)) return;
    st->enabled = 1;
    snprintf(st->reason, sizeof st->reason, "probation");
    st->samples = 0;
    st->moving_kl = 0;
    p->probation = 1;
    p->acc = 1.0;   /* the next switch is shadowed */
    kvl__svc_log_text("info", "guardrail: pair %s->%s on probation after %.0f s disabled: translated again, "
                      "every switch shadowed until %ld samples judge it", st->source, st->target, p->cooldown_s,
                      g->min_samples);
}

int kvr_guard_pair_ok(void *arg, const char *src, const char *dst) {
    kvr_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    pair *p = find_locked(g, src, dst, 1);
    if (p) probation_check_locked(g, p);
    int ok = !p || p->st.enabled;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

int kvr_guard_shadow_due(kvr_guard *g, const char *src, const char *dst) {
    pthread_mutex_lock(&g->mu);
    pair *p = find_locked(g, src, dst, 1);
    int due = p && (p->probation || (g->fraction > 0 && p->acc + g->fraction >= 1.0 - 1e-9));
    pthread_mutex_unlock(&g->mu);
    return due;
}

int kvr_guard_count_switch(kvr_guard *g, const char *src, const char *dst, int can_shadow) {
    pthread_mutex_lock(&g->mu);
    pair *p = find_locked(g, src, dst, 1);
    int shadow = 0;
    if (p && p->probation) {
        p->st.switches++;
        shadow = can_shadow;
    } else if (p) {
        p->st.switches++;
        p->acc += g->fraction;
        /* a switch that cannot be shadowed leaves the sample due to the pair's next one */
        if (p->acc > 1.0 + g->fraction) p->acc = 1.0 + g->fraction;
        if (can_shadow && g->fraction > 0 && p->acc >= 1.0 - 1e-9) { p->acc -= 1.0; shadow = 1; }
    }
    pthread_mutex_unlock(&g->mu);
    return shadow;
}

void kvr_guard_record(kvr_guard *g, const char *src, const char *dst, double kl) {
    char labels[160];
    snprintf(labels, sizeof labels, "source=\"%s\",target=\"%s\"", src, dst);
    kvr_metrics_observe(g->metrics, "kvlingo_router_shadow_kl_nats", labels, kl);
    pthread_mutex_lock(&g->mu);
    pair *p = find_locked(g, src, dst, 1);
    if (p) {
        kvr_pair_status *st = &p->st;
        st->moving_kl = st->samples ? (1 - g->alpha) * st->moving_kl + g->alpha * kl : kl;
        st->samples++;
        kvl__svc_log_text("info", "guardrail: %s->%s KL(native||translated)=%.5f nats, moving %.5f "
                "(budget %.4f, %u samples)", src, dst, kl, st->moving_kl, st->budget, st->samples);
        if (st->enabled && st->samples >= (unsigned)g->min_samples && st->moving_kl > st->budget) {
            /* the first cooldown is retry_s; each failed probation doubles it, up to a day */
            p->cooldown_s = p->probation ? fmin(fmax(2 * p->cooldown_s, g->retry_s), fmax(86400.0, g->retry_s))
                                         : g->retry_s;
            p->disabled_at = kvl__now_s();
            p->probation = 0;
            st->enabled = 0;
            snprintf(st->reason, sizeof st->reason, "kl_budget");
            char retry[80] = "";
            if (g->retry_s > 0) snprintf(retry, sizeof retry, "; on probation again in %.0f s", p->cooldown_s);
            kvl__svc_log_text("warn", "guardrail: pair %s->%s DISABLED: moving KL %.4f > budget %.4f; "
                    "switches re-prefill instead%s", src, dst, st->moving_kl, st->budget, retry);
        } else if (p->probation && st->samples >= (unsigned)g->min_samples) {
            p->probation = 0;
            st->reason[0] = 0;
            kvl__svc_log_text("info", "guardrail: pair %s->%s passed its probation (moving KL %.4f <= budget "
                              "%.4f over %u samples)", src, dst, st->moving_kl, st->budget, st->samples);
        }
    }
    pthread_mutex_unlock(&g->mu);
}

int kvr_guard_pairs(kvr_guard *g, kvr_pair_status *out, int max) {
    pthread_mutex_lock(&g->mu);
    int n = 0;
    for (int i = 0; i < g->n_pairs && n < max; i++) out[n++] = g->pairs[i].st;
    pthread_mutex_unlock(&g->mu);
    return n;
}

int kvr_guard_disabled_count(kvr_guard *g) {
    pthread_mutex_lock(&g->mu);
    int n = 0;
    for (int i = 0; i < g->n_pairs; i++) n += !g->pairs[i].st.enabled;
    pthread_mutex_unlock(&g->mu);
    return n;
}

kvl_status kvr_shadow_run(kvr_node *node, const char *sid, const int32_t *tokens, int n,
                          int64_t timeout_ms, float **logprobs, int *vocab, double *ttft_s) {
    static const char suffix[] = ".shadow";
    char ssid[KVR_ID_MAX + 32];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(ssid, sizeof ssid, "%s%s.%ld%09ld", sid, suffix, (long)ts.tv_sec, ts.tv_nsec);
    if (logprobs) *logprobs = NULL;
    if (vocab) *vocab = 0;
    *ttft_s = 0;
    double t0 = kvl__now_s();
    kvl_status s = kvr_node_open(node, ssid, timeout_ms, NULL);
    if (!s) s = kvr_node_append(node, ssid, tokens, n, timeout_ms, NULL, NULL);
    kvl__rpc_stream *st = NULL;
    kvr_gen_params gp = {.max_tokens = 1, .return_logprobs = logprobs != NULL};
    if (!s) s = kvr_node_generate(node, ssid, &gp, timeout_ms, &st);
    int got = 0;
    while (!s) {
        Kvlingo__V1__GenerateResponse *msg = NULL;
        grpc_status_code code;
        int r = kvr_node_gen_next(node, st, &msg, &code);
        if (r < 0) { s = (kvl_status)r; break; }
        if (r == 0) {
            if (code != GRPC_STATUS_OK) s = kvl__rpc_status_to_kvl(code);
            else if (!got) s = kvl__errorf(KVL_ERR_INTERNAL, "shadow: node %s generated nothing", node->name);
            break;
        }
        if (!msg->done && !got) {
            got = 1;
            *ttft_s = kvl__now_s() - t0;
            if (logprobs && msg->n_logprobs) {
                *logprobs = malloc(msg->n_logprobs * sizeof(float));
                if (!*logprobs) s = kvl__errorf(KVL_ERR_NOMEM, "shadow logprobs");
                else {
                    memcpy(*logprobs, msg->logprobs, msg->n_logprobs * sizeof(float));
                    *vocab = (int)msg->n_logprobs;
                }
            }
        }
        protobuf_c_message_free_unpacked(&msg->base, NULL);
    }
    kvl__rpc_stream_free(st);
    char keep[512];
    snprintf(keep, sizeof keep, "%s", kvl_last_error());
    kvr_node_drop(node, ssid, timeout_ms, NULL);
    if (s) {
        if (logprobs) { free(*logprobs); *logprobs = NULL; }
        return kvl__errorf(s, "shadow re-prefill on %s: %s", node->name, keep);
    }
    return KVL_OK;
}

void kvr_guard_enqueue(kvr_guard *g, int ni, const char *sid, const char *src, const char *dst,
                       int32_t *tokens, int n, float *translated, int vocab) {
    pthread_mutex_lock(&g->mu);
    if (g->q_len >= QUEUE_MAX || g->stop) {
        pthread_mutex_unlock(&g->mu);
        free(tokens);
        free(translated);
        kvr_metrics_inc(g->metrics, "kvlingo_router_shadow_dropped_total", "", 1);
        return;
    }
    job *j = &g->queue[(g->q_head + g->q_len++) % QUEUE_MAX];
    j->node = ni;
    snprintf(j->sid, sizeof j->sid, "%s", sid);
    snprintf(j->src, sizeof j->src, "%s", src);
    snprintf(j->dst, sizeof j->dst, "%s", dst);
    j->tokens = tokens;
    j->n = n;
    j->translated = translated;
    j->vocab = vocab;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void *worker_main(void *arg) {
    kvr_guard *g = arg;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->stop && g->q_len == 0) pthread_cond_wait(&g->cv, &g->mu);
        if (g->stop) { pthread_mutex_unlock(&g->mu); return NULL; }
        job j = g->queue[g->q_head];
        g->q_head = (g->q_head + 1) % QUEUE_MAX;
        g->q_len--;
        pthread_mutex_unlock(&g->mu);

        float *native = NULL;
        int vocab = 0;
        double ttft = 0;
        kvl_status s = kvr_shadow_run(&g->reg->nodes[j.node], j.sid, j.tokens, j.n,
                                      g->reg->node_timeout_ms * 4, &native, &vocab, &ttft);
        if (s)
            kvl__svc_log_text("warn", "guardrail: sample %s->%s failed: %s", j.src, j.dst, kvl_last_error());
        else if (vocab != j.vocab)
            kvl__svc_log_text("warn", "guardrail: sample %s->%s: vocab %d vs %d, ignored", j.src,
                    j.dst, vocab, j.vocab);
        else
            kvr_guard_record(g, j.src, j.dst, kvr_kl_logprobs(native, j.translated, vocab));
        free(native);
        free(j.tokens);
        free(j.translated);
    }
}
