/* router/nodecall.h: typed calls from the router to a node's Node service (protobuf-c over
 * rpc/).  Each returns KVL_OK when the node answered OK; otherwise a kvl_status with a message
 * "node NAME (ADDR): Method: CODE: details" and the gRPC code in *code (when code != NULL), so
 * callers can tell a rejection (FAILED_PRECONDITION, OUT_OF_RANGE, ...) from a transport failure
 * (UNAVAILABLE, DEADLINE_EXCEEDED) when deciding on a retry. */
#ifndef KVR_NODECALL_H
#define KVR_NODECALL_H

#include <stdint.h>

#include "kvlingo/v1/node.pb-c.h"
#include "registry.h"
#include "ticket.h"

typedef struct kvr_node_session {
    int found;                   /* 0: the node does not know the session                     */
    unsigned tokens;             /* node ledger length                                        */
    unsigned cached;             /* positions held in its KV cache                            */
    int idle;                    /* 1 when no operation (import, decode, ...) owns it          */
    unsigned imported;           /* tokens whose K/V came from translated spans               */
    char sha256[65];             /* SHA-256 (hex) of its ledger's ids; "" from an older node  */
} kvr_node_session;

kvl_status kvr_node_info(kvr_node *n, int64_t timeout_ms, Kvlingo__V1__InfoResponse **out,
                         grpc_status_code *code);
kvl_status kvr_node_session_info(kvr_node *n, const char *sid, int64_t timeout_ms,
                                 kvr_node_session *out, grpc_status_code *code);
kvl_status kvr_node_open(kvr_node *n, const char *sid, int64_t timeout_ms, grpc_status_code *code);
/* Append tokens (prefill deferred to Generate). *token_count: node ledger length after. */
kvl_status kvr_node_append(kvr_node *n, const char *sid, const int32_t *ids, int count,
                           int64_t timeout_ms, unsigned *token_count, grpc_status_code *code);
/* Cut the node's ledger to `keep` tokens (only tokens outside its KV cache may go), then
 * append ids[0, count).  *token_count: the ledger length after. */
kvl_status kvr_node_replace_tail(kvr_node *n, const char *sid, unsigned keep, const int32_t *ids,
                                 int count, int64_t timeout_ms, unsigned *token_count,
                                 grpc_status_code *code);
kvl_status kvr_node_drop(kvr_node *n, const char *sid, int64_t timeout_ms, grpc_status_code *code);

typedef struct kvr_export_result {
    unsigned t0, t1, peer_tokens;
    uint64_t payload_bytes;
    double transfer_s, translate_s, total_s;
    double export_s;             /* the source reading its cache and encoding the span          */
    char peer_sha256[65];        /* SHA-256 (hex) of the target's ledger after the import      */
} kvr_export_result;

/* ExportSpan on the source node `src`: ship [from, to) to `dst` (same session id).  With a
 * ticket key (NULL: none), the request carries a fresh ticket for exactly this move (both
 * nodes by their configured addresses, expiring a little after the deadline).  timeout_ms:
 * the node's deadline for the move, which it reports as its own error; grace_ms: how much
 * longer the call waits for that report (its rpc deadline is timeout_ms + grace_ms). */
kvl_status kvr_node_export(kvr_node *src, const kvr_node *dst, const char *sid, unsigned from,
                           unsigned to, int replace, int64_t timeout_ms, int64_t grace_ms,
                           const kvl__ticket_key *key, kvr_export_result *out,
                           grpc_status_code *code);

typedef struct kvr_gen_params {
    unsigned max_tokens;
    float temperature;
    unsigned top_k;
    float top_p;
    uint64_t seed;
    int stop_at_eos;
    const int32_t *stop_ids;      /* further ids that end the turn (finish_reason "stop")      */
    int n_stop;                   /* at most 8 (the node's bound)                              */
    int return_logprobs;
} kvr_gen_params;

/* Open a Generate stream; read with kvr_node_gen_next; free with kvl__rpc_stream_free. */
kvl_status kvr_node_generate(kvr_node *n, const char *sid, const kvr_gen_params *p,
                             int64_t timeout_ms, kvl__rpc_stream **out);
/* What a ContinueTurn asks of the node (see node.proto): the session must hold ledger tokens
 * [0, held) (SHA-256 held_sha256); context = ledger tokens [held, N) (n_context of them), input =
 * the turn's; a pull (source != NULL) ships and translates [the node's cache, what the source
 * caches) from `source` first, on a window ticket for [0, source_tokens) issued here when `key`
 * is non-NULL. */
typedef struct kvr_continue_req {
    const char *sid;
    unsigned held;
    const char *held_sha256;
    const int32_t *context;
    int n_context;
    const int32_t *input;
    int n_input;
    const kvr_node *source;           /* NULL: no pull */
    unsigned source_tokens;
    const char *source_sha256;
    int64_t pull_timeout_ms;
    int native_only;
    int pull_only;                    /* only the span: no context, input or generation */
    const kvl__ticket_key *key;
} kvr_continue_req;

/* Open a ContinueTurn stream on node n (the GenerateResponse messages of kvr_node_gen_next; the
 * final one carries the ContinueResult); free with kvl__rpc_stream_free. */
kvl_status kvr_node_continue(kvr_node *n, const kvr_continue_req *c, const kvr_gen_params *p,
                             int64_t timeout_ms, kvl__rpc_stream **out);

/* 1: *msg set (free with protobuf_c_message_free_unpacked); 0: end of stream (then *code and
 * the thread error say how it ended; KVL_OK status only when code == OK); negative: failure. */
int kvr_node_gen_next(kvr_node *n, kvl__rpc_stream *st, Kvlingo__V1__GenerateResponse **msg,
                      grpc_status_code *code);

#endif
