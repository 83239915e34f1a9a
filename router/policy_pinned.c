/* router/policy_pinned.c: `pinned` — the client names the model.
 *
 * Model of a turn: SendRequest.model, else CreateSession's model, else the model the session is
 * on, else `default_model`.  Node: among healthy nodes of that model, the one holding most of the
 * session (then the current one, then the least loaded), so a session never hops between equal
 * nodes.
 *
 * Config keys (policy section):
 *   name: pinned
 *   default_model: qwen3-a      # optional; default: the first node's model
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "policy.h"

typedef struct pinned {
    char *default_model;
} pinned;

static kvl_status pinned_create(kvl__svc_kvlist *keys, const kvr_config *c, void **self) {
    const char *dm = kvl__svc_kv_str(keys, "default_model", "");
    if (dm[0]) {
        kvl_status s = kvr_policy_check_models(keys, "default_model", dm, c);
        if (s) return s;
    }
    pinned *p = calloc(1, sizeof *p);
    if (!p || !(p->default_model = strdup(dm))) {
        free(p);
        return kvl__errorf(KVL_ERR_NOMEM, "policy pinned: out of memory");
    }
    *self = p;
    return KVL_OK;
}

static void pinned_destroy(void *self) {
    pinned *p = self;
    free(p->default_model);
    free(p);
}

static kvl_status pinned_choose(void *self, const kvr_policy_input *in, kvr_policy_decision *out) {
    pinned *p = self;
    const char *model = kvr_policy_default_model(in, p->default_model);
    snprintf(out->wanted, sizeof out->wanted, "%s", model);
    int idx = kvr_policy_pick_of_model(in, model);
    if (idx < 0) return (kvl_status)idx;
    out->node = idx;
    snprintf(out->reason, sizeof out->reason, "pinned: model %s (%s)", model,
             in->requested_model[0] ? "requested" : in->session_model[0] ? "session" : "default");
    return KVL_OK;
}

const kvr_policy_ops kvr_policy_pinned = {
    .name = "pinned",
    .needs_entropy = 0,
    .create = pinned_create,
    .destroy = pinned_destroy,
    .choose = pinned_choose,
    .observe = NULL,
};
