/* bench/bench_runtime.c: CPU runtime throughput on the shipped models.
 *
 * Prints, per model: prefill tokens/s at 64, 512 and 2048 tokens and decode tokens/s (128 steps
 * after a 64-token prompt), each with its achieved GFLOP/s and that figure as a fraction of this
 * machine's OpenBLAS sgemm peak measured in the same run (1024^3 product).  Median of repeats.
 *   bench_runtime [--models-dir DIR] [--repeats N] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "kvlingo/cache.h"
#include "kvlingo/model.h"


static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double sgemm_peak(int repeats) {
    const int N = 1024;
    float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N), *c = malloc(sizeof(float) * N * N);
    if (!a || !b || !c) { free(a); free(b); free(c); return 0; }
    for (int i = 0; i < N * N; i++) { a[i] = (float)(i % 13) * 0.01f; b[i] = (float)(i % 7) * 0.02f; }
    double t[16];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1, a, N, b, N, 0, c, N);   /* warm-up */
    for (int r = 0; r < repeats; r++) {
        double t0 = kvl__now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1, a, N, b, N, 0, c, N);
        t[r] = kvl__now_s() - t0;
    }
    free(a); free(b); free(c);
    return 2.0 * N * N * N / median(t, repeats) / 1e9;
}

/* FLOPs of the transformer body per token (projections + MLP), attention per (query, key) pair,
 * and the LM head per logits row. */
static void flop_model(const kvl_model_config *c, double *per_token, double *per_pair, double *head) {
    double H = c->hidden_size, D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads, F = c->intermediate_size;
    *per_token = 2.0 * c->n_layers * (H * Hq * D * 2 + 2 * H * Hkv * D + 3 * H * F);
    *per_pair = 4.0 * c->n_layers * Hq * D;
    *head = 2.0 * c->vocab_size * H;
}

int main(int argc, char **argv) {
    const char *models_dir = "models";
    int repeats = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--models-dir")) models_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
    }
    if (repeats < 1 || repeats > 16) repeats = 5;
    const char *names[] = {"qwen3-a", "qwen3-b", "qwen2-c"};
    const int lens[] = {64, 512, 2048};
    double peak = sgemm_peak(repeats);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("OpenBLAS sgemm peak (1024^3, median of %d): %.1f GFLOP/s  [OPENBLAS_CORETYPE=%s, %d threads]\n\n",
           repeats, peak, ct ? ct : "unset", openblas_get_num_threads());
    printf("| model   | phase            | tokens/s | GFLOP/s | of sgemm peak |\n");
    printf("|---------|------------------|---------:|--------:|--------------:|\n");
    for (size_t mi = 0; mi < sizeof names / sizeof names[0]; mi++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", models_dir, names[mi]);
        kvl_model *m;
        if (kvl_model_load(dir, NULL, &m) != KVL_OK) { fprintf(stderr, "%s: %s\n", dir, kvl_last_error()); return 1; }
        const kvl_model_config *c = kvl_model_config_get(m);
        double ft, fp, fh;
        flop_model(c, &ft, &fp, &fh);
        int32_t *toks = malloc(sizeof(int32_t) * 2048 + 4 * 256);
        float *logits = malloc(sizeof(float) * c->vocab_size);
        kvl_cache *cache;
        kvl_cache_params cp = kvl_cache_default_params();
        cp.max_tokens = 2048 + 256;
        if (!toks || !logits || kvl_cache_create(c, &cp, &cache) != KVL_OK) { fprintf(stderr, "out of memory\n"); return 1; }
        for (int i = 0; i < 2048 + 256; i++) toks[i] = (i * 7919 + 13) % c->vocab_size;
        for (int li = 0; li < 3; li++) {
            int T = lens[li];
            double t[16];
            for (int r = 0; r < repeats; r++) {
                kvl_cache_truncate(cache, 0);
                double t0 = kvl__now_s();
                if (kvl_model_prefill(m, cache, toks, T, KVL_LOGITS_LAST, logits) != KVL_OK) return 1;
                t[r] = kvl__now_s() - t0;
            }
            double sec = median(t, repeats);
            double flops = ft * T + fp * (double)T * (T + 1) / 2 + fh;
            printf("| %-7s | prefill %5d    | %8.0f | %7.1f | %12.0f%% |\n", names[mi], T, T / sec,
                   flops / sec / 1e9, 100.0 * flops / sec / 1e9 / peak);
        }
        {
            const int P = 64, S = 128;
            double t[16];
            for (int r = 0; r < repeats; r++) {
                kvl_cache_truncate(cache, 0);
                if (kvl_model_prefill(m, cache, toks, P, KVL_LOGITS_LAST, logits) != KVL_OK) return 1;
                double t0 = kvl__now_s();
                for (int s = 0; s < S; s++)
                    if (kvl_model_decode(m, cache, toks[P + s], logits) != KVL_OK) return 1;
                t[r] = kvl__now_s() - t0;
            }
            double sec = median(t, repeats);
            double flops = (ft + fh) * S + fp * ((double)S * P + (double)S * (S + 1) / 2);
            printf("| %-7s | decode, ctx 64+  | %8.0f | %7.1f | %12.0f%% |\n", names[mi], S / sec,
                   flops / sec / 1e9, 100.0 * flops / sec / 1e9 / peak);
        }
        kvl_cache_free(cache);
        free(toks);
        free(logits);
        kvl_model_free(m);
    }
    return 0;
}
