/* rpc/rpc.h: a small gRPC layer on the gRPC C core API (libgrpc, completion queues,
 * grpc_call_start_batch), shared by kvld (daemon/) and kvlingo-router (router/).
 *
 * Wire: HTTP/2 gRPC over TLS (gRPC core's SSL credentials; kvl__rpc_tls below: a server may
 * require client certificates signed by its CA, i.e. mutual TLS), or plaintext when the caller
 * asks for it by name (kvl__rpc_tls.insecure), method paths of the
 * form "/kvlingo.v1.Node/Info", payloads are protobuf bytes carried in raw byte buffers; a grpcio
 * or grpc-go client generated from the same .proto files interoperates.  This layer moves BYTES;
 * the *_pb helpers pack/unpack protobuf-c messages for callers that want that.
 *
 * Server model
 *   - kvl__rpc_server_create(); kvl__rpc_server_add_method() for each method path (unary or
 *     server-streaming); kvl__rpc_server_start(); ...; kvl__rpc_server_shutdown(); _free().
 *   - One internal worker thread at a time polls the completion queue.  Every accepted call whose
 *     request message has arrived runs its handler on the worker that received it, which first
 *     passes the poll role to an idle worker (or a new one), so each handler has a thread of its
 *     own (calls are few and long-lived: Generate streams, ExportSpan waits for a peer) and a
 *     handler MAY block (on a condition variable, a peer RPC, a transfer).  At most `max_calls` handlers run at once; a call
 *     beyond that is answered RESOURCE_EXHAUSTED without running a handler.
 *   - A handler answers exactly once: kvl__rpc_call_reply() (unary: message + OK) or
 *     kvl__rpc_call_finish() (any status); streaming handlers kvl__rpc_call_send() messages first.
 *     If the handler returns without answering, the layer answers INTERNAL "handler did not
 *     reply".  The kvl__rpc_call is freed by the layer after the handler returns: never keep it.
 *   - grpc.health.v1.Health/Check is served by every server (service "" and every service name
 *     set with kvl__rpc_server_set_health); Health/Watch answers the current status once and then
 *     keeps the stream open until the client cancels or the server shuts down.  Health keeps
 *     reserved capacity: Health/Check has 16 slots of its own outside max_calls (the probe
 *     answers while every other slot is busy), and at most 32 Watch streams run at once.
 *   - Unknown method -> UNIMPLEMENTED; a call without a request message -> INVALID_ARGUMENT;
 *     more than max_calls handlers busy -> RESOURCE_EXHAUSTED.
 *
 * Client model
 *   - kvl__rpc_client_create(target "host:port") opens a channel (lazy connect, reconnects by
 *     itself).  A client is thread-safe: any number of threads may call through one client.
 *   - kvl__rpc_client_unary(): blocking call with a deadline; the result carries the gRPC status,
 *     its message and the response bytes.
 *   - kvl__rpc_client_stream_open() + kvl__rpc_stream_read() ... + kvl__rpc_stream_finish():
 *     server-streaming with a deadline; kvl__rpc_stream_cancel() from any thread aborts it.
 *
 * Errors: functions returning kvl_status use kvlingo/status.h and record a message readable with
 * kvl_last_error(); the gRPC status of a finished call is reported separately (kvl__rpc_result).
 * Nothing here calls exit() or abort().
 */
#ifndef KVL_RPC_H
#define KVL_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>               /* grpc_status_code: GRPC_STATUS_OK, _NOT_FOUND, ...     */
#include <protobuf-c/protobuf-c.h>

#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status mapping ----------------------------------------------------------------------- */

/* gRPC status for a kvlingo status (INVALID_ARG/FORMAT -> INVALID_ARGUMENT, NOT_FOUND ->
 * NOT_FOUND, RANGE -> OUT_OF_RANGE, MISMATCH -> FAILED_PRECONDITION, UNSUPPORTED ->
 * UNIMPLEMENTED, NOMEM -> RESOURCE_EXHAUSTED, CANCELLED -> CANCELLED, IO -> UNAVAILABLE, else
 * INTERNAL). */
grpc_status_code kvl__rpc_status_from_kvl(kvl_status s);
/* The reverse, for clients that want to propagate a peer's error as a kvl_status. */
kvl_status kvl__rpc_status_to_kvl(grpc_status_code code);
/* Static name, e.g. "NOT_FOUND". */
const char *kvl__rpc_status_name(grpc_status_code code);


/* ---- transport security ------------------------------------------------------------------ */

/* TLS settings of a server or a client.  PEM texts, not paths (service/tls.h reads and checks
 * the files); the layer copies what it needs, so they may be freed after the create call.
 * Either insecure = 1 (plaintext; everything else ignored) or TLS with:
 *   server: cert_pem + key_pem (its identity); ca_pem: the CA client certificates must chain to,
 *           required when require_client_cert; require_client_cert = 1: a client without a
 *           certificate signed by ca_pem fails the handshake (mutual TLS).
 *   client: ca_pem (required): the roots the server certificate must chain to; cert_pem +
 *           key_pem (optional, both or neither): the client certificate for mutual TLS;
 *           target_name: check the server certificate against this name instead of the target
 *           host (NULL: the host of the target). */
typedef struct kvl__rpc_tls {
    int insecure;
    const char *cert_pem;
    const char *key_pem;
    const char *ca_pem;
    int require_client_cert;
    const char *target_name;
} kvl__rpc_tls;

/* ---- server -------------------------------------------------------------------------------- */

typedef struct kvl__rpc_server kvl__rpc_server;
typedef struct kvl__rpc_call kvl__rpc_call;

typedef enum kvl__rpc_kind {
    KVL_RPC_UNARY = 0,          /* one request, one response                                   */
    KVL_RPC_SERVER_STREAM = 1,  /* one request, zero or more responses, then a status          */
} kvl__rpc_kind;

/* A method handler.  `req`/`req_len`: the request message bytes (owned by the call, valid
 * until the handler returns; may be empty).  `user`: the pointer given at registration.
 * Runs on its own thread; must answer via kvl__rpc_call_reply / kvl__rpc_call_finish. */
typedef void (*kvl__rpc_handler)(kvl__rpc_call *call, const uint8_t *req, size_t req_len,
                                void *user);

typedef struct kvl__rpc_server_params {
    const char *listen;         /* "host:port" ("127.0.0.1:0" picks a free port)               */
    int max_calls;              /* handlers running at once; 0 = 256                            */
    int max_message_bytes;      /* largest request/response message; 0 = 64 MiB                */
    /* A message of a server stream (or a final answer) that the client does not take for
     * this long (it stopped reading: HTTP/2 flow control holds the send) cancels the call
     * with DEADLINE_EXCEEDED, so that its handler, and what the handler holds, are freed; so
     * do a call's sends that have waited this long all together (a client reading a message
     * now and then, each within the bound); 0 = 120000 ms. */
    int send_stall_ms;
    const kvl__rpc_tls *tls;    /* required: TLS settings, or {.insecure = 1} for plaintext    */
    /* A health-only server: its grpc.health.v1 answers with the health of `health_of` (which
     * must outlive it), e.g. a plaintext port for orchestrator probes that cannot speak TLS
     * while the real server requires it.  NULL: the server's own health. */
    kvl__rpc_server *health_of;
} kvl__rpc_server_params;

kvl__rpc_server_params kvl__rpc_server_default_params(void);

/* Create a server bound to params->listen (the port is bound here, so a taken port fails
 * early: KVL_ERR_IO naming the address).  params->tls NULL, or TLS without cert/key (or
 * require_client_cert without a CA) -> KVL_ERR_INVALID_ARG.  Free with kvl__rpc_server_free. */
kvl_status kvl__rpc_server_create(const kvl__rpc_server_params *params, kvl__rpc_server **out);

/* Register `path` (e.g. "/kvlingo.v1.Node/Generate", copied).  Only before start.
 * KVL_ERR_INVALID_ARG for a duplicate or malformed path. */
kvl_status kvl__rpc_server_add_method(kvl__rpc_server *srv, const char *path, kvl__rpc_kind kind,
                                     kvl__rpc_handler handler, void *user);

/* The bound port (useful with port 0). */
int kvl__rpc_server_port(const kvl__rpc_server *srv);

/* Health status of `service` ("" = the whole server) for grpc.health.v1; serving = 1 is
 * SERVING, 0 NOT_SERVING.  Thread-safe, any time.  Before any call the server's "" is SERVING
 * once started. */
kvl_status kvl__rpc_server_set_health(kvl__rpc_server *srv, const char *service, int serving);

/* Start the first worker thread (the poller) and accept calls. */
kvl_status kvl__rpc_server_start(kvl__rpc_server *srv);

/* Number of handlers currently running (calls in flight). */
int kvl__rpc_server_active_calls(const kvl__rpc_server *srv);

/* Stop accepting calls (new ones get UNAVAILABLE from gRPC), wait up to `grace_ms` for running
 * handlers to answer, then cancel what is left (their sends fail, kvl__rpc_call_cancelled
 * returns 1) and wait for the handlers to return.  Idempotent. */
void kvl__rpc_server_shutdown(kvl__rpc_server *srv, int64_t grace_ms);

/* Shut down (grace 0) if needed and release everything.  NULL is a no-op. */
void kvl__rpc_server_free(kvl__rpc_server *srv);

/* ---- server call (valid only inside its handler) ------------------------------------------- */

/* Method path of the call, e.g. "/kvlingo.v1.Node/Info". */
const char *kvl__rpc_call_method(const kvl__rpc_call *call);
/* Peer address as gRPC reports it ("ipv4:127.0.0.1:54321"). */
const char *kvl__rpc_call_peer(const kvl__rpc_call *call);
/* First value of request metadata `key` (lower-case, as gRPC carries keys), copied
 * NUL-terminated into buf[0..cap).  Returns its length; 0 when the key is absent (or its value
 * empty); SIZE_MAX, writing nothing, when the value needs more than cap - 1 bytes. */
size_t kvl__rpc_call_metadata(const kvl__rpc_call *call, const char *key, char *buf, size_t cap);
/* The client's identity from its TLS certificate: the subject common name, copied
 * NUL-terminated into buf[0..cap); returns its length, 0 for a plaintext call or a client
 * without a certificate (or one without a CN), SIZE_MAX when it does not fit.  With
 * require_client_cert the handshake already checked the chain; this is for logs and policy. */
size_t kvl__rpc_call_peer_cn(const kvl__rpc_call *call, char *buf, size_t cap);
/* Milliseconds until the client's deadline (INT64_MAX when none; <= 0 when passed). */
int64_t kvl__rpc_call_deadline_left_ms(const kvl__rpc_call *call);
/* 1 when the client cancelled, the deadline passed, the connection dropped, or the server
 * cancelled the call (kvl__rpc_server_shutdown after its grace period); 0 otherwise. */
int kvl__rpc_call_cancelled(const kvl__rpc_call *call);

/* Register a function run once when the call gets cancelled (from the worker polling the
 * server's queue; keep it short and non-blocking, e.g. signal a condition variable).  If the
 * call is already cancelled it runs at once on the calling thread.  One callback per call; NULL
 * clears it.  The layer guarantees no invocation after the handler has returned. */
void kvl__rpc_call_on_cancel(kvl__rpc_call *call, void (*fn)(void *arg), void *arg);

/* Unary: send `msg` (bytes) with status OK.  Streaming: same as send + finish(OK). */
kvl_status kvl__rpc_call_reply(kvl__rpc_call *call, const uint8_t *msg, size_t len);

/* Streaming: send one message and wait until gRPC has taken it (flow control: a slow reader
 * slows the handler).  KVL_ERR_CANCELLED when the call was cancelled, KVL_ERR_INVALID_ARG on a
 * unary call or after finish. */
kvl_status kvl__rpc_call_send(kvl__rpc_call *call, const uint8_t *msg, size_t len);

/* End the call with `code` and a message (printf-style; may be NULL).  Later calls on the
 * same call return KVL_ERR_INVALID_ARG.  Returns KVL_ERR_CANCELLED if the client is gone. */
kvl_status kvl__rpc_call_finish(kvl__rpc_call *call, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Convenience: finish with kvl__rpc_status_from_kvl(s) and the thread's kvl_last_error()
 * (or kvl_strerror(s) when empty). */
kvl_status kvl__rpc_call_finish_kvl(kvl__rpc_call *call, kvl_status s);

/* protobuf-c helpers: pack `msg` and reply / send it. */
kvl_status kvl__rpc_call_reply_pb(kvl__rpc_call *call, const ProtobufCMessage *msg);
kvl_status kvl__rpc_call_send_pb(kvl__rpc_call *call, const ProtobufCMessage *msg);

/* ---- client -------------------------------------------------------------------------------- */

typedef struct kvl__rpc_client kvl__rpc_client;
typedef struct kvl__rpc_stream kvl__rpc_stream;

/* Outcome of a finished client call.  `message` and `data` are malloc'ed (free with
 * kvl__rpc_result_clear).  `data` is the (last) response message, NULL when none. */
typedef struct kvl__rpc_result {
    grpc_status_code code;
    char *message;              /* status details; never NULL after a call (may be "")        */
    uint8_t *data;
    size_t len;
} kvl__rpc_result;

void kvl__rpc_result_clear(kvl__rpc_result *res);

/* Open a channel to "host:port".  `max_message_bytes` 0 = 64 MiB.  `tls` is required: TLS
 * settings (see kvl__rpc_tls; a CA is required), or {.insecure = 1} for plaintext; NULL ->
 * KVL_ERR_INVALID_ARG.  Connects lazily: a wrong address, or a server whose certificate does not
 * verify, shows as UNAVAILABLE on the first call.  Free with kvl__rpc_client_free. */
kvl_status kvl__rpc_client_create(const char *target, int max_message_bytes,
                                 const kvl__rpc_tls *tls, kvl__rpc_client **out);
void kvl__rpc_client_free(kvl__rpc_client *cli);
/* Try to connect again at once: a channel whose server went away waits out a reconnect
 * back-off (up to KVL_RPC_RECONNECT_MAX_MS) and fails every call meanwhile, even after the server
 * is back; a caller that knows it is back (it heard from it) ends the wait.  NULL is a no-op. */
void kvl__rpc_client_reconnect_now(kvl__rpc_client *cli);
const char *kvl__rpc_client_target(const kvl__rpc_client *cli);

/* Metadata sent with every later call and stream of this client (e.g. "authorization").
 * `key`: 1-64 characters of [a-z0-9-_.], not "grpc-..." nor "...-bin"; `value`: up to 4096
 * printable ASCII characters; setting a key again replaces its value, NULL removes it.  At most
 * KVL_RPC_CLIENT_MAX_METADATA keys (KVL_ERR_RANGE beyond).  Thread-safe; calls already started
 * keep what they sent. */
#define KVL_RPC_CLIENT_MAX_METADATA 8
kvl_status kvl__rpc_client_set_metadata(kvl__rpc_client *cli, const char *key, const char *value);

/* "authorization: Bearer KEY" with every later call (an API key of the router's key file);
 * NULL or "" removes it.  Errors as kvl__rpc_client_set_metadata's (a key the value rules
 * refuse: KVL_ERR_INVALID_ARG). */
kvl_status kvl__rpc_client_set_bearer(kvl__rpc_client *cli, const char *api_key);

/* Blocking unary call.  timeout_ms <= 0 means no deadline.  Returns KVL_OK when the call
 * completed (whatever its gRPC status: look at res->code), KVL_ERR_NOMEM / KVL_ERR_INTERNAL when
 * the layer itself failed.  A deadline shows as res->code == GRPC_STATUS_DEADLINE_EXCEEDED. */
kvl_status kvl__rpc_client_unary(kvl__rpc_client *cli, const char *method, const uint8_t *req,
                                size_t req_len, int64_t timeout_ms, kvl__rpc_result *res);

/* Unary with protobuf-c: packs `req`; on GRPC_STATUS_OK unpacks the response with `resp_desc`
 * into *resp_out (free with protobuf_c_message_free_unpacked(*resp_out, NULL)); a response that
 * does not parse turns into res->code = GRPC_STATUS_INTERNAL "malformed response". */
kvl_status kvl__rpc_client_unary_pb(kvl__rpc_client *cli, const char *method,
                                   const ProtobufCMessage *req,
                                   const ProtobufCMessageDescriptor *resp_desc,
                                   int64_t timeout_ms, ProtobufCMessage **resp_out,
                                   kvl__rpc_result *res);

/* The same unary call in two halves, for a caller with other work while it runs (a node waits
 * for a span's bytes while the source's answer is on its way).  start sends the request and
 * returns (KVL_ERR_NOMEM, KVL_ERR_INTERNAL when the layer fails: nothing is left to finish
 * then); the call then progresses without the caller only in a process where some other thread
 * sits in a completion queue (a kvld or router: its server's poller), else in wait / finish.
 * wait: 1 once the call has ended (its result is ready), 0 when wait_ms (< 0: no limit) passed
 * first.  finish waits for the end, fills `res` as kvl__rpc_client_unary does, and frees the
 * call: every started call is finished exactly once, also by finish_pb with NULL arguments
 * (which then returns KVL_ERR_INVALID_ARG).  One call is waited on and finished by one thread
 * at a time.  The _pb forms pack the request / unpack the response as
 * kvl__rpc_client_unary_pb. */
typedef struct kvl__rpc_unary kvl__rpc_unary;
kvl_status kvl__rpc_unary_start(kvl__rpc_client *cli, const char *method, const uint8_t *req,
                               size_t req_len, int64_t timeout_ms, kvl__rpc_unary **out);
kvl_status kvl__rpc_unary_start_pb(kvl__rpc_client *cli, const char *method,
                                  const ProtobufCMessage *req, int64_t timeout_ms,
                                  kvl__rpc_unary **out);
int kvl__rpc_unary_wait(kvl__rpc_unary *u, int64_t wait_ms);
/* Cancel a started call (any thread; its finish then reports CANCELLED unless it had ended). */
void kvl__rpc_unary_cancel(kvl__rpc_unary *u);
kvl_status kvl__rpc_unary_finish(kvl__rpc_unary *u, kvl__rpc_result *res);
kvl_status kvl__rpc_unary_finish_pb(kvl__rpc_unary *u, const ProtobufCMessageDescriptor *resp_desc,
                                   ProtobufCMessage **resp_out, kvl__rpc_result *res);

/* Start a server-streaming call: returns once the request is sent, without waiting for the
 * server's first message (the first read takes its initial metadata), so the caller can cancel
 * a call whose server has sent nothing yet.  Free with kvl__rpc_stream_free. */
kvl_status kvl__rpc_client_stream_open(kvl__rpc_client *cli, const char *method,
                                      const uint8_t *req, size_t req_len, int64_t timeout_ms,
                                      kvl__rpc_stream **out);

/* Read the next message: returns 1 and sets *data (malloc'ed, caller free()s) / *len; 0 at the
 * end of the stream (then call kvl__rpc_stream_finish for the status); negative kvl_status on a
 * layer failure. */
int kvl__rpc_stream_read(kvl__rpc_stream *st, uint8_t **data, size_t *len);

/* Wait for the final status (after read returned 0; or earlier, which drains and discards
 * unread messages).  res->data is NULL. */
kvl_status kvl__rpc_stream_finish(kvl__rpc_stream *st, kvl__rpc_result *res);

/* Cancel the call (thread-safe; a blocked read returns 0 and finish reports CANCELLED). */
void kvl__rpc_stream_cancel(kvl__rpc_stream *st);

/* Cancels if unfinished, then releases.  NULL is a no-op. */
void kvl__rpc_stream_free(kvl__rpc_stream *st);

/* ---- library lifetime ---------------------------------------------------------------------- */

/* grpc_init()/grpc_shutdown() reference counting; create functions call these themselves, so
 * applications need not.  Exposed for programs that use gRPC directly as well. */
void kvl__rpc_init(void);
void kvl__rpc_shutdown(void);

/* gRPC core's own messages (a failed TLS handshake, a bind error), which it writes to stderr
 * as bare lines ("E1207 12:01:56.97 ... ssl_transport_security.cc:1501] Handshake failed"),
 * go to `log` instead: log(level, fmt, ...) with level "error" / "info" / "debug" and a logfmt
 * body `msg=grpc_core where=FILE:LINE detail="..."` (the servers pass kvl__svc_log; in the
 * detail `"` becomes `'` and `\` becomes `/`, so it needs no escapes).  At most one message per
 * source line every 10 s, whatever it says: a client that probes with the wrong certificate
 * would otherwise write a line per probe; the next message of that line says how many were
 * left out (a count nobody follows up is lost).  The first 32 source lines seen are limited so,
 * later ones pass unlimited (gRPC logs from far fewer).  Call once, before any server or
 * client is created (NULL: no change). */
void kvl__rpc_log_to(void (*log)(const char *level, const char *fmt, ...));

#ifdef __cplusplus
}
#endif
#endif
