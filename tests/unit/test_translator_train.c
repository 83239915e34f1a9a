/* tests/unit/test_translator_train.c: a short end-to-end training run on the shipped models
 * (stage 1 ridge + a few stage-2 steps on a slice of the training text) must reduce the KL of
 * held-out samples; a resumed run must equal the uninterrupted one bit for bit; two worker
 * threads must be deterministic, and a worker thread's failure reaches the caller with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvlingo/tokenizer.h"
#include "kvlingo/translator.h"
#include "kvlingo/translator_train.h"
#include "testutil.h"

typedef struct fixture {
    kvl_model *src, *dst;
    int32_t *stream;
    size_t n;
    char dir[4096];
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    kvl_model_params mp = kvl_model_default_params();
    mp.n_threads = 1;
    /* qwen3-b -> qwen3-a: different depth, head_dim and RoPE theta; the cheap direction */
    if (kvl_model_load(kvl__test_path("models/qwen3-b"), &mp, &f->src) ||
        kvl_model_load(kvl__test_path("models/qwen3-a"), &mp, &f->dst))
        return -1;
    kvl_tokenizer *tok = NULL;
    if (kvl_tokenizer_load_dir(kvl__test_path("models/qwen3-a"), &tok)) return -1;
    size_t len;
    char *text = kvl__test_read_file(kvl__test_path("testdata/corpus/train_slice.txt"), &len);
    if (!text) return -1;
    f->stream = malloc(sizeof(int32_t) * (len + 1000));
    int32_t eos = kvl_tokenizer_token_id(tok, "<|endoftext|>");
    for (char *p = text, *end = text + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t dl = nl ? (size_t)(nl - p) : (size_t)(end - p);
        int32_t *ids;
        size_t k;
        if (dl && kvl_tokenizer_encode(tok, p, dl, &ids, &k) == KVL_OK) {
            memcpy(f->stream + f->n, ids, sizeof(int32_t) * k);
            f->n += k;
            f->stream[f->n++] = eos;
            free(ids);
        }
        p = nl ? nl + 1 : end;
    }
    free(text);
    kvl_tokenizer_free(tok);
    snprintf(f->dir, sizeof f->dir, "%s", kvl__test_tmpdir());
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    kvl_model_free(f->src);
    kvl_model_free(f->dst);
    free(f->stream);
    free(f);
    return 0;
}

static kvl_translator *stage1_taps(fixture *f, int taps) {
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create_taps(f->src, f->dst, taps, NULL, &tr), KVL_OK);
    kvl_ridge_params rp = kvl_ridge_default_params();
    rp.train_tokens = 8192;
    rp.heldout_tokens = 2048;
    assert_int_equal(kvl_translator_fit_ridge(tr, f->src, f->dst, f->stream, f->n, &rp), KVL_OK);
    assert_non_null(kvl_translator_metadata(tr, "stage1"));
    return tr;
}

static kvl_translator *stage1(fixture *f) { return stage1_taps(f, 1); }

static kvl_train_params small_params(void) {
    kvl_train_params p = kvl_train_default_params();
    p.steps = 12;
    p.batch = 4;
    p.prefix_min = 16;
    p.prefix_max = 64;
    p.cont_len = 32;
    p.lr = 1e-3;
    p.warmup = 2;
    p.seed = 7;
    return p;
}

/* small_params with `steps` steps of 2 short samples: the error-path tests' runs */
static kvl_train_params tiny_params(int steps) {
    kvl_train_params p = small_params();
    p.steps = steps;
    p.batch = 2;
    p.prefix_min = 8;
    p.prefix_max = 16;
    p.cont_len = 8;
    return p;
}

static double eval_kl(fixture *f, const kvl_translator *tr) {
    kvl_eval_params ep = kvl_eval_default_params();
    ep.prefix_len = 64;
    ep.cont_len = 32;
    ep.samples = 12;
    kvl_eval_result r;
    /* held-out: samples from the second half of the slice (training draws from all of it,
     * but 12 x 96 tokens out of ~70k are rarely seen in 48 samples) */
    size_t off = f->n / 2;
    assert_int_equal(kvl_translator_evaluate(tr, f->src, f->dst, f->stream + off, f->n - off, &ep, &r), KVL_OK);
    assert_true(r.ppl_native > 1 && r.ppl_translated > 1);
    return r.kl;
}

static void test_training_reduces_kl(void **state) {
    fixture *f = *state;
    kvl_translator *tr = stage1(f);
    double kl0 = eval_kl(f, tr);
    kvl_train_params p = small_params();
    double fl = 0;
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &p, &fl), KVL_OK);
    double kl1 = eval_kl(f, tr);
    print_message("held-out KL: stage 1 %.5f -> after %d steps %.5f (training KL %.5f)\n", kl0,
                  p.steps, kl1, fl);
    assert_true(kl1 < kl0);
    assert_non_null(kvl_translator_metadata(tr, "training"));
    kvl_translator_free(tr);
}

static int cancel_at_3(void *user, int step, int steps, double loss, double tps, double el, size_t mem) {
    (void)user; (void)steps; (void)loss; (void)tps; (void)el; (void)mem;
    return step == 3;
}

/* Two source layers per target layer: stage 1 fits at least as well on held-out text as one
 * (its inputs include the one-tap map's), and stage 2 trains the wider maps (a few steps from a
 * good start may lose a little; it must stay ahead of the one-tap fit). */
static void test_taps_fit_and_train(void **state) {
    fixture *f = *state;
    kvl_translator *t1 = stage1(f), *t2 = stage1_taps(f, 2);
    double kl1 = eval_kl(f, t1), kl2 = eval_kl(f, t2);
    print_message("held-out KL after stage 1: 1 tap %.5f, 2 taps %.5f\n", kl1, kl2);
    assert_true(kl2 < kl1 * 1.02);
    kvl_train_params p = small_params();
    double fl = 0;
    assert_int_equal(kvl_translator_train(t2, f->src, f->dst, f->stream, f->n, &p, &fl), KVL_OK);
    double kl3 = eval_kl(f, t2);
    print_message("2 taps after %d steps: %.5f (training KL %.5f)\n", p.steps, kl3, fl);
    assert_true(isfinite(fl) && fl > 0);
    assert_true(kl3 < kl1);
    kvl_translator_free(t1);
    kvl_translator_free(t2);
}

static void test_resume_is_exact(void **state) {
    fixture *f = *state;
    kvl_translator *a = stage1(f), *b = stage1(f);
    kvl_train_params p = small_params();
    p.steps = 6;
    assert_int_equal(kvl_translator_train(a, f->src, f->dst, f->stream, f->n, &p, NULL), KVL_OK);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", f->dir);
    kvl_train_params q = p;
    q.checkpoint = ckpt;
    q.checkpoint_every = 3;
    q.progress = cancel_at_3;
    assert_int_equal(kvl_translator_train(b, f->src, f->dst, f->stream, f->n, &q, NULL), KVL_ERR_CANCELLED);
    q.progress = NULL;
    q.resume = ckpt;
    assert_int_equal(kvl_translator_train(b, f->src, f->dst, f->stream, f->n, &q, NULL), KVL_OK);
    size_t n = 32 * 128 * sizeof(float);
    for (int l = 0; l < 4; l++) {
        assert_memory_equal(kvl_translator_wk(a, l), kvl_translator_wk(b, l), n);
        assert_memory_equal(kvl_translator_wv(a, l), kvl_translator_wv(b, l), n);
    }
    /* a checkpoint of another seed is refused */
    q.seed = 8;
    assert_int_equal(kvl_translator_train(b, f->src, f->dst, f->stream, f->n, &q, NULL), KVL_ERR_MISMATCH);
    q.seed = p.seed;
    /* a run with fewer steps than the checkpoint's has nothing to train: refused, not 'done' */
    q.steps = 3;
    assert_int_equal(kvl_translator_train(b, f->src, f->dst, f->stream, f->n, &q, NULL), KVL_ERR_RANGE);
    assert_non_null(strstr(kvl_last_error(), "at or past this run's 3 steps"));
    /* a checkpoint whose step is negative (it indexed the loss history before it) is refused */
    {
        kvl_safetensors *st = NULL;
        assert_int_equal(kvl_safetensors_open(ckpt, &st), KVL_OK);
        const char *keys[16], *vals[16];
        size_t nm = 0;
        static const char *const want[] = {"format", "seed", "step"};
        for (size_t k = 0; k < 3; k++) {
            const char *v = kvl_safetensors_metadata(st, want[k]);
            if (!v) continue;
            keys[nm] = want[k];
            vals[nm++] = strcmp(want[k], "step") ? v : "-3";
        }
        kvl_st_write_tensor tw[6];
        static const char *const names[6] = {"wk", "wv", "adam_m.k", "adam_m.v", "adam_v.k", "adam_v.v"};
        float *bufs[6] = {0};
        for (int k = 0; k < 6; k++) {
            const kvl_st_tensor *t = kvl_safetensors_find(st, names[k]);
            assert_non_null(t);
            bufs[k] = malloc(sizeof(float) * (size_t)t->n_elements);
            assert_non_null(bufs[k]);
            assert_int_equal(kvl_st_tensor_to_f32(t, bufs[k], (size_t)t->n_elements), KVL_OK);
            tw[k] = (kvl_st_write_tensor){names[k], KVL_DTYPE_F32, t->n_dims, {t->shape[0], t->shape[1]},
                                          bufs[k], sizeof(float) * (size_t)t->n_elements};
        }
        char bad[4300];
        snprintf(bad, sizeof bad, "%s/ckpt_neg.safetensors", f->dir);
        assert_int_equal(kvl_safetensors_write(bad, tw, 6, keys, vals, nm), KVL_OK);
        kvl_safetensors_close(st);   /* after the write: vals point into its metadata */
        for (int k = 0; k < 6; k++) free(bufs[k]);
        q.steps = 6;
        q.resume = bad;
        assert_int_equal(kvl_translator_train(b, f->src, f->dst, f->stream, f->n, &q, NULL), KVL_ERR_FORMAT);
        assert_non_null(strstr(kvl_last_error(), "metadata 'step' = \"-3\""));
    }
    kvl_translator_free(a);
    kvl_translator_free(b);
}

static void test_threads_deterministic(void **state) {
    fixture *f = *state;
    kvl_translator *a = stage1(f), *b = stage1(f);
    kvl_train_params p = small_params();
    p.steps = 2;
    p.threads = 2;
    assert_int_equal(kvl_translator_train(a, f->src, f->dst, f->stream, f->n, &p, NULL), KVL_OK);
    assert_int_equal(kvl_translator_train(b, f->src, f->dst, f->stream, f->n, &p, NULL), KVL_OK);
    size_t n = 32 * 128 * sizeof(float);
    for (int l = 0; l < 4; l++) assert_memory_equal(kvl_translator_wk(a, l), kvl_translator_wk(b, l), n);
    kvl_translator_free(a);
    kvl_translator_free(b);
}

static double g_last_loss;
static int record_loss(void *user, int step, int steps, double loss, double tps, double el, size_t mem) {
    (void)user; (void)step; (void)steps; (void)tps; (void)el; (void)mem;
    g_last_loss = loss;
    return 0;
}

/* The training forward (translator_core.inc) must agree with the inference forward: a model
 * translated into itself by identity maps is its own teacher, so the loss is ~0. */
static void test_identity_student_matches_teacher(void **state) {
    fixture *f = *state;
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(f->dst, f->dst, NULL, &tr), KVL_OK);
    int d = 64;
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < d; i++) kvl_translator_wk(tr, l)[i * d + i] = kvl_translator_wv(tr, l)[i * d + i] = 1;
    kvl_train_params p = small_params();
    p.steps = 1;
    p.per_window = 2;
    p.lr = 0;
    p.progress = record_loss;
    g_last_loss = -1;
    assert_int_equal(kvl_translator_train(tr, f->dst, f->dst, f->stream, f->n, &p, NULL), KVL_OK);
    print_message("identity translator: training KL %.3g\n", g_last_loss);
    /* the teacher (the backend's forward) and the student (training's own pass) are the same
     * model through different kernels, so their logits differ by float rounding; KL of two
     * float log-softmaxes that close can come out a few 1e-9 below 0 */
    assert_true(g_last_loss > -1e-6 && g_last_loss < 1e-4);
    kvl_translator_free(tr);
}

/* A failure in a worker thread other than the caller's is reported with its own message:
 * kvl_last_error() is per thread.  The stream's second half holds ids outside the vocabulary,
 * so with two threads some seeds fail only in worker 1's window. */
static void test_worker_error_reaches_caller(void **state) {
    fixture *f = *state;
    const size_t n = 4000;
    int32_t *bad = malloc(sizeof(int32_t) * n);
    assert_non_null(bad);
    for (size_t i = 0; i < n; i++) bad[i] = i < n / 2 ? f->stream[i] : 999999;
    kvl_train_params p = kvl_train_default_params();
    p.steps = 1;
    p.batch = 2;
    p.prefix_min = p.prefix_max = 8;
    p.cont_len = 8;
    p.warmup = 0;
    p.threads = 2;
    int failures = 0;
    for (int seed = 1; seed <= 12; seed++) {
        kvl_translator *tr = NULL;
        assert_int_equal(kvl_translator_create(f->src, f->dst, NULL, &tr), KVL_OK);
        p.seed = (uint64_t)seed;
        kvl_clear_error();
        if (kvl_translator_train(tr, f->src, f->dst, bad, n, &p, NULL) != KVL_OK) {
            failures++;
            if (!strstr(kvl_last_error(), "outside the vocabulary"))
                fail_msg("seed %d: the failure's message is '%s'", seed, kvl_last_error());
        }
        kvl_translator_free(tr);
    }
    assert_true(failures >= 6);   /* 3/4 of the seeds draw a bad window in one worker or both */
    free(bad);
}

/* Divergence stops training with KVL_ERR_NUMERIC naming the step, and the checkpoint keeps the
 * last good step: non-finite maps (a NaN loss at the first sample), and an update that
 * overflows float (lr 1e39 after a good step; before, step 2's inf maps were checkpointed over
 * step 1's, and a run ending at that step returned KVL_OK). */
static void test_divergence_is_reported(void **state) {
    fixture *f = *state;
    kvl_train_params p = tiny_params(3);
    p.warmup = 0;
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/diverge.safetensors", f->dir);
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(f->src, f->dst, NULL, &tr), KVL_OK);
    kvl_translator_wk(tr, 1)[5] = NAN;
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &p, NULL), KVL_ERR_NUMERIC);
    assert_non_null(strstr(kvl_last_error(), "diverged at step 1 of 3"));
    kvl_translator_free(tr);

    assert_int_equal(kvl_translator_create(f->src, f->dst, NULL, &tr), KVL_OK);
    p.checkpoint = ckpt;
    p.checkpoint_every = 1;
    p.steps = 1;
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &p, NULL), KVL_OK);
    const size_t per = (size_t)64 * 128;
    float *good = malloc(sizeof(float) * per);
    assert_non_null(good);
    memcpy(good, kvl_translator_wk(tr, 0), sizeof(float) * per);
    p.steps = 3;
    p.resume = ckpt;
    p.lr = 1e39;
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &p, NULL), KVL_ERR_NUMERIC);
    assert_non_null(strstr(kvl_last_error(), "diverged at step 2 of 3"));
    kvl_safetensors *st = NULL;
    assert_int_equal(kvl_safetensors_open(ckpt, &st), KVL_OK);
    assert_string_equal(kvl_safetensors_metadata(st, "step"), "1");
    const kvl_st_tensor *t = kvl_safetensors_find(st, "wk");
    assert_non_null(t);
    float *w = malloc(sizeof(float) * (size_t)t->n_elements);
    assert_non_null(w);
    assert_int_equal(kvl_st_tensor_to_f32(t, w, (size_t)t->n_elements), KVL_OK);
    assert_memory_equal(w, good, sizeof(float) * per);
    kvl_safetensors_close(st);
    free(w);
    free(good);
    kvl_translator_free(tr);
}

/* A checkpoint resumes only the run it belongs to: another pair whose maps have as many weights
 * (qwen3-b -> qwen3-a with one tap, qwen3-a -> qwen3-a with two: 4 x 64 x 128 each), another
 * layer map of the same pair, or other sampling parameters are refused (before, all three
 * loaded and trained on); so is one whose values are not finite. */
static void test_checkpoint_of_another_run_is_refused(void **state) {
    fixture *f = *state;
    kvl_train_params p = tiny_params(1);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/ident.safetensors", f->dir);
    p.checkpoint = ckpt;
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(f->src, f->dst, NULL, &tr), KVL_OK);
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &p, NULL), KVL_OK);
    kvl_train_params q = p;
    q.steps = 2;
    q.resume = ckpt;
    q.checkpoint = NULL;
    /* the same run resumes */
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &q, NULL), KVL_OK);
    kvl_translator_free(tr);
    /* another pair, same number of weights */
    assert_int_equal(kvl_translator_create_taps(f->dst, f->dst, 2, NULL, &tr), KVL_OK);
    assert_int_equal(kvl_translator_train(tr, f->dst, f->dst, f->stream, f->n, &q, NULL), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "source model"));
    kvl_translator_free(tr);
    /* the same pair with another layer map */
    const int map[4] = {0, 0, 5, 5};
    assert_int_equal(kvl_translator_create(f->src, f->dst, map, &tr), KVL_OK);
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &q, NULL), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "layer map is 0,2,3,5, this run's is 0,0,5,5"));
    kvl_translator_free(tr);
    /* the same translator with another batch */
    assert_int_equal(kvl_translator_create(f->src, f->dst, NULL, &tr), KVL_OK);
    q.batch = 4;
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &q, NULL), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "sampling is batch 2,"));
    q.batch = p.batch;
    /* a corrupted checkpoint: NaN in a second moment (before, it resumed, wrote NaN maps over the
     * checkpoint and returned KVL_OK) */
    size_t len = 0;
    unsigned char *bytes = (unsigned char *)kvl__test_read_file(ckpt, &len);
    assert_non_null(bytes);
    kvl_safetensors *st = NULL;
    assert_int_equal(kvl_safetensors_open(ckpt, &st), KVL_OK);
    const kvl_st_tensor *t = kvl_safetensors_find(st, "adam_v.v");
    assert_non_null(t);
    const float nanv = NAN;
    size_t at = len - (size_t)t->n_elements * 4 + 40;   /* adam_v.v is the last tensor written */
    kvl_safetensors_close(st);
    memcpy(bytes + at, &nanv, 4);
    char bad[4300];
    snprintf(bad, sizeof bad, "%s/ident_nan.safetensors", f->dir);
    assert_int_equal(kvl__test_write_file(bad, bytes, len), 0);
    free(bytes);
    q.resume = bad;
    q.checkpoint = bad;
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &q, NULL), KVL_ERR_NUMERIC);
    assert_non_null(strstr(kvl_last_error(), "tensor 'adam_v.v' element 10 is nan"));
    kvl_translator_free(tr);
}

/* Multi-turn parameters that leave a turn with no scored token (turn_len 1: turn 0 scores
 * turn_len - 1) or no session are refused before any sample runs; before, the evaluation
 * returned KVL_OK with 0/0 = NaN perplexities, which the JSON figures printed as 'nan'. */
static void test_eval_turn_params(void **state) {
    fixture *f = *state;
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(f->src, f->dst, NULL, &tr), KVL_OK);
    kvl_eval_params ep = kvl_eval_default_params();
    ep.prefix_len = 8;
    ep.cont_len = 4;
    ep.samples = 1;
    ep.turns = 2;
    ep.turn_len = 4;
    ep.sessions = 1;
    kvl_eval_result r;
    assert_int_equal(kvl_translator_evaluate(tr, f->src, f->dst, f->stream, f->n, &ep, &r), KVL_OK);
    assert_true(isfinite(r.turn_ppl_translated[0]) && isfinite(r.turn_ppl_reprefill[1]));
    ep.turn_len = 1;
    assert_int_equal(kvl_translator_evaluate(tr, f->src, f->dst, f->stream, f->n, &ep, &r), KVL_ERR_INVALID_ARG);
    assert_non_null(strstr(kvl_last_error(), "turn_len in [2,"));
    ep.turn_len = 4;
    ep.sessions = 0;
    ep.samples = 0;
    assert_int_equal(kvl_translator_evaluate(tr, f->src, f->dst, f->stream, f->n, &ep, &r), KVL_ERR_INVALID_ARG);
    assert_non_null(strstr(kvl_last_error(), "sessions in [1,"));
    kvl_translator_free(tr);
}

/* Small random maps from a fixed generator (the same for every translator it is given). */
static void random_maps(kvl_translator *tr) {
    uint64_t x = 12345;
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 64 * 128; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            kvl_translator_wk(tr, l)[i] = (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5) * 0.2f;
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            kvl_translator_wv(tr, l)[i] = (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5) * 0.2f;
        }
}

static double g_losses[64];
static int record_losses(void *user, int step, int steps, double loss, double tps, double el, size_t mem) {
    (void)user; (void)steps; (void)tps; (void)el; (void)mem;
    g_losses[step - 1] = loss;
    return 0;
}

/* *final_loss is the mean loss of the last 10% of steps (before: one step more, 2 of 10 and
 * 41 of 400). */
static void test_final_loss_is_last_tenth(void **state) {
    fixture *f = *state;
    kvl_train_params p = tiny_params(small_params().steps);
    p.progress = record_losses;
    for (int steps = 10; steps <= 30; steps += 20) {
        kvl_translator *tr = NULL;
        assert_int_equal(kvl_translator_create(f->src, f->dst, NULL, &tr), KVL_OK);
        p.steps = steps;
        double fl = -1, want = 0;
        assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &p, &fl), KVL_OK);
        int last = steps / 10;
        for (int k = steps - last; k < steps; k++) want += g_losses[k] / last;
        assert_true(fabs(fl - want) <= 1e-12 * fabs(want));
        kvl_translator_free(tr);
    }
}

/* Worker threads split a step's windows: two and three threads give the one-thread maps up to
 * the float rounding of the gradients' summation order (measured: 7e-7 of weights ~0.1 after 5
 * steps); a window run twice or skipped would be far off.  The determinism test above only
 * compares two runs of the same thread count. */
static void test_threads_match_one_thread(void **state) {
    fixture *f = *state;
    kvl_translator *tr[3];
    for (int k = 0; k < 3; k++) {
        assert_int_equal(kvl_translator_create(f->src, f->dst, NULL, &tr[k]), KVL_OK);
        random_maps(tr[k]);
        kvl_train_params p = small_params();
        p.steps = 3;
        p.batch = 6;
        p.per_window = 2;
        p.prefix_min = 16;
        p.prefix_max = 48;
        p.cont_len = 16;
        p.threads = k + 1;
        assert_int_equal(kvl_translator_train(tr[k], f->src, f->dst, f->stream, f->n, &p, NULL), KVL_OK);
    }
    for (int k = 1; k < 3; k++) {
        double worst = 0;
        for (int l = 0; l < 4; l++)
            for (int i = 0; i < 64 * 128; i++) {
                double dk = fabs(kvl_translator_wk(tr[k], l)[i] - kvl_translator_wk(tr[0], l)[i]);
                double dv = fabs(kvl_translator_wv(tr[k], l)[i] - kvl_translator_wv(tr[0], l)[i]);
                worst = fmax(worst, fmax(dk, dv));
            }
        print_message("%d threads vs 1: max |dW| %.2e\n", k + 1, worst);
        assert_true(worst < 1e-5);
    }
    for (int k = 0; k < 3; k++) kvl_translator_free(tr[k]);
}

/* OpenBLAS's own thread count (the library's BLAS), set to 1 while worker threads train */
int openblas_get_num_threads(void);
void openblas_set_num_threads(int n);

/* Training with worker threads gives the caller its BLAS thread count back (before, it stayed
 * at 1, so a later stage 1 or apply in the process ran its GEMMs on one core). */
static void test_threads_restore_blas(void **state) {
    fixture *f = *state;
    const int was = openblas_get_num_threads();
    openblas_set_num_threads(3);
    const int want = openblas_get_num_threads();   /* 3, or fewer where OpenBLAS was built so */
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(f->src, f->dst, NULL, &tr), KVL_OK);
    kvl_train_params p = tiny_params(1);
    p.threads = 2;
    assert_int_equal(kvl_translator_train(tr, f->src, f->dst, f->stream, f->n, &p, NULL), KVL_OK);
    assert_int_equal(openblas_get_num_threads(), want);
    openblas_set_num_threads(was);
    kvl_translator_free(tr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity_student_matches_teacher),
        cmocka_unit_test(test_training_reduces_kl),
        cmocka_unit_test(test_resume_is_exact),
        cmocka_unit_test(test_taps_fit_and_train),
        cmocka_unit_test(test_threads_deterministic),
        cmocka_unit_test(test_worker_error_reaches_caller),
        cmocka_unit_test(test_divergence_is_reported),
        cmocka_unit_test(test_checkpoint_of_another_run_is_refused),
        cmocka_unit_test(test_eval_turn_params),
        cmocka_unit_test(test_final_loss_is_last_tenth),
        cmocka_unit_test(test_threads_restore_blas),
        cmocka_unit_test(test_threads_match_one_thread),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
