/* router/policy.h: the routing-policy interface.  A policy sees the fleet as an array of node
 * views (model, health, load, how much of this session each node holds, whether a translation
 * into it is possible) and picks the node that answers the next turn.  Policies are pure
 * decision code: no RPC, no SQLite, no locks; their per-session state is two integers the
 * ledger persists, so a router restart keeps every session's policy position.
 *
 * Policies (each file documents its config keys):
 *   pinned        router/policy_pinned.c
 *   least_loaded  router/policy_least_loaded.c
 *   cascade       router/policy_cascade.c
 *   cost          router/policy_cost.c
 */
#ifndef KVR_POLICY_H
#define KVR_POLICY_H

#include "config.h"

typedef struct kvr_node_view {
    const char *name;
    const char *model;
    int healthy;
    int load;                 /* turns the router has running on the node now              */
    int held;                 /* ledger tokens [0, held) of this session the node holds     */
    int can_translate;        /* a usable translator from the current node's model into it   */
    double prefill_tps;       /* measured (or configured initial) prefill tokens/s           */
    double decode_tps;
    double translate_tps;     /* span tokens/s of an export+translate into this node          */
} kvr_node_view;

typedef struct kvr_policy_state {
    int level;                /* cascade: rung of the model ladder                           */
    int calm;                 /* cascade: calm turns counted on the current rung             */
} kvr_policy_state;

typedef struct kvr_policy_input {
    const kvr_node_view *nodes;
    int n_nodes;
    int current;              /* node holding the session's latest context, -1 if none      */
    int n_context;            /* ledger tokens before this turn                              */
    int n_user;               /* this turn's input tokens                                    */
    int max_tokens;
    const char *requested_model;  /* "" when the request names none                         */
    const char *session_model;    /* CreateSession's model, "" when none                    */
    int escalate;             /* request flag                                                */
    kvr_policy_state state;
} kvr_policy_input;

typedef struct kvr_policy_decision {
    int node;                 /* index into nodes                                            */
    char reason[320];         /* human-readable, goes to the turn summary and the log        */
    kvr_policy_state state;   /* state to persist with the turn                              */
    /* the model the policy chose; set by a policy before it looks for a node of it, so the
     * failover (kvr_policy_choose) can name it when no healthy node serves it */
    char wanted[KVR_CFG_NAME_MAX];
    int failover;             /* 1: no healthy node served `wanted`; `node` serves another model */
} kvr_policy_decision;

typedef struct kvr_turn_outcome {
    int node;
    double mean_entropy;      /* nats, over the turn's generated tokens                      */
    int entropy_valid;
} kvr_turn_outcome;

typedef struct kvr_policy_ops {
    const char *name;
    int needs_entropy;        /* the router asks nodes for distributions to measure entropy  */
    /* Validate and take the policy's keys (every key must be looked up: leftovers are
     * errors).  `c` gives the fleet (to check model names). */
    kvl_status (*create)(kvl__svc_kvlist *keys, const kvr_config *c, void **self);
    void (*destroy)(void *self);
    /* KVL_ERR_NOT_FOUND for an unknown requested model, KVL_ERR_IO when no healthy node. */
    kvl_status (*choose)(void *self, const kvr_policy_input *in, kvr_policy_decision *out);
    /* Called after a completed turn; updates *st (starting from the decision's state). */
    void (*observe)(void *self, const kvr_policy_input *in, const kvr_turn_outcome *o,
                    kvr_policy_state *st);
    /* Optional (NULL: no opinion): after a completed turn, the model the policy expects to
     * answer the next one, given the state observe() left in *st; writes it into model[cap]
     * and returns 1, or returns 0 when it expects no change of model. */
    int (*predict)(void *self, const kvr_policy_input *in, const kvr_policy_state *st, char *model,
                   size_t cap);
} kvr_policy_ops;

typedef struct kvr_policy kvr_policy;

const kvr_policy_ops *kvr_policy_find(const char *name);
const char *kvr_policy_names(void);   /* "pinned, least_loaded, cascade, cost" */

/* Create the policy named in c->policy_name from c->policy (every key but `name` must be taken
 * by the policy).  Errors: KVL_ERR_FORMAT "FILE:LINE: key 'policy.name': unknown policy 'X'
 * (known: ...)", or a policy key's own "FILE:LINE: key 'policy.KEY': ..." / "unknown key";
 * KVL_ERR_NOMEM.  *out is owned by the caller: free with kvr_policy_free.  c->policy's `used`
 * marks are reset and set again (the only change to c). */
kvl_status kvr_policy_create(kvr_config *c, kvr_policy **out);
/* Validate c's policy section as kvr_policy_create does, keeping nothing: what the router runs
 * right after loading a configuration (start, --check, SIGHUP), before anything else opens. */
kvl_status kvr_policy_check(kvr_config *c);
void kvr_policy_free(kvr_policy *p);
const char *kvr_policy_name(const kvr_policy *p);
int kvr_policy_needs_entropy(const kvr_policy *p);
/* The policy's choice.  Model failover, for every policy: when the policy finds no healthy node
 * of the model it chose (KVL_ERR_IO), the nearest model that can take the session answers
 * instead: a healthy node a translator from the session's current model reaches first, then
 * the node holding most of the session (least to re-prefill), then the least loaded, then
 * config order; out->failover is set and out->reason says what happened.  Fails (KVL_ERR_IO)
 * only when no node at all is healthy. */
kvl_status kvr_policy_choose(kvr_policy *p, const kvr_policy_input *in, kvr_policy_decision *out);
void kvr_policy_observe(kvr_policy *p, const kvr_policy_input *in, const kvr_turn_outcome *o,
                        kvr_policy_state *st);
/* Push-ahead (router/push_ahead.h): `push_ahead: true|false` in the policy block, taken by
 * kvr_policy_create for every policy (default true).  kvr_policy_push_ahead says whether it is
 * on; kvr_policy_predict is the policy's predict op (0 when it has none or push-ahead is off). */
int kvr_policy_push_ahead(const kvr_policy *p);
int kvr_policy_predict(kvr_policy *p, const kvr_policy_input *in, const kvr_policy_state *st,
                       char *model, size_t cap);

/* ---- helpers shared by the policies ------------------------------------------------------- */

/* 1 when some configured node serves `model`. */
int kvr_policy_model_known(const kvr_policy_input *in, const char *model);
/* The model a turn should use when the policy has no opinion: the requested model, else the
 * session's, else the current node's, else `dflt`, else the first node's. */
const char *kvr_policy_default_model(const kvr_policy_input *in, const char *dflt);
/* Among healthy nodes of `model`: the one holding most of the session, then the current node,
 * then the least loaded, then the first in config order (stable: no random hops).
 * Returns the index, or a negative kvl_status with the message set. */
int kvr_policy_pick_of_model(const kvr_policy_input *in, const char *model);
/* Check that every comma-separated model of `list` is served by a node of `c`. */
kvl_status kvr_policy_check_models(const kvl__svc_kvlist *keys, const char *key, const char *list,
                                   const kvr_config *c);
/* Split "a,b,c" into at most `max` malloc'ed strings; returns the count (negative on OOM). */
int kvr_policy_split(const char *list, char **out, int max);

extern const kvr_policy_ops kvr_policy_pinned;
extern const kvr_policy_ops kvr_policy_least_loaded;
extern const kvr_policy_ops kvr_policy_cascade;
extern const kvr_policy_ops kvr_policy_cost;

#endif
