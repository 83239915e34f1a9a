/* bench/bench_prefill.c: the cost of a short prefill chunk over a long context, the forward a
 * model switch waits for (the target runs the turn's new tokens over the translated span), beside
 * one decode step over the same context and a chunked re-prefill of the whole context.
 *
 * For each context length C (random tokens, prefilled untimed in chunks of --chunk): a forward
 * of n new tokens at n_past = C for each n of --tokens (n = 1 is a decode step), the cache cut
 * back to C after every repeat; then a re-prefill of C tokens from an empty cache in chunks of
 * --chunk (as kvld's scheduler runs it).  Medians of --reps after one warm-up, milliseconds.
 *   bench_prefill --model DIR [--weights-dtype f32|bf16] [--kv-dtype f32|bf16] [--contexts 512,2048]
 *                 [--tokens 1,9,64,256] [--chunk 256] [--reps 15] [--threads N (0: all cores)]
 *                 [--no-reprefill] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "kvlingo/cache.h"
#include "kvlingo/model.h"

#define MAX_LIST 16

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* "a,b,c" of positive ints into out[MAX_LIST]; the count, or -1 naming the bad text. */
static int parse_list(const char *flag, const char *text, int *out) {
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 20) || n == MAX_LIST || (*end && *end != ',')) {
            fprintf(stderr, "bench_prefill: %s: bad list '%s' (up to %d positive integers, "
                            "comma-separated)\n", flag, text, MAX_LIST);
            return -1;
        }
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

/* Prefill tokens [from, to) of tok in chunks of `chunk` (logits of the last row only). */
static kvl_status prefill_chunks(kvl_model *m, kvl_cache *c, const int32_t *tok, int from, int to,
                                 int chunk, float *logits) {
    for (int t = from; t < to; t += chunk) {
        int n = to - t < chunk ? to - t : chunk;
        kvl_status s = kvl_model_prefill(m, c, tok + t, n, KVL_LOGITS_LAST, logits);
        if (s != KVL_OK) return s;
    }
    return KVL_OK;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *dtype = "f32", *kv_dtype = "f32";
    int contexts[MAX_LIST] = {512, 2048}, n_ctx = 2, tokens[MAX_LIST] = {1, 9, 64, 256}, n_tok = 4;
    int chunk = 256, reps = 15, threads = 0, reprefill = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-reprefill")) { reprefill = 0; continue; }
        if (!v) { fprintf(stderr, "bench_prefill: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--weights-dtype")) dtype = v;
        else if (!strcmp(a, "--kv-dtype")) kv_dtype = v;
        else if (!strcmp(a, "--contexts")) { if ((n_ctx = parse_list(a, v, contexts)) < 0) return 2; }
        else if (!strcmp(a, "--tokens")) { if ((n_tok = parse_list(a, v, tokens)) < 0) return 2; }
        else if (!strcmp(a, "--chunk")) chunk = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else { fprintf(stderr, "bench_prefill: unknown option %s\n", a); return 2; }
    }
    if (!dir || chunk < 1 || reps < 1 || reps > 1000 || threads < 0) {
        fprintf(stderr, "usage: bench_prefill --model DIR [--weights-dtype f32|bf16] [--kv-dtype f32|bf16] [--contexts 512,2048]\n"
                        "       [--tokens 1,9,64,256] [--chunk N >= 1] [--reps 1..1000] [--threads N] [--no-reprefill]\n");
        return 2;
    }
    kvl_model_params mp = kvl_model_default_params();
    mp.n_threads = threads;
    kvl_model *m = NULL;
    kvl_status s = kvl_weights_dtype_parse(dtype, &mp.weights_dtype);
    if (s == KVL_OK) s = kvl_kv_dtype_parse(kv_dtype, &mp.kv_dtype);
    if (s == KVL_OK) s = kvl_model_load(dir, &mp, &m);
    if (s != KVL_OK) {
        fprintf(stderr, "bench_prefill: %s: %s\n", dir, kvl_last_error());
        return 1;
    }
    const kvl_model_config *cfg = kvl_model_config_get(m);
    int max_ctx = 0, max_tok = 0;
    for (int i = 0; i < n_ctx; i++) max_ctx = contexts[i] > max_ctx ? contexts[i] : max_ctx;
    for (int i = 0; i < n_tok; i++) max_tok = tokens[i] > max_tok ? tokens[i] : max_tok;
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = max_ctx + max_tok;
    kvl_cache *c = NULL;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(max_ctx + max_tok));
    float *logits = malloc(sizeof(float) * (size_t)cfg->vocab_size);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!tok || !logits || !t) { fprintf(stderr, "bench_prefill: out of memory\n"); return 1; }
    if ((s = kvl_model_cache_create(m, &cp, &c)) != KVL_OK) {
        fprintf(stderr, "bench_prefill: cache of %d tokens: %s\n", cp.max_tokens, kvl_last_error());
        return 1;
    }
    uint64_t rng = 12345;
    for (int i = 0; i < max_ctx + max_tok; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((rng >> 33) % (uint64_t)cfg->vocab_size);
    }
    printf("bench_prefill: %s (%s weights, %s KV cache), %d layers, %d q / %d KV heads, head_dim %d; chunk %d, "
           "median of %d, ms\n", dir, dtype, kv_dtype, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads,
           cfg->head_dim, chunk, reps);
    printf("%8s", "context");
    for (int i = 0; i < n_tok; i++) printf(" %9d tok", tokens[i]);
    printf(" %14s\n", reprefill ? "re-prefill" : "");
    for (int ci = 0; ci < n_ctx; ci++) {
        const int C = contexts[ci];
        if ((s = kvl_cache_truncate(c, 0)) != KVL_OK ||
            (s = prefill_chunks(m, c, tok, 0, C, chunk, logits)) != KVL_OK)
            goto fail;
        printf("%8d", C);
        for (int ti = 0; ti < n_tok; ti++) {
            const int n = tokens[ti];
            for (int r = -1; r < reps; r++) {
                double t0 = kvl__now_s();
                if ((s = kvl_model_prefill(m, c, tok + C, n, KVL_LOGITS_LAST, logits)) != KVL_OK) goto fail;
                double dt = kvl__now_s() - t0;
                if ((s = kvl_cache_truncate(c, C)) != KVL_OK) goto fail;
                if (r >= 0) t[r] = dt * 1e3;
            }
            printf(" %13.3f", median(t, reps));
        }
        for (int r = -1; reprefill && r < reps; r++) {
            if ((s = kvl_cache_truncate(c, 0)) != KVL_OK) goto fail;
            double t0 = kvl__now_s();
            if ((s = prefill_chunks(m, c, tok, 0, C, chunk, logits)) != KVL_OK) goto fail;
            if (r >= 0) t[r] = (kvl__now_s() - t0) * 1e3;
        }
        if (reprefill) printf(" %14.3f", median(t, reps));
        printf("\n");
        fflush(stdout);
    }
    kvl_cache_free(c);
    kvl_model_free(m);
    free(tok); free(logits); free(t);
    return 0;
fail:
    fprintf(stderr, "bench_prefill: %s\n", kvl_last_error());
    return 1;
}
