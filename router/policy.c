/* router/policy.c: policy lookup by name, the wrapper object and helpers shared by policies. */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

struct kvr_policy {
    const kvr_policy_ops *ops;
    void *self;
    int push_ahead;           /* policy.push_ahead */
};

static const kvr_policy_ops *const k_policies[] = {
    &kvr_policy_pinned, &kvr_policy_least_loaded, &kvr_policy_cascade, &kvr_policy_cost,
};
#define N_POLICIES ((int)(sizeof k_policies / sizeof k_policies[0]))

const kvr_policy_ops *kvr_policy_find(const char *name) {
    for (int i = 0; name && i < N_POLICIES; i++)
        if (!strcmp(k_policies[i]->name, name)) return k_policies[i];
    return NULL;
}

const char *kvr_policy_names(void) { return "pinned, least_loaded, cascade, cost"; }

kvl_status kvr_policy_create(kvr_config *c, kvr_policy **out) {
    *out = NULL;
    const kvr_policy_ops *ops = kvr_policy_find(c->policy_name);
    if (!ops)
        return kvl__errorf(KVL_ERR_FORMAT,
                          "%s:%d: key 'policy.name': unknown policy '%s' (known: %s)", c->path,
                          kvl__svc_kv_line(&c->policy, "name"),
                          c->policy_name ? c->policy_name : "", kvr_policy_names());
    /* every key but `name` must be consumed by the policy */
    for (int i = 0; i < c->policy.n; i++) c->policy.items[i].used = !strcmp(c->policy.items[i].key, "name");
    kvr_policy *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "policy: out of memory");
    p->ops = ops;
    kvl_status s = kvl__svc_kv_bool(&c->policy, "push_ahead", 1, &p->push_ahead);
    if (!s) s = ops->create(&c->policy, c, &p->self);
    if (!s) s = kvl__svc_kv_check_unused(&c->policy);
    if (s) { kvr_policy_free(p); return s; }
    *out = p;
    return KVL_OK;
}

kvl_status kvr_policy_check(kvr_config *c) {
    kvr_policy *p = NULL;
    kvl_status s = kvr_policy_create(c, &p);
    kvr_policy_free(p);
    return s;
}

void kvr_policy_free(kvr_policy *p) {
    if (!p) return;
    if (p->self) p->ops->destroy(p->self);
    free(p);
}

const char *kvr_policy_name(const kvr_policy *p) { return p->ops->name; }
int kvr_policy_needs_entropy(const kvr_policy *p) { return p->ops->needs_entropy; }

/* No healthy node of the chosen model: the nearest model that can take the session (see
 * policy.h).  The policy's message (kvl_last_error) goes into the reason. */
static kvl_status failover(const kvr_policy *p, const kvr_policy_input *in, kvr_policy_decision *out) {
    char why[200];
    snprintf(why, sizeof why, "%s", kvl_last_error());
    /* a translation needs the node holding the context to answer the export */
    int src_up = in->current >= 0 && in->nodes[in->current].healthy;
    int best = -1, best_rank = 0;
    for (int i = 0; i < in->n_nodes; i++) {
        const kvr_node_view *v = &in->nodes[i];
        if (!v->healthy || (out->wanted[0] && !strcmp(v->model, out->wanted))) continue;
        /* nearest first: holds the whole context (nothing moves), then reachable by a
         * translator, then the most of the session held (least to re-prefill), then load */
        int rank = in->n_context > 0 && v->held >= in->n_context ? 2 : (src_up && v->can_translate) ? 1 : 0;
        if (best >= 0) {
            const kvr_node_view *b = &in->nodes[best];
            if (rank != best_rank) { if (rank < best_rank) continue; }
            else if (v->held != b->held) { if (v->held < b->held) continue; }
            else if (v->load >= b->load) continue;
        }
        best = i;
        best_rank = rank;
    }
    if (best < 0)
        return kvl__errorf(KVL_ERR_IO, "%s, and no other node is healthy to take over", why);
    const kvr_node_view *v = &in->nodes[best];
    out->node = best;
    out->failover = 1;
    snprintf(out->reason, sizeof out->reason, "failover: %s (policy %s); %s on %s takes the session%s",
             why, p->ops->name, v->model, v->name,
             best_rank == 2 ? " (it holds the context)" : best_rank == 1 ? " by translation"
             : in->n_context > 0 ? " by re-prefill" : "");
    return KVL_OK;
}

kvl_status kvr_policy_choose(kvr_policy *p, const kvr_policy_input *in, kvr_policy_decision *out) {
    memset(out, 0, sizeof *out);
    out->node = -1;
    out->state = in->state;
    if (in->requested_model && in->requested_model[0] &&
        !kvr_policy_model_known(in, in->requested_model))
        return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown model '%s'", in->requested_model);
    kvl_status s = p->ops->choose(p->self, in, out);
    if (s == KVL_ERR_IO) s = failover(p, in, out);
    if (!s && (out->node < 0 || out->node >= in->n_nodes))
        return kvl__errorf(KVL_ERR_INTERNAL, "policy %s chose no node", p->ops->name);
    return s;
}

void kvr_policy_observe(kvr_policy *p, const kvr_policy_input *in, const kvr_turn_outcome *o,
                        kvr_policy_state *st) {
    if (p->ops->observe) p->ops->observe(p->self, in, o, st);
}

int kvr_policy_push_ahead(const kvr_policy *p) { return p->push_ahead; }

int kvr_policy_predict(kvr_policy *p, const kvr_policy_input *in, const kvr_policy_state *st,
                       char *model, size_t cap) {
    if (!p->push_ahead || !p->ops->predict || !cap) return 0;
    model[0] = 0;
    return p->ops->predict(p->self, in, st, model, cap) && model[0];
}

/* ---- helpers ------------------------------------------------------------------------------ */

int kvr_policy_model_known(const kvr_policy_input *in, const char *model) {
    for (int i = 0; i < in->n_nodes; i++)
        if (!strcmp(in->nodes[i].model, model)) return 1;
    return 0;
}

const char *kvr_policy_default_model(const kvr_policy_input *in, const char *dflt) {
    if (in->requested_model && in->requested_model[0]) return in->requested_model;
    if (in->session_model && in->session_model[0]) return in->session_model;
    if (in->current >= 0) return in->nodes[in->current].model;
    if (dflt && dflt[0]) return dflt;
    return in->n_nodes ? in->nodes[0].model : "";
}

int kvr_policy_pick_of_model(const kvr_policy_input *in, const char *model) {
    int best = -1, known = 0;
    for (int i = 0; i < in->n_nodes; i++) {
        const kvr_node_view *v = &in->nodes[i];
        if (strcmp(v->model, model)) continue;
        known = 1;
        if (!v->healthy) continue;
        if (best < 0) { best = i; continue; }
        const kvr_node_view *b = &in->nodes[best];
        if (v->held != b->held) { if (v->held > b->held) best = i; continue; }
        if ((i == in->current) != (best == in->current)) { if (i == in->current) best = i; continue; }
        if (v->load < b->load) best = i;
    }
    if (best >= 0) return best;
    if (!known) return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown model '%s'", model);
    return kvl__errorf(KVL_ERR_IO, "no healthy node serves model '%s'", model);
}

int kvr_policy_split(const char *list, char **out, int max) {
    int n = 0;
    const char *p = list;
    while (p && *p && n < max) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        while (len && (*p == ' ')) { p++; len--; }
        while (len && p[len - 1] == ' ') len--;
        if (len) {
            out[n] = strndup(p, len);
            if (!out[n]) { while (n) free(out[--n]); return -1; }
            n++;
        }
        p = e ? e + 1 : NULL;
    }
    return n;
}

kvl_status kvr_policy_check_models(const kvl__svc_kvlist *keys, const char *key, const char *list,
                                   const kvr_config *c) {
    char *m[16];
    int n = kvr_policy_split(list, m, 16);
    if (n < 0) return kvl__errorf(KVL_ERR_NOMEM, "policy: out of memory");
    kvl_status s = KVL_OK;
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int j = 0; j < c->n_nodes; j++) found |= !strcmp(c->nodes[j].model, m[i]);
        if (!found && !s)
            s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'policy.%s': model '%s' is served by no node",
                           keys->file, kvl__svc_kv_line(keys, key), key, m[i]);
    }
    for (int i = 0; i < n; i++) free(m[i]);
    return s;
}
