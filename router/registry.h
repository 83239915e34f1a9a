/* router/registry.h: the fleet as the router sees it.  One entry per configured node: its gRPC
 * client, what its Info said (model hash, geometry, translators), health, the turns the router
 * runs there, and measured rates (EMA) that the cost policy and the deadlines use.
 *
 * Translator pairs are discovered from each node's Info and checked: a translator into node N
 * counts only when its target is N's own model (name and hash) and its source is a model of the
 * fleet with the same hash as a node serving it; anything else is listed with the reason. */
#ifndef KVR_REGISTRY_H
#define KVR_REGISTRY_H

#include <pthread.h>
#include <stdint.h>

#include "config.h"
#include "ledger.h"
#include "policy.h"
#include "rpc.h"

#define KVR_MAX_NODES 32
#define KVR_MAX_TR 16

typedef struct kvr_node {
    /* immutable after create */
    char name[KVR_NAME_MAX];
    char address[128];
    char model[KVR_NAME_MAX];
    kvl__rpc_client *cli;
    /* below: guarded by the registry mutex */
    int healthy;
    int probed;                  /* Info answered at least once                               */
    int down_logged;             /* the current outage has been logged                        */
    char error[256];
    char hash[40];
    unsigned n_layers, n_kv_heads, head_dim, max_context, vocab, sessions;
    int one_call;                /* serves ContinueTurn: a turn is one call on the critical path */
    int pull_only;               /* serves ContinueRequest.pull_only: a push-ahead is one call  */
    char tr_from[KVR_MAX_TR][KVR_NAME_MAX];  /* usable source models                         */
    int n_tr_from;
    struct {                                 /* discovered but unusable, with the reason     */
        char src[KVR_NAME_MAX], why[128];
    } tr_bad[KVR_MAX_TR];
    int n_tr_bad;
    char key_id[17];             /* its ticket key's public name (Info), as last warned about  */
    int key_warned;              /* a key other than the router's has been logged            */
    int active;                  /* turns in flight here                                      */
    /* moving averages (EMA) of the rates measured on real turns; until the first measurement
     * (n_*_samples == 0) they hold the seed the cost policy plans with */
    double prefill_tps, decode_tps, translate_tps;
    unsigned n_prefill_samples, n_decode_samples, n_translate_samples;
} kvr_node;

typedef struct kvr_registry {
    kvr_node nodes[KVR_MAX_NODES];
    int n;
    int64_t node_timeout_ms;
    char ticket_key_id[17];      /* the router's ticket key's public name, "" without tickets  */
    pthread_mutex_t mu;
} kvr_registry;

kvl_status kvr_registry_create(const kvr_config *cfg, const kvl__rpc_tls *tls, kvr_registry **out);
void kvr_registry_free(kvr_registry *r);

/* Ask every node (or only the unhealthy ones) for Info with `timeout_ms`; update health,
 * geometry and translators.  Returns the number of healthy nodes. */
int kvr_registry_refresh(kvr_registry *r, int only_unhealthy, int64_t timeout_ms);

int kvr_registry_find(const kvr_registry *r, const char *name);   /* -1 when unknown */
int kvr_registry_model_known(const kvr_registry *r, const char *model);
/* "qwen3-a, qwen3-b" into buf. */
void kvr_registry_models(const kvr_registry *r, char *buf, size_t cap);

/* Record a failed call (marks the node unhealthy until the next successful probe) or success. */
void kvr_registry_mark(kvr_registry *r, int i, int healthy, const char *err);

/* 1 when node i holds a usable translator from `src_model` (and is healthy). */
int kvr_registry_can_translate(kvr_registry *r, const char *src_model, int i);

/* Geometry of node i for span-size estimates (0s when never probed). */
void kvr_registry_geometry(kvr_registry *r, int i, unsigned *layers, unsigned *kv_heads,
                           unsigned *head_dim, unsigned *vocab);

void kvr_registry_turn_begin(kvr_registry *r, int i);
void kvr_registry_turn_end(kvr_registry *r, int i);

/* Fold a measurement into node i's EMA rates, tokens per second (a rate outside [0.01, 1e9],
 * or not a number, is ignored: 0 stands for "not measured this turn"). */
void kvr_registry_observe(kvr_registry *r, int i, double prefill_tps, double decode_tps,
                          double translate_tps);

/* Fill views[0..n) for a policy, with `held` from the session (may be NULL) and
 * can_translate relative to node `current` (-1: none) and the pair filter `pair_ok(src, dst)`. */
void kvr_registry_views(kvr_registry *r, const kvr_session *s, int current,
                        int (*pair_ok)(void *arg, const char *src, const char *dst), void *arg,
                        kvr_node_view *views);

/* Copy node i under the lock (for ListNodes / metrics). */
void kvr_registry_copy(kvr_registry *r, int i, kvr_node *out);

/* `in` as a client may read it (out: NUL-terminated, at most cap bytes, truncated if need be):
 * each fleet member's address replaced by its name, and any other network address left (an
 * IPv4 address with or without its port, a bracketed IPv6 one: a node's peer, a resolved
 * name in a connect error) by "<address>", and a session key's tenant tag dropped (the client
 * reads its own id, ledger.h kvr_session_key).  Node addresses are the fleet's internals
 * (ListNodes, which shows them, is an admin call), and node errors that name them travel into
 * a turn's error status and fallback reason. */
void kvr_registry_redact(const kvr_registry *r, const char *in, char *out, size_t cap);

#endif
