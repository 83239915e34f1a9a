/* bench/bench_batch.c: node throughput under concurrency, through kvld's continuous-batching
 * scheduler in process (the code a node runs; no gRPC).
 *
 *   bench_batch [--model DIR | --shape NAME] [--sessions 1,4,16,32] [--tokens 128] [--prompt 64]
 *               [--repeat 3] [--long-prefill 2048] [--threads 2] [--weights-dtype auto|f32|bf16]
 *               [--kv-dtype f32|bf16]
 *               [--max-batch 64] [--prefill-chunk 256] [--decode-stretch 2]
 *
 * For each session count N: N sessions, each prefilled with a `prompt`-token prompt, generate
 * `tokens` tokens greedily and concurrently (one reader thread per session, as kvld's gRPC
 * handlers do).  Reported per N, as the median of `repeat` runs (counts interleaved, so every
 * count sees the same machine load):
 *   tokens/s (all sessions), the speed-up over one session, the mean decode batch, and the p50 /
 *   p99 inter-token latency (the gap between two tokens of one session, as its reader sees it);
 *   then the same run again with one long prompt (`long-prefill` tokens) submitted when the
 *   first session is halfway, and its prefill time: what a long prefill does to decoding sessions.
 *   p99/p50 is within that run; p99/solo divides its p99 by the p50 of the run without the long
 *   prompt (the stricter figure: most of a decoding session's tokens arrive while it prefills).
 * --shape runs a random-weight model of a published geometry (kvlingo/shapes.h, e.g.
 * qwen2.5-0.5b), which is where decode is bound by reading the weights.  The load average
 * before and after is printed: a loaded machine lowers the multi-session figures most. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "kvld.h"
#include "kvlingo/shapes.h"
#include "kvlingo/status.h"
#include "kvlingo/version.h"

#define MAX_COUNTS 16

typedef struct reader {
    kvld_job *job;
    int got, cap;
    double *t;   /* [cap] arrival time of each token */
} reader;

static void *read_tokens(void *arg) {
    reader *r = arg;
    kvld_token tok;
    while (kvld_job_next(r->job, &tok)) {
        if (r->got < r->cap) r->t[r->got] = kvl__now_s();
        r->got++;
    }
    return NULL;
}

typedef struct long_job {
    kvld_sched *sch;
    kvld_sessions *tab;
    const reader *watch;   /* start when this reader is halfway */
    int half, n_tokens, vocab;
    double prefill_s;
    kvl_status st;
} long_job;

static void *long_prefill(void *arg) {
    long_job *lj = arg;
    while (__atomic_load_n(&lj->watch->got, __ATOMIC_RELAXED) < lj->half) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    char id[KVLD_ID_MAX];
    kvld_session *ss;
    lj->st = kvld_sessions_open(lj->tab, "long", 0, id);
    if (lj->st == KVL_OK) lj->st = kvld_session_acquire(lj->tab, "long", KVLD_DECODE, 0, &ss, NULL);
    if (lj->st != KVL_OK) return NULL;
    for (int k = 0; k < lj->n_tokens; k++) ss->ledger[k] = (int32_t)((37 + 11 * k) % lj->vocab);
    ss->n_ledger = lj->n_tokens;
    double t0 = kvl__now_s();
    lj->st = kvld_sched_prefill(lj->sch, ss, NULL);
    lj->prefill_s = kvl__now_s() - t0;
    kvld_session_release(lj->tab, ss);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(double *v, size_t n, double q) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static double median(double *v, int n) { return quantile(v, (size_t)n, 0.5); }

typedef struct run_result {
    double tps, mean_batch, itl_p50, itl_p99, prefill_s;
} run_result;

typedef struct cfg {
    kvl_model *m;
    int tokens, prompt, long_tokens, vocab, max_batch, prefill_chunk;
    double decode_stretch;
} cfg;

/* The forward passes' batch-size histogram so far: the sum of the sizes and the count. */
static void batch_hist(kvld_metrics *met, double *sum, double *cnt) {
    size_t len;
    char *text = kvld_metrics_render(met, &len);
    const char *p = text ? strstr(text, "kvlingo_decode_batch_size_sum ") : NULL;
    *sum = p ? atof(p + strlen("kvlingo_decode_batch_size_sum ")) : 0;
    p = text ? strstr(text, "kvlingo_decode_batch_size_count ") : NULL;
    *cnt = p ? atof(p + strlen("kvlingo_decode_batch_size_count ")) : 0;
    free(text);
}

/* One run of ns sessions (with the long prompt when `with_long`); 0 on success. */
static int run_once(const cfg *c, int ns, int with_long, run_result *r) {
    kvld_metrics *met;
    kvld_sessions *tab;
    kvld_sched *sch;
    kvld_sched_params sp = {.max_batch = c->max_batch, .prefill_chunk = c->prefill_chunk,
                            .decode_stretch = c->decode_stretch};
    int ctx = c->prompt + c->tokens + 8;
    if (with_long && c->long_tokens + 8 > ctx) ctx = c->long_tokens + 8;
    if (kvld_metrics_create(&met) || kvld_sessions_create(c->m, ns + 1, ctx, &tab) ||
        kvld_sched_create(c->m, met, &sp, &sch)) {
        fprintf(stderr, "bench_batch: %s\n", kvl_last_error());
        return 1;
    }
    kvld_session **ss = calloc((size_t)ns, sizeof *ss);
    reader *rd = calloc((size_t)ns, sizeof *rd);
    pthread_t *th = calloc((size_t)ns, sizeof *th);
    if (!ss || !rd || !th) return 1;
    for (int i = 0; i < ns; i++) {
        char id[KVLD_ID_MAX], name[32];
        snprintf(name, sizeof name, "b%d", i);
        if (kvld_sessions_open(tab, name, 0, id) ||
            kvld_session_acquire(tab, name, KVLD_DECODE, 0, &ss[i], NULL)) {
            fprintf(stderr, "bench_batch: %s\n", kvl_last_error());
            return 1;
        }
        for (int k = 0; k < c->prompt; k++) ss[i]->ledger[k] = (int32_t)((100 + 7 * i + k) % c->vocab);
        ss[i]->n_ledger = c->prompt;
        if (kvld_sched_prefill(sch, ss[i], NULL) != KVL_OK) return 1;
        rd[i].cap = c->tokens;
        rd[i].t = calloc((size_t)c->tokens, sizeof(double));
        if (!rd[i].t) return 1;
    }
    kvld_gen_params gp = {.max_tokens = c->tokens, .stop_at_eos = 0,
                          .sampler = kvl_sampler_default_params()};
    gp.sampler.temperature = 0;
    /* the prompts' prefill steps (batches of one) are in the histogram too: the mean decode
     * batch counts only the steps after them */
    double bsum0, bcnt0;
    batch_hist(met, &bsum0, &bcnt0);
    long_job lj = {sch, tab, &rd[0], c->tokens / 2, c->long_tokens, c->vocab, 0, KVL_OK};
    pthread_t lth;
    double t0 = kvl__now_s();
    for (int i = 0; i < ns; i++) {
        if (kvld_sched_generate(sch, ss[i], &gp, &rd[i].job) != KVL_OK) return 1;
        pthread_create(&th[i], NULL, read_tokens, &rd[i]);
    }
    if (with_long) pthread_create(&lth, NULL, long_prefill, &lj);
    long total = 0;
    for (int i = 0; i < ns; i++) {
        pthread_join(th[i], NULL);
        total += rd[i].got;
    }
    double dt = kvl__now_s() - t0;
    if (with_long) {
        pthread_join(lth, NULL);
        if (lj.st != KVL_OK) {
            fprintf(stderr, "bench_batch: long prefill: %s\n", kvl_last_error());
            return 1;
        }
    }
    /* inter-token gaps of every session */
    size_t ng = 0;
    double *gaps = malloc(sizeof(double) * (size_t)ns * (size_t)c->tokens);
    if (!gaps) return 1;
    for (int i = 0; i < ns; i++)
        for (int k = 1; k < rd[i].got && k < rd[i].cap; k++) gaps[ng++] = rd[i].t[k] - rd[i].t[k - 1];
    r->itl_p50 = quantile(gaps, ng, 0.50);
    r->itl_p99 = quantile(gaps, ng, 0.99);
    free(gaps);
    double bsum, bcnt;
    batch_hist(met, &bsum, &bcnt);
    bsum -= bsum0, bcnt -= bcnt0;
    r->tps = (double)total / dt;
    r->mean_batch = bcnt > 0 ? bsum / bcnt : 0;
    r->prefill_s = lj.prefill_s;
    for (int i = 0; i < ns; i++) {
        kvld_job_free(rd[i].job);
        kvld_session_release(tab, ss[i]);
        free(rd[i].t);
    }
    kvld_sched_free(sch);
    kvld_sessions_free(tab);
    kvld_metrics_free(met);
    free(ss), free(rd), free(th);
    return 0;
}

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    while (s && *s && n < cap) {
        out[n++] = atoi(s);
        s = strchr(s, ',');
        if (s) s++;
    }
    return n;
}

static double loadavg(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *shape = NULL, *sessions_s = "1,4,16,32", *dtype = "auto",
               *kv_dtype = "f32";
    int tokens = 128, prompt = 64, repeat = 3, long_tokens = 2048, threads = 2;
    int max_batch = 64, prefill_chunk = 256;
    double decode_stretch = KVLD_DEFAULT_DECODE_STRETCH;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench_batch: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--shape")) shape = v;
        else if (!strcmp(a, "--sessions")) sessions_s = v;
        else if (!strcmp(a, "--tokens")) tokens = atoi(v);
        else if (!strcmp(a, "--prompt")) prompt = atoi(v);
        else if (!strcmp(a, "--repeat")) repeat = atoi(v);
        else if (!strcmp(a, "--long-prefill")) long_tokens = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--weights-dtype")) dtype = v;
        else if (!strcmp(a, "--kv-dtype")) kv_dtype = v;
        else if (!strcmp(a, "--max-batch")) max_batch = atoi(v);
        else if (!strcmp(a, "--prefill-chunk")) prefill_chunk = atoi(v);
        else if (!strcmp(a, "--decode-stretch")) decode_stretch = atof(v);
        else { fprintf(stderr, "bench_batch: unknown option %s\n", a); return 2; }
        i++;
    }
    if (repeat < 1 || tokens < 2 || prompt < 1 || (!model_dir && !shape)) {
        fprintf(stderr, "usage: bench_batch --model DIR | --shape NAME [--sessions 1,4,16,32] "
                        "[--tokens N >= 2] [--prompt N] [--repeat N] [--long-prefill N (0: off)] "
                        "[--threads N] [--weights-dtype auto|f32|bf16] [--kv-dtype f32|bf16]\n");
        return 2;
    }
    kvl_model_params mp = kvl_model_default_params();
    mp.n_threads = threads;
    if (kvl_weights_dtype_parse(dtype, &mp.weights_dtype) != KVL_OK) {
        fprintf(stderr, "bench_batch: --weights-dtype: %s\n", kvl_last_error());
        return 2;
    }
    if (kvl_kv_dtype_parse(kv_dtype, &mp.kv_dtype) != KVL_OK) {
        fprintf(stderr, "bench_batch: --kv-dtype: %s\n", kvl_last_error());
        return 2;
    }
    kvl_model *m = NULL;
    kvl_status st;
    if (model_dir) {
        st = kvl_model_load(model_dir, &mp, &m);
    } else {
        kvl_model_config mc;
        st = kvl_shape_config(shape, &mc);
        if (st == KVL_OK) st = kvl_model_create_random(&mc, 42, &mp, &m);
    }
    if (st != KVL_OK) {
        fprintf(stderr, "bench_batch: %s\n", kvl_last_error());
        return 1;
    }
    int counts[MAX_COUNTS];
    int nc = parse_list(sessions_s, counts, MAX_COUNTS);
    cfg c = {m, tokens, prompt, long_tokens, kvl_model_config_get(m)->vocab_size, max_batch,
             prefill_chunk, decode_stretch};
    double load0 = loadavg();
    run_result *res = calloc((size_t)nc * 2 * (size_t)repeat, sizeof *res);
    if (!res) return 1;
    /* counts interleaved and repeated: run rep of count k, plain then with the long prompt */
    for (int rep = 0; rep < repeat; rep++)
        for (int k = 0; k < nc; k++)
            for (int wl = 0; wl < (long_tokens > 0 ? 2 : 1); wl++)
                if (run_once(&c, counts[k], wl, &res[((size_t)k * 2 + wl) * repeat + rep])) return 1;
    printf("# %s, %d threads, weights %s, KV cache %s; prompt %d, %d tokens per session, greedy; max_batch %d, "
           "prefill_chunk %d, decode_stretch %.1f; median of %d runs; load average %.1f before, "
           "%.1f after\n", model_dir ? model_dir : shape, threads,
           kvl_weights_dtype_name(kvl_model_weights_dtype(m)), kvl_kv_dtype_name(kvl_model_kv_dtype(m)),
           prompt, tokens, max_batch,
           prefill_chunk, decode_stretch, repeat, load0, loadavg());
    char backends[512];
    kvl_backends_describe(backends, sizeof backends);
    printf("# backends: %s\n", backends);
    printf("%-9s %10s %8s %10s %9s %9s", "sessions", "tokens/s", "speedup", "mean_batch",
           "itl_p50ms", "itl_p99ms");
    if (long_tokens > 0)
        printf(" | %-4s %10s %9s %9s %9s %9s %10s", "with", "tokens/s", "itl_p50ms", "itl_p99ms", "p99/p50",
               "p99/solo", "prefill_ms");
    printf("\n");
    double base = 0;
    for (int k = 0; k < nc; k++) {
        double solo_p50 = 0;   /* this count's p50 without the long prompt */
        double v[5][64];
        int n = repeat < 64 ? repeat : 64;
        for (int wl = 0; wl < (long_tokens > 0 ? 2 : 1); wl++) {
            for (int i = 0; i < n; i++) {
                const run_result *r = &res[((size_t)k * 2 + wl) * repeat + i];
                v[0][i] = r->tps, v[1][i] = r->mean_batch, v[2][i] = r->itl_p50;
                v[3][i] = r->itl_p99, v[4][i] = r->prefill_s;
            }
            double tps = median(v[0], n), mb = median(v[1], n), p50 = median(v[2], n);
            double p99 = median(v[3], n), pf = median(v[4], n);
            if (wl == 0) {
                if (k == 0) base = tps;
                solo_p50 = p50;
                printf("%-9d %10.1f %8.2f %10.2f %9.2f %9.2f", counts[k], tps, base > 0 ? tps / base : 0,
                       mb, p50 * 1e3, p99 * 1e3);
            } else {
                printf(" | %-4d %10.1f %9.2f %9.2f %9.2f %9.2f %10.1f", long_tokens, tps, p50 * 1e3,
                       p99 * 1e3, p50 > 0 ? p99 / p50 : 0, solo_p50 > 0 ? p99 / solo_p50 : 0, pf * 1e3);
            }
        }
        printf("\n");
    }
    free(res);
    kvl_model_free(m);
    return 0;
}
