/* daemon/node.h: the one context object of kvld.  Everything mutable lives here (or in the
 * objects it owns); handlers receive it as their `user` pointer. */
#ifndef KVLD_NODE_H
#define KVLD_NODE_H

#include <pthread.h>

#include "config.h"
#include "kvlingo/model.h"
#include "kvlingo/tokenizer.h"
#include "kvlingo/v1/node.pb-c.h"
#include "metrics.h"
#include "peers.h"
#include "rpc.h"
#include "scheduler.h"
#include "session.h"
#include "tls.h"
#include "ticket.h"
#include "translators.h"
#include "transport.h"
#include "spanbuf.h"
#include "span.h"

#define KVLD_PEER_TRANSPORT_MAX 4096  /* bytes of a peer's transport (UCX worker) address */
#define KVLD_REPLAY_CAP 16384         /* live ticket nonces remembered (tickets live minutes) */
#define KVLD_SPANBUFS 4               /* span payload buffers kept for the next switch ...     */
#define KVLD_SPANBUF_BYTES ((size_t)128 << 20)   /* ... and their bytes at most              */

typedef struct kvld_peer {
    char target[256];
    kvl__rpc_client *cli;
    char model_name[128];             /* from the peer's Info, fetched on first export */
    char model_hash[32];
    uint8_t transport_address[KVLD_PEER_TRANSPORT_MAX];   /* from the same Info */
    size_t transport_len;
    int span_push;                    /* its Info says it honours ExportSpanRequest.push_tag */
    int refs;                         /* callers between kvld_node_peer and kvld_node_peer_release */
    int stale;                        /* Info is asked again on next use (a send to it failed)     */
} kvld_peer;

typedef struct kvld_node {
    kvld_config cfg;
    kvl_model *model;
    kvl_tokenizer *tok;               /* NULL when the model directory has none usable */
    kvld_translators translators;
    kvld_sessions *sessions;
    kvld_sched *sched;
    kvl__transport *transport;         /* NULL with --transport none */
    kvl__spanbufs *spanbufs;          /* payload buffers of spans sent and received */
    kvld_metrics *metrics;
    kvl__rpc_server *rpc;
    kvl__rpc_server *health_rpc;      /* --health-listen: plaintext health mirror, or NULL */
    int max_context;
    volatile int draining;            /* SIGTERM: refuse new work */
    int work_in_flight;               /* Node calls that do work (atomic) */
    pthread_mutex_t peers_mu;
    kvld_peer *peers;                 /* [KVLD_MAX_PEERS], allocated at the first peer and never
                                       * moved (callers keep pointers to its names); a full
                                       * table refuses new ones */
    int n_peers;
    char fleet[KVLD_MAX_PEERS][KVLD_PEER_ADDR_MAX];   /* --peers: where spans may go (peers_mu;
                                                         * replaced by a SIGHUP reload) */
    int n_fleet;
    int tickets;                      /* 1: spans move only on a router-issued ticket */
    kvl__ticket_key ticket_key;
    char ticket_key_id[17];           /* its public name (Info), "" without tickets            */
    kvl__ticket_replay replay;        /* nonces of tickets this node accepted */
    char self[KVLD_PEER_ADDR_MAX];    /* this node's fleet address (tickets' source/target) */
    pthread_t peers_thread;           /* connects --peers at start and reload (peers.c) */
    int argc;                         /* the command line, which a SIGHUP reads again */
    char **argv;
    int peers_started;
    volatile int peers_stop;
    pthread_cond_t peers_cv;          /* wakes the connecting thread's back-off (peers_mu)   */
    clockid_t peers_cv_clock;         /* the clock peers_cv's timed waits are measured on     */
    int peers_kick;                   /* a fleet member may have come up: retry now (peers_mu) */
    int peers_pending;                /* members the thread still tries (atomic)              */
    double warmup_ms;                 /* the warm-up run before serving (warmup.c), 0 if off */
    kvl__svc_tls tls;                 /* the TLS files (empty with insecure)                */
    kvl__rpc_tls server_tls;          /* the Node API: mutual TLS with the fleet CA         */
    kvl__rpc_tls client_tls;          /* channels to peers: the node's cert as client cert  */
} kvld_node;

/* Create everything but the servers: model, tokenizer, translators, sessions, scheduler,
 * transport, metrics (objects only). */
kvl_status kvld_node_create(const kvld_config *cfg, kvld_node **out);
/* Register the Node service on a server and start it (and the metrics endpoint). */
kvl_status kvld_node_serve(kvld_node *node);
void kvld_node_free(kvld_node *node);

/* A peer's model identity, copied out of the table (a background refresh may rewrite it). */
typedef struct kvld_peer_model {
    char name[128];
    char hash[32];
} kvld_peer_model;

/* A cached client for a peer node "host:port", with the peer's model identity (Info is asked
 * on first use, and again after kvld_node_peer_forget).  On success the entry is the caller's
 * until kvld_node_peer_release(node, target): the client stays valid until then.  The table
 * holds KVLD_MAX_PEERS entries; a new address takes the place of one that is no longer a fleet
 * member and in nobody's use, else KVL_ERR_RANGE ("peer table full"). */
kvl_status kvld_node_peer(kvld_node *node, const char *target, int64_t timeout_ms,
                          kvl__rpc_client **out, kvld_peer_model *model);
void kvld_node_peer_release(kvld_node *node, const char *target);
/* Ask `target`'s Info again on its next use: a send to its transport address failed (it may
 * have restarted with a new one, or with another model). */
void kvld_node_peer_forget(kvld_node *node, const char *target);
/* Fetch `target`'s Info now (the background refresh of fleet members); KVL_OK when it
 * answered. */
kvl_status kvld_node_peer_refresh(kvld_node *node, const char *target, int64_t timeout_ms);

/* The transport address of peer `target` from its Info (kvld_node_peer fetched it) into
 * addr[cap], and whether the peer takes pushed spans (ExportSpanRequest.push_tag).
 * KVL_ERR_NOT_FOUND when the table has no such peer or it named no transport address. */
kvl_status kvld_node_peer_transport(kvld_node *node, const char *target, uint8_t *addr, size_t cap,
                                    size_t *len, int *span_push);

/* May spans go to `target`?  A member of --peers always; without --peers any address, but
 * only while tickets are off (a node with a ticket key ships only inside its fleet). */
int kvld_node_peer_allowed(kvld_node *node, const char *target);

/* Check a span move's ticket (the node's key, expiry, replay) and that it names `e`'s fields.
 * Returns GRPC_STATUS_OK, or PERMISSION_DENIED with msg saying what failed (and the refusal
 * counted).  Tickets off: OK without looking. */
grpc_status_code kvld_node_check_ticket(kvld_node *node, const uint8_t *ticket, size_t len,
                                        const kvl__ticket_expect *e, char *msg, size_t cap);

/* Before serving: one prefill + decode on a scratch cache and each translator on a zero span,
 * so that the first real request (and the first switch) finds code, weights, thread pools and
 * cache blocks warm.  Sets node->warmup_ms. */
kvl_status kvld_warmup(kvld_node *node);

/* Node service handlers (service.c, span_service.c). */
void kvld_rpc_info(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvld_rpc_open_session(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvld_rpc_append(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvld_rpc_generate(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvld_rpc_drop_session(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvld_rpc_session_info(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvld_rpc_export_span(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvld_rpc_import_span(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvld_rpc_continue(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);

/* Per-request bookkeeping shared by the handlers: log line + request metrics. */
/* ---- received spans (span_service.c): the checks and the landing of ImportSpan and of a
 * pull in push mode (continue.c) ---- */

/* Why a received span was refused: the reject reason (metrics label), the status, a message. */
typedef struct kvld_span_err {
    kvl__span_reject why;
    grpc_status_code code;
    char msg[1024];
} kvld_span_err;

/* The header's structure (kvl__span_header_check with max_payload, 0 = no limit), this node's
 * model as target, a translator from its source (*te), the source geometry the translator
 * expects.  1 when accepted; 0 with *e filled. */
int kvld_span_check_header(kvld_node *n, const Kvlingo__V1__SpanHeader *h, uint64_t max_payload,
                           const kvld_translator_entry **te, kvld_span_err *e);
/* The span's range against session s (held by the caller): no gap after its cached tokens, an
 * overlap only with replace, within its max context.  1 when accepted; 0 with *e filled. */
int kvld_span_check_range(const kvld_session *s, const Kvlingo__V1__SpanHeader *h, int replace,
                          kvld_span_err *e);
/* Check a received payload[got] against h (length, xxh3-64, ids, finite values), translate it
 * into s (a clean replace of [t0, ...) when t0 < its cached tokens) and set its ledger ids
 * [t0, t1).  Atomic: on a refusal s is as it was.  *translate_s: seconds translating.
 * 1 when landed; 0 with *e filled. */
int kvld_span_land(kvld_node *n, kvld_session *s, const kvld_translator_entry *te,
                   const Kvlingo__V1__SpanHeader *h, const uint8_t *payload, size_t got,
                   double *translate_s, kvld_span_err *e);
/* kvld_span_land in two steps, for a span translated before its header is confirmed (a pull
 * whose bytes and trailer land before the source's answer): land_pending checks and translates
 * a span that extends s's cache (t0 == its cached tokens, else refused) without touching the
 * ledger, and points *ids at the payload's ids (valid while the payload is); then either
 * kvld_span_commit sets the ledger ids [t0, t1) (as kvld_span_land does), or kvld_span_unland
 * takes the translated tokens back out of the cache (s is then as before; an error, from the
 * cache's truncation, means it is not, and the caller drops the session). */
int kvld_span_land_pending(kvld_node *n, kvld_session *s, const kvld_translator_entry *te,
                           const Kvlingo__V1__SpanHeader *h, const uint8_t *payload, size_t got,
                           double *translate_s, const int32_t **ids, kvld_span_err *e);
void kvld_span_commit(kvld_node *n, kvld_session *s, const Kvlingo__V1__SpanHeader *h,
                      const int32_t *ids);
kvl_status kvld_span_unland(kvld_session *s, const Kvlingo__V1__SpanHeader *h);

/* The end of a receive, landed or not: free the posted receive `rv` and the payload buffer,
 * release s (NULL: none) and, with drop, remove it (a session the import created and could not
 * fill leaves no trace). */
void kvld_span_import_end(kvld_node *n, kvl__transport_recv *rv, uint8_t *payload, kvld_session *s,
                          int drop);

typedef struct kvld_req {
    kvld_node *node;
    kvl__rpc_call *call;
    const char *method;
    char session[KVLD_ID_MAX];
    double t0;
    int counted_work;
} kvld_req;

void kvld_req_begin(kvld_req *r, kvld_node *node, kvl__rpc_call *call, const char *method);
/* Refuse new work while draining (returns 1 after answering UNAVAILABLE). */
int kvld_req_refuse_if_draining(kvld_req *r);
/* Finish the call with a kvl status (OK: the caller already replied) and log the line;
 * `extra` is appended to the log line (may be NULL). */
void kvld_req_end(kvld_req *r, grpc_status_code code, const char *msg, const char *extra);
void kvld_req_fail(kvld_req *r, kvl_status st, const char *extra);

/* A GenerateRequest's sampling settings, checked against the node (stop ids in the
 * vocabulary, at most KVLD_MAX_STOP_IDS; max_tokens clipped to the max context).
 * KVL_ERR_INVALID_ARG naming the field. */
kvl_status kvld_gen_params_from_pb(const kvld_node *n, const Kvlingo__V1__GenerateRequest *in,
                                   kvld_gen_params *gp);

/* Run a turn on session `s` (acquired by the caller; released here) and stream it on r->call:
 * one message per token, a final message with the timings (and `result`, when non-NULL, its
 * after-turn figures filled in here), then the status and the request's log line. */
void kvld_stream_turn(kvld_req *r, kvld_session *s, const kvld_gen_params *gp,
                      Kvlingo__V1__ContinueResult *result);

#endif
