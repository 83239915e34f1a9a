/* router/router.h: the one context object of kvlingo-router.  Everything mutable lives here or in
 * the objects it owns; gRPC handlers get it as their `user` pointer.
 *
 * Files, one concern each:
 *   config.c     fleet.yaml (libyaml)            ledger.c     session ledger interface
 *   ledger_sqlite.c, ledger_pg.c  its backends    lease.c      leases held, keeper thread
 *   turn_once.c  lease + idempotency around a turn
 *   registry.c   nodes, health, translators       nodecall.c   typed Node-service calls
 *   policy*.c    routing policies                 turn.c       one turn: choose, switch, decode
 *   guard.c      quality guardrail (shadow KL)    metrics.c    /metrics (libmicrohttpd)
 *   service.c    Router gRPC handlers             main.c       process: args, libuv, signals
 *   tenants.c    key file, key lookup, buckets    auth.c       who calls: keys, refusals, quotas
 *   push_ahead.c ship a session's span to the node likely next, after a turn, off the critical path
 */
#ifndef KVR_ROUTER_H
#define KVR_ROUTER_H

#include <pthread.h>
#include <stdint.h>

#include <stdio.h>

#include "config.h"
#include "guard.h"
#include "kvlingo/tokenizer.h"
#include "kvlingo/v1/router.pb-c.h"
#include "lease.h"
#include "ledger.h"
#include "metrics.h"
#include "policy.h"
#include "registry.h"
#include "rpc.h"
#include "tls.h"
#include "tenants.h"
#include "ticket.h"

typedef struct kvr_router {
    kvr_config *cfg;              /* the loaded config; SIGHUP swaps policy + guardrail only   */
    pthread_rwlock_t policy_lock;
    kvr_policy *policy;
    kvr_ledger *ledger;
    kvr_leases *leases;           /* leases of the sessions this replica drives now             */
    kvr_registry *reg;
    kvr_guard *guard;
    kvr_metrics *metrics;
    kvl_tokenizer *tok;
    kvr_tenants *tenants;         /* API keys -> tenants, quotas (SIGHUP swaps the table in)    */
    unsigned long long keys_sig[4];   /* the key file as last loaded: dev, inode, size, mtime   */
    double keys_checked;          /* when the key file was last looked at                      */
    kvl__rpc_server *server;
    kvl__rpc_server *health_server;  /* health_listen: plaintext health mirror, or NULL      */
    struct kvr_prefix *prefix;    /* token prefixes -> sessions, for stateless HTTP clients     */
    struct kvr_oai_http *http;    /* the OpenAI-compatible HTTP server (NULL: off)             */
    /* sessions with a turn running (a second Send on one is refused) */
    pthread_mutex_t busy_mu;
    char (*busy)[KVR_ID_MAX];
    int n_busy, max_busy;
    int expiry_held;            /* the idle expiry holds its own place in busy[] (past max_busy) */
    int turns_in_flight;
    kvl__svc_tls tls;             /* the TLS files (empty with insecure)                        */
    kvl__rpc_tls server_tls;      /* the Router API: server TLS, client certificates optional   */
    kvl__rpc_tls client_tls;      /* channels to nodes: mutual TLS with the router's cert       */
    struct kvr_push_ahead *push;  /* background span pushes (push_ahead.h); NULL: off           */
    int tickets;                  /* 1: every span move carries a ticket under ticket_key      */
    kvl__ticket_key ticket_key;
} kvr_router;

/* Build the context from a loaded config (takes ownership of cfg): ledger, tokenizer, registry
 * (first probe of every node: a node that does not answer is logged and marked down, the router
 * still starts), policy, guardrail, metrics objects.  No servers started. */
kvl_status kvr_router_create(kvr_config *cfg, kvr_router **out);
/* --check: every check kvr_router_create and start run short of binding ports and loading
 * model weights (the tokenizer loads; the ledger's location must be writable; the policy is
 * built), then the settings with resolved paths on `out`.  Errors name file:line and key. */
kvl_status kvr_router_check(const kvr_config *cfg, FILE *out);
/* The router's TLS files (tls_cert, tls_key, tls_ca), read and checked: all three set ->
 * loaded; insecure and none set -> empty; neither -> KVL_ERR_INVALID_ARG with
 * KVL_SVC_TLS_REQUIRED_MSG; insecure with TLS keys, or only some of them -> an error naming
 * them.  Free with kvl__svc_tls_free. */
kvl_status kvr_router_tls(const kvr_config *cfg, kvl__svc_tls *out);
/* Register the Router service and start gRPC (+ metrics HTTP when configured). */
kvl_status kvr_router_serve(kvr_router *r);
void kvr_router_free(kvr_router *r);

/* SIGHUP: re-read the config file; swap the policy and guardrail settings.  Sessions, nodes and
 * the ledger are untouched.  On error the old policy stays and the error is returned. */
kvl_status kvr_router_reload(kvr_router *r);

/* Register every discovered translator pair with the guardrail (after a registry refresh). */
void kvr_router_sync_pairs(kvr_router *r);

/* TTL sweep: expire idle sessions (nodes told to drop them), purge old ended rows. */
void kvr_router_expire(kvr_router *r);

/* Seconds since the Unix epoch. */
double kvr_wall_now(void);

/* ---- one turn (turn.c) --------------------------------------------------------------------- */

/* How a caller ends its turn from another thread when its client goes away (the gRPC call's
 * cancel callback): kvr_turn_cancel_fire marks it and cancels the node call the turn waits on,
 * so a turn whose node is still prefilling (no token yet, nothing to emit into) ends at once
 * instead of at its deadline.  Initialise with kvr_turn_cancel_init; the turn registers the
 * node stream it reads (under mu) and takes it back before freeing it. */
typedef struct kvr_turn_cancel {
    pthread_mutex_t mu;
    int fired;
    struct kvl__rpc_stream *st;   /* the node stream the turn reads now, or NULL */
} kvr_turn_cancel;
void kvr_turn_cancel_init(kvr_turn_cancel *c);
void kvr_turn_cancel_destroy(kvr_turn_cancel *c);
void kvr_turn_cancel_fire(kvr_turn_cancel *c);   /* any thread; idempotent */

typedef struct kvr_turn_req {
    const char *sid;
    const int32_t *user;          /* this turn's input ids                                     */
    int n_user;
    unsigned max_tokens;
    float temperature;
    unsigned top_k;
    float top_p;
    uint64_t seed;
    int stop_at_eos;
    const int32_t *stop_ids;      /* further ids that end the turn, e.g. <|im_end|> (<= 8)     */
    int n_stop;
    int has_end_token;            /* a turn ending at EOS records end_token (a chat template's */
    int32_t end_token;            /* end-of-turn) in its place, on the node too                */
    const char *model;            /* "" none                                                   */
    int escalate, force_reprefill, compare_reprefill;
    const char *request_id;       /* idempotency key: "" or NULL none                          */
    const kvr_fence *fence;       /* set by kvr_turn_run for kvr_turn_run_once's commit        */
    const char *tenant;           /* the caller's tenant: its tokens_per_minute bucket is
                                     checked before the turn and charged with its tokens; NULL
                                     none (in-process callers)                                 */
    const char *prefetch_model;   /* push-ahead hint: the model likely next; "" or NULL none    */
    kvr_turn_cancel *cancel;      /* the caller's cancel (NULL: none but emit's answer)         */
} kvr_turn_req;

typedef struct kvr_turn_out {
    char model[KVR_NAME_MAX], node[KVR_NAME_MAX];
    char from_model[KVR_NAME_MAX], from_node[KVR_NAME_MAX];
    int mode;                     /* KVLINGO__V1__SWITCH_MODE__* */
    unsigned span_tokens, n_generated, turn, context_tokens, user_tokens;
    unsigned prefill_tokens;      /* tokens the answering node prefilled (the rest came from its
                                     cache or a translated span)                                */
    double ttft_s, tps, switch_s, reprefill_ttft_s;
    char fallback[160];
    char finish_reason[32];
    float mean_entropy, shadow_kl;
    char policy_reason[320];
    char failover_from[KVR_NAME_MAX];   /* the model chosen but served by no healthy node, or "" */
    /* where the time to first token went (seconds; 0 when the phase did not happen): the
     * ledger read, the span's move (export on the source, the wire, translate-apply on the
     * target), and the target's forward up to the first token (node clock) */
    double ledger_s, export_s, transfer_s, translate_s, forward_s;
    int one_call;                 /* the turn was one ContinueTurn call on the node */
    unsigned pushed_ahead_tokens; /* span tokens a background push shipped to this node before */
} kvr_turn_out;

/* Called for every generated token; return non-zero to stop: KVR_EMIT_STOP ends the turn as
 * finished with this token its last (a stop sequence matched: finish_reason "stop"), any other
 * value cancels it (the client is gone: the output is discarded). */
#define KVR_EMIT_STOP 2
typedef int (*kvr_emit_fn)(void *arg, int32_t token, const char *text, float logprob);

/* Run one turn (turn_once.c): take the session's lease (waiting up to lease_wait_ms for
 * another replica's), answer a request id already applied with its stored result, else run
 * kvr_turn_run_once under the lease.  Errors carry the thread message; the gRPC code to answer
 * with is kvl__rpc_status_from_kvl(status), ABORTED for a "busy" KVL_ERR_MISMATCH. */
kvl_status kvr_turn_run(kvr_router *r, const kvr_turn_req *req, kvr_emit_fn emit, void *arg,
                        kvr_turn_out *out);
/* Take session `sid`'s lease for this replica as a turn does (turn_once.c): waiting up to
 * lease_wait_ms while another replica or a push-ahead holds it, then KVL_ERR_MISMATCH "is busy"
 * (ABORTED); an ended session is KVL_ERR_MISMATCH naming its state.  Release with
 * kvr_ledger_lease_release under kvr_leases_owner(r->leases). */
kvl_status kvr_turn_lease_take(kvr_router *r, const char *sid, kvr_lease *lease);
/* The turn itself (turn.c), its commit fenced by req->fence. */
kvl_status kvr_turn_run_once(kvr_router *r, const kvr_turn_req *req, kvr_emit_fn emit, void *arg,
                             kvr_turn_out *out);

/* The key (kvr_session_key) of the session a client of `tenant` names `id`, when it exists and
 * is that tenant's: KVL_OK and key (KVR_ID_MAX bytes) set; an id that is not valid is refused
 * naming the rule; one that does not exist, or is another tenant's, is KVL_ERR_NOT_FOUND with
 * the same message ("unknown session 'id'"), key then holding where a new session of that name
 * goes.  A session of the tenant made before keys were per tenant is found under its bare id. */
kvl_status kvr_session_resolve(kvr_router *r, const char *id, const char *tenant, char key[KVR_ID_MAX]);

/* Sessions with a turn running: take fails (KVL_ERR_MISMATCH "is busy") when `id` has one
 * (KVL_ERR_NOMEM when max_busy_sessions are running); release after the turn. */
kvl_status kvr_router_busy_take(kvr_router *r, const char *id);
kvl_status kvr_router_busy_take_expiry(kvr_router *r, const char *id);
void kvr_router_busy_release_expiry(kvr_router *r, const char *id);
void kvr_router_busy_release(kvr_router *r, const char *id);
int kvr_router_is_busy(kvr_router *r, const char *id);

/* ---- callers and quotas (auth.c) ------------------------------------------------------------ */

enum { KVR_AUTH_OK = 0, KVR_AUTH_MISSING = 1, KVR_AUTH_UNKNOWN = 2, KVR_AUTH_FORBIDDEN = 3 };

/* The tenant table of `cfg`: its api_keys file, or the anonymous table without one.  Errors
 * name the fleet file's line and the key file's file:line:field. */
kvl_status kvr_auth_load(const kvr_config *cfg, kvr_tenants **out);
/* A start without api_keys needs insecure: else KVL_ERR_INVALID_ARG saying so. */
kvl_status kvr_auth_check_start(const kvr_config *cfg);
/* SIGHUP: re-read the key file (no-op without one); on error the old table stays. */
kvl_status kvr_auth_reload(kvr_router *r);
/* Probe timer: every api_keys_reload_seconds, reload the key file when it changed (a failed
 * load is logged once per change; the old table stays). */
void kvr_auth_poll(kvr_router *r, double now);
/* Remember the key file's current identity (after a load). */
void kvr_auth_mark(kvr_router *r);
/* The series of the refusal reasons and of every tenant's quotas, at zero. */
void kvr_auth_declare(kvr_router *r);
/* The caller of an `authorization` value (NULL: none): KVR_AUTH_OK with *out filled, or the
 * refusal (counted; *reason "missing", "unknown" or "forbidden").  need_admin: the tenant must
 * have admin: true. */
int kvr_auth_value(kvr_router *r, const char *value, int need_admin, kvr_tenant_info *out,
                   const char **reason);
/* The same from a gRPC call's metadata; a refusal finishes the call (UNAUTHENTICATED, or
 * PERMISSION_DENIED) and returns -1; 0 when the caller may go on. */
int kvr_auth_call(kvr_router *r, kvl__rpc_call *call, const char *method, int need_admin,
                  kvr_tenant_info *out);
void kvr_auth_refused(kvr_router *r, const char *reason);
/* Count a quota refusal ("max_sessions" or "tokens_per_minute") of `tenant`. */
void kvr_quota_refused(kvr_router *r, const char *tenant, const char *quota);

/* Gauges callback for metrics (sessions open, pairs disabled, nodes healthy, ...). */
void kvr_router_gauges(void *arg, kvl__svc_text *b);

#endif
