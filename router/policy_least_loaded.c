/* router/policy_least_loaded.c: `least_loaded` — spread sessions over the nodes of a model.
 *
 * Model: as `pinned` (request, session, current, default_model).  Node: a new session goes to the
 * least loaded healthy node of the model (load = turns the router has running there).  A session
 * with context stays on the node holding it unless that node is busier than the least loaded one
 * by more than `rebalance_margin` turns: moving costs a switch, so small imbalances are not worth
 * it.
 *
 * Config keys:
 *   name: least_loaded
 *   default_model: qwen3-a      # optional
 *   rebalance_margin: 4         # optional, >= 0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "policy.h"

typedef struct least_loaded {
    char *default_model;
    long margin;
} least_loaded;

static kvl_status ll_create(kvl__svc_kvlist *keys, const kvr_config *c, void **self) {
    long margin = 0;
    kvl_status s = kvl__svc_kv_int(keys, "rebalance_margin", 4, 0, 1 << 20, &margin);
    if (s) return s;
    const char *dm = kvl__svc_kv_str(keys, "default_model", "");
    if (dm[0] && (s = kvr_policy_check_models(keys, "default_model", dm, c))) return s;
    least_loaded *p = calloc(1, sizeof *p);
    if (!p || !(p->default_model = strdup(dm))) {
        free(p);
        return kvl__errorf(KVL_ERR_NOMEM, "policy least_loaded: out of memory");
    }
    p->margin = margin;
    *self = p;
    return KVL_OK;
}

static void ll_destroy(void *self) {
    least_loaded *p = self;
    free(p->default_model);
    free(p);
}

static kvl_status ll_choose(void *self, const kvr_policy_input *in, kvr_policy_decision *out) {
    least_loaded *p = self;
    const char *model = kvr_policy_default_model(in, p->default_model);
    snprintf(out->wanted, sizeof out->wanted, "%s", model);
    int best = -1;
    for (int i = 0; i < in->n_nodes; i++) {
        const kvr_node_view *v = &in->nodes[i];
        if (strcmp(v->model, model) || !v->healthy) continue;
        if (best < 0 || v->load < in->nodes[best].load ||
            (v->load == in->nodes[best].load && v->held > in->nodes[best].held))
            best = i;
    }
    if (best < 0) {
        int idx = kvr_policy_pick_of_model(in, model);   /* for its message */
        return idx < 0 ? (kvl_status)idx : kvl__errorf(KVL_ERR_INTERNAL, "least_loaded");
    }
    /* stay on the node holding the context when it is not much busier */
    int holder = -1;
    for (int i = 0; i < in->n_nodes; i++) {
        const kvr_node_view *v = &in->nodes[i];
        if (!strcmp(v->model, model) && v->healthy && v->held > 0 &&
            (holder < 0 || v->held > in->nodes[holder].held))
            holder = i;
    }
    if (holder >= 0 && in->nodes[holder].load <= in->nodes[best].load + p->margin) {
        out->node = holder;
        snprintf(out->reason, sizeof out->reason, "least_loaded: %s stays on %s (load %d)", model,
                 in->nodes[holder].name, in->nodes[holder].load);
    } else {
        out->node = best;
        snprintf(out->reason, sizeof out->reason, "least_loaded: %s on %s (load %d)", model,
                 in->nodes[best].name, in->nodes[best].load);
    }
    return KVL_OK;
}

const kvr_policy_ops kvr_policy_least_loaded = {
    .name = "least_loaded",
    .needs_entropy = 0,
    .create = ll_create,
    .destroy = ll_destroy,
    .choose = ll_choose,
    .observe = NULL,
};
