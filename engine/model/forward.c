/* engine/model/forward.c: the forward pass on the CPU (prefill, decode, and batched decode).
 *
 * Follows transformers' Qwen3DecoderLayer / LlamaDecoderLayer (see include/kvlingo/model.h).
 * All tokens of a batch go through the projections and the MLP as one GEMM; attention runs per
 * sequence over that sequence's cache (which already holds the new tokens' K/V when attention
 * runs, so prefill and decode share one code path). */
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "ops.h"
#include "error.h"
#include "model_internal.h"

/* Carve the scratch for T tokens of a batch whose longest sequence reaches ctx tokens. */
static kvl_status scratch_prepare(kvl_model *m, int T, int ctx) {
    kvl__scratch *s = &m->scratch;
    if (s->base && T <= s->cap_tokens && ctx <= s->cap_ctx) return KVL_OK;
    /* grow geometrically so a growing decode context does not reallocate every step */
    int nt = T > s->cap_tokens ? T : s->cap_tokens;
    int nc = ctx > s->cap_ctx ? ctx : s->cap_ctx;
    if (ctx > s->cap_ctx && nc < 2 * s->cap_ctx) nc = 2 * s->cap_ctx;
    if (nc < 64) nc = 64;
    const kvl_model_config *c = &m->cfg;
    size_t H = c->hidden_size, QD = (size_t)c->n_heads * c->head_dim;
    size_t KD = (size_t)c->n_kv_heads * c->head_dim, F = c->intermediate_size;
    size_t sizes[] = {
        nt * H, nt * H, nt * QD, nt * KD, nt * KD, nt * KD, nt * QD, nt * F, nt * F,
        (size_t)nc * KD, (size_t)nc * KD, kvl__cpu_attention_scratch(nt, nc), nt * H,
        (size_t)nt /* pos (ints fit in floats' space) */,
        (size_t)nc * 2 /* kblk: one pointer (<= 2 floats) per block, at most ctx blocks */,
        (size_t)nc * 2 /* vblk */,
        nt * (size_t)c->head_dim / 2, nt * (size_t)c->head_dim / 2,   /* rope cos/sin tables */
    };
    float **dst[] = {&s->x, &s->xn, &s->q, &s->k, &s->kpre, &s->v, &s->att, &s->gate, &s->up,
                     &s->kctx, &s->vctx, &s->scores, &s->logit_x, (float **)&s->pos,
                     (float **)&s->kblk, (float **)&s->vblk, &s->rope_cos, &s->rope_sin};
    size_t n = sizeof sizes / sizeof sizes[0], total = 0;
    for (size_t i = 0; i < n; i++) total += (sizes[i] + 15) & ~(size_t)15;  /* 64-byte steps */
    float *base = aligned_alloc(64, total * sizeof(float));
    if (!base) return kvl__errorf(KVL_ERR_NOMEM, "forward: out of memory for %zu activation floats", total);
    free(s->base);
    s->base = base;
    s->cap_floats = total;
    s->cap_tokens = nt;
    s->cap_ctx = nc;
    float *cur = base;
    for (size_t i = 0; i < n; i++) {
        *dst[i] = cur;
        cur += (sizes[i] + 15) & ~(size_t)15;
    }
    return KVL_OK;
}

static int same_geometry(const kvl_model_config *a, const kvl_model_config *b) {
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->qk_norm == b->qk_norm && a->rope_theta == b->rope_theta;
}

static kvl_status validate(const kvl_model *m, const kvl_batch_seq *seqs, int n_seqs, int *T_out,
                           int *ctx_out) {
    if (!seqs || n_seqs < 1) return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: empty batch");
    int T = 0, ctx = 0;
    for (int i = 0; i < n_seqs; i++) {
        const kvl_batch_seq *q = &seqs[i];
        if (!q->cache || !q->tokens || q->n_tokens < 1)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: sequence %d has no tokens or no cache", i);
        if (q->logits_mode != KVL_LOGITS_NONE && !q->logits)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: sequence %d asks for logits but gives no buffer", i);
        if (!same_geometry(&q->cache->cfg, &m->cfg))
            return kvl__errorf(KVL_ERR_MISMATCH, "forward: sequence %d: cache geometry is not model '%s''s", i, m->name);
        for (int j = 0; j < i; j++)
            if (seqs[j].cache == q->cache)
                return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: sequences %d and %d share one cache", j, i);
        for (int t = 0; t < q->n_tokens; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= m->cfg.vocab_size)
                return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: sequence %d: token %d has id %d outside "
                                  "the vocabulary [0, %d)", i, t, q->tokens[t], m->cfg.vocab_size);
        int end = q->cache->n_tokens + q->n_tokens;
        if (end > q->cache->capacity)
            return kvl__errorf(KVL_ERR_RANGE, "forward: sequence %d: %d tokens exceed the context "
                              "limit of %d", i, end, q->cache->capacity);
        if (end > ctx) ctx = end;
        T += q->n_tokens;
    }
    *T_out = T;
    *ctx_out = ctx;
    return KVL_OK;
}

static void add_inplace(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static kvl_status forward_locked(kvl_model *m, const kvl_batch_seq *seqs, int n_seqs) {
    int T = 0, ctx = 0;
    kvl_status st = validate(m, seqs, n_seqs, &T, &ctx);
    if (st != KVL_OK) return st;
    if ((st = scratch_prepare(m, T, ctx)) != KVL_OK) return st;
    for (int i = 0; i < n_seqs; i++) {
        kvl_cache *c = seqs[i].cache;
        if ((st = kvl__cache_reserve(c, c->n_tokens + seqs[i].n_tokens)) != KVL_OK) return st;
    }
    const kvl_model_config *c = &m->cfg;
    const int H = c->hidden_size, D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads;
    const int QD = Hq * D, KD = Hkv * D, F = c->intermediate_size;
    kvl__scratch *s = &m->scratch;

    /* embeddings and absolute positions */
    for (int i = 0, t = 0; i < n_seqs; i++) {
        for (int j = 0; j < seqs[i].n_tokens; j++, t++) {
            memcpy(s->x + (size_t)t * H, m->embed + (size_t)seqs[i].tokens[j] * H, sizeof(float) * H);
            s->pos[t] = seqs[i].cache->n_tokens + j;
        }
    }

    /* RoPE angles of every new token, once for all layers */
    kvl__cpu_rope_table(s->rope_cos, s->rope_sin, s->pos, T, D, c->rope_theta);

    for (int l = 0; l < c->n_layers; l++) {
        const kvl__layer_weights *w = &m->layers[l];
        kvl__cpu_rmsnorm_forward(s->xn, s->x, w->attn_norm, T, H, c->rms_norm_eps);
        kvl__cpu_matmul_forward(s->q, s->xn, w->wq, w->bq, T, H, QD);
        kvl__cpu_matmul_forward(s->k, s->xn, w->wk, w->bk, T, H, KD);
        kvl__cpu_matmul_forward(s->v, s->xn, w->wv, w->bv, T, H, KD);
        if (c->qk_norm) {
            memcpy(s->kpre, s->k, sizeof(float) * (size_t)T * KD);
            kvl__cpu_rmsnorm_forward(s->q, s->q, w->q_norm, T * Hq, D, c->rms_norm_eps);
            kvl__cpu_rmsnorm_forward(s->k, s->k, w->k_norm, T * Hkv, D, c->rms_norm_eps);
        }
        kvl__cpu_rope_apply(s->q, s->rope_cos, s->rope_sin, T, Hq, D, 0);
        kvl__cpu_rope_apply(s->k, s->rope_cos, s->rope_sin, T, Hkv, D, 0);

        for (int i = 0, t0 = 0; i < n_seqs; t0 += seqs[i].n_tokens, i++) {
            kvl_cache *kc = seqs[i].cache;
            int n = seqs[i].n_tokens, p0 = kc->n_tokens;
            kvl__cache_scatter(kc, l, KVL_PLANE_K, p0, p0 + n, s->k + (size_t)t0 * KD);
            kvl__cache_scatter(kc, l, KVL_PLANE_V, p0, p0 + n, s->v + (size_t)t0 * KD);
            if (c->qk_norm) kvl__cache_scatter(kc, l, KVL_PLANE_KPRE, p0, p0 + n, s->kpre + (size_t)t0 * KD);
            if (n == 1) {
                /* decode: read keys/values in place from the blocks (no gather copy) */
                int nb = (p0 + 1 + kc->block_tokens - 1) / kc->block_tokens;
                for (int b = 0; b < nb; b++) {
                    s->kblk[b] = kvl__cache_slot(kc, l, KVL_PLANE_K, b * kc->block_tokens);
                    s->vblk[b] = kvl__cache_slot(kc, l, KVL_PLANE_V, b * kc->block_tokens);
                }
                kvl__cpu_attention_decode_blocks(s->att + (size_t)t0 * QD, s->q + (size_t)t0 * QD,
                                                (const float *const *)s->kblk, (const float *const *)s->vblk,
                                                kc->block_tokens, p0 + 1, Hq, Hkv, D, s->scores);
                continue;
            }
            kvl__cache_gather(kc, l, KVL_PLANE_K, 0, p0 + n, s->kctx);
            kvl__cache_gather(kc, l, KVL_PLANE_V, 0, p0 + n, s->vctx);
            kvl__cpu_attention_forward(s->att + (size_t)t0 * QD, NULL, s->q + (size_t)t0 * QD, s->kctx,
                                      s->vctx, n, p0 + n, p0, Hq, Hkv, D, s->scores);
        }
        kvl__cpu_matmul_forward(s->xn, s->att, w->wo, w->bo, T, QD, H);
        add_inplace(s->x, s->xn, (size_t)T * H);

        kvl__cpu_rmsnorm_forward(s->xn, s->x, w->mlp_norm, T, H, c->rms_norm_eps);
        kvl__cpu_matmul_forward(s->gate, s->xn, w->w_gate, NULL, T, H, F);
        kvl__cpu_matmul_forward(s->up, s->xn, w->w_up, NULL, T, H, F);
        kvl__cpu_swiglu_forward(s->gate, s->gate, s->up, (size_t)T * F);
        kvl__cpu_matmul_forward(s->xn, s->gate, w->w_down, NULL, T, F, H);
        add_inplace(s->x, s->xn, (size_t)T * H);
    }

    /* final norm + LM head, only for the rows whose logits were asked for */
    for (int i = 0, t0 = 0; i < n_seqs; t0 += seqs[i].n_tokens, i++) {
        const kvl_batch_seq *q = &seqs[i];
        if (q->logits_mode == KVL_LOGITS_NONE) continue;
        int first = q->logits_mode == KVL_LOGITS_ALL ? t0 : t0 + q->n_tokens - 1;
        int rows = q->logits_mode == KVL_LOGITS_ALL ? q->n_tokens : 1;
        kvl__cpu_rmsnorm_forward(s->logit_x, s->x + (size_t)first * H, m->final_norm, rows, H, c->rms_norm_eps);
        kvl__cpu_matmul_forward(q->logits, s->logit_x, m->lm_head, NULL, rows, H, c->vocab_size);
    }

    for (int i = 0; i < n_seqs; i++) {
        kvl_cache *kc = seqs[i].cache;
        memcpy(kc->ids + kc->n_tokens, seqs[i].tokens, sizeof(int32_t) * (size_t)seqs[i].n_tokens);
        kc->n_tokens += seqs[i].n_tokens;
    }
    return KVL_OK;
}

kvl_status kvl_model_forward(kvl_model *m, const kvl_batch_seq *seqs, int n_seqs) {
    if (!m) return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: NULL model");
    pthread_mutex_lock(&m->lock);
    if (m->n_threads > 0) kvl__cpu_set_threads(m->n_threads);
    kvl_status s = forward_locked(m, seqs, n_seqs);
    pthread_mutex_unlock(&m->lock);
    return s;
}

kvl_status kvl_model_prefill(kvl_model *m, kvl_cache *cache, const int32_t *tokens, int n,
                             kvl_logits_mode mode, float *logits) {
    kvl_batch_seq q = {.cache = cache, .tokens = tokens, .n_tokens = n, .logits_mode = mode, .logits = logits};
    return kvl_model_forward(m, &q, 1);
}

kvl_status kvl_model_decode(kvl_model *m, kvl_cache *cache, int32_t token, float *logits) {
    kvl_batch_seq q = {.cache = cache, .tokens = &token, .n_tokens = 1,
                       .logits_mode = logits ? KVL_LOGITS_LAST : KVL_LOGITS_NONE, .logits = logits};
    return kvl_model_forward(m, &q, 1);
}
