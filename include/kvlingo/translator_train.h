/* kvlingo/translator_train.h: building, saving, inspecting, training and evaluating KV-Lingo
 * translators (the method: kvlingo/translator.h).  Extends kvlingo/translator.h.
 *
 * Token streams given to training and evaluation are int32 ids, e.g. a text file encoded under
 * the evaluation protocol (each line one document, encoded and followed by <|endoftext|>).
 * All tensors are float32; shapes are named: Lt target layers, Ls source layers, Dt = Ht*Dt and
 * Ds = Hs*Ds feature widths of one token's keys (or values) over all kv heads. */
#ifndef KVLINGO_TRANSLATOR_TRAIN_H
#define KVLINGO_TRANSLATOR_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/translator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Geometry of a translator. */
typedef struct kvl_translator_geometry {
    int src_layers, src_kv_heads, src_head_dim;
    int dst_layers, dst_kv_heads, dst_head_dim;
    int dst_qk_norm;            /* the target applies k_norm (its weights are in the file) */
} kvl_translator_geometry;

void kvl_translator_get_geometry(const kvl_translator *tr, kvl_translator_geometry *out);
/* Taps T: how many source layers each target layer reads (1 for the classic map). */
int kvl_translator_taps(const kvl_translator *tr);
/* Source layer of tap j (0 <= j < T, ascending in j) of target layer l, -1 when out of range. */
int kvl_translator_layer_source(const kvl_translator *tr, int l, int j);
/* Source layer read by target layer l (its first tap), -1 when l is out of range. */
int kvl_translator_layer_map(const kvl_translator *tr, int l);
/* Maps of target layer l: [Ht*Dt, T*Hs*Ds] float32, row-major, owned by tr (NULL if l is out of
 * range); column block j reads tap j.  Writable so that training can update them in place:
 * fetching the pointer marks the maps changed, so the next kvl_translator_apply makes its
 * prepared forms again (the transposed maps the CPU reads, a device's copy); fetch it again
 * for writes after an apply. */
float *kvl_translator_wk(kvl_translator *tr, int l);
float *kvl_translator_wv(kvl_translator *tr, int l);
/* Metadata entries in insertion order (NULL past the end). */
int kvl_translator_metadata_count(const kvl_translator *tr);
const char *kvl_translator_metadata_key(const kvl_translator *tr, int i);
const char *kvl_translator_metadata_value(const kvl_translator *tr, int i);
/* Set or replace a metadata string (copied).  KVL_ERR_NOMEM. */
kvl_status kvl_translator_set_meta(kvl_translator *tr, const char *key, const char *value);

/* An untrained translator for src -> dst: default layer map (or `layer_map` [Lt] when not
 * NULL, each entry in [0, Ls)), zero maps, the target's k_norm weights, and metadata naming
 * both models (name, hash, geometry). */
kvl_status kvl_translator_create(const kvl_model *src, const kvl_model *dst,
                                 const int *layer_map, kvl_translator **out);

/* The same with `taps` source layers per target layer (1 <= taps <= Ls; KVL_ERR_INVALID_ARG
 * otherwise): `layer_map` [Lt][taps] ascending source layers per target layer, or NULL for the
 * taps nearest in relative depth (the window of `taps` layers around round(l (Ls-1)/(Lt-1)),
 * grown toward l (Ls-1)/(Lt-1)).  Each map then has shape [Ht*Dt, taps*Hs*Ds]. */
kvl_status kvl_translator_create_taps(const kvl_model *src, const kvl_model *dst, int taps,
                                      const int *layer_map, kvl_translator **out);

/* Write `tr` as safetensors (atomically: temp file + rename).  dtype KVL_DTYPE_F32 or
 * KVL_DTYPE_BF16 for the maps (k_norm weights always F32).  Metadata (all strings):
 *   format = "kvlingo-translator-1", source_name, source_hash, target_name, target_hash,
 *   source_layers/_kv_heads/_head_dim, target_layers/_kv_heads/_head_dim, target_qk_norm,
 *   target_rms_norm_eps, source_taps, layer_map ("0,1,1,2"; with taps > 1 each entry joins its taps with '+',
 *   "0+1,1+2,2+3"), capture, plus any set by the caller
 *   (training: JSON of the training run; eval / eval_stage1: JSON figures).
 * Tensors: layers.{l}.k.weight, layers.{l}.v.weight [Ht*Dt, Hs*Ds]; layers.{l}.k_norm.weight
 * [Dt] when the target has k_norm.  Errors: KVL_ERR_INVALID_ARG, KVL_ERR_IO, KVL_ERR_NOMEM. */
kvl_status kvl_translator_save(const kvl_translator *tr, const char *path, int dtype);

/* ---- stage 1: ridge regression ------------------------------------------------------------ */

typedef struct kvl_ridge_params {
    int window;          /* tokens per forward window (default 256)                       */
    long train_tokens;   /* tokens for the Gram matrices (default 65536)                  */
    long heldout_tokens; /* held-out tokens for choosing lambda (default 16384)           */
    int verbose;         /* progress lines on stderr                                       */
} kvl_ridge_params;

kvl_ridge_params kvl_ridge_default_params(void);

/* Fit every target layer's W_K and W_V (into tr) by ridge regression from the source's
 * pre-norm keys/values (layer s(l)) to the target's, over windows of `stream` [n] (both models
 * read each window from an empty cache):  W = Y X^T (X X^T + lambda I)^-1 with X X^T and Y X^T
 * accumulated in double over the training windows, solved by LAPACKE_dposv; lambda per layer
 * and side picked from a grid (lambda = alpha tr(X X^T)/Ds, alpha in 1e-8..1) by the squared
 * error on the held-out windows (taken from the end of the stream).  The chosen alphas and the
 * held-out relative errors are written into the metadata key "stage1".  Errors: KVL_ERR_RANGE
 * (stream too short), KVL_ERR_NUMERIC (factorisation failed for every lambda), KVL_ERR_NOMEM. */
kvl_status kvl_translator_fit_ridge(kvl_translator *tr, kvl_model *src, kvl_model *dst,
                                    const int32_t *stream, size_t n, const kvl_ridge_params *p);

/* ---- stage 2: distillation ---------------------------------------------------------------- */

typedef struct kvl_train_params {
    int steps;              /* optimiser steps (default 400)                                */
    int batch;              /* samples per step (default 16)                                 */
    int prefix_min, prefix_max; /* prefix length range, uniform (default 32..256)           */
    int cont_len;           /* continuation tokens (default 64)                              */
    double lr;              /* peak learning rate (default 1e-3)                             */
    double min_lr_frac;     /* cosine decays to lr * min_lr_frac (default 0.1)               */
    int warmup;             /* linear warm-up steps (default steps/20)                       */
    double weight_decay;    /* AdamW decoupled decay (default 0)                             */
    double beta1, beta2, adam_eps; /* default 0.9, 0.999, 1e-8                               */
    double clip;            /* global gradient-norm clip (default 1.0; 0 = off)              */
    uint64_t seed;          /* sampling seed (default 1)                                     */
    int per_window;         /* samples sharing one stream window (default 1): they differ in
                             * prefix length, and one teacher pass and one source pass over the
                             * window serve them all (causal models), which saves most of the
                             * prefix cost; batch must be a multiple                         */
    int threads;            /* worker threads, each with its own model copies (default 1)   */
    const char *checkpoint; /* path written every checkpoint_every steps (NULL: none)      */
    int checkpoint_every;   /* default 50                                                   */
    const char *resume;     /* checkpoint to resume from (NULL: start at step 0)            */
    /* progress callback, called after every step (may be NULL); returning non-zero stops
     * training (KVL_ERR_CANCELLED). */
    int (*progress)(void *user, int step, int steps, double loss, double tokens_per_s,
                    double elapsed_s, size_t mem_bytes);
    void *user;
} kvl_train_params;

kvl_train_params kvl_train_default_params(void);

/* The learning rate stage 2 uses at 0-based `step` under p (linear warm-up over p->warmup
 * steps, p->steps / 20 when negative, then cosine decay to lr * min_lr_frac). */
double kvl_train_lr_at(const kvl_train_params *p, int step);

/* Distil W_K, W_V of `tr` (initialised by the caller, e.g. by kvl_translator_fit_ridge) with
 * the target frozen: each sample draws a prefix length P in [prefix_min, prefix_max] and an
 * offset in `stream` [n] (shared by per_window samples); teacher = target reads stream[o, o+P+C-1) natively, logits on the
 * last C; student = source reads stream[o, o+P-1), its pre-norm K/V are translated into a
 * target cache, the target reads the same last C tokens; loss = mean over the C tokens of
 * KL(teacher || student).  AdamW on the maps, linear warm-up then cosine decay, global-norm
 * clipping.  Deterministic for a given seed and thread count (samples of step s are drawn
 * from a generator seeded by (seed, s), so a resumed run repeats the uninterrupted one); another
 * thread count sums the samples' gradients in another order, so the maps agree to float
 * rounding (about 1e-6 of the weights after a few steps), not bit for bit.
 * `src_dir`, `dst_dir`: model directories, loaded once per extra worker thread.
 * The metadata key "training" receives a JSON summary.  *final_loss (may be NULL): mean loss
 * of the last 10% of steps.  Divergence (a sample's loss, the gradient norm, an updated map or
 * AdamW moment not finite) stops training with KVL_ERR_NUMERIC naming the step: the checkpoint
 * file keeps the last step written before it, and tr's maps are not to be used. */
kvl_status kvl_translator_train(kvl_translator *tr, kvl_model *src, kvl_model *dst,
                                const int32_t *stream, size_t n, const kvl_train_params *p,
                                double *final_loss);

/* ---- evaluation ------------------------------------------------------------------------- */

typedef struct kvl_eval_params {
    int prefix_len;       /* P (default 256)             */
    int cont_len;         /* C (default 64)              */
    int samples;          /* N (default 200); 0 with turns > 0: multi-turn figures only */
    int turns;            /* multi-turn session turns (0 = no multi-turn figures) */
    int turn_len;         /* tokens per turn (default 64) */
    int sessions;         /* multi-turn sessions (default 20) */
    const kvl_translator *reverse;  /* target -> source translator for multi-turn, or NULL */
    /* progress callback (may be NULL): after each sample ("samples") and each multi-turn
     * session ("sessions"), with how many are done of how many */
    void (*progress)(void *user, const char *phase, int done, int total);
    void *user;
} kvl_eval_params;

kvl_eval_params kvl_eval_default_params(void);

#define KVL_EVAL_MAX_LAYERS 256
#define KVL_EVAL_MAX_TURNS 64

typedef struct kvl_eval_result {
    int samples;                /* samples evaluated (fewer than asked when the stream ends) */
    double kl;                  /* mean KL(native || translated) over scored tokens, nats    */
    double ppl_native, ppl_translated, ppl_no_context;
    double top1_agreement;      /* fraction of tokens where the argmaxes agree               */
    double context_gain_recovered;
    int n_layers;
    double k_rel_err[KVL_EVAL_MAX_LAYERS], v_rel_err[KVL_EVAL_MAX_LAYERS];
    /* multi-turn: per turn t, the model holding the turn (0 source, 1 target), perplexity of
     * that turn's tokens on the retained + translated cache and on a re-prefill */
    int turns;
    int turn_model[KVL_EVAL_MAX_TURNS];
    double turn_ppl_translated[KVL_EVAL_MAX_TURNS], turn_ppl_reprefill[KVL_EVAL_MAX_TURNS];
} kvl_eval_result;

/* Evaluate `tr` (src -> dst) under the fixed evaluation protocol: sample i is
 * stream[i(P+C), (i+1)(P+C)); the cache (native, translated, none) covers prefix[0, P-1) at
 * positions 0..P-2; the target reads prefix[P-1] and continuation[0, C-1) at P-1..P+C-2 (from
 * 0 without a cache) and is scored on the C continuation tokens.  KL is KL(native ||
 * translated); context_gain_recovered = (ln ppl_none - ln ppl_tr) / (ln ppl_none - ln ppl_nat).
 * Per-layer relative errors ||K_tr - K_nat|| / ||K_nat|| of the pre-norm keys and values over
 * the prefix tokens.  Multi-turn (p->turns > 0): sessions of `turns` turns of turn_len tokens,
 * session s at stream offset (s turns turn_len) mod (n - turns turn_len) (from the stream's
 * start, so they may cover the samples' tokens), turn 0 on the source, alternating; at a switch to
 * the target the source's new span is translated and appended to the target's retained cache;
 * at a switch back the target's span is translated by p->reverse (or re-prefilled by the
 * source natively when NULL).  Errors: KVL_ERR_RANGE (stream shorter than one sample or one
 * session), KVL_ERR_INVALID_ARG (turn_len < 2 or sessions < 1 with turns > 0). */
kvl_status kvl_translator_evaluate(const kvl_translator *tr, kvl_model *src, kvl_model *dst,
                                   const int32_t *stream, size_t n, const kvl_eval_params *p,
                                   kvl_eval_result *out);

/* JSON object of a result (malloc'ed, caller frees): keys kl, ppl_native, ppl_translated,
 * ppl_no_context, top1_agreement, context_gain_recovered, samples, prefix_len, cont_len,
 * k_rel_err [Lt], v_rel_err [Lt], and turns [{turn, model, ppl_translated, ppl_reprefill}]. */
char *kvl_eval_result_json(const kvl_eval_result *r, const kvl_eval_params *p);

#ifdef __cplusplus
}
#endif
#endif
