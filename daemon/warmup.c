/* daemon/warmup.c: one forward pass and each translator, before the node serves.
 *
 * A node's first forward pays for page faults on the weights, the BLAS thread pool's start and
 * the first cache blocks; its first import pays the same for the translator's maps.  Paid at
 * start, that cost leaves the first request's TTFT and the fleet's first (cold) switch. */
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "log.h"
#include "node.h"

#define WARM_TOKENS 64

kvl_status kvld_warmup(kvld_node *n) {
    n->warmup_ms = 0;
    if (!n->cfg.warmup) return KVL_OK;
    double t0 = kvl__now_s();
    const kvl_model_config *mc = kvl_model_config_get(n->model);
    kvl_cache_params cp = {.max_tokens = WARM_TOKENS + 1, .block_tokens = 16};
    kvl_cache *c = NULL;
    float *logits = malloc(sizeof(float) * (size_t)mc->vocab_size);
    int32_t ids[WARM_TOKENS];
    for (int i = 0; i < WARM_TOKENS; i++) ids[i] = (int32_t)((i * 131 + 7) % mc->vocab_size);
    kvl_status st = logits ? kvl_model_cache_create(n->model, &cp, &c)
                           : kvl__errorf(KVL_ERR_NOMEM, "warm-up: logits");
    if (st == KVL_OK) st = kvl_model_prefill(n->model, c, ids, WARM_TOKENS, KVL_LOGITS_LAST, logits);
    if (st == KVL_OK) st = kvl_model_decode(n->model, c, ids[0], logits);
    /* each translator on a span of zeros (a valid input: the maps are linear) */
    for (int i = 0; st == KVL_OK && i < n->translators.n; i++) {
        const kvld_translator_entry *e = &n->translators.items[i];
        size_t per = (size_t)e->src_layers * WARM_TOKENS * e->src_kv_heads * e->src_head_dim;
        float *kv = calloc(per * 2, sizeof(float));
        if (!kv) {
            st = kvl__errorf(KVL_ERR_NOMEM, "warm-up: span of %s", e->path);
            break;
        }
        if ((st = kvl_cache_truncate(c, 0)) == KVL_OK)
            st = kvl_translator_apply(e->tr, kv, kv + per, 0, WARM_TOKENS, NULL, c);
        free(kv);
        if (st != KVL_OK) kvl__error_prefix(st, e->path);
    }
    kvl_cache_free(c);
    free(logits);
    if (st != KVL_OK) return kvl__error_prefix(st, "warm-up");
    n->warmup_ms = (kvl__now_s() - t0) * 1e3;
    return KVL_OK;
}
