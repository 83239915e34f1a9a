/* cli/cmd_bench.c: `kvlingo bench switch`: the cost of a model switch by KV-Lingo translation
 * against a re-prefill of the target, on the CPU or one CUDA GPU.
 *
 * For each context length n: the source model prefills n random tokens (untimed); the switched
 * turn then brings N = --new-tokens more (default 9: a turn of 8 input tokens plus the source's
 * last sampled token, which the source never ran: what the target runs in kvlingo-router's
 * switch).  On the target, timed (median of --reps after one warm-up):
 *   re-prefill TTFT: prefill of the n + N tokens from an empty cache until the greedy first token;
 *   translate:       translation of the source span [0, n) into an empty target cache;
 *   forward:         then the target's forward pass over the N new tokens (appended at
 *                    positions [n, n+N)) until the greedy first token;
 *   switch TTFT:     translate + forward, timed as one;
 *   ratio:           re-prefill TTFT / switch TTFT;
 *   translate GB/s:  bytes the translation reads and writes / translate time, against the
 *                    measured copy bandwidth (cudaMemcpy device to device, or host memcpy); on
 *                    the CPU counted in float32 (source span, maps, target rows), so where the
 *                    products are bf16 (the span read as bf16, half its bytes) it can pass 100%.
 * --source / --target take a model directory or a SHAPE name (kvlingo/shapes.h: random weights
 * of a published geometry); the maps are random of the right shape (kvlingo/kv_maps.h), applied
 * on the CPU by the translator kvld uses (kvl_translator_translate_span: the export a node makes
 * and the apply of its peer, into caches of the models as a node's sessions have), on a GPU by
 * the CUDA backend's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "clock.h"
#include "error.h"
#include "kvlingo/cache.h"
#include "kvlingo/cuda.h"
#include "kvlingo/kv_maps.h"
#include "kvlingo/model.h"
#include "kvlingo/shapes.h"
#include "kvlingo/translator_train.h"


/* One model on one backend. */
typedef struct bmodel {
    int cuda;
    kvl_model *host;          /* CPU backend (and the source of a CUDA upload)  */
    kvl_cuda_model *dev;      /* CUDA backend                                    */
    kvl_model_config cfg;
    float *logits;            /* [V] host scratch                                */
} bmodel;

typedef struct bcache {
    kvl_cache *host;
    kvl_cuda_cache *dev;
} bcache;

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* `dt` is the CUDA weights dtype; `wdt` the CPU one (AUTO: a directory's checkpoint dtype, f32
 * for a random SHAPE). */
static kvl_status bmodel_open(bmodel *b, const char *spec, int cuda, kvl_cuda_dtype dt,
                              kvl_weights_dtype wdt, uint64_t seed) {
    memset(b, 0, sizeof *b);
    b->cuda = cuda;
    kvl_cuda_params cp = kvl_cuda_default_params();
    cp.dtype = dt;
    kvl_status s;
    if (is_dir(spec)) {
        /* host weights; the CUDA side uploads them itself below (one device copy) */
        kvl_model_params mp = kvl_model_default_params();
        if (!cuda) mp.weights_dtype = wdt;
        if ((s = kvl_model_load(spec, &mp, &b->host)) != KVL_OK) return s;
        b->cfg = *kvl_model_config_get(b->host);
        if (cuda) {
            s = kvl_cuda_model_create(kvl_model_weights(b->host), &cp, &b->dev);
            kvl_model_free(b->host);   /* the weights now live on the device */
            b->host = NULL;
            if (s != KVL_OK) return s;
        }
    } else {
        if ((s = kvl_shape_config(spec, &b->cfg)) != KVL_OK) return s;
        kvl_model_params mp = kvl_model_default_params();
        mp.weights_dtype = wdt == KVL_WEIGHTS_AUTO ? KVL_WEIGHTS_F32 : wdt;
        s = cuda ? kvl_cuda_model_create_random(&b->cfg, seed, &cp, &b->dev)
                 : kvl_model_create_random(&b->cfg, seed, &mp, &b->host);
        if (s != KVL_OK) return s;
    }
    b->logits = malloc(sizeof(float) * (size_t)b->cfg.vocab_size);
    return b->logits ? KVL_OK : KVL_ERR_NOMEM;
}

static void bmodel_close(bmodel *b) {
    kvl_cuda_model_free(b->dev);
    kvl_model_free(b->host);
    free(b->logits);
}

static kvl_status bcache_open(bmodel *b, int cap, bcache *c) {
    memset(c, 0, sizeof *c);
    if (b->cuda) return kvl_cuda_cache_create(b->dev, cap, &c->dev);
    kvl_cache_params p = kvl_cache_default_params();
    p.max_tokens = cap;
    /* the model's cache, as a node's sessions have: its block pool, and its threads for the
     * span's export and translation */
    return kvl_model_cache_create(b->host, &p, &c->host);
}

static void bcache_close(bcache *c) {
    kvl_cuda_cache_free(c->dev);
    kvl_cache_free(c->host);
}

static kvl_status bcache_reset(bcache *c) {
    return c->dev ? kvl_cuda_cache_truncate(c->dev, 0) : kvl_cache_truncate(c->host, 0);
}

static int32_t argmax_host(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static kvl_status b_prefill(bmodel *b, bcache *c, const int32_t *tok, int n, int32_t *next) {
    if (b->cuda) return kvl_cuda_prefill(b->dev, c->dev, tok, n, KVL_LOGITS_LAST, b->logits, next);
    kvl_status s = kvl_model_prefill(b->host, c->host, tok, n, KVL_LOGITS_LAST, b->logits);
    if (s == KVL_OK) *next = argmax_host(b->logits, b->cfg.vocab_size);
    return s;
}

static kvl_status b_decode(bmodel *b, bcache *c, int32_t tok, int32_t *next) {
    if (b->cuda) return kvl_cuda_decode(b->dev, c->dev, tok, NULL, next);
    kvl_status s = kvl_model_decode(b->host, c->host, tok, b->logits);
    if (s == KVL_OK) *next = argmax_host(b->logits, b->cfg.vocab_size);
    return s;
}

typedef struct btrans {
    const kvl_kv_maps *maps;
    kvl_translator *host;      /* CPU: the translator kvld applies, holding the maps */
    kvl_cuda_translator *dev;
} btrans;

static kvl_status b_translate(bmodel *dst, btrans *tr, bcache *src, bcache *dc, int t1, size_t *bytes) {
    if (dst->cuda) {
        kvl_status s = kvl_cuda_translate(tr->dev, src->dev, 0, t1, dc->dev, bytes);
        return s == KVL_OK ? kvl_cuda_synchronize(dst->dev) : s;
    }
    *bytes = 0;
    return kvl_translator_translate_span(tr->host, src->host, 0, t1, dc->host);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double host_copy_gbps(void) {
    size_t bytes = (size_t)256 << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) { free(a); free(b); return 0.0; }
    memset(a, 1, bytes);
    memcpy(b, a, bytes);
    double t0 = kvl__now_s();
    for (int r = 0; r < 4; r++) memcpy(b, a, bytes);
    double dt = kvl__now_s() - t0;
    volatile char sink = b[bytes / 2];
    (void)sink;
    free(a);
    free(b);
    return dt > 0 ? 2.0 * bytes * 4 / dt / 1e9 : 0.0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kvlingo bench switch --source DIR|SHAPE --target DIR|SHAPE [--device cpu|cuda]\n"
               "                            [--lengths 64,1024,8192,32752] [--dtype bf16|f32] [--reps N]\n"
               "                            [--new-tokens N] [--seed S] [--json]\n"
               "--new-tokens N: tokens of the switched turn the target runs after the context (default 9)\n"
               "--dtype: the weights' dtype (CUDA: bf16 unless told; CPU: a directory's checkpoint dtype,\n"
               "         float32 for a SHAPE, unless told)\n"
               "SHAPE: %s (random weights of that geometry)\n", kvl_shape_names());
}

static int bench_switch(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 3)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) { usage(stdout); cli_args_free(&a); return 0; }
    const char *src_spec = cli_opt(&a, "--source", &err);
    const char *dst_spec = cli_opt(&a, "--target", &err);
    const char *device = cli_opt(&a, "--device", &err);
    const char *lengths = cli_opt(&a, "--lengths", &err);
    const char *dtype = cli_opt(&a, "--dtype", &err);
    long reps = cli_opt_long(&a, "--reps", 3, 1, 1000, &err);
    long seed = cli_opt_long(&a, "--seed", 1, 0, 1L << 62, &err);
    long n_new = cli_opt_long(&a, "--new-tokens", 9, 1, 4096, &err);
    int json = cli_flag(&a, "--json");
    if (err || cli_args_leftover(&a, "bench switch")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!src_spec || !dst_spec) { usage(stderr); return 2; }
    int cuda = 0;
    if (device && !strcmp(device, "cuda")) cuda = 1;
    else if (device && strcmp(device, "cpu")) { fprintf(stderr, "kvlingo bench: --device must be cpu or cuda\n"); return 2; }
    kvl_cuda_dtype dt = KVL_CUDA_BF16;
    kvl_weights_dtype wdt = KVL_WEIGHTS_AUTO;
    if (dtype && !strcmp(dtype, "f32")) { dt = KVL_CUDA_F32; wdt = KVL_WEIGHTS_F32; }
    else if (dtype && !strcmp(dtype, "bf16")) wdt = KVL_WEIGHTS_BF16;
    else if (dtype) { fprintf(stderr, "kvlingo bench: --dtype must be bf16 or f32\n"); return 2; }
    int32_t *lens = NULL;
    size_t n_lens = 0;
    if (cli_parse_ids(lengths ? lengths : (cuda ? "64,1024,8192,32752" : "16,64"), &lens, &n_lens)) return 2;
    int max_len = 0;
    for (size_t i = 0; i < n_lens; i++) {
        if (lens[i] < 1 || lens[i] > (1 << 24)) {
            fprintf(stderr, "kvlingo bench: --lengths: %d is not in [1, 16777216]\n", lens[i]);
            free(lens);
            return 2;
        }
        if (lens[i] > max_len) max_len = lens[i];
    }
    if (cuda) {
        kvl_status s = kvl_cuda_probe(NULL);
        if (s != KVL_OK) { free(lens); return cli_fail("bench switch --device cuda", s); }
    }

    bmodel src, dst;
    kvl_kv_maps maps = {0};
    btrans tr = {.maps = &maps};
    bcache sc = {0}, dc = {0};
    int32_t *prompt = NULL;
    int rc = 1;
    kvl_status s = bmodel_open(&src, src_spec, cuda, dt, wdt, (uint64_t)seed);
    if (s != KVL_OK) { free(lens); return cli_fail("bench switch (source)", s); }
    if ((s = bmodel_open(&dst, dst_spec, cuda, dt, wdt, (uint64_t)seed + 1)) != KVL_OK) {
        bmodel_close(&src);
        free(lens);
        return cli_fail("bench switch (target)", s);
    }
    for (size_t i = 0; i < n_lens; i++) {   /* positions past the models' context mean nothing */
        const long need = (long)lens[i] + n_new;
        const int lim = src.cfg.max_position_embeddings < dst.cfg.max_position_embeddings
                            ? src.cfg.max_position_embeddings : dst.cfg.max_position_embeddings;
        if (need > lim) {
            fprintf(stderr, "kvlingo bench switch: options --lengths + --new-tokens: %ld positions exceed the "
                    "models' context (max_position_embeddings %d)\n", need, lim);
            rc = 2;
            goto done;
        }
    }
    if ((s = kvl_kv_maps_random(&src.cfg, &dst.cfg, (uint64_t)seed + 2, &maps)) != KVL_OK) goto done;
    if (cuda && (s = kvl_cuda_translator_create(&maps, &src.cfg, dst.dev, &tr.dev)) != KVL_OK) goto done;
    if (!cuda && (s = cli_translator_from_maps(src.host, dst.host, &maps, &tr.host)) != KVL_OK) goto done;
    const int cap = max_len + (int)n_new;   /* context + the switched turn's tokens */
    if ((s = bcache_open(&src, max_len + 1, &sc)) != KVL_OK) goto done;
    if ((s = bcache_open(&dst, cap, &dc)) != KVL_OK) goto done;
    double copy_gbps = 0.0;
    if (cuda) {
        if ((s = kvl_cuda_copy_bandwidth((size_t)1 << 30, 10, &copy_gbps)) != KVL_OK) goto done;
    } else {
        copy_gbps = host_copy_gbps();
    }
    int vocab = src.cfg.vocab_size < dst.cfg.vocab_size ? src.cfg.vocab_size : dst.cfg.vocab_size;
    prompt = malloc(sizeof(int32_t) * (size_t)cap);
    if (!prompt) { s = kvl__errorf(KVL_ERR_NOMEM, "prompt of %d tokens", cap); goto done; }
    uint64_t st = (uint64_t)seed * 2654435761u + 12345;
    for (int i = 0; i < cap; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((st >> 33) % (uint64_t)vocab);
    }
    char devname[256] = "cpu";
    if (cuda) kvl_cuda_device_name(devname, sizeof devname, NULL);
    if (!json) {
        printf("switch bench: %s -> %s on %s (%s), reps %ld, %ld new tokens per switched turn, "
               "copy bandwidth %.1f GB/s\n", src_spec, dst_spec, devname,
               cuda ? (dt == KVL_CUDA_F32 ? "f32" : "bf16")
                    : (kvl_model_weights_dtype(dst.host) == KVL_WEIGHTS_BF16 ? "bf16" : "f32"),
               reps, n_new, copy_gbps);
        printf("%8s %14s %13s %11s %12s %8s %15s %7s\n", "tokens", "re-prefill ms", "translate ms",
               "forward ms", "switch ms", "ratio", "translate GB/s", "% copy");
    }
    for (size_t li = 0; li < n_lens; li++) {
        const int n = lens[li];
        double t_pre[1000], t_tr[1000], t_fw[1000], t_sw[1000];
        int32_t next = 0;
        size_t bytes = 0;
        if ((s = bcache_reset(&sc)) != KVL_OK) goto done;
        if ((s = b_prefill(&src, &sc, prompt, n, &next)) != KVL_OK) goto done;
        for (long r = -1; r < reps; r++) {   /* r = -1: warm-up (graph capture, cuBLAS heuristics) */
            if ((s = bcache_reset(&dc)) != KVL_OK) goto done;
            double t0 = kvl__now_s();
            if ((s = b_prefill(&dst, &dc, prompt, n + (int)n_new, &next)) != KVL_OK) goto done;
            double t1 = kvl__now_s();
            if ((s = bcache_reset(&dc)) != KVL_OK) goto done;
            double t2 = kvl__now_s();
            if ((s = b_translate(&dst, &tr, &sc, &dc, n, &bytes)) != KVL_OK) goto done;
            double t3 = kvl__now_s();
            /* the turn's tokens on the translated cache: one decode step for one token (what a
             * node runs for a single token), one prefill pass for more */
            if (n_new == 1) s = b_decode(&dst, &dc, prompt[n], &next);
            else s = b_prefill(&dst, &dc, prompt + n, (int)n_new, &next);
            if (s != KVL_OK) goto done;
            double t4 = kvl__now_s();
            if (r >= 0) {
                t_pre[r] = t1 - t0;
                t_tr[r] = t3 - t2;
                t_fw[r] = t4 - t3;
                t_sw[r] = t4 - t2;
            }
        }
        if (!cuda) {   /* the same byte count as the CUDA kernel, float32 */
            size_t ks = (size_t)src.cfg.n_kv_heads * src.cfg.head_dim;
            size_t kt = (size_t)dst.cfg.n_kv_heads * dst.cfg.head_dim;
            bytes = 4 * (2 * (size_t)src.cfg.n_layers * n * ks + 2 * (size_t)dst.cfg.n_layers * kt * ks +
                         (size_t)dst.cfg.n_layers * n * kt * (dst.cfg.qk_norm ? 3 : 2));
        }
        double pre = median(t_pre, (int)reps), trn = median(t_tr, (int)reps), sw = median(t_sw, (int)reps);
        double fwd = median(t_fw, (int)reps);
        double gbps = trn > 0 ? (double)bytes / trn / 1e9 : 0.0;
        double pct = copy_gbps > 0 ? 100.0 * gbps / copy_gbps : 0.0;
        if (json) {
            cJSON *j = cJSON_CreateObject();
            if (j) {
                cJSON_AddStringToObject(j, "source", src_spec);
                cJSON_AddStringToObject(j, "target", dst_spec);
                cJSON_AddStringToObject(j, "device", devname);
                cJSON_AddNumberToObject(j, "tokens", n);
                cJSON_AddNumberToObject(j, "new_tokens", (double)n_new);
                cJSON_AddNumberToObject(j, "reprefill_ttft_ms", pre * 1e3);
                cJSON_AddNumberToObject(j, "translate_ms", trn * 1e3);
                cJSON_AddNumberToObject(j, "forward_ms", fwd * 1e3);
                cJSON_AddNumberToObject(j, "reps", (double)reps);
                cJSON_AddNumberToObject(j, "switch_ttft_ms", sw * 1e3);
                cJSON_AddNumberToObject(j, "ratio", sw > 0 ? pre / sw : 0.0);
                cJSON_AddNumberToObject(j, "translate_bytes", (double)bytes);
                cJSON_AddNumberToObject(j, "translate_gbps", gbps);
                cJSON_AddNumberToObject(j, "copy_gbps", copy_gbps);
            }
            if (cli_print_json(j)) { rc = 2; goto done; }   /* reported by cli_print_json */
        }
        else
            printf("%8d %14.3f %13.3f %11.3f %12.3f %7.1fx %15.1f %6.1f%%\n", n, pre * 1e3, trn * 1e3,
                   fwd * 1e3, sw * 1e3,
                   sw > 0 ? pre / sw : 0.0, gbps, pct);
        fflush(stdout);
    }
    rc = 0;
done:
    if (rc == 1) cli_fail("bench switch", s);
    if (rc) rc = 1;
    free(prompt);
    bcache_close(&sc);
    bcache_close(&dc);
    kvl_cuda_translator_free(tr.dev);
    kvl_translator_free(tr.host);
    kvl_kv_maps_free(&maps);
    bmodel_close(&src);
    bmodel_close(&dst);
    free(lens);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        usage(argc < 3 ? stderr : stdout);
        return argc < 3 ? 2 : 0;
    }
    if (!strcmp(argv[2], "switch")) return bench_switch(argc, argv);
    fprintf(stderr, "kvlingo bench: unknown benchmark '%s' (known: switch)\n", argv[2]);
    return 2;
}
