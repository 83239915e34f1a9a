/* router/policy_cascade.c: `cascade` — start small, escalate when the small model is unsure.
 *
 * The policy keeps each session on a rung of a model ladder (small -> large).  A session starts
 * on rung 0.  After a turn whose mean next-token entropy (nats, over the generated tokens)
 * exceeds `entropy_threshold`, the next turn goes one rung up; a request with `escalate` set is
 * answered one rung up at once.  After `calm_turns` consecutive turns at or under the threshold
 * on a higher rung, the session steps one rung down.  A request naming a model of the ladder
 * moves the session to that rung.  Within a rung the node holding most of the session answers.
 *
 * Config keys:
 *   name: cascade
 *   models: [qwen3-a, qwen3-b]  # required, 1..8 models, small to large
 *   entropy_threshold: 3.0      # nats, optional
 *   calm_turns: 2               # optional, >= 1
 *   escalate_on_flag: true      # optional: honour SendRequest.escalate
 *   push_ahead: true            # optional (every policy): when a turn moves the session to
 *                               #   another rung, its span is pushed to that rung's node
 *                               #   right after the turn (router/push_ahead.h)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "policy.h"

#define MAX_RUNGS 8

typedef struct cascade {
    char *models[MAX_RUNGS];
    int n;
    double threshold;
    long calm_turns;
    int on_flag;
} cascade;

static void cascade_destroy(void *self) {
    cascade *p = self;
    for (int i = 0; i < p->n; i++) free(p->models[i]);
    free(p);
}

static kvl_status cascade_create(kvl__svc_kvlist *keys, const kvr_config *c, void **self) {
    const char *models = kvl__svc_kv_str(keys, "models", NULL);
    if (!models)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'policy.models' is required for cascade",
                          keys->file, keys->line);
    kvl_status s = kvr_policy_check_models(keys, "models", models, c);
    if (s) return s;
    cascade *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "policy cascade: out of memory");
    p->n = kvr_policy_split(models, p->models, MAX_RUNGS);
    if (p->n < 0) { p->n = 0; cascade_destroy(p); return kvl__errorf(KVL_ERR_NOMEM, "cascade"); }
    if (p->n < 1) {
        cascade_destroy(p);
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'policy.models': at least one model",
                          keys->file, kvl__svc_kv_line(keys, "models"));
    }
    if (!s) s = kvl__svc_kv_double(keys, "entropy_threshold", 3.0, 0, 1e3, &p->threshold);
    if (!s) s = kvl__svc_kv_int(keys, "calm_turns", 2, 1, 1 << 20, &p->calm_turns);
    if (!s) s = kvl__svc_kv_bool(keys, "escalate_on_flag", 1, &p->on_flag);
    if (s) { cascade_destroy(p); return s; }
    *self = p;
    return KVL_OK;
}

static int rung_of(const cascade *p, const char *model) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->models[i], model)) return i;
    return -1;
}

static kvl_status cascade_choose(void *self, const kvr_policy_input *in, kvr_policy_decision *out) {
    cascade *p = self;
    int level = in->state.level;
    if (level < 0) level = 0;
    if (level >= p->n) level = p->n - 1;
    const char *why = "where the session stands";   /* its rung, from the turns before */
    int r = in->requested_model[0] ? rung_of(p, in->requested_model) : -1;
    if (in->requested_model[0] && r < 0)
        return kvl__errorf(KVL_ERR_NOT_FOUND, "model '%s' is not on the cascade ladder",
                          in->requested_model);
    if (r >= 0) {
        if (r != level) out->state.calm = 0;
        level = r;
        why = "requested";
    } else if (in->escalate && p->on_flag && level + 1 < p->n) {
        level++;
        out->state.calm = 0;
        why = "escalate flag";
    }
    out->state.level = level;
    snprintf(out->wanted, sizeof out->wanted, "%s", p->models[level]);
    int idx = kvr_policy_pick_of_model(in, p->models[level]);
    if (idx < 0) return (kvl_status)idx;
    out->node = idx;
    snprintf(out->reason, sizeof out->reason, "cascade: rung %d (%s), %s", level,
             p->models[level], why);
    return KVL_OK;
}

static void cascade_observe(void *self, const kvr_policy_input *in, const kvr_turn_outcome *o,
                            kvr_policy_state *st) {
    cascade *p = self;
    if (!o->entropy_valid) return;
    int rung = rung_of(p, in->nodes[o->node].model);
    if (rung < 0) return;
    st->level = rung;
    if (o->mean_entropy > p->threshold) {
        st->calm = 0;
        if (rung + 1 < p->n) st->level = rung + 1;   /* the next turn goes one rung up */
    } else if (rung > 0) {
        if (++st->calm >= p->calm_turns) { st->level = rung - 1; st->calm = 0; }
    } else {
        st->calm = 0;
    }
}

/* The rung observe() left the session on is the next turn's model (unless the request names
 * another or escalates): a prediction when it is not the model that just answered. */
static int cascade_predict(void *self, const kvr_policy_input *in, const kvr_policy_state *st,
                           char *model, size_t cap) {
    cascade *p = self;
    (void)in;
    if (st->level < 0 || st->level >= p->n) return 0;
    snprintf(model, cap, "%s", p->models[st->level]);
    return 1;
}

const kvr_policy_ops kvr_policy_cascade = {
    .name = "cascade",
    .needs_entropy = 1,
    .create = cascade_create,
    .destroy = cascade_destroy,
    .choose = cascade_choose,
    .observe = cascade_observe,
    .predict = cascade_predict,
};
