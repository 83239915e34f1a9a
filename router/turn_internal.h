/* router/turn_internal.h: what the turn's files share (turn.c: the turn end to end;
 * turn_call.c: the calls that answer it, Generate or ContinueTurn).  Private to router/. */
#ifndef KVR_TURN_INTERNAL_H
#define KVR_TURN_INTERNAL_H

#include "router.h"
#include "nodecall.h"

typedef struct turn {
    kvr_router *r;
    const kvr_turn_req *req;
    kvr_turn_out *out;
    kvr_session s;
    int N;                        /* ledger tokens before the turn                            */
    int cur;                      /* node holding the latest context (-1 none)                */
    char fb_code[48];             /* short fallback reason (metric label)                     */
    int64_t node_ms;
    int hash_bad;                 /* a node held the right count of tokens but other ids       */
    int client_cancelled;         /* the client went (emit said so): not a node's CANCELLED    */
} turn;

/* What a ContinueTurn's final message said (the node's ContinueResult, copied). */
typedef struct one_result {
    int got;                      /* the final message carried a ContinueResult */
    int mode;                     /* KVLINGO__V1__CONTINUE_RESULT__MODE__* */
    char fallback[400];           /* the node's, whole: the summary's copy is cut (kvr__reason_copy) */
    unsigned span_t0, span_t1, prefill_tokens, token_count;
    char sha256[65];
    double pull_s, transfer_s, translate_s, export_s, forward_s;
} one_result;

/* The fallback reason of the turn: `code` (the metric's label) and a detail (printf). */
void kvr__turn_fallback(turn *t, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* src into dst[cap]; one too long is cut after its last whole word that fits, with "...". */
void kvr__reason_copy(char *dst, size_t cap, const char *src);
/* Node ti's session table is full: drop its least recently used idle session (1 when done). */
int kvr__turn_make_room(turn *t, int ti);
/* How many places one turn may free on a full node before it gives up. */
#define KVR_MAKE_ROOM_TRIES 3
/* A refusal because the node's session table is full. */
int kvr__turn_table_full(grpc_status_code code, const char *msg);

/* Stream the turn from node ti: a Generate opened here (after prepare and Append), or the
 * ContinueTurn stream `opened` (its result kept in *nr).  Fills t->out, gen[] (the generated
 * ids), and with want_lp the first token's log-distribution (*first_lp, *vocab).  *started = 1
 * once a token reached the client; *code the call's gRPC status. */
kvl_status kvr__turn_decode(turn *t, int ti, int want_lp, kvr_emit_fn emit, void *arg, double t_start,
                            int32_t *gen, float **first_lp, int *vocab, int *started,
                            grpc_status_code *code, kvl__rpc_stream *opened, one_result *nr);

/* The turn as one ContinueTurn call on node ti (see turn_call.c); KVL_ERR_UNSUPPORTED when the
 * node refused its session state before any token (the caller takes the several-call path).
 * *shadow: the guardrail wants this switch shadowed. */
kvl_status kvr__turn_one_call(turn *t, int ti, int needs_entropy, kvr_emit_fn emit, void *arg,
                              double t_start, int32_t *gen, float **first_lp, int *vocab,
                              int *started, grpc_status_code *code, one_result *nr, int *shadow);

#endif
