/* engine/model/forward.c: the backend-neutral half of the forward pass (kvlingo/model.h):
 * validate the batch, hand it to the model's backend (kvlingo/backend.h), commit the new tokens.
 * The math lives in each backend (the CPU's in kernels/cpu/decoder.h). */
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "error.h"
#include "model_internal.h"

static int same_geometry(const kvl_model_config *a, const kvl_model_config *b) {
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->qk_norm == b->qk_norm && a->rope_theta == b->rope_theta &&
           !memcmp(&a->rope, &b->rope, sizeof a->rope);
}

static kvl_status validate(const kvl_model *m, const kvl_batch_seq *seqs, int n_seqs) {
    if (!seqs || n_seqs < 1) return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: empty batch");
    for (int i = 0; i < n_seqs; i++) {
        const kvl_batch_seq *q = &seqs[i];
        if (!q->cache || !q->tokens || q->n_tokens < 1)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: sequence %d has no tokens or no cache", i);
        if (q->logits_mode != KVL_LOGITS_NONE && !q->logits)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: sequence %d asks for logits but gives no buffer", i);
        if (!same_geometry(&q->cache->cfg, &m->cfg))
            return kvl__errorf(KVL_ERR_MISMATCH, "forward: sequence %d: cache geometry is not model '%s''s", i, m->name);
        if (q->cache->ops != m->ops)
            return kvl__errorf(KVL_ERR_MISMATCH, "forward: sequence %d: the cache lives on backend '%s', "
                               "model '%s' on '%s'", i, q->cache->ops->name, m->name, m->ops->name);
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
    }
    return KVL_OK;
}

kvl_status kvl_model_forward(kvl_model *m, const kvl_batch_seq *seqs, int n_seqs) {
    if (!m) return kvl__errorf(KVL_ERR_INVALID_ARG, "forward: NULL model");
    kvl_status s = validate(m, seqs, n_seqs);
    if (s != KVL_OK) return s;
    kvl_backend_seq small[32], *bs = n_seqs <= 32 ? small : malloc(sizeof *bs * (size_t)n_seqs);
    if (!bs) return kvl__errorf(KVL_ERR_NOMEM, "forward: out of memory for a batch of %d", n_seqs);
    for (int i = 0; i < n_seqs; i++)
        bs[i] = (kvl_backend_seq){.cache = seqs[i].cache->be, .n_past = seqs[i].cache->n_tokens,
                                  .tokens = seqs[i].tokens, .n_tokens = seqs[i].n_tokens,
                                  .logits_mode = seqs[i].logits_mode, .logits = seqs[i].logits};
    pthread_mutex_lock(&m->lock);
    s = m->ops->forward(m->be, bs, n_seqs);
    pthread_mutex_unlock(&m->lock);
    if (bs != small) free(bs);
    if (s != KVL_OK) return s;
    for (int i = 0; i < n_seqs; i++) kvl__cache_commit(seqs[i].cache, seqs[i].n_tokens, seqs[i].tokens);
    return KVL_OK;
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
