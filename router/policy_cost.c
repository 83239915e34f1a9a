/* router/policy_cost.c: `cost` — pick the node with the lowest expected time to first token.
 *
 * Candidates: healthy nodes of the requested model (or of the session's model), else of
 * `models` (default: every model of the fleet).  For each candidate, with `missing` the ledger
 * tokens it lacks:
 *   holds everything:          TTFT = n_user / prefill_tps
 *   translator usable:         TTFT = switch_overhead + missing / translate_tps + n_user / prefill_tps
 *   otherwise (re-prefill):    TTFT = (missing + n_user) / prefill_tps
 * plus `decode_weight` * max_tokens / decode_tps (0 by default: pure TTFT).  Rates are measured
 * by the router per node (EMA of observed turns); the configured values seed them.  Ties go to the
 * node holding the session, then config order.
 *
 * Config keys:
 *   name: cost
 *   models: [qwen3-a, qwen3-b]  # optional candidate models
 *   switch_overhead_ms: 2       # optional, fixed cost of a translated switch
 *   decode_weight: 0            # optional, weight of the expected decode time
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "policy.h"

#define MAX_MODELS 16

typedef struct cost {
    char *models[MAX_MODELS];
    int n;
    double overhead_s;
    double decode_weight;
} cost;

static void cost_destroy(void *self) {
    cost *p = self;
    for (int i = 0; i < p->n; i++) free(p->models[i]);
    free(p);
}

static kvl_status cost_create(kvl__svc_kvlist *keys, const kvr_config *c, void **self) {
    cost *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "policy cost: out of memory");
    const char *models = kvl__svc_kv_str(keys, "models", NULL);
    kvl_status s = KVL_OK;
    if (models) {
        s = kvr_policy_check_models(keys, "models", models, c);
        if (!s) {
            p->n = kvr_policy_split(models, p->models, MAX_MODELS);
            if (p->n < 0) { p->n = 0; s = kvl__errorf(KVL_ERR_NOMEM, "cost"); }
        }
    }
    double ms = 2;
    if (!s) s = kvl__svc_kv_double(keys, "switch_overhead_ms", 2, 0, 1e6, &ms);
    if (!s) s = kvl__svc_kv_double(keys, "decode_weight", 0, 0, 1e6, &p->decode_weight);
    p->overhead_s = ms / 1000.0;
    if (s) { cost_destroy(p); return s; }
    *self = p;
    return KVL_OK;
}

static int candidate(const cost *p, const kvr_policy_input *in, const char *model) {
    const char *want = in->requested_model[0] ? in->requested_model : in->session_model;
    if (want[0]) return !strcmp(model, want);
    if (!p->n) return 1;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->models[i], model)) return 1;
    return 0;
}

static double expected_ttft(const cost *p, const kvr_policy_input *in, int i) {
    const kvr_node_view *v = &in->nodes[i];
    double pf = v->prefill_tps > 0 ? v->prefill_tps : 1000;
    double dc = v->decode_tps > 0 ? v->decode_tps : 100;
    double tr = v->translate_tps > 0 ? v->translate_tps : 1e5;
    int missing = in->n_context - v->held;
    if (missing < 0) missing = 0;
    double t;
    if (missing == 0) t = in->n_user / pf;
    else if (v->can_translate && in->current >= 0) t = p->overhead_s + missing / tr + in->n_user / pf;
    else t = (missing + in->n_user) / pf;
    return t + p->decode_weight * in->max_tokens / dc;
}

static kvl_status cost_choose(void *self, const kvr_policy_input *in, kvr_policy_decision *out) {
    cost *p = self;
    int best = -1, any = 0;
    double best_t = 0;
    for (int i = 0; i < in->n_nodes; i++) {
        if (!candidate(p, in, in->nodes[i].model)) continue;
        any = 1;
        if (!in->nodes[i].healthy) continue;
        double t = expected_ttft(p, in, i);
        if (best < 0 || t < best_t) { best = i; best_t = t; }
    }
    /* 1% hysteresis towards the node holding the session, so it does not hop on noise */
    if (best >= 0 && in->current >= 0 && in->current != best &&
        in->nodes[in->current].healthy && candidate(p, in, in->nodes[in->current].model)) {
        double tc = expected_ttft(p, in, in->current);
        if (tc <= best_t * 1.01) { best = in->current; best_t = tc; }
    }
    if (best < 0) {
        if (!any) return kvl__errorf(KVL_ERR_NOT_FOUND, "cost: no candidate model in the fleet");
        /* the failover looks beyond the candidates: name the one the session is on (or the first) */
        for (int i = 0; i < in->n_nodes && !out->wanted[0]; i++)
            if (candidate(p, in, in->nodes[i].model) && (in->current < 0 || i == in->current))
                snprintf(out->wanted, sizeof out->wanted, "%s", in->nodes[i].model);
        return kvl__errorf(KVL_ERR_IO, "cost: no healthy candidate node");
    }
    out->node = best;
    snprintf(out->reason, sizeof out->reason, "cost: %s on %s, expected TTFT %.2f ms",
             in->nodes[best].model, in->nodes[best].name, best_t * 1e3);
    return KVL_OK;
}

const kvr_policy_ops kvr_policy_cost = {
    .name = "cost",
    .needs_entropy = 0,
    .create = cost_create,
    .destroy = cost_destroy,
    .choose = cost_choose,
    .observe = NULL,
};
