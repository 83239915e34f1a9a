/* bench/bench_runtime.c: CPU runtime throughput, float32 against bf16 weights side by side.
 *
 * In one run: this machine's memory bandwidth (a STREAM-like copy on the same thread count),
 * the OpenBLAS sgemm peak (1024^3) and the bf16 kernel's peak (16 rows against a cache-resident
 * 1024x1024 bf16 matrix); then per model, once with --weights-dtype f32 and once with bf16:
 * prefill tokens/s and GFLOP/s, decode tokens/s after a 64-token prompt, the weight bytes a
 * decode step streams per second (parameters x dtype size x tokens/s; the LM head is read
 * once per token, the embedding one row) and that as a fraction of the measured read bandwidth
 * (a read-only pass beside the copy: weight streaming reads and writes nothing back; the best
 * of a few access patterns, since one sequential stream a core does not reach what the
 * decode kernels' several rows at once do).
 * Models: the shipped ones (models/), and random-weight published shapes (kvlingo/shapes.h).
 * Medians of repeats.
 *   bench_runtime [--models-dir DIR] [--repeats N] [--threads N (2)] [--shapes a,b (qwen2.5-1.5b)]
 *                 [--no-shipped] [--model DIR (instead of the shipped models and shapes)]
 *                 [--decode-only] */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bigalloc.h"
#include "clock.h"
#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/shapes.h"
#include "matmul_bf16.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double best(const double *v, int n) {
    double b = v[0];
    for (int i = 1; i < n; i++) b = v[i] < b ? v[i] : b;
    return b;
}

/* ---- machine figures ------------------------------------------------------------------------ */

typedef struct copy_arg {
    char *dst; const char *src; size_t n;
    int streams, prefetch;   /* read-only pass: interleaved streams, prefetch distance (bytes, 0 none) */
    uint64_t sum;
} copy_arg;
static void *copy_main(void *p) { copy_arg *a = p; memcpy(a->dst, a->src, a->n); return NULL; }

/* Read-only pass (what weight streaming does). One sequential stream per core leaves the
 * memory system idle between the hardware prefetcher's requests, so a single pattern
 * understates what the cores can pull; the decode kernels read several weight rows at once and
 * prefetch ahead in software. The region is cut into `streams` equal parts read in lock-step,
 * 256 bytes from each in turn, optionally prefetching `prefetch` bytes ahead; independent sums
 * keep the loads in flight, 64-byte loads where the CPU has AVX-512, 32 with AVX2. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVL_BENCH_X86 1
__attribute__((target("avx512f"))) static uint64_t read_avx512(const char *p, size_t per, int S, int pf) {
    __m512i s[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (size_t i = 0; i + 256 <= per; i += 256)
        for (int k = 0; k < S; k++) {
            const char *q = p + (size_t)k * per + i;
            if (pf) { _mm_prefetch(q + pf, _MM_HINT_T0); _mm_prefetch(q + pf + 128, _MM_HINT_T0); }
            s[0] = _mm512_add_epi64(s[0], _mm512_loadu_si512(q));
            s[1] = _mm512_add_epi64(s[1], _mm512_loadu_si512(q + 64));
            s[2] = _mm512_add_epi64(s[2], _mm512_loadu_si512(q + 128));
            s[3] = _mm512_add_epi64(s[3], _mm512_loadu_si512(q + 192));
        }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s[0], s[1]), _mm512_add_epi64(s[2], s[3])));
}
__attribute__((target("avx2"))) static uint64_t read_avx2(const char *p, size_t per, int S, int pf) {
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (size_t i = 0; i + 256 <= per; i += 256)
        for (int k = 0; k < S; k++) {
            const char *q = p + (size_t)k * per + i;
            if (pf) { _mm_prefetch(q + pf, _MM_HINT_T0); _mm_prefetch(q + pf + 128, _MM_HINT_T0); }
            for (int j = 0; j < 256; j += 128) {
                s[0] = _mm256_add_epi64(s[0], _mm256_loadu_si256((const __m256i *)(q + j)));
                s[1] = _mm256_add_epi64(s[1], _mm256_loadu_si256((const __m256i *)(q + j + 32)));
                s[2] = _mm256_add_epi64(s[2], _mm256_loadu_si256((const __m256i *)(q + j + 64)));
                s[3] = _mm256_add_epi64(s[3], _mm256_loadu_si256((const __m256i *)(q + j + 96)));
            }
        }
    __m256i t = _mm256_add_epi64(_mm256_add_epi64(s[0], s[1]), _mm256_add_epi64(s[2], s[3]));
    return (uint64_t)_mm256_extract_epi64(t, 0) ^ (uint64_t)_mm256_extract_epi64(t, 3);
}
#endif
static void *read_main(void *p) {
    copy_arg *a = p;
    size_t per = a->n / (size_t)a->streams / 256 * 256;
#ifdef KVL_BENCH_X86
    if (__builtin_cpu_supports("avx512f")) { a->sum = read_avx512(a->src, per, a->streams, a->prefetch); return NULL; }
    if (__builtin_cpu_supports("avx2")) { a->sum = read_avx2(a->src, per, a->streams, a->prefetch); return NULL; }
#endif
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 64 <= per; i += 64)
        for (int k = 0; k < a->streams; k++) {
            const uint64_t *v = (const uint64_t *)(a->src + (size_t)k * per + i);
            for (int j = 0; j < 8; j++) s[j] += v[j];
        }
    a->sum = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    return NULL;
}

/* Read-only patterns tried: (streams, prefetch bytes); the figure is the best of them. */
static const int read_patterns[][2] = {{1, 0}, {4, 0}, {16, 0}, {1, 512}, {4, 512}, {16, 1024}};
#define N_READ_PATTERNS ((int)(sizeof read_patterns / sizeof read_patterns[0]))

/* Over 512 MiB on n_threads threads, best of repeats (the machine's figure; the models' are
 * medians): STREAM "copy" (bytes read + written per second, GB/s) if !read_only, else the
 * bytes read per second of a read-only pass, best over read_patterns (*pattern: its index). */
static double bandwidth(int n_threads, int repeats, int read_only, int *pattern) {
    const size_t N = (size_t)512 << 20;
    /* on huge pages, as the model weights the decode figures stream (bigalloc.h) */
    char *a = kvl__bigalloc(N), *b = kvl__bigalloc(N);
    if (!a || !b) { free(a); free(b); return 0; }
    memset(a, 1, N);
    memset(b, 2, N);
    double top = 0;
    for (int pi = 0; pi < (read_only ? N_READ_PATTERNS : 1); pi++) {
        double t[16] = {0};
        for (int r = 0; r <= repeats; r++) {
            pthread_t th[16];
            copy_arg args[16];
            double t0 = kvl__now_s();
            for (int i = 0; i < n_threads; i++) {
                args[i] = (copy_arg){b + N / n_threads * i, a + N / n_threads * i, N / n_threads,
                                     read_patterns[pi][0], read_patterns[pi][1], 0};
                pthread_create(&th[i], NULL, read_only ? read_main : copy_main, &args[i]);
            }
            for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
            if (r) t[r - 1] = kvl__now_s() - t0;   /* the first pass warms the pages */
        }
        double gbs = (read_only ? 1.0 : 2.0) * (double)N / best(t, repeats) / 1e9;
        if (gbs > top) { top = gbs; if (pattern) *pattern = pi; }
    }
    free(a); free(b);
    return top;
}

static double sgemm_peak(int repeats) {
    const int N = 1024;
    float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N), *c = malloc(sizeof(float) * N * N);
    if (!a || !b || !c) { free(a); free(b); free(c); return 0; }
    for (int i = 0; i < N * N; i++) { a[i] = (float)(i % 13) * 0.01f; b[i] = (float)(i % 7) * 0.02f; }
    double t[16] = {0};
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1, a, N, b, N, 0, c, N);   /* warm-up */
    for (int r = 0; r < repeats; r++) {
        double t0 = kvl__now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1, a, N, b, N, 0, c, N);
        t[r] = kvl__now_s() - t0;
    }
    free(a); free(b); free(c);
    return 2.0 * N * N * N / best(t, repeats) / 1e9;
}

/* A bf16 kernel's compute peak: T input rows (16: the small-batch tiles; 256: the prefill
 * path), a 1024x1024 bf16 matrix (2 MB, cache-resident), 50 products per repeat, on the bench's
 * pool size. */
static double bf16_peak(int n_threads, int repeats, int T) {
    const int K = 1024, N = 1024, reps = 50;
    uint16_t *W = kvl__bigalloc(sizeof(uint16_t) * (size_t)N * K);
    float *in = malloc(sizeof(float) * (size_t)T * K), *out = malloc(sizeof(float) * (size_t)T * N);
    kvl__bf16_exec ex = {0};
    ex.panel = malloc(sizeof(float) * kvl__bf16_panel_elems(K));
    if (!W || !in || !out || !ex.panel || kvl__pool_create(n_threads, &ex.pool) != KVL_OK) return 0;
    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = kvl__f32_to_bf16((float)(i % 17) * 0.01f);
    for (int i = 0; i < T * K; i++) in[i] = (float)(i % 5) * 0.1f;
    double t[16] = {0};
    for (int r = 0; r <= repeats; r++) {
        double t0 = kvl__now_s();
        for (int i = 0; i < reps; i++) kvl__cpu_matmul_bf16(&ex, out, in, W, NULL, T, K, N);
        if (r) t[r - 1] = kvl__now_s() - t0;
    }
    kvl__pool_free(ex.pool);
    free(W); free(in); free(out); free(ex.panel);
    return 2.0 * T * K * N * reps / best(t, repeats) / 1e9;
}

/* ---- models --------------------------------------------------------------------------------- */

/* FLOPs of the transformer body per token (projections + MLP), attention per (query, key) pair,
 * and the LM head per logits row. */
static void flop_model(const kvl_model_config *c, double *per_token, double *per_pair, double *head) {
    double H = c->hidden_size, D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads, F = c->intermediate_size;
    *per_token = 2.0 * c->n_layers * (H * Hq * D * 2 + 2 * H * Hkv * D + 3 * H * F);
    *per_pair = 4.0 * c->n_layers * Hq * D;
    *head = 2.0 * c->vocab_size * H;
}

#define MAX_LENS 3
typedef struct run_result {
    int n_lens, lens[MAX_LENS];
    double prefill_s[MAX_LENS];   /* median seconds of one prefill of lens[i] tokens */
    int steps;
    double decode_s;              /* median seconds of `steps` decode steps            */
} run_result;

static int run_model(kvl_model *m, const int *lens, int n_lens, int steps, int repeats, run_result *r) {
    const kvl_model_config *c = kvl_model_config_get(m);
    const int P = 64, maxlen = 2048 + 256;
    int32_t *toks = malloc(sizeof(int32_t) * maxlen);
    float *logits = malloc(sizeof(float) * c->vocab_size);
    kvl_cache *cache = NULL;
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = maxlen;
    if (!toks || !logits || kvl_model_cache_create(m, &cp, &cache) != KVL_OK) return 1;
    for (int i = 0; i < maxlen; i++) toks[i] = (i * 7919 + 13) % c->vocab_size;
    r->n_lens = n_lens;
    r->steps = steps;
    for (int li = 0; li < n_lens; li++) {
        double t[16];
        r->lens[li] = lens[li];
        for (int k = 0; k < repeats; k++) {
            kvl_cache_truncate(cache, 0);
            double t0 = kvl__now_s();
            if (kvl_model_prefill(m, cache, toks, lens[li], KVL_LOGITS_LAST, logits) != KVL_OK) return 1;
            t[k] = kvl__now_s() - t0;
        }
        r->prefill_s[li] = median(t, repeats);
    }
    double t[16];
    for (int k = 0; k < repeats; k++) {
        kvl_cache_truncate(cache, 0);
        if (kvl_model_prefill(m, cache, toks, P, KVL_LOGITS_LAST, logits) != KVL_OK) return 1;
        double t0 = kvl__now_s();
        for (int s = 0; s < steps; s++)
            if (kvl_model_decode(m, cache, toks[P + s], logits) != KVL_OK) return 1;
        t[k] = kvl__now_s() - t0;
    }
    r->decode_s = median(t, repeats);
    kvl_cache_free(cache);
    free(toks);
    free(logits);
    return 0;
}

typedef struct bench_env {
    double copy_gbs, read_gbs, sgemm_gflops, bf16_gflops, bf16_prefill_gflops;
} bench_env;

/* One model in both dtypes: `dir` a model directory, or NULL and `shape` a shape name. */
static int bench_one(const char *label, const char *dir, const char *shape, int threads, int repeats,
                     int decode_only, const bench_env *env) {
    static const int shipped_lens[] = {64, 512, 2048}, big_lens[] = {64, 512};
    run_result res[2];
    kvl_model_config cfg;
    for (int d = 0; d < 2; d++) {
        kvl_model_params p = kvl_model_default_params();
        p.n_threads = threads;
        p.weights_dtype = d ? KVL_WEIGHTS_BF16 : KVL_WEIGHTS_F32;
        kvl_model *m = NULL;
        kvl_status s;
        if (dir) s = kvl_model_load(dir, &p, &m);
        else if ((s = kvl_shape_config(shape, &cfg)) == KVL_OK) s = kvl_model_create_random(&cfg, 42, &p, &m);
        if (s != KVL_OK) { fprintf(stderr, "%s: %s\n", label, kvl_last_error()); return 1; }
        cfg = *kvl_model_config_get(m);
        int big = cfg.hidden_size >= 1024;
        if (run_model(m, big ? big_lens : shipped_lens, decode_only ? 0 : big ? 2 : 3, big ? 16 : 128,
                      big && repeats > 3 ? 3 : repeats, &res[d])) {
            fprintf(stderr, "%s: %s\n", label, kvl_last_error());
            return 1;
        }
        kvl_model_free(m);
    }
    double ft, fp, fh;
    flop_model(&cfg, &ft, &fp, &fh);
    for (int li = 0; li < res[0].n_lens; li++) {
        int T = res[0].lens[li];
        double flops = ft * T + fp * (double)T * (T + 1) / 2 + fh, a = res[0].prefill_s[li], b = res[1].prefill_s[li];
        printf("| %-13s | prefill %4d  | %9.1f | %9.1f | %5.2fx | %6.1f (%3.0f%%) | %6.1f (%3.0f%%) |           |           |\n",
               label, T, T / a, T / b, a / b, flops / a / 1e9, 100 * flops / a / 1e9 / env->sgemm_gflops,
               flops / b / 1e9, 100 * flops / b / 1e9 / env->bf16_prefill_gflops);
    }
    const int P = 64, S = res[0].steps;
    double flops = (ft + fh) * S + fp * ((double)S * P + (double)S * (S + 1) / 2);
    double a = res[0].decode_s, b = res[1].decode_s, params = (double)kvl_config_param_count(&cfg);
    double gba = params * 4 * S / a / 1e9, gbb = params * 2 * S / b / 1e9;
    printf("| %-13s | decode ctx 64 | %9.1f | %9.1f | %5.2fx | %6.1f (%3.0f%%) | %6.1f (%3.0f%%) | %5.1f %2.0f%% | %5.1f %2.0f%% |\n",
           label, S / a, S / b, a / b, flops / a / 1e9, 100 * flops / a / 1e9 / env->sgemm_gflops,
           flops / b / 1e9, 100 * flops / b / 1e9 / env->bf16_gflops, gba, 100 * gba / env->read_gbs, gbb,
           100 * gbb / env->read_gbs);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    const char *models_dir = "models", *shapes = "qwen2.5-1.5b", *model = NULL;
    int repeats = 5, threads = 2, shipped = 1, decode_only = 0;
    static const char usage[] =
        "usage: bench_runtime [--models-dir DIR] [--repeats N (1-16)] [--threads N (1-16, 2)]\n"
        "                     [--shapes a,b (qwen2.5-1.5b)] [--no-shipped] [--model DIR] [--decode-only]\n";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(usage, stdout); return 0; }
        if (!strcmp(argv[i], "--no-shipped")) { shipped = 0; continue; }
        if (!strcmp(argv[i], "--decode-only")) { decode_only = 1; continue; }
        int known = !strcmp(argv[i], "--models-dir") || !strcmp(argv[i], "--repeats") ||
                    !strcmp(argv[i], "--threads") || !strcmp(argv[i], "--shapes") || !strcmp(argv[i], "--model");
        if (!known) { fprintf(stderr, "bench_runtime: unknown option '%s'\n%s", argv[i], usage); return 2; }
        if (i + 1 >= argc) { fprintf(stderr, "bench_runtime: %s needs a value\n%s", argv[i], usage); return 2; }
        const char *opt = argv[i], *v = argv[++i];
        if (!strcmp(opt, "--models-dir")) models_dir = v;
        else if (!strcmp(opt, "--shapes")) shapes = v;
        else if (!strcmp(opt, "--model")) model = v;
        else {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 16) {
                fprintf(stderr, "bench_runtime: %s '%s': want a whole number from 1 to 16\n", opt, v);
                return 2;
            }
            if (!strcmp(opt, "--repeats")) repeats = (int)n;
            else threads = (int)n;
        }
    }
    openblas_set_num_threads(threads);
    int rp = 0;
    bench_env env = {bandwidth(threads, repeats, 0, NULL), bandwidth(threads, repeats, 1, &rp), sgemm_peak(repeats),
                     bf16_peak(threads, repeats, KVL__BF16_SMALL_T), bf16_peak(threads, repeats, 256)};
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("%d threads; memory (512 MiB, best of %d): STREAM-like copy %.1f GB/s (read+write), read %.1f GB/s "
           "(best of %d patterns: %d interleaved streams a thread, prefetch %d B); "
           "OpenBLAS sgemm peak (1024^3): %.1f GFLOP/s [OPENBLAS_CORETYPE=%s]; bf16 kernel (%s) peaks "
           "16x1024x1024 %.1f GFLOP/s (decode %%), 256x1024x1024 %.1f GFLOP/s (prefill %%); model figures are medians of %d repeats (3 for hidden >= 1024); "
           "decode GB/s are %% of the read bandwidth\n\n",
           threads, repeats, env.copy_gbs, env.read_gbs, N_READ_PATTERNS, read_patterns[rp][0], read_patterns[rp][1],
           env.sgemm_gflops, ct ? ct : "unset",
           kvl__bf16_kernel_name(kvl__bf16_kernel_active()), env.bf16_gflops, env.bf16_prefill_gflops, repeats);
    printf("| model         | phase         | f32 tok/s | bf16 tok/s | speedup | f32 GFLOP/s (peak) | bf16 GFLOP/s (peak) | f32 GB/s (of read) | bf16 GB/s (of read) |\n");
    printf("|---------------|---------------|----------:|-----------:|--------:|----------------:|-----------------:|----------:|----------:|\n");
    if (model) {
        const char *base = strrchr(model, '/');
        return bench_one(base && base[1] ? base + 1 : model, model, NULL, threads, repeats, decode_only, &env) != 0;
    }
    if (shipped) {
        const char *names[] = {"qwen3-a", "qwen3-b", "qwen2-c"};
        for (size_t mi = 0; mi < 3; mi++) {
            char dir[4096];
            snprintf(dir, sizeof dir, "%s/%s", models_dir, names[mi]);
            if (bench_one(names[mi], dir, NULL, threads, repeats, decode_only, &env)) return 1;
        }
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s", shapes);
    for (char *tok = buf, *next; tok && *tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        if (bench_one(tok, NULL, tok, threads, repeats, decode_only, &env)) return 1;
    }
    return 0;
}
