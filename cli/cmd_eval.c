/* cli/cmd_eval.c: `kvlingo eval-ppl`, `tokenize`, `detokenize`. */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvlingo/backend.h"
#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/sampling.h"
#include "kvlingo/tokenizer.h"

int cmd_eval_ppl(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 2)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        puts("usage: kvlingo eval-ppl --model DIR --text-file FILE [--window 256] [--max-windows 200]\n"
             "         [--threads N] [--device cpu|cuda|cuda:N] [--weights-dtype auto|f32|bf16]\n"
             "         [--kv-dtype f32|bf16] [--json]\n"
             "         [--quiet]\n"
             "Perplexity over windows starting at tokens 0, W, 2W, ...: each window reads tokens\n"
             "[s, s+W) from an empty cache and is scored on predicting [s+1, s+W+1).  The file is one\n"
             "document per line, each followed by <|endoftext|>.  Progress lines go to stderr\n"
             "(--quiet: none).");
        cli_args_free(&a);
        return 0;
    }
    const char *dir = cli_opt(&a, "--model", &err);
    const char *file = cli_opt(&a, "--text-file", &err);
    long W = cli_opt_long(&a, "--window", 256, 1, 1 << 20, &err);
    long max_windows = cli_opt_long(&a, "--max-windows", 200, 1, 1L << 30, &err);
    int threads = (int)cli_opt_long(&a, "--threads", 0, 0, 1024, &err);
    kvl_model_params dev = kvl_model_default_params();
    cli_opt_device(&a, &dev, &err);
    cli_opt_weights_dtype(&a, &dev, &err);
    cli_opt_kv_dtype(&a, &dev, &err);
    int json = cli_flag(&a, "--json"), quiet = cli_flag(&a, "--quiet");
    if (err || cli_args_leftover(&a, "eval-ppl")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!dir || !file) { fprintf(stderr, "kvlingo eval-ppl: --model DIR and --text-file FILE are required\n"); return 2; }

    kvl_model_params mp = dev;
    mp.n_threads = threads;
    kvl_model *m = NULL;
    kvl_tokenizer *tok = NULL;
    kvl_cache *cache = NULL;
    int32_t *stream = NULL;
    float *logits = NULL;
    size_t n = 0;
    int rc = 1;
    kvl_status s = kvl_model_load(dir, &mp, &m);
    if (s != KVL_OK) { rc = cli_fail("eval-ppl", s); goto done; }
    if ((s = kvl_tokenizer_load_dir(dir, &tok)) != KVL_OK) { rc = cli_fail("eval-ppl", s); goto done; }
    const kvl_model_config *c = kvl_model_config_get(m);
    if (cli_check_context("eval-ppl", "option --window", W, m)) goto done;
    int32_t eos = kvl_tokenizer_token_id(tok, "<|endoftext|>");
    if (eos < 0) eos = kvl_tokenizer_eos_id(tok);
    if (eos < 0 && c->n_eos > 0) eos = c->eos_token_ids[0];
    if (eos < 0) { fprintf(stderr, "kvlingo eval-ppl: %s: no end-of-text token to separate documents\n", dir); goto done; }
    if (cli_encode_documents("eval-ppl", tok, eos, file, &stream, &n)) goto done;
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = (int)W;
    if ((s = kvl_model_cache_create(m, &cp, &cache)) != KVL_OK) { rc = cli_fail("eval-ppl", s); goto done; }
    logits = malloc(sizeof(float) * (size_t)W * c->vocab_size);
    if (!logits) { fprintf(stderr, "kvlingo eval-ppl: out of memory\n"); goto done; }
    double nll = 0.0;
    long windows = 0, preds = 0;
    long avail = (long)((n > 0 ? n - 1 : 0) / (size_t)W);
    long n_planned = avail < max_windows ? avail : max_windows;
    cli_progress pr;
    cli_progress_init(&pr, "eval-ppl", quiet);
    for (long i = 0; i < max_windows; i++) {
        size_t st = (size_t)i * (size_t)W;
        if (st + (size_t)W + 1 > n) break;
        kvl_cache_truncate(cache, 0);
        s = kvl_model_prefill(m, cache, stream + st, (int)W, KVL_LOGITS_ALL, logits);
        if (s != KVL_OK) { rc = cli_fail("eval-ppl", s); goto done; }
        for (long t = 0; t < W; t++) {
            nll -= kvl_logprob(logits + (size_t)t * c->vocab_size, c->vocab_size, stream[st + t + 1]);
            preds++;
        }
        windows++;
        cli_progress_step(&pr, "windows", windows, n_planned);
    }
    if (preds == 0) {
        fprintf(stderr, "kvlingo eval-ppl: %s: %zu tokens are too few for one window of %ld\n", file, n, W);
        goto done;
    }
    double ppl = exp(nll / preds);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        if (j) {
            cJSON_AddNumberToObject(j, "ppl", ppl);
            cJSON_AddNumberToObject(j, "predictions", (double)preds);
            cJSON_AddNumberToObject(j, "windows", (double)windows);
            cJSON_AddNumberToObject(j, "tokens", (double)n);
            cJSON_AddStringToObject(j, "model", kvl_model_name(m));
            cJSON_AddStringToObject(j, "text_file", file);
        }
        if (cli_print_json(j)) goto done;
    } else printf("perplexity %.4f over %ld predictions (%ld windows of %ld; %zu tokens in %s)\n", ppl, preds,
                windows, W, n, file);
    rc = 0;
done:
    free(logits);
    free(stream);
    kvl_cache_free(cache);
    kvl_tokenizer_free(tok);
    kvl_model_free(m);
    return rc;
}

/* --model DIR or --tokenizer FILE */
static kvl_tokenizer *open_tokenizer(const char *cmd, const char *dir, const char *file) {
    if (!!dir == !!file) {
        fprintf(stderr, "kvlingo %s: give exactly one of --model DIR or --tokenizer FILE|DIR\n", cmd);
        return NULL;
    }
    kvl_tokenizer *t;
    struct stat sb;   /* --tokenizer names the file, or the folder holding it (as chat's does) */
    if (file && stat(file, &sb) == 0 && S_ISDIR(sb.st_mode)) dir = file, file = NULL;
    kvl_status s = dir ? kvl_tokenizer_load_dir(dir, &t) : kvl_tokenizer_load(file, &t);
    if (s != KVL_OK) { cli_fail(cmd, s); return NULL; }
    return t;
}

int cmd_tokenize(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 2)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        puts("usage: kvlingo tokenize (--model DIR | --tokenizer FILE|DIR) (--text STR | --text-file FILE) [--json]");
        cli_args_free(&a);
        return 0;
    }
    const char *dir = cli_opt(&a, "--model", &err);
    const char *file = cli_opt(&a, "--tokenizer", &err);
    const char *text = cli_opt(&a, "--text", &err);
    const char *text_file = cli_opt(&a, "--text-file", &err);
    int json = cli_flag(&a, "--json");
    if (err || cli_args_leftover(&a, "tokenize")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!!text == !!text_file) { fprintf(stderr, "kvlingo tokenize: give exactly one of --text STR or --text-file FILE\n"); return 2; }
    kvl_tokenizer *tok = open_tokenizer("tokenize", dir, file);
    if (!tok) return 1;
    size_t len = text ? strlen(text) : 0;
    char *buf = NULL;
    if (text_file) {
        buf = cli_read_file(text_file, &len);
        if (!buf) { kvl_tokenizer_free(tok); return 1; }
        text = buf;
    }
    int32_t *ids;
    size_t n;
    kvl_status s = kvl_tokenizer_encode(tok, text, len, &ids, &n);
    free(buf);
    if (s != KVL_OK) { kvl_tokenizer_free(tok); return cli_fail("tokenize", s); }
    int rc = 0;
    if (json) {
        cJSON *j = cJSON_CreateObject(), *arr = j ? cJSON_AddArrayToObject(j, "ids") : NULL;
        for (size_t i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
        rc = cli_print_json(j);
    } else {
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
        printf("\n");
    }
    free(ids);
    kvl_tokenizer_free(tok);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 2)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        puts("usage: kvlingo detokenize (--model DIR | --tokenizer FILE|DIR) --ids 1,2,3 [--json]");
        cli_args_free(&a);
        return 0;
    }
    const char *dir = cli_opt(&a, "--model", &err);
    const char *file = cli_opt(&a, "--tokenizer", &err);
    const char *ids_s = cli_opt(&a, "--ids", &err);
    int json = cli_flag(&a, "--json");
    if (err || cli_args_leftover(&a, "detokenize")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!ids_s) { fprintf(stderr, "kvlingo detokenize: --ids 1,2,3 is required\n"); return 2; }
    int32_t *ids;
    size_t n;
    if (cli_parse_ids(ids_s, &ids, &n)) return 2;
    kvl_tokenizer *tok = open_tokenizer("detokenize", dir, file);
    if (!tok) { free(ids); return 1; }
    char *text;
    size_t len;
    kvl_status s = kvl_tokenizer_decode(tok, ids, n, &text, &len);
    free(ids);
    kvl_tokenizer_free(tok);
    if (s != KVL_OK) return cli_fail("detokenize", s);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        if (j && !cli_json_add_text(j, "text", text, len)) { cJSON_Delete(j); j = NULL; }
        if (cli_print_json(j)) { free(text); return 1; }
    } else {
        fwrite(text, 1, len, stdout);
        putchar('\n');
    }
    free(text);
    return 0;
}
