/* cli/cmd_translator.c: `kvlingo translator train | eval | info`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <signal.h>
#include <sys/stat.h>
#include <errno.h>

#include "cli.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/backend.h"
#include "clock.h"
#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/tokenizer.h"
#include "kvlingo/translator.h"
#include "kvlingo/translator_train.h"

/* Token stream of a text file under the evaluation protocol: each line is a document,
 * encoded on its own and followed by <|endoftext|>; documents concatenated. */
static int encode_corpus(const char *cmd, const char *model_dir, const char *path, int32_t **out,
                         size_t *n_out) {
    kvl_tokenizer *tok = NULL;
    kvl_status s = kvl_tokenizer_load_dir(model_dir, &tok);
    if (s != KVL_OK) return cli_fail(cmd, s);
    int32_t eos = kvl_tokenizer_token_id(tok, "<|endoftext|>");
    if (eos < 0) eos = kvl_tokenizer_eos_id(tok);
    if (eos < 0) {
        fprintf(stderr, "kvlingo %s: %s: no end-of-text token to separate documents\n", cmd, model_dir);
        kvl_tokenizer_free(tok);
        return 1;
    }
    int rc = cli_encode_documents(cmd, tok, eos, path, out, n_out);
    kvl_tokenizer_free(tok);
    return rc;
}

static double rss_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

typedef struct progress_state {
    int tty, quiet;
    int log_every;
    double loss_ema;
    FILE *csv;                     /* loss curve, one row per step (NULL: none) */
    const kvl_train_params *tp;
    const char *csv_path;
    int trim;                      /* a resumed run appending: cut the rows it repeats first */
} progress_state;

/* Cut the loss curve at path before its first row of step `from` or later: a run resumed from
 * a checkpoint of step from-1 writes those steps again, and the rows the interrupted run wrote
 * past its checkpoint would otherwise stay in the curve twice.  Rows are in step order; the
 * header line stays. */
static void csv_trim_from(const char *path, int from) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    long off = 0, cut = -1;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        char *end;
        long step = strtol(line, &end, 10);
        if (end != line && *end == ',' && step >= from) {
            cut = off;
            break;
        }
        off += (long)n;
    }
    free(line);
    fclose(f);
    if (cut >= 0 && truncate(path, (off_t)cut) != 0)
        fprintf(stderr, "kvlingo translator train: --loss-csv %s: cannot cut the rows past the checkpoint: %s\n",
                path, strerror(errno));
}

static int on_progress(void *user, int step, int steps, double loss, double tok_s, double el,
                       size_t mem) {
    progress_state *ps = user;
    if (ps->trim) {   /* the first step of a resumed run: the file is flushed, nothing buffered */
        ps->trim = 0;
        csv_trim_from(ps->csv_path, step);
    }
    ps->loss_ema = ps->loss_ema < 0 ? loss : 0.9 * ps->loss_ema + 0.1 * loss;
    if (ps->csv) {
        fprintf(ps->csv, "%d,%.6f,%.6f,%.6g,%.1f\n", step, loss, ps->loss_ema,
                kvl_train_lr_at(ps->tp, step - 1), tok_s);
        fflush(ps->csv);
    }
    if (ps->quiet) return 0;
    double eta = step > 0 ? el / step * (steps - step) : 0;
    if (ps->tty) {
        fprintf(stderr, "\rstage 2: step %d/%d  KL %.4f (avg %.4f)  %.0f tok/s  %.0fs elapsed, ETA %.0fs  "
                "RSS %.0f MiB  ", step, steps, loss, ps->loss_ema, tok_s, el, eta, rss_mib());
        if (step == steps) fputc('\n', stderr);
    } else if (step % ps->log_every == 0 || step == steps || step == 1) {
        fprintf(stderr, "stage 2: step %d/%d KL %.4f avg %.4f tokens/s %.0f elapsed %.0fs ETA %.0fs "
                "workspace %.1f MiB RSS %.0f MiB\n", step, steps, loss, ps->loss_ema, tok_s, el, eta,
                (double)mem / (1024.0 * 1024.0), rss_mib());
    }
    fflush(stderr);
    return 0;
}

static int cmd_train(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 3)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        puts("usage: kvlingo translator train --source DIR --target DIR --corpus FILE --out FILE\n"
             "         [--steps 400] [--batch 16] [--prefix-min 32] [--prefix-max 256] [--cont-len 64]\n"
             "         [--lr 1e-3] [--warmup N] [--weight-decay 0] [--clip 1.0] [--seed 1] [--threads 1]\n"
             "         [--per-window 1] [--taps 1]\n"
             "         [--stage1-only] [--stage1-out FILE] [--ridge-tokens 65536] [--init FILE]\n"
             "         [--checkpoint FILE] [--checkpoint-every 50] [--resume CKPT] [--bf16]\n"
             "         [--loss-csv FILE (default: OUT with .csv for .safetensors)] [--quiet]\n"
             "Stage 1 (ridge regression from streamed Gram matrices, lambda chosen on held-out tokens of\n"
             "the corpus's end), then stage 2 (distillation: mean KL(teacher || student) over the\n"
             "continuation, target frozen, AdamW + warm-up + cosine decay).  The corpus is one document\n"
             "per line.  --init FILE starts stage 2 from a saved translator instead of stage 1.\n"
             "--per-window K: K samples of a step share one text window (different prefix lengths), so\n"
             "one teacher and one source pass serve K samples.\n"
             "--taps T: each target layer reads the pre-norm K/V of the T source layers nearest in\n"
             "relative depth (maps [Ht*Dt, T*Hs*Ds]; still linear per token); with --init, the file's.\n"
             "The loss curve goes to a CSV (step, loss = the step's mean KL(teacher || student),\n"
             "kl_ema = its moving average, lr, tokens_per_s; `kvlingo translator plot` draws it);\n"
             "progress lines go to stderr (--quiet: none).");
        cli_args_free(&a);
        return 0;
    }
    const char *sdir = cli_opt(&a, "--source", &err), *ddir = cli_opt(&a, "--target", &err);
    const char *corpus = cli_opt(&a, "--corpus", &err), *out = cli_opt(&a, "--out", &err);
    const char *s1out = cli_opt(&a, "--stage1-out", &err), *init = cli_opt(&a, "--init", &err);
    kvl_train_params tp = kvl_train_default_params();
    tp.steps = (int)cli_opt_long(&a, "--steps", tp.steps, 1, 10000000, &err);
    tp.batch = (int)cli_opt_long(&a, "--batch", tp.batch, 1, 100000, &err);
    tp.prefix_min = (int)cli_opt_long(&a, "--prefix-min", tp.prefix_min, 1, 1 << 20, &err);
    tp.prefix_max = (int)cli_opt_long(&a, "--prefix-max", tp.prefix_max, 1, 1 << 20, &err);
    tp.cont_len = (int)cli_opt_long(&a, "--cont-len", tp.cont_len, 1, 1 << 20, &err);
    tp.lr = cli_opt_double(&a, "--lr", tp.lr, 0, 10, &err);
    tp.warmup = (int)cli_opt_long(&a, "--warmup", -1, -1, 10000000, &err);
    tp.weight_decay = cli_opt_double(&a, "--weight-decay", tp.weight_decay, 0, 10, &err);
    tp.clip = cli_opt_double(&a, "--clip", tp.clip, 0, 1e9, &err);
    tp.seed = (uint64_t)cli_opt_long(&a, "--seed", 1, 0, 1L << 62, &err);
    tp.threads = (int)cli_opt_long(&a, "--threads", 1, 1, 64, &err);
    tp.per_window = (int)cli_opt_long(&a, "--per-window", 1, 1, 1024, &err);
    int taps = (int)cli_opt_long(&a, "--taps", 0, 1, 4096, &err);
    tp.checkpoint = cli_opt(&a, "--checkpoint", &err);
    tp.checkpoint_every = (int)cli_opt_long(&a, "--checkpoint-every", 50, 1, 10000000, &err);
    tp.resume = cli_opt(&a, "--resume", &err);
    long ridge_tokens = cli_opt_long(&a, "--ridge-tokens", 65536, 256, 1L << 40, &err);
    int stage1_only = cli_flag(&a, "--stage1-only"), bf16 = cli_flag(&a, "--bf16");
    int quiet = cli_flag(&a, "--quiet");
    const char *csv_opt = cli_opt(&a, "--loss-csv", &err);
    if (err || cli_args_leftover(&a, "translator train")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!sdir || !ddir || !corpus || !out) {
        fprintf(stderr, "kvlingo translator train: --source, --target, --corpus and --out are required\n");
        return 2;
    }
    if (tp.resume && !tp.checkpoint) tp.checkpoint = tp.resume;
    /* what would fail only after the models loaded and stage 1 ran (minutes): refused now */
    if (tp.prefix_min > tp.prefix_max) {
        fprintf(stderr, "kvlingo translator train: --prefix-min %d is above --prefix-max %d\n", tp.prefix_min,
                tp.prefix_max);
        return 2;
    }
    if (tp.batch % tp.per_window) {
        fprintf(stderr, "kvlingo translator train: --batch %d is not a multiple of --per-window %d\n", tp.batch,
                tp.per_window);
        return 2;
    }
    if (cli_check_output("translator train", "--out", out) ||
        (s1out && cli_check_output("translator train", "--stage1-out", s1out)) ||
        (tp.checkpoint && cli_check_output("translator train", "--checkpoint", tp.checkpoint)) ||
        (csv_opt && cli_check_output("translator train", "--loss-csv", csv_opt)))
        return 2;
    kvl_model_params mp = kvl_model_default_params();
    mp.n_threads = tp.threads > 1 ? 1 : 0;
    kvl_model *src = NULL, *dst = NULL;
    kvl_translator *tr = NULL;
    int32_t *stream = NULL;
    size_t n = 0;
    int rc = 1;
    kvl_status s;
    double t0 = kvl__now_s(), t1;
    FILE *ps_csv_close = NULL;
    if ((s = kvl_model_load(sdir, &mp, &src)) || (s = kvl_model_load(ddir, &mp, &dst))) {
        rc = cli_fail("translator train", s);
        goto done;
    }
    if (cli_check_context("translator train", "options --prefix-max + --cont-len", (long)tp.prefix_max + tp.cont_len,
                          src) ||
        cli_check_context("translator train", "options --prefix-max + --cont-len", (long)tp.prefix_max + tp.cont_len,
                          dst)) {
        rc = 2;
        goto done;
    }
    if (encode_corpus("translator train", ddir, corpus, &stream, &n)) goto done;
    t1 = kvl__now_s();
    fprintf(stderr, "corpus %s: %zu tokens (encoded in %.1fs)\n", corpus, n,
            t1 - t0);
    if (init) {
        if ((s = kvl_translator_load(init, &tr)) || (s = kvl_translator_check(tr, src, dst))) {
            rc = cli_fail("translator train", s);
            goto done;
        }
        if (taps && taps != kvl_translator_taps(tr)) {
            fprintf(stderr, "kvlingo translator train: --taps %d, but --init %s has %d tap(s) per target "
                    "layer\n", taps, init, kvl_translator_taps(tr));
            rc = 2;
            goto done;
        }
    } else {
        if ((s = kvl_translator_create_taps(src, dst, taps ? taps : 1, NULL, &tr))) {
            rc = cli_fail("translator train", s);
            goto done;
        }
        kvl_ridge_params rp = kvl_ridge_default_params();
        rp.train_tokens = ridge_tokens;
        rp.heldout_tokens = ridge_tokens / 4;
        rp.verbose = 1;
        t0 = kvl__now_s();
        if ((s = kvl_translator_fit_ridge(tr, src, dst, stream, n, &rp))) { rc = cli_fail("translator train", s); goto done; }
        t1 = kvl__now_s();
        fprintf(stderr, "stage 1: done in %.1fs\n",
                t1 - t0);
        kvl_translator_set_meta(tr, "corpus", corpus);
        const char *s1 = stage1_only ? out : s1out;
        if (s1 && (s = kvl_translator_save(tr, s1, bf16 ? KVL_DTYPE_BF16 : KVL_DTYPE_F32))) {
            rc = cli_fail("translator train", s);
            goto done;
        }
        if (s1) fprintf(stderr, "stage 1: wrote %s\n", s1);
        if (stage1_only) { rc = 0; goto done; }
    }
    progress_state ps = {.tty = isatty(2), .quiet = quiet, .log_every = tp.steps >= 100 ? tp.steps / 50 : 1,
                         .loss_ema = -1, .tp = &tp};
    char csv_path[4096];
    if (csv_opt) snprintf(csv_path, sizeof csv_path, "%s", csv_opt);
    else {
        size_t ol = strlen(out);
        const char *ext = ".safetensors";
        size_t el = strlen(ext);
        int cut = ol > el && !strcmp(out + ol - el, ext);
        snprintf(csv_path, sizeof csv_path, "%.*s.csv", (int)(cut ? ol - el : ol), out);
    }
    /* a resumed run appends to the curve it continues */
    int append = tp.resume && access(csv_path, F_OK) == 0;
    ps.csv = ps_csv_close = fopen(csv_path, append ? "a" : "w");
    if (!ps.csv) {
        fprintf(stderr, "kvlingo translator train: --loss-csv %s: cannot write\n", csv_path);
        goto done;
    }
    if (!append) fputs("step,loss,kl_ema,lr,tokens_per_s\n", ps.csv);
    fflush(ps.csv);
    ps.csv_path = csv_path;
    ps.trim = append;
    tp.progress = on_progress;
    tp.user = &ps;
    double fl = 0;
    fprintf(stderr, "stage 2: %d steps x %d samples (%d per window), prefix %d..%d, continuation %d, "
            "lr %g, %d thread(s)\n", tp.steps, tp.batch, tp.per_window, tp.prefix_min, tp.prefix_max,
            tp.cont_len, tp.lr, tp.threads);
    if ((s = kvl_translator_train(tr, src, dst, stream, n, &tp, &fl))) { rc = cli_fail("translator train", s); goto done; }
    kvl_translator_set_meta(tr, "corpus", corpus);
    if ((s = kvl_translator_save(tr, out, bf16 ? KVL_DTYPE_BF16 : KVL_DTYPE_F32))) {
        rc = cli_fail("translator train", s);
        goto done;
    }
    fprintf(stderr, "stage 2: final KL (mean of the last 10%% of steps) %.4f; wrote %s (loss curve %s)\n",
            fl, out, csv_path);
    rc = 0;
done:
    if (ps_csv_close) fclose(ps_csv_close);
    kvl_translator_free(tr);
    free(stream);
    kvl_model_free(src);
    kvl_model_free(dst);
    return rc;
}

static void on_eval_progress(void *user, const char *phase, int done, int total) {
    cli_progress_step(user, phase, done, total);
}

/* The dtype a translator file stores its maps in (F32 unless they are BF16), so that a file
 * written again keeps it. */
static kvl_dtype maps_dtype_of(const char *path) {
    kvl_safetensors *st = NULL;
    kvl_dtype dt = KVL_DTYPE_F32;
    if (kvl_safetensors_open(path, &st) == KVL_OK) {
        const kvl_st_tensor *t = kvl_safetensors_find(st, "layers.0.k.weight");
        if (t && t->dtype == KVL_DTYPE_BF16) dt = KVL_DTYPE_BF16;
        kvl_safetensors_close(st);
    }
    return dt;
}

static int cmd_eval(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 3)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        puts("usage: kvlingo translator eval --translator FILE --source DIR --target DIR --text-file FILE\n"
             "         [--prefix-len 256] [--cont-len 64] [--samples 200] [--json] [--threads N]\n"
             "         [--device cpu|cuda|cuda:N]\n"
             "         [--turns K [--turn-len 64] [--sessions 20] [--reverse FILE]]\n"
             "         [--store KEY [--store-file FILE]] [--quiet]\n"
             "Token stream = each line encoded + <|endoftext|>; sample i = stream[i(P+C), (i+1)(P+C)); the\n"
             "cache (native, translated, none) covers prefix[0, P-1) at positions 0..P-2, the target reads\n"
             "prefix[P-1] and continuation[0, C-1) and is scored on the C continuation tokens.\n"
             "--turns K: sessions alternating source and target each turn with retained caches (only the new\n"
             "span is translated; --reverse gives the target->source translator, else the source re-prefills\n"
             "its missing span); per-turn perplexity against re-prefill.  --store KEY writes the JSON figures\n"
             "into the metadata of the evaluated translator file (or of --store-file FILE, a translator of\n"
             "the same pair) under KEY (e.g. eval, eval_stage1, eval_multiturn).  Progress lines go\n"
             "to stderr (--quiet: none).");
        cli_args_free(&a);
        return 0;
    }
    const char *file = cli_opt(&a, "--translator", &err), *sdir = cli_opt(&a, "--source", &err);
    const char *ddir = cli_opt(&a, "--target", &err), *text = cli_opt(&a, "--text-file", &err);
    const char *rev = cli_opt(&a, "--reverse", &err), *store = cli_opt(&a, "--store", &err);
    const char *store_file = cli_opt(&a, "--store-file", &err);
    kvl_eval_params ep = kvl_eval_default_params();
    ep.prefix_len = (int)cli_opt_long(&a, "--prefix-len", ep.prefix_len, 2, 1 << 20, &err);
    ep.cont_len = (int)cli_opt_long(&a, "--cont-len", ep.cont_len, 1, 1 << 20, &err);
    ep.samples = (int)cli_opt_long(&a, "--samples", ep.samples, 0, 1 << 30, &err);
    ep.turns = (int)cli_opt_long(&a, "--turns", 0, 0, KVL_EVAL_MAX_TURNS, &err);
    ep.turn_len = (int)cli_opt_long(&a, "--turn-len", ep.turn_len, 2, 1 << 20, &err);
    ep.sessions = (int)cli_opt_long(&a, "--sessions", ep.sessions, 1, 1 << 20, &err);
    int threads = (int)cli_opt_long(&a, "--threads", 0, 0, 1024, &err);
    kvl_model_params dev = kvl_model_default_params();
    cli_opt_device(&a, &dev, &err);
    int json = cli_flag(&a, "--json"), quiet = cli_flag(&a, "--quiet");
    if (err || cli_args_leftover(&a, "translator eval")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!file || !sdir || !ddir || !text) {
        fprintf(stderr, "kvlingo translator eval: --translator, --source, --target and --text-file are required\n");
        return 2;
    }
    if (store_file && access(store_file, R_OK | W_OK) != 0) {   /* before the evaluation, not after */
        fprintf(stderr, "kvlingo translator eval: option --store-file: %s: %s\n", store_file, strerror(errno));
        return 2;
    }
    kvl_model_params mp = dev;
    mp.n_threads = threads;
    kvl_model *src = NULL, *dst = NULL;
    kvl_translator *tr = NULL, *rtr = NULL;
    int32_t *stream = NULL;
    size_t n = 0;
    char *js = NULL;
    int rc = 1;
    kvl_status s;
    if ((s = kvl_translator_load(file, &tr)) || (s = kvl_model_load(sdir, &mp, &src)) ||
        (s = kvl_model_load(ddir, &mp, &dst)) || (s = kvl_translator_check(tr, src, dst)) ||
        (rev && (s = kvl_translator_load(rev, &rtr)))) {
        rc = cli_fail("translator eval", s);
        goto done;
    }
    {   /* the longest context an evaluation builds: a sample's prefix and continuation, and the
         * multi-turn sessions' turns (and the token after them) */
        const long single = ep.samples > 0 ? (long)ep.prefix_len + ep.cont_len : 0;
        const long multi = ep.turns ? (long)ep.turns * ep.turn_len + 1 : 0;
        const long need = single > multi ? single : multi;
        const char *fl = single >= multi ? "options --prefix-len + --cont-len" : "options --turns x --turn-len";
        if (cli_check_context("translator eval", fl, need, src) || cli_check_context("translator eval", fl, need, dst)) {
            rc = 2;
            goto done;
        }
    }
    ep.reverse = rtr;
    cli_progress pr;
    cli_progress_init(&pr, "translator eval", quiet);
    ep.progress = on_eval_progress;
    ep.user = &pr;
    if (encode_corpus("translator eval", ddir, text, &stream, &n)) goto done;
    kvl_eval_result r;
    if ((s = kvl_translator_evaluate(tr, src, dst, stream, n, &ep, &r))) { rc = cli_fail("translator eval", s); goto done; }
    js = kvl_eval_result_json(&r, &ep);
    if (!js) { fprintf(stderr, "kvlingo translator eval: out of memory\n"); goto done; }
    if (json) {
        cJSON *j = cJSON_Parse(js);   /* the figures, plus what was evaluated */
        if (j) {
            cJSON_AddStringToObject(j, "translator", file);
            cJSON_AddStringToObject(j, "source", kvl_model_name(src));
            cJSON_AddStringToObject(j, "target", kvl_model_name(dst));
            cJSON_AddStringToObject(j, "text_file", text);
        }
        if (cli_print_json(j)) goto done;
    } else {
        printf("%s -> %s on %s: %d samples, prefix %d, continuation %d\n", kvl_model_name(src),
               kvl_model_name(dst), text, r.samples, ep.prefix_len, ep.cont_len);
        if (r.samples > 0) {
            printf("  KL(native || translated) %.5f   top-1 agreement %.4f\n", r.kl, r.top1_agreement);
            printf("  ppl native %.3f   translated %.3f   no context %.3f   context gain recovered %.4f\n",
                   r.ppl_native, r.ppl_translated, r.ppl_no_context, r.context_gain_recovered);
            printf("  layer  K rel err  V rel err\n");
            for (int l = 0; l < r.n_layers; l++) printf("  %5d  %9.4f  %9.4f\n", l, r.k_rel_err[l], r.v_rel_err[l]);
        }
        if (r.turns) {
            printf("  turn  model   ppl translated  ppl re-prefill  ratio\n");
            for (int t = 0; t < r.turns; t++)
                printf("  %4d  %-6s  %14.3f  %14.3f  %.4f\n", t, r.turn_model[t] ? "target" : "source",
                       r.turn_ppl_translated[t], r.turn_ppl_reprefill[t],
                       r.turn_ppl_translated[t] / r.turn_ppl_reprefill[t]);
        }
    }
    if (store) {
        const char *sf = store_file ? store_file : file;
        kvl_translator *dest = tr, *other = NULL;
        if (store_file && ((s = kvl_translator_load(store_file, &other)) ||
                           (s = kvl_translator_check(other, src, dst)))) {
            kvl_translator_free(other);
            rc = cli_fail("translator eval", s);
            goto done;
        }
        if (other) dest = other;
        s = kvl_translator_set_meta(dest, store, js);
        if (s == KVL_OK) s = kvl_translator_save(dest, sf, maps_dtype_of(sf));   /* as it was stored */
        kvl_translator_free(other);
        if (s) { rc = cli_fail("translator eval", s); goto done; }
        fprintf(stderr, "stored the figures under metadata '%s' of %s\n", store, sf);
    }
    rc = 0;
done:
    free(js);
    free(stream);
    kvl_translator_free(tr);
    kvl_translator_free(rtr);
    kvl_model_free(src);
    kvl_model_free(dst);
    return rc;
}

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* The evaluation record under metadata `key` as one table row; nothing when absent. */
static void print_eval_row(const kvl_translator *tr, const char *key, const char *label) {
    cJSON *e = cJSON_Parse(kvl_translator_metadata(tr, key) ? kvl_translator_metadata(tr, key) : "");
    if (e && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(e, "kl")))
        printf("  %-10s %8.4f %8.3f %8.2f %10.2f %10.2f %8.3f %8.0f\n", label, jnum(e, "kl"),
               jnum(e, "top1_agreement"), jnum(e, "ppl_native"), jnum(e, "ppl_translated"),
               jnum(e, "ppl_no_context"), jnum(e, "context_gain_recovered"), jnum(e, "samples"));
    cJSON_Delete(e);
}

static int print_info_json(const kvl_translator *tr, const char *file) {
    cJSON *j = cJSON_CreateObject();
    if (j) cJSON_AddStringToObject(j, "file", file);
    for (int i = 0; j && i < kvl_translator_metadata_count(tr); i++) {
        const char *k = kvl_translator_metadata_key(tr, i), *v = kvl_translator_metadata_value(tr, i);
        cJSON *val = (v[0] == '{' || v[0] == '[') ? cJSON_Parse(v) : NULL;   /* JSON stays JSON */
        if (!val) val = cJSON_CreateString(v);
        if (val) cJSON_AddItemToObject(j, k, val);
    }
    return cli_print_json(j);
}

static void print_info_table(const kvl_translator *tr, const char *file) {
    kvl_translator_geometry g;
    kvl_translator_get_geometry(tr, &g);
    const char *sn = kvl_translator_source_name(tr), *tn = kvl_translator_target_name(tr);
    printf("translator %s\n", file);
    printf("  %-7s %-10s %-18s %6s %8s %8s\n", "side", "model", "hash", "layers", "kv heads", "head_dim");
    printf("  %-7s %-10s %-18s %6d %8d %8d\n", "source", sn ? sn : "?",
           kvl_translator_source_hash(tr) ? kvl_translator_source_hash(tr) : "-", g.src_layers,
           g.src_kv_heads, g.src_head_dim);
    printf("  %-7s %-10s %-18s %6d %8d %8d%s\n", "target", tn ? tn : "?",
           kvl_translator_target_hash(tr) ? kvl_translator_target_hash(tr) : "-", g.dst_layers,
           g.dst_kv_heads, g.dst_head_dim, g.dst_qk_norm ? "  (k_norm)" : "");
    printf("  maps: %d x 2 of [%d, %d]; layer map (target <- source):", g.dst_layers,
           g.dst_kv_heads * g.dst_head_dim, kvl_translator_taps(tr) * g.src_kv_heads * g.src_head_dim);
    for (int l = 0; l < g.dst_layers; l++) {
        printf(" %d<-%d", l, kvl_translator_layer_source(tr, l, 0));
        for (int j = 1; j < kvl_translator_taps(tr); j++) printf("+%d", kvl_translator_layer_source(tr, l, j));
    }
    printf("\n");
    const char *corpus = kvl_translator_metadata(tr, "corpus");
    if (corpus) printf("  corpus: %s\n", corpus);
    if (kvl_translator_metadata(tr, "imported_from"))
        printf("  imported from: %s\n", kvl_translator_metadata(tr, "imported_from"));
    cJSON *s1 = cJSON_Parse(kvl_translator_metadata(tr, "stage1") ? kvl_translator_metadata(tr, "stage1") : "");
    if (s1)
        printf("  stage 1 (ridge): %.0f train tokens, %.0f held-out tokens\n", jnum(s1, "train_tokens"),
               jnum(s1, "heldout_tokens"));
    cJSON_Delete(s1);
    /* training runs, oldest first: the record nests each earlier run under continued_from */
    cJSON *t = cJSON_Parse(kvl_translator_metadata(tr, "training") ? kvl_translator_metadata(tr, "training") : "");
    const cJSON *runs[64];
    int nr = 0;
    for (const cJSON *r = t; r && cJSON_IsObject(r) && nr < 64;
         r = cJSON_GetObjectItemCaseSensitive(r, "continued_from"))
        runs[nr++] = r;
    if (nr) {
        printf("  stage 2 runs:\n  %3s %6s %5s %4s %8s %6s %4s %9s %8s\n", "run", "steps", "batch", "win",
               "lr", "warmup", "seed", "final KL", "seconds");
        for (int i = nr - 1, k = 1; i >= 0; i--, k++) {
            /* runs recorded before --per-window existed read one sample per window */
            double win = jnum(runs[i], "per_window");
            printf("  %3d %6.0f %5.0f %4.0f %8.2g %6.0f %4.0f %9.5f %8.1f\n", k, jnum(runs[i], "steps"),
                   jnum(runs[i], "batch"), isnan(win) ? 1.0 : win, jnum(runs[i], "lr"),
                   jnum(runs[i], "warmup"), jnum(runs[i], "seed"), jnum(runs[i], "final_kl"),
                   jnum(runs[i], "seconds"));
        }
    }
    cJSON_Delete(t);
    if (kvl_translator_metadata(tr, "eval") || kvl_translator_metadata(tr, "eval_stage1")) {
        printf("  evaluation:\n  %-10s %8s %8s %8s %10s %10s %8s %8s\n", "", "KL", "top-1", "ppl nat",
               "ppl transl", "ppl no ctx", "gain", "samples");
        print_eval_row(tr, "eval_stage1", "stage 1");
        print_eval_row(tr, "eval", "final");
        /* figures stored under other keys (`translator eval --store eval_prefix128`) */
        for (int i = 0; i < kvl_translator_metadata_count(tr); i++) {
            const char *k = kvl_translator_metadata_key(tr, i);
            if (!strncmp(k, "eval_", 5) && strcmp(k, "eval_stage1") && strcmp(k, "eval_multiturn"))
                print_eval_row(tr, k, k + 5);
        }
    }
    cJSON *mt = cJSON_Parse(kvl_translator_metadata(tr, "eval_multiturn") ? kvl_translator_metadata(tr, "eval_multiturn") : "");
    const cJSON *turns = cJSON_GetObjectItemCaseSensitive(mt, "turns"), *x;
    if (cJSON_IsArray(turns)) {
        double worst = 0;
        printf("  multi-turn (%.0f sessions, %.0f tokens a turn): ratio translated / re-prefill per turn\n   ",
               jnum(mt, "sessions"), jnum(mt, "turn_len"));
        cJSON_ArrayForEach(x, turns) {
            double r = jnum(x, "ratio");
            printf(" %.3f", r);
            if (r > worst) worst = r;
        }
        printf("\n    worst %.3f\n", worst);
    }
    cJSON_Delete(mt);
    static const char *const shown[] = {"format", "source_name", "source_hash", "target_name",
        "target_hash", "source_layers", "source_kv_heads", "source_head_dim", "target_layers",
        "target_kv_heads", "target_head_dim", "target_qk_norm", "source_taps", "layer_map", "stage1",
        "training", "eval", "corpus", "imported_from"};
    for (int i = 0; i < kvl_translator_metadata_count(tr); i++) {
        const char *k = kvl_translator_metadata_key(tr, i);
        int sk = !strncmp(k, "eval_", 5);   /* every evaluation is in the tables above */
        for (size_t j = 0; j < sizeof shown / sizeof shown[0]; j++) sk |= !strcmp(shown[j], k);
        if (!sk) printf("  %s: %s\n", k, kvl_translator_metadata_value(tr, i));
    }
    printf("  (--json prints the full record)\n");
}

static int cmd_tr_info(int argc, char **argv) {
    if (argc >= 4 && (!strcmp(argv[3], "--help") || !strcmp(argv[3], "-h"))) {
        puts("usage: kvlingo translator info FILE [--json]\n"
             "A table of the pair, geometry, layer map, training runs (oldest first) and evaluation\n"
             "figures; --json prints the whole metadata record as one JSON object.");
        return 0;
    }
    if (argc < 4) { fprintf(stderr, "usage: kvlingo translator info FILE [--json]\n"); return 2; }
    int json = argc >= 5 && !strcmp(argv[4], "--json");
    if (argc > 5 || (argc == 5 && !json)) { fprintf(stderr, "kvlingo translator info: unexpected argument '%s'\n", argv[argc - 1]); return 2; }
    kvl_translator *tr = NULL;
    kvl_status s = kvl_translator_load(argv[3], &tr);
    if (s) return cli_fail("translator info", s);
    int rc = 0;
    if (json) rc = print_info_json(tr, argv[3]);
    else print_info_table(tr, argv[3]);
    kvl_translator_free(tr);
    return rc;
}

static int cmd_import(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 3)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
        puts("usage: kvlingo translator import --layout plain --in FILE --source DIR --target DIR --out FILE\n"
             "         [--bf16]\n"
             "Turns a translator in the plain layout (tensors layers.{l}.k.weight / layers.{l}.v.weight of\n"
             "shape [Ht*Dt, Hs*Ds], metadata layer_map: a JSON list with, per target layer, the source\n"
             "layer it maps from, e.g. \"[0, 1, 1, 2]\", or a list of source layers it maps from together,\n"
             "e.g. \"[[0, 1], [1, 2]]\", with [Ht*Dt, taps*Hs*Ds] weights; no kvlingo format key) into a kvlingo translator\n"
             "file: geometry checked against both models, the target's k_norm taken from the target\n"
             "model, both models' names and hashes recorded.  --bf16 stores the maps in bfloat16\n"
             "(default float32).");
        cli_args_free(&a);
        return 0;
    }
    const char *layout = cli_opt(&a, "--layout", &err), *in = cli_opt(&a, "--in", &err);
    const char *sdir = cli_opt(&a, "--source", &err), *ddir = cli_opt(&a, "--target", &err);
    const char *out = cli_opt(&a, "--out", &err);
    int bf16 = cli_flag(&a, "--bf16");
    if (err || cli_args_leftover(&a, "translator import")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!layout || !in || !sdir || !ddir || !out) {
        fprintf(stderr, "kvlingo translator import: --layout, --in, --source, --target and --out are required\n");
        return 2;
    }
    if (strcmp(layout, "plain")) {
        fprintf(stderr, "kvlingo translator import: --layout '%s' is not known (plain is)\n", layout);
        return 2;
    }
    kvl_model_params mp = kvl_model_default_params();
    kvl_model *src = NULL, *dst = NULL;
    kvl_translator *tr = NULL;
    kvl_status s;
    int rc = 0;
    if ((s = kvl_model_load(sdir, &mp, &src)) || (s = kvl_model_load(ddir, &mp, &dst)) ||
        (s = kvl_translator_import_plain(in, src, dst, &tr)) ||
        (s = kvl_translator_save(tr, out, bf16 ? KVL_DTYPE_BF16 : KVL_DTYPE_F32)))
        rc = cli_fail("translator import", s);
    else
        fprintf(stderr, "translator import: %s (%s -> %s) -> %s\n", in, kvl_model_name(src),
                kvl_model_name(dst), out);
    kvl_translator_free(tr);
    kvl_model_free(src);
    kvl_model_free(dst);
    return rc;
}

int cmd_translator(int argc, char **argv) {
    const char *sub = argc >= 3 ? argv[2] : NULL;
    if (sub && !strcmp(sub, "train")) return cmd_train(argc, argv);
    if (sub && !strcmp(sub, "eval")) return cmd_eval(argc, argv);
    if (sub && !strcmp(sub, "info")) return cmd_tr_info(argc, argv);
    if (sub && !strcmp(sub, "import")) return cmd_import(argc, argv);
    if (sub && !strcmp(sub, "plot")) return cmd_translator_plot(argc, argv);
    if (sub && !strcmp(sub, "random")) return cmd_translator_random(argc, argv);
    int help = sub && (!strcmp(sub, "--help") || !strcmp(sub, "-h"));
    fprintf(help ? stdout : stderr, "usage: kvlingo translator (train | eval | info | import | plot | random) [options]   (--help for each)\n");
    return help ? 0 : 2;
}
