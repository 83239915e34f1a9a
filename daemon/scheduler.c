/* daemon/scheduler.c: the continuous-batching scheduler (see scheduler.h). */
#include "scheduler.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "log.h"

typedef enum { JOB_PREFILL, JOB_GENERATE } job_kind;

struct kvld_job {
    kvld_sched *s;
    kvld_session *sess;
    job_kind kind;
    kvld_gen_params gp;
    kvl_sampler *sampler;
    const volatile int *cancel_flag;   /* the caller's flag (kvld_sched_prefill's, kvld_gen_params.cancel) */
    int generated;
    kvld_token *out;
    int n_out, cap_out, n_read;
    int finished, cancelled;
    size_t buffered;                   /* output bytes not yet taken by kvld_job_next */
    int paused;                        /* backpressure: skipped until the reader catches up */
    kvl_status status;
    char err[512];
    const char *finish_reason;
    double t_start, ttft;
    double t_last_token;               /* when the previous token was emitted (inter-token time) */
    int started;                       /* a forward pass has included this job (queue time) */
    pthread_cond_t cv;                 /* with s->mu: a token arrived or the job finished */
    struct kvld_job *next;
};

struct kvld_sched {
    kvl_model *model;
    kvld_metrics *metrics;
    kvld_sched_params p;
    int vocab;
    pthread_mutex_t mu;
    pthread_cond_t cv;                 /* work arrived / job cancelled / stop */
    pthread_t thread;
    int started, stop;
    /* who steps: the scheduler thread, or a submitting thread that runs its new job's first
     * step itself on an idle node (submit); never both at once */
    int stepping;                      /* a submitting thread is running steps             */
    int sched_stepping;                /* the scheduler thread is running a step           */
    kvld_job *jobs;
    int n_jobs;
    size_t buffered;                   /* sum of the jobs' buffered bytes */
    /* per-step scratch, used by the thread that steps (see stepping) */
    kvl_batch_seq *seqs;
    kvld_job **seq_jobs;
    /* measured costs (the stepping thread's; exponential moving averages, 0 until measured):
     * a decode-only step per decoding sequence, and one prefill token in a mixed step */
    double decode_s_per_seq, prefill_s_per_token;
};

/* Weight of the newest sample in the cost averages: about the last 8 steps. */
#define COST_EWMA 0.125

static void ewma(double *avg, double sample) {
    *avg = *avg > 0 ? *avg + COST_EWMA * (sample - *avg) : sample;
}

/* Prefill tokens this step may carry next to n_decode decoding sequences (see
 * kvld_sched_params.decode_stretch). */
static int prefill_budget(const kvld_sched *s, int n_decode) {
    int full = s->p.prefill_chunk;
    if (n_decode == 0 || s->p.decode_stretch < 1.0 || s->decode_s_per_seq <= 0 ||
        s->prefill_s_per_token <= 0)
        return full;
    double allow = (s->p.decode_stretch - 1.0) * s->decode_s_per_seq * n_decode;
    double tok = allow / s->prefill_s_per_token;
    int b = tok >= (double)full ? full : (int)tok;
    return b < KVLD_MIN_PREFILL_CHUNK ? (full < KVLD_MIN_PREFILL_CHUNK ? full : KVLD_MIN_PREFILL_CHUNK) : b;
}

static void job_finish(kvld_job *j, kvl_status st, const char *reason, const char *err) {
    j->finished = 1;
    j->status = st;
    j->finish_reason = reason;
    if (err) snprintf(j->err, sizeof j->err, "%s", err);
    pthread_cond_broadcast(&j->cv);
}

/* Sample from the session's logits, append to the ledger, hand the token to the reader.
 * mu held.  Ends the job on max_tokens, EOS or a full context. */
static void emit(kvld_sched *s, kvld_job *j) {
    kvld_session *ss = j->sess;
    int32_t tok;
    float lp;
    kvl_status st = kvl_sampler_sample(j->sampler, ss->logits, s->vocab, &tok, &lp);
    if (st != KVL_OK) {
        job_finish(j, st, "error", kvl_last_error());
        return;
    }
    if (j->n_out == j->cap_out) {
        int cap = j->cap_out ? j->cap_out * 2 : 64;
        kvld_token *o = realloc(j->out, sizeof *o * (size_t)cap);
        if (!o) {
            job_finish(j, KVL_ERR_NOMEM, "error", "out of memory for generated tokens");
            return;
        }
        j->out = o;
        j->cap_out = cap;
    }
    float *lps = NULL;
    if (j->gp.want_logprobs) {
        lps = malloc(sizeof(float) * (size_t)s->vocab);
        if (!lps) {
            job_finish(j, KVL_ERR_NOMEM, "error", "out of memory for logprobs");
            return;
        }
        /* the logits as they are: the reader turns them into the log-softmax (kvld_job_next),
         * off this thread and its lock.  Computed here, in double, a 151,936-token vocabulary
         * held every session of the batch 1.4 ms per token of each session that asked. */
        memcpy(lps, ss->logits, sizeof(float) * (size_t)s->vocab);
    }
    j->out[j->n_out++] = (kvld_token){tok, lp, lps};
    size_t bytes = sizeof(kvld_token) + (lps ? sizeof(float) * (size_t)s->vocab : 0);
    j->buffered += bytes;
    s->buffered += bytes;
    double now = kvl__now_s();
    if (j->generated++ == 0) j->ttft = now - j->t_start;
    else kvld_metrics_observe(s->metrics, KVLD_H_INTER_TOKEN_SECONDS, now - j->t_last_token);
    j->t_last_token = now;
    ss->ledger[ss->n_ledger] = tok;
    __atomic_store_n(&ss->n_ledger, ss->n_ledger + 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&j->cv);
    int stop_id = 0;
    for (int i = 0; i < j->gp.n_stop; i++) stop_id |= j->gp.stop_ids[i] == tok;
    if (j->gp.stop_at_eos && kvl_model_is_eos(s->model, tok)) job_finish(j, KVL_OK, "eos", NULL);
    else if (stop_id) job_finish(j, KVL_OK, "stop", NULL);
    else if (j->generated >= j->gp.max_tokens) job_finish(j, KVL_OK, "length", NULL);
    else if (ss->n_ledger >= ss->max_context) job_finish(j, KVL_OK, "context", NULL);
}

/* Backpressure (mu held): a generate job whose reader fell behind is skipped until it reads;
 * counted once per pause. */
static int held_back(kvld_sched *s, kvld_job *j) {
    int p = j->kind == JOB_GENERATE && j->buffered > 0 &&
            (j->buffered >= s->p.stream_backlog_bytes || s->buffered >= s->p.node_buffer_bytes);
    if (p && !j->paused) kvld_metrics_refuse(s->metrics, KVLD_R_STREAM_PAUSED);
    j->paused = p;
    return p;
}

/* Before a step: settle jobs that need no forward (cancelled, prefill already complete, a
 * generate whose logits are ready).  mu held. */
static void settle(kvld_sched *s) {
    for (kvld_job *j = s->jobs; j; j = j->next) {
        if (j->finished) continue;
        if (j->cancelled || (j->cancel_flag && *j->cancel_flag)) {
            job_finish(j, KVL_ERR_CANCELLED, "cancelled", "cancelled by the client");
            continue;
        }
        kvld_session *ss = j->sess;
        int cached = kvl_cache_n_tokens(ss->cache);
        if (cached < ss->n_ledger) continue;
        if (j->kind == JOB_PREFILL) {
            job_finish(j, KVL_OK, "prefilled", NULL);
        } else if (ss->logits_valid) {
            if (!held_back(s, j)) emit(s, j);
        } else if (cached > 0) {
            /* K/V of the last token came from a translated span (or logits were dropped):
             * re-run that token natively to get the next-token distribution.  A cut that fails
             * ends the job: left as it is, no pass would ever pick it up */
            if (kvl_cache_truncate(ss->cache, cached - 1) != KVL_OK)
                job_finish(j, KVL_ERR_INTERNAL, "error", kvl_last_error());
        }
    }
}

/* Unlink finished jobs (their owners still hold them). mu held. */
static void unlink_finished(kvld_sched *s) {
    kvld_job **pp = &s->jobs;
    while (*pp) {
        if ((*pp)->finished) {
            *pp = (*pp)->next;
            s->n_jobs--;
        } else {
            pp = &(*pp)->next;
        }
    }
    kvld_metrics_set(s->metrics, KVLD_G_ACTIVE_JOBS, s->n_jobs);
}

/* Round robin: the jobs that just ran go to the back of the queue (in their order), so that
 * with more sessions than max_batch, or several prefills, every job gets its turn.  mu held. */
static void rotate(kvld_sched *s, int n) {
    kvld_job *head = NULL, **tail = &head;
    for (int i = 0; i < n; i++) {
        kvld_job *j = s->seq_jobs[i];
        kvld_job **pp = &s->jobs;
        while (*pp && *pp != j) pp = &(*pp)->next;
        if (!*pp) continue;   /* only finished jobs leave the queue, and these are running */
        *pp = j->next;
        j->next = NULL;
        *tail = j;
        tail = &j->next;
    }
    kvld_job **pp = &s->jobs;
    while (*pp) pp = &(*pp)->next;
    *pp = head;
}

/* One step: a batch of decode tokens and prefill chunks through one forward pass.  mu held
 * (released during the forward); the caller settled and unlinked before.  Returns 0 when
 * nothing was runnable. */
static int step(kvld_sched *s) {
    /* decode tokens first (one each), then prefill chunks within the token budget */
    int n = 0, budget, n_decode = 0, n_prefill_tok = 0, n_chunks = 0;
    /* keep one slot for prefill when some is waiting: decoders must not starve a new
     * session's prompt any more than a long prompt may starve them */
    int has_prefill = 0;
    for (kvld_job *j = s->jobs; j && !has_prefill; j = j->next)
        has_prefill = j->sess->n_ledger - kvl_cache_n_tokens(j->sess->cache) > 1;
    int decode_slots = s->p.max_batch - (has_prefill && s->p.max_batch > 1);
    for (kvld_job *j = s->jobs; j && n < decode_slots; j = j->next) {
        kvld_session *ss = j->sess;
        int pending = ss->n_ledger - kvl_cache_n_tokens(ss->cache);
        if (pending != 1 || held_back(s, j)) continue;
        s->seqs[n] = (kvl_batch_seq){ss->cache, ss->ledger + kvl_cache_n_tokens(ss->cache), 1,
                                     KVL_LOGITS_LAST, ss->logits};
        s->seq_jobs[n++] = j;
        if (j->kind == JOB_GENERATE && j->generated > 0) n_decode++;
        else n_prefill_tok++;
    }
    budget = prefill_budget(s, n_decode);
    for (kvld_job *j = s->jobs; j && n < s->p.max_batch && budget > 0; j = j->next) {
        kvld_session *ss = j->sess;
        int cached = kvl_cache_n_tokens(ss->cache);
        int pending = ss->n_ledger - cached;
        if (pending <= 1) continue;
        int chunk = pending < budget ? pending : budget;
        budget -= chunk;
        n_prefill_tok += chunk;
        n_chunks++;
        s->seqs[n] = (kvl_batch_seq){ss->cache, ss->ledger + cached, chunk,
                                     chunk == pending ? KVL_LOGITS_LAST : KVL_LOGITS_NONE,
                                     chunk == pending ? ss->logits : NULL};
        s->seq_jobs[n++] = j;
    }
    if (n == 0) return 0;   /* nothing runnable (cannot happen after settle, but never spin) */
    double t0 = kvl__now_s();
    for (int i = 0; i < n; i++) {
        kvld_job *j = s->seq_jobs[i];
        if (j->started) continue;
        j->started = 1;
        kvld_metrics_observe(s->metrics, KVLD_H_QUEUE_SECONDS, t0 - j->t_start);
    }
    pthread_mutex_unlock(&s->mu);
    kvl_status st = kvl_model_forward(s->model, s->seqs, n);
    double dt = kvl__now_s() - t0;
    char err[512] = "";
    if (st != KVL_OK) snprintf(err, sizeof err, "forward pass failed: %s", kvl_last_error());
    pthread_mutex_lock(&s->mu);
    kvld_metrics_add(s->metrics, KVLD_C_FORWARD_PASSES, 1);
    kvld_metrics_observe(s->metrics, KVLD_H_FORWARD_SECONDS, dt);
    kvld_metrics_observe(s->metrics, KVLD_H_DECODE_BATCH, n);
    if (st != KVL_OK) {
        kvl__svc_log("error", "msg=forward_failed seqs=%d err=\"%s\"", n, kvl_last_error());
        for (int i = 0; i < n; i++)
            if (!s->seq_jobs[i]->finished) job_finish(s->seq_jobs[i], st, "error", err);
        return 1;
    }
    /* the cost model behind prefill_budget: decode-only steps give the per-sequence decode
     * cost; mixed steps give the prefill token cost net of their decode rows */
    if (n_prefill_tok == 0 && n_decode > 0) {
        ewma(&s->decode_s_per_seq, dt / n_decode);
    } else if (n_prefill_tok >= KVLD_MIN_PREFILL_CHUNK) {
        double net = dt - s->decode_s_per_seq * n_decode;
        if (net > 0) ewma(&s->prefill_s_per_token, net / n_prefill_tok);
    }
    kvld_metrics_add(s->metrics, KVLD_C_TOKENS_DECODED, (uint64_t)n_decode);
    kvld_metrics_add(s->metrics, KVLD_C_TOKENS_PREFILLED, (uint64_t)n_prefill_tok);
    kvld_metrics_add(s->metrics, KVLD_C_PREFILL_CHUNKS, (uint64_t)n_chunks);
    for (int i = 0; i < n; i++) {
        kvld_session *ss = s->seq_jobs[i]->sess;
        /* logits are current only when the cache reached the end of the ledger */
        ss->logits_valid = s->seqs[i].logits_mode == KVL_LOGITS_LAST;
    }
    rotate(s, n);
    return 1;
}

static void *sched_main(void *arg) {
    kvld_sched *s = arg;
    pthread_setname_np(pthread_self(), "kvld-sched");
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->stepping) {   /* a submitter runs its job's first step (submit) */
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        settle(s);
        unlink_finished(s);
        if (s->stop) break;
        if (!s->jobs) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        s->sched_stepping = 1;
        int ran = step(s);
        s->sched_stepping = 0;
        if (!ran) pthread_cond_wait(&s->cv, &s->mu);
    }
    /* stopping: fail whatever is left */
    for (kvld_job *j = s->jobs; j; j = j->next)
        if (!j->finished) job_finish(j, KVL_ERR_CANCELLED, "cancelled", "node shutting down");
    unlink_finished(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

kvl_status kvld_sched_create(kvl_model *model, kvld_metrics *metrics,
                             const kvld_sched_params *p, kvld_sched **out) {
    kvld_sched *s = calloc(1, sizeof *s);
    if (!s) return kvl__errorf(KVL_ERR_NOMEM, "scheduler");
    s->model = model;
    s->metrics = metrics;
    s->p = *p;
    if (s->p.max_batch < 1) s->p.max_batch = 32;
    if (!s->p.stream_backlog_bytes) s->p.stream_backlog_bytes = (size_t)1 << 20;
    if (!s->p.node_buffer_bytes) s->p.node_buffer_bytes = (size_t)64 << 20;
    if (s->p.prefill_chunk < 1) s->p.prefill_chunk = 256;
    s->vocab = kvl_model_config_get(model)->vocab_size;
    s->seqs = calloc((size_t)s->p.max_batch, sizeof *s->seqs);
    s->seq_jobs = calloc((size_t)s->p.max_batch, sizeof *s->seq_jobs);
    if (!s->seqs || !s->seq_jobs) {
        kvld_sched_free(s);
        return kvl__errorf(KVL_ERR_NOMEM, "scheduler");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        kvld_sched_free(s);
        return kvl__errorf(KVL_ERR_INTERNAL, "cannot start the scheduler thread");
    }
    s->started = 1;
    *out = s;
    return KVL_OK;
}

void kvld_sched_free(kvld_sched *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
    }
    free(s->seqs);
    free(s->seq_jobs);
    free(s);
}

size_t kvld_sched_buffered(kvld_sched *s) {
    pthread_mutex_lock(&s->mu);
    size_t b = s->buffered;
    pthread_mutex_unlock(&s->mu);
    return b;
}

int kvld_sched_active(kvld_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_jobs;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Queue job j.  When the node is idle (no other job, the scheduler thread not stepping), the
 * caller, which waits for j's first token or its end anyway, runs j's first step itself: waking
 * the scheduler thread and then being woken by it put two thread wake-ups (20-80 us each on a
 * 2-vCPU host, measured) on every turn's time to first token.  One step only (a prompt longer
 * than prefill_chunk continues on the scheduler thread), so a cancel is seen as soon as it was
 * before; what is left goes to the scheduler thread. */
static kvl_status submit(kvld_sched *s, kvld_job *j) {
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return kvl__errorf(KVL_ERR_CANCELLED, "node shutting down");
    }
    /* append: older jobs keep their place in the prefill order (first come, first served) */
    kvld_job **pp = &s->jobs;
    while (*pp) pp = &(*pp)->next;
    *pp = j;
    s->n_jobs++;
    kvld_metrics_set(s->metrics, KVLD_G_ACTIVE_JOBS, s->n_jobs);
    if (s->jobs == j && !j->next && !s->stepping && !s->sched_stepping) {
        s->stepping = 1;
        settle(s);
        unlink_finished(s);
        /* a session whose logits were current (prefilled by Append) had its first token from
         * the settle: no forward before it goes out */
        if (!s->stop && !j->finished && j->n_out == 0 && step(s)) {   /* then its first token */
            settle(s);
            unlink_finished(s);
        }
        s->stepping = 0;
        /* the scheduler thread is woken only for work left: the rest of j, or jobs that came */
        int left = 0;
        for (kvld_job *x = s->jobs; x && !left; x = x->next) left = !x->finished;
        if (left || s->stop) pthread_cond_broadcast(&s->cv);
    } else {
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return KVL_OK;
}

static kvld_job *job_new(kvld_sched *s, kvld_session *sess, job_kind kind) {
    kvld_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->s = s;
    j->sess = sess;
    j->kind = kind;
    j->t_start = kvl__now_s();
    pthread_cond_init(&j->cv, NULL);
    return j;
}

kvl_status kvld_sched_prefill(kvld_sched *s, kvld_session *sess, const volatile int *cancel) {
    kvld_job *j = job_new(s, sess, JOB_PREFILL);
    if (!j) return kvl__errorf(KVL_ERR_NOMEM, "prefill job");
    j->cancel_flag = cancel;
    kvl_status st = submit(s, j);
    if (st != KVL_OK) {
        kvld_job_free(j);
        return st;
    }
    pthread_mutex_lock(&s->mu);
    while (!j->finished) pthread_cond_wait(&j->cv, &s->mu);
    st = j->status;
    pthread_mutex_unlock(&s->mu);
    if (st != KVL_OK) kvl__errorf(st, "%s", j->err);
    kvld_job_free(j);
    return st;
}

kvl_status kvld_sched_generate(kvld_sched *s, kvld_session *sess, const kvld_gen_params *p,
                               kvld_job **out) {
    *out = NULL;
    if (p->max_tokens < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "max_tokens must be >= 1 (got %d)", p->max_tokens);
    if (sess->n_ledger == 0)
        return kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is empty: Append tokens before Generate",
                          sess->id);
    if (sess->n_ledger >= sess->max_context)
        return kvl__errorf(KVL_ERR_RANGE, "session '%s' is full: %d tokens = max context %d",
                          sess->id, sess->n_ledger, sess->max_context);
    kvld_job *j = job_new(s, sess, JOB_GENERATE);
    if (!j) return kvl__errorf(KVL_ERR_NOMEM, "generate job");
    j->gp = *p;
    j->cancel_flag = p->cancel;
    kvl_status st = kvl_sampler_create(&p->sampler, &j->sampler);
    if (st == KVL_OK) st = submit(s, j);
    if (st != KVL_OK) {
        kvld_job_free(j);
        return st;
    }
    *out = j;
    return KVL_OK;
}

int kvld_job_next(kvld_job *j, kvld_token *tok) {
    kvld_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    while (j->n_read == j->n_out && !j->finished) pthread_cond_wait(&j->cv, &s->mu);
    int got = j->n_read < j->n_out;
    if (got) {
        kvld_token *o = &j->out[j->n_read++];
        *tok = *o;
        o->logprobs = NULL;   /* the reader's now */
        size_t bytes = sizeof(kvld_token) + (tok->logprobs ? sizeof(float) * (size_t)s->vocab : 0);
        j->buffered -= bytes;
        s->buffered -= bytes;
        if (j->paused) pthread_cond_broadcast(&s->cv);   /* it may run again */
    }
    pthread_mutex_unlock(&s->mu);
    if (got && tok->logprobs) kvl_log_softmax(tok->logprobs, s->vocab);   /* emit() left logits */
    return got;
}

kvl_status kvld_job_result(kvld_job *j, const char **err, const char **finish_reason,
                           double *ttft) {
    if (err) *err = j->err;
    if (finish_reason) *finish_reason = j->finish_reason ? j->finish_reason : "";
    if (ttft) *ttft = j->ttft;
    return j->status;
}

void kvld_job_cancel(kvld_job *j) {
    kvld_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    j->cancelled = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void kvld_job_free(kvld_job *j) {
    if (!j) return;
    kvld_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    int queued = 0;
    for (kvld_job *x = s->jobs; x; x = x->next) queued |= x == j;
    if (queued && !j->finished) {
        j->cancelled = 1;
        pthread_cond_broadcast(&s->cv);
        while (!j->finished) pthread_cond_wait(&j->cv, &s->mu);
    }
    s->buffered -= j->buffered;   /* output nobody will read */
    j->buffered = 0;
    /* the scheduler unlinks finished jobs at its next step: do it now so j can go */
    kvld_job **pp = &s->jobs;
    while (*pp) {
        if (*pp == j) {
            *pp = j->next;
            s->n_jobs--;
            break;
        }
        pp = &(*pp)->next;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < j->n_out; i++) free(j->out[i].logprobs);
    free(j->out);
    kvl_sampler_free(j->sampler);
    pthread_cond_destroy(&j->cv);
    free(j);
}
