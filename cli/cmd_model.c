/* cli/cmd_model.c: `kvlingo info`, `generate` and `eval-ppl`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "kvlingo/backend.h"
#include "clock.h"
#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/sampling.h"
#include "kvlingo/tokenizer.h"


static const char *dtype_word(kvl_dtype d) {
    return d == KVL_DTYPE_BF16 ? "bfloat16" : d == KVL_DTYPE_F16 ? "float16" : "float32";
}

int cmd_info(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 2)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        puts("usage: kvlingo info --model DIR [--json]");
        cli_args_free(&a);
        return 0;
    }
    const char *dir = cli_opt(&a, "--model", &err);
    int json = cli_flag(&a, "--json");
    if (err || cli_args_leftover(&a, "info")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!dir) { fprintf(stderr, "kvlingo info: --model DIR is required\n"); return 2; }
    kvl_model *m;
    kvl_status s = kvl_model_load(dir, NULL, &m);
    if (s != KVL_OK) return cli_fail("info", s);
    const kvl_model_config *c = kvl_model_config_get(m);
    long long params = (long long)kvl_config_param_count(c);
    size_t kvb = kvl_config_kv_bytes_per_token(c);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        if (j) {
            cJSON_AddStringToObject(j, "name", kvl_model_name(m));
            cJSON_AddStringToObject(j, "architecture", c->architecture);
            cJSON_AddNumberToObject(j, "layers", c->n_layers);
            cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
            cJSON_AddNumberToObject(j, "heads", c->n_heads);
            cJSON_AddNumberToObject(j, "kv_heads", c->n_kv_heads);
            cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
            cJSON_AddNumberToObject(j, "intermediate_size", c->intermediate_size);
            cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
            cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
            cJSON_AddStringToObject(j, "rope_type", kvl_rope_type_name(c->rope.type));
            cJSON_AddNumberToObject(j, "rope_factor", c->rope.factor);
            cJSON_AddBoolToObject(j, "qk_norm", c->qk_norm);
            cJSON_AddBoolToObject(j, "qkv_bias", c->qkv_bias);
            cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings);
            cJSON_AddStringToObject(j, "dtype", dtype_word(c->weight_dtype));
            cJSON_AddNumberToObject(j, "parameters", (double)params);
            cJSON_AddNumberToObject(j, "kv_bytes_per_token", (double)kvb);
            cJSON_AddStringToObject(j, "hash", kvl_model_hash(m));
            cJSON_AddStringToObject(j, "dir", kvl_model_dir(m));
        }
        if (cli_print_json(j)) { kvl_model_free(m); return 1; }
    } else {
        printf("model          %s (%s)\n", kvl_model_name(m), kvl_model_dir(m));
        printf("architecture   %s\n", c->architecture);
        printf("layers         %d\n", c->n_layers);
        printf("hidden         %d (intermediate %d)\n", c->hidden_size, c->intermediate_size);
        printf("heads          %d query / %d kv, head_dim %d\n", c->n_heads, c->n_kv_heads, c->head_dim);
        printf("vocab          %d\n", c->vocab_size);
        printf("rope theta     %g\n", c->rope_theta);
        if (c->rope.type != KVL_ROPE_DEFAULT)
            printf("rope scaling   %s, factor %g (original context %d)\n", kvl_rope_type_name(c->rope.type),
                   c->rope.factor, c->rope.original_max_position_embeddings);
        printf("q/k norm       %s, q/k/v bias %s, tied embeddings %s\n", c->qk_norm ? "yes" : "no",
               c->qkv_bias ? "yes" : "no", c->tie_word_embeddings ? "yes" : "no");
        const kvl_backend_ops *be = kvl_model_backend(m);
        printf("weights dtype  %s on disk, %s in memory, float32 accumulation (%s: %s)\n",
               dtype_word(c->weight_dtype), kvl_weights_dtype_name(kvl_model_weights_dtype(m)), be->name,
               be->describe ? be->describe() : "-");
        printf("parameters     %lld\n", params);
        printf("KV bytes/token %zu (float32 K and V%s, all layers)\n", kvb, c->qk_norm ? " and pre-norm K" : "");
        printf("hash           %s\n", kvl_model_hash(m));
    }
    kvl_model_free(m);
    return 0;
}

/* Load the tokenizer beside a model; prints why on failure. */
static kvl_tokenizer *load_tok(const char *cmd, const char *dir) {
    kvl_tokenizer *t;
    kvl_status s = kvl_tokenizer_load_dir(dir, &t);
    if (s != KVL_OK) { cli_fail(cmd, s); return NULL; }
    return t;
}

static int tok_file_exists(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    return access(p, R_OK) == 0;
}

int cmd_generate(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 2)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        puts("usage: kvlingo generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N (32)]\n"
             "         [--temperature T] [--top-k K] [--top-p P] [--seed S] [--threads N]\n"
             "         [--device cpu|cuda|cuda:N] [--weights-dtype auto|f32|bf16] [--kv-dtype f32|bf16]\n"
             "         [--special] [--json]\n"
             "Greedy when --temperature is 0 (default); stops at EOS.  The text leaves special tokens\n"
             "(<|endoftext|>, ...) out unless --special.  --json prints {\"ids\": [...], \"text\": \"...\"}\n"
             "with the generated ids only, ending with EOS when generation stopped on it, and the text\n"
             "as Hugging Face decode() gives it (special tokens included).");
        cli_args_free(&a);
        return 0;
    }
    const char *dir = cli_opt(&a, "--model", &err);
    const char *prompt = cli_opt(&a, "--prompt", &err);
    const char *prompt_ids = cli_opt(&a, "--prompt-ids", &err);
    long max_tokens = cli_opt_long(&a, "--max-tokens", 32, 0, 1 << 24, &err);
    kvl_sampler_params sp = kvl_sampler_default_params();
    sp.temperature = (float)cli_opt_double(&a, "--temperature", 0.0, 0.0, 100.0, &err);
    sp.top_k = (int)cli_opt_long(&a, "--top-k", 0, 0, 1 << 30, &err);
    sp.top_p = (float)cli_opt_double(&a, "--top-p", 1.0, 1e-9, 1.0, &err);
    sp.seed = (uint64_t)cli_opt_long(&a, "--seed", 0, 0, 0x7fffffffffffffffL, &err);
    int threads = (int)cli_opt_long(&a, "--threads", 0, 0, 1024, &err);
    kvl_model_params dev = kvl_model_default_params();
    cli_opt_device(&a, &dev, &err);
    cli_opt_weights_dtype(&a, &dev, &err);
    cli_opt_kv_dtype(&a, &dev, &err);
    int json = cli_flag(&a, "--json");
    int special = cli_flag(&a, "--special");
    if (err || cli_args_leftover(&a, "generate")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!dir) { fprintf(stderr, "kvlingo generate: --model DIR is required\n"); return 2; }
    if (!!prompt == !!prompt_ids) {
        fprintf(stderr, "kvlingo generate: give exactly one of --prompt TEXT or --prompt-ids 1,2,3\n");
        return 2;
    }

    kvl_model_params mp = dev;
    mp.n_threads = threads;
    kvl_model *m = NULL;
    kvl_tokenizer *tok = NULL;
    kvl_cache *cache = NULL;
    kvl_sampler *smp = NULL;
    kvl_detok *dt = NULL;
    int32_t *ids = NULL, *out = NULL;
    float *logits = NULL;
    char *piece = NULL;
    size_t n_ids = 0;
    int rc = 1;
    kvl_status s = kvl_model_load(dir, &mp, &m);
    if (s != KVL_OK) { rc = cli_fail("generate", s); goto done; }
    const kvl_model_config *c = kvl_model_config_get(m);
    if (prompt_ids) {
        if (cli_parse_ids(prompt_ids, &ids, &n_ids)) { rc = 2; goto done; }
        for (size_t i = 0; i < n_ids; i++)
            if (ids[i] >= c->vocab_size) {
                fprintf(stderr, "kvlingo generate: --prompt-ids: id %d is outside the vocabulary [0, %d)\n",
                        ids[i], c->vocab_size);
                rc = 2;
                goto done;
            }
    }
    /* text needs a tokenizer; ids work without one (output is then ids only) */
    if (prompt || !prompt_ids || tok_file_exists(dir)) {
        tok = load_tok("generate", dir);
        if (!tok) goto done;
    }
    if (prompt) {
        s = kvl_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n_ids);
        if (s != KVL_OK) { rc = cli_fail("generate", s); goto done; }
        if (n_ids == 0) { fprintf(stderr, "kvlingo generate: --prompt encodes to no tokens\n"); rc = 2; goto done; }
    }
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = (int)(n_ids + (size_t)max_tokens + 1);
    if (cp.max_tokens > c->max_position_embeddings) cp.max_tokens = c->max_position_embeddings;
    if ((s = kvl_model_cache_create(m, &cp, &cache)) != KVL_OK ||
        (s = kvl_sampler_create(&sp, &smp)) != KVL_OK) { rc = cli_fail("generate", s); goto done; }
    logits = malloc(sizeof(float) * c->vocab_size);
    out = malloc(sizeof(int32_t) * ((size_t)max_tokens + 1));
    size_t piece_cap = tok ? kvl_detok_push_capacity(tok) : 0;
    piece = malloc(piece_cap + 1);
    if (!logits || !out || !piece) { fprintf(stderr, "kvlingo generate: out of memory\n"); goto done; }
    if (tok && !json && (s = kvl_detok_create(tok, &dt)) != KVL_OK) { rc = cli_fail("generate", s); goto done; }

    double t0 = kvl__now_s();
    s = kvl_model_prefill(m, cache, ids, (int)n_ids, KVL_LOGITS_LAST, logits);
    if (s != KVL_OK) { rc = cli_fail("generate", s); goto done; }
    double t_prefill = kvl__now_s() - t0;
    long n_out = 0;
    while (n_out < max_tokens) {
        int32_t next;
        if ((s = kvl_sampler_sample(smp, logits, c->vocab_size, &next, NULL)) != KVL_OK) break;
        out[n_out++] = next;
        if (dt && (special || !kvl_tokenizer_is_special(tok, next))) {
            size_t len;
            if (kvl_detok_push(dt, next, piece, piece_cap, &len) == KVL_OK) { fwrite(piece, 1, len, stdout); fflush(stdout); }
        } else if (!json && !tok) {
            printf("%s%d", n_out > 1 ? "," : "", next);
            fflush(stdout);
        }
        if (kvl_model_is_eos(m, next) || n_out == max_tokens) break;
        if ((s = kvl_model_decode(m, cache, next, logits)) != KVL_OK) break;
    }
    if (s != KVL_OK) { rc = cli_fail("generate", s); goto done; }
    double t_total = kvl__now_s() - t0;
    if (json) {
        cJSON *j = cJSON_CreateObject(), *arr = j ? cJSON_AddArrayToObject(j, "ids") : NULL;
        for (long i = 0; arr && i < n_out; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(out[i]));
        if (tok) {
            char *text = NULL;
            size_t len = 0;
            if ((s = kvl_tokenizer_decode(tok, out, (size_t)n_out, &text, &len)) != KVL_OK) {
                cJSON_Delete(j);
                rc = cli_fail("generate", s);
                goto done;
            }
            if (j) cli_json_add_text(j, "text", text, len);
            free(text);
        }
        if (cli_print_json(j)) goto done;
    } else {
        if (dt) {
            size_t len;
            if (kvl_detok_flush(dt, piece, piece_cap, &len) == KVL_OK) fwrite(piece, 1, len, stdout);
        }
        printf("\n");
        fprintf(stderr, "[%zu prompt tokens, prefill %.1f ms; %ld generated, %.1f tokens/s]\n", n_ids,
                t_prefill * 1e3, n_out, n_out > 1 ? (n_out - 1) / (t_total - t_prefill) : 0.0);
    }
    rc = 0;
done:
    kvl_detok_free(dt);
    free(piece);
    free(out);
    free(logits);
    free(ids);
    kvl_sampler_free(smp);
    kvl_cache_free(cache);
    kvl_tokenizer_free(tok);
    kvl_model_free(m);
    return rc;
}
