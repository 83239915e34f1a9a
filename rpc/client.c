/* rpc/client.c: blocking unary and server-streaming client calls.  Every call has its own
 * pluck completion queue, so any number of threads can call through one channel without a
 * shared poller. */
#include "rpc_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include "error.h"

struct kvl__rpc_client {
    grpc_channel *channel;
    char *target;
    pthread_mutex_t md_mu;         /* guards the metadata below                             */
    int n_md;
    char *md_key[KVL_RPC_CLIENT_MAX_METADATA];
    char *md_val[KVL_RPC_CLIENT_MAX_METADATA];
};

/* One call's copy of the client's metadata: slices that live until its batch completes. */
typedef struct call_md {
    grpc_metadata md[KVL_RPC_CLIENT_MAX_METADATA];
    size_t n;
} call_md;

struct kvl__rpc_stream {
    grpc_call *call;
    grpc_completion_queue *cq;
    grpc_metadata_array initial_md;
    grpc_metadata_array trailing_md;
    grpc_status_code code;
    grpc_slice details;
    int status_pending;            /* RECV_STATUS_ON_CLIENT batch outstanding               */
    int status_done;
    int ended;                     /* read saw the end of the stream                         */
    int md_received;               /* the first read took the initial metadata with it       */
    char tag_start, tag_read, tag_status;
};

static grpc_channel_credentials *channel_credentials(const kvl__rpc_tls *t) {
    if (t->insecure) return grpc_insecure_credentials_create();
    grpc_ssl_pem_key_cert_pair pair = {.private_key = t->key_pem, .cert_chain = t->cert_pem};
    int with_cert = t->cert_pem && t->cert_pem[0];
    return grpc_ssl_credentials_create(t->ca_pem, with_cert ? &pair : NULL, NULL, NULL);
}

kvl_status kvl__rpc_client_create(const char *target, int max_message_bytes,
                                 const kvl__rpc_tls *tls, kvl__rpc_client **out) {
    if (!target || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: client target required");
    *out = NULL;
    if (!tls)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: client of %s: no TLS settings (TLS, or "
                          "insecure by name)", target);
    if (!tls->insecure) {
        /* without our own roots gRPC would fall back to the system's: a fleet trusts its CA */
        if (!tls->ca_pem || !tls->ca_pem[0])
            return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: client of %s: TLS needs the CA that signed "
                              "the server's certificate", target);
        int c = tls->cert_pem && tls->cert_pem[0], k = tls->key_pem && tls->key_pem[0];
        if (c != k)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: client of %s: a client certificate needs "
                              "its key (and a key its certificate)", target);
    }
    kvl__rpc_client *cli = calloc(1, sizeof *cli);
    if (!cli) return kvl__errorf(KVL_ERR_NOMEM, "rpc: client");
    cli->target = strdup(target);
    if (!cli->target) {
        free(cli);
        return kvl__errorf(KVL_ERR_NOMEM, "rpc: client");
    }
    pthread_mutex_init(&cli->md_mu, NULL);
    kvl__rpc_init();
    grpc_arg args[6];
    grpc_channel_args cargs;
    kvl__rpc_message_limits(max_message_bytes, args, &cargs);
    /* A peer that went away is tried again within KVL_RPC_RECONNECT_MAX_MS, not gRPC's default
     * of up to 120 s: fleet members and routers restart in seconds, and until the channel
     * reconnects every call to the member fails at once (UNAVAILABLE) although it serves */
    const char *bk[3] = {GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
                         GRPC_ARG_MAX_RECONNECT_BACKOFF_MS};
    /* (the "min" is gRPC's least time one connection attempt gets: a handshake over a slow
     * link still has a second, while a refused connect is tried again 100 ms later) */
    const int bv[3] = {KVL_RPC_RECONNECT_MIN_MS, 1000, KVL_RPC_RECONNECT_MAX_MS};
    for (int i = 0; i < 3; i++) {
        args[cargs.num_args].type = GRPC_ARG_INTEGER;
        args[cargs.num_args].key = (char *)bk[i];
        args[cargs.num_args].value.integer = bv[i];
        cargs.num_args++;
    }
    if (!tls->insecure && tls->target_name && tls->target_name[0]) {
        args[cargs.num_args].type = GRPC_ARG_STRING;
        args[cargs.num_args].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[cargs.num_args].value.string = (char *)tls->target_name;
        cargs.num_args++;
    }
    grpc_channel_credentials *creds = channel_credentials(tls);
    cli->channel = creds ? grpc_channel_create(target, creds, &cargs) : NULL;
    if (creds) grpc_channel_credentials_release(creds);
    if (!cli->channel) {
        kvl__rpc_client_free(cli);
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: cannot create a channel to '%s'", target);
    }
    *out = cli;
    return KVL_OK;
}

void kvl__rpc_client_reconnect_now(kvl__rpc_client *cli) {
    if (cli && cli->channel) grpc_channel_reset_connect_backoff(cli->channel);
}

void kvl__rpc_client_free(kvl__rpc_client *cli) {
    if (!cli) return;
    if (cli->channel) grpc_channel_destroy(cli->channel);
    free(cli->target);
    for (int i = 0; i < cli->n_md; i++) {
        free(cli->md_key[i]);
        free(cli->md_val[i]);
    }
    pthread_mutex_destroy(&cli->md_mu);
    free(cli);
    kvl__rpc_shutdown();
}

const char *kvl__rpc_client_target(const kvl__rpc_client *cli) { return cli ? cli->target : ""; }

/* gRPC refuses (and a server would misread) keys outside [a-z0-9-_.], its reserved grpc-
 * prefix, and binary -bin keys carrying text; checked here so the caller learns which one. */
static int md_key_ok(const char *k) {
    size_t n = strlen(k);
    if (n == 0 || n > 64 || !strncmp(k, "grpc-", 5) || (n >= 4 && !strcmp(k + n - 4, "-bin")))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((k[i] >= 'a' && k[i] <= 'z') || (k[i] >= '0' && k[i] <= '9') || k[i] == '-' ||
              k[i] == '_' || k[i] == '.'))
            return 0;
    return 1;
}

static int md_value_ok(const char *v) {
    size_t n = strlen(v);
    if (n > 4096) return 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] < 0x20 || v[i] > 0x7e) return 0;
    return 1;
}

kvl_status kvl__rpc_client_set_metadata(kvl__rpc_client *cli, const char *key, const char *value) {
    if (!cli || !key) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: set_metadata: NULL");
    if (!md_key_ok(key))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: metadata key '%.80s': expected 1-64 characters "
                          "of [a-z0-9-_.], not grpc-* nor *-bin", key);
    if (value && !md_value_ok(value))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: metadata '%s': the value must be at most 4096 "
                          "printable ASCII characters", key);
    char *v = value ? strdup(value) : NULL;
    if (value && !v) return kvl__errorf(KVL_ERR_NOMEM, "rpc: metadata");
    kvl_status st = KVL_OK;
    pthread_mutex_lock(&cli->md_mu);
    int i = 0;
    while (i < cli->n_md && strcmp(cli->md_key[i], key)) i++;
    if (i < cli->n_md) {                     /* replace or remove */
        free(cli->md_val[i]);
        if (v) {
            cli->md_val[i] = v;
        } else {
            free(cli->md_key[i]);
            cli->n_md--;
            cli->md_key[i] = cli->md_key[cli->n_md];
            cli->md_val[i] = cli->md_val[cli->n_md];
        }
    } else if (v) {
        char *k = strdup(key);
        if (!k) {
            st = kvl__errorf(KVL_ERR_NOMEM, "rpc: metadata");
        } else if (cli->n_md >= KVL_RPC_CLIENT_MAX_METADATA) {
            free(k);
            st = kvl__errorf(KVL_ERR_RANGE, "rpc: metadata '%s': a client sends at most %d keys",
                             key, KVL_RPC_CLIENT_MAX_METADATA);
        } else {
            cli->md_key[cli->n_md] = k;
            cli->md_val[cli->n_md++] = v;
            v = NULL;
        }
        free(v);
    }
    pthread_mutex_unlock(&cli->md_mu);
    return st;
}

kvl_status kvl__rpc_client_set_bearer(kvl__rpc_client *cli, const char *api_key) {
    if (!api_key || !api_key[0]) return kvl__rpc_client_set_metadata(cli, "authorization", NULL);
    size_t kl = strlen(api_key);
    char *bearer = malloc(kl + 8);
    if (!bearer) return kvl__errorf(KVL_ERR_NOMEM, "rpc: authorization metadata");
    memcpy(bearer, "Bearer ", 7);
    memcpy(bearer + 7, api_key, kl + 1);
    kvl_status s = kvl__rpc_client_set_metadata(cli, "authorization", bearer);
    free(bearer);
    return s;
}

static void call_md_fill(kvl__rpc_client *cli, call_md *cm) {
    memset(cm, 0, sizeof *cm);
    pthread_mutex_lock(&cli->md_mu);
    for (int i = 0; i < cli->n_md; i++) {
        cm->md[cm->n].key = grpc_slice_from_copied_string(cli->md_key[i]);
        cm->md[cm->n++].value = grpc_slice_from_copied_string(cli->md_val[i]);
    }
    pthread_mutex_unlock(&cli->md_mu);
}

static void call_md_clear(call_md *cm) {
    for (size_t i = 0; i < cm->n; i++) {
        grpc_slice_unref(cm->md[i].key);
        grpc_slice_unref(cm->md[i].value);
    }
    cm->n = 0;
}

static grpc_call *make_call(kvl__rpc_client *cli, grpc_completion_queue *cq, const char *method,
                            int64_t timeout_ms) {
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(cli->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m,
                                               NULL, kvl__rpc_deadline(timeout_ms), NULL);
    grpc_slice_unref(m);
    return call;
}

static void cq_destroy(grpc_completion_queue *cq) {
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_completion_queue_destroy(cq);
}

/* A unary call in flight: what its one batch writes into lives here until it ends. */
struct kvl__rpc_unary {
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_byte_buffer *send_bb, *recv_bb;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code code;
    grpc_slice details;
    call_md cm;
    char tag;
    int ended;                     /* the batch's completion was taken off the queue         */
    kvl_status st;                 /* a layer failure while it ran                           */
};

static void unary_release(kvl__rpc_unary *u) {
    call_md_clear(&u->cm);
    if (u->recv_bb) grpc_byte_buffer_destroy(u->recv_bb);
    if (u->send_bb) grpc_byte_buffer_destroy(u->send_bb);
    grpc_slice_unref(u->details);
    grpc_metadata_array_destroy(&u->init_md);
    grpc_metadata_array_destroy(&u->trail_md);
    if (u->call) grpc_call_unref(u->call);
    cq_destroy(u->cq);
    free(u);
}

kvl_status kvl__rpc_unary_start(kvl__rpc_client *cli, const char *method, const uint8_t *req,
                               size_t req_len, int64_t timeout_ms, kvl__rpc_unary **out) {
    if (!cli || !method || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: unary: NULL");
    *out = NULL;
    kvl__rpc_unary *u = calloc(1, sizeof *u);
    if (!u) return kvl__errorf(KVL_ERR_NOMEM, "rpc: unary");
    u->details = grpc_empty_slice();
    u->code = GRPC_STATUS_UNKNOWN;
    grpc_metadata_array_init(&u->init_md);
    grpc_metadata_array_init(&u->trail_md);
    u->cq = grpc_completion_queue_create_for_pluck(NULL);
    if (!u->cq) {
        free(u);
        return kvl__errorf(KVL_ERR_NOMEM, "rpc: completion queue");
    }
    u->call = make_call(cli, u->cq, method, timeout_ms);
    u->send_bb = kvl__rpc_bb_from(req, req_len);
    if (!u->call || !u->send_bb) {
        unary_release(u);
        return kvl__errorf(KVL_ERR_NOMEM, "rpc: cannot create call %s", method);
    }
    call_md_fill(cli, &u->cm);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = u->cm.n;
    ops[0].data.send_initial_metadata.metadata = u->cm.md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = u->send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &u->recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &u->trail_md;
    ops[5].data.recv_status_on_client.status = &u->code;
    ops[5].data.recv_status_on_client.status_details = &u->details;
    if (grpc_call_start_batch(u->call, ops, 6, &u->tag, NULL) != GRPC_CALL_OK) {
        unary_release(u);
        return kvl__errorf(KVL_ERR_INTERNAL, "rpc: %s: cannot start the call", method);
    }
    *out = u;
    return KVL_OK;
}

void kvl__rpc_unary_cancel(kvl__rpc_unary *u) {
    if (u && u->call) grpc_call_cancel(u->call, NULL);
}

int kvl__rpc_unary_wait(kvl__rpc_unary *u, int64_t wait_ms) {
    if (!u) return 1;
    if (u->ended) return 1;
    gpr_timespec until = wait_ms < 0 ? gpr_inf_future(GPR_CLOCK_REALTIME)
                                     : gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                    gpr_time_from_millis(wait_ms, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_pluck(u->cq, &u->tag, until, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) return 0;
    u->ended = 1;
    if (ev.type != GRPC_OP_COMPLETE) u->st = kvl__errorf(KVL_ERR_INTERNAL, "rpc: completion queue failed");
    return 1;
}

kvl_status kvl__rpc_unary_finish(kvl__rpc_unary *u, kvl__rpc_result *res) {
    if (!u || !res) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: unary finish: NULL");
    memset(res, 0, sizeof *res);
    kvl__rpc_unary_wait(u, -1);
    kvl_status st = u->st;
    if (st == KVL_OK) {
        res->code = u->code;
        res->message = kvl__rpc_slice_strdup(u->details);
        if (!res->message) st = kvl__errorf(KVL_ERR_NOMEM, "rpc: status message");
        if (st == KVL_OK && u->recv_bb) st = kvl__rpc_bb_read(u->recv_bb, &res->data, &res->len);
    }
    unary_release(u);
    if (st != KVL_OK) kvl__rpc_result_clear(res);
    return st;
}

kvl_status kvl__rpc_unary_finish_pb(kvl__rpc_unary *u, const ProtobufCMessageDescriptor *resp_desc,
                                   ProtobufCMessage **resp_out, kvl__rpc_result *res) {
    if (!resp_desc || !resp_out) {
        kvl__rpc_result tmp;
        kvl__rpc_unary_finish(u, &tmp);
        kvl__rpc_result_clear(&tmp);
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: unary finish_pb: NULL");
    }
    *resp_out = NULL;
    kvl_status st = kvl__rpc_unary_finish(u, res);
    if (st != KVL_OK || res->code != GRPC_STATUS_OK) return st;
    *resp_out = protobuf_c_message_unpack(resp_desc, NULL, res->len, res->data);
    if (!*resp_out) {
        free(res->message);
        res->message = strdup("malformed response");
        res->code = GRPC_STATUS_INTERNAL;
    }
    return KVL_OK;
}

kvl_status kvl__rpc_client_unary(kvl__rpc_client *cli, const char *method, const uint8_t *req,
                                size_t req_len, int64_t timeout_ms, kvl__rpc_result *res) {
    if (!cli || !method || !res) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: unary: NULL");
    memset(res, 0, sizeof *res);
    kvl__rpc_unary *u = NULL;
    kvl_status st = kvl__rpc_unary_start(cli, method, req, req_len, timeout_ms, &u);
    if (st != KVL_OK) return st;
    return kvl__rpc_unary_finish(u, res);
}

kvl_status kvl__rpc_unary_start_pb(kvl__rpc_client *cli, const char *method,
                                  const ProtobufCMessage *req, int64_t timeout_ms,
                                  kvl__rpc_unary **out) {
    if (!req || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: unary_start_pb: NULL");
    *out = NULL;
    uint8_t *buf;
    size_t len;
    kvl_status st = kvl__rpc_pack(req, &buf, &len);
    if (st != KVL_OK) return st;
    st = kvl__rpc_unary_start(cli, method, buf, len, timeout_ms, out);
    free(buf);   /* the call holds its own copy */
    return st;
}

kvl_status kvl__rpc_client_unary_pb(kvl__rpc_client *cli, const char *method,
                                   const ProtobufCMessage *req,
                                   const ProtobufCMessageDescriptor *resp_desc,
                                   int64_t timeout_ms, ProtobufCMessage **resp_out,
                                   kvl__rpc_result *res) {
    if (!req || !resp_desc || !resp_out || !res)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: unary_pb: NULL");
    *resp_out = NULL;
    memset(res, 0, sizeof *res);
    kvl__rpc_unary *u = NULL;
    kvl_status st = kvl__rpc_unary_start_pb(cli, method, req, timeout_ms, &u);
    if (st != KVL_OK) return st;
    return kvl__rpc_unary_finish_pb(u, resp_desc, resp_out, res);
}

kvl_status kvl__rpc_client_stream_open(kvl__rpc_client *cli, const char *method,
                                      const uint8_t *req, size_t req_len, int64_t timeout_ms,
                                      kvl__rpc_stream **out) {
    if (!cli || !method || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: stream: NULL");
    *out = NULL;
    kvl__rpc_stream *st = calloc(1, sizeof *st);
    if (!st) return kvl__errorf(KVL_ERR_NOMEM, "rpc: stream");
    st->cq = grpc_completion_queue_create_for_pluck(NULL);
    if (!st->cq) {
        free(st);
        return kvl__errorf(KVL_ERR_NOMEM, "rpc: completion queue");
    }
    grpc_metadata_array_init(&st->initial_md);
    grpc_metadata_array_init(&st->trailing_md);
    st->details = grpc_empty_slice();
    st->call = make_call(cli, st->cq, method, timeout_ms);
    grpc_byte_buffer *bb = kvl__rpc_bb_from(req, req_len);
    if (!st->call || !bb) {
        if (bb) grpc_byte_buffer_destroy(bb);
        kvl__rpc_stream_free(st);
        return kvl__errorf(KVL_ERR_NOMEM, "rpc: cannot create call %s", method);
    }
    call_md cm;
    call_md_fill(cli, &cm);
    /* the request only: the server sends its initial metadata with its first message, so
     * waiting for it here would hold the caller, with no handle to cancel the call, until the
     * server's first message (a prefill); the first read takes it instead */
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = cm.n;
    ops[0].data.send_initial_metadata.metadata = cm.md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    kvl_status s = KVL_OK;
    if (grpc_call_start_batch(st->call, ops, 3, &st->tag_start, NULL) != GRPC_CALL_OK) {
        s = kvl__errorf(KVL_ERR_INTERNAL, "rpc: %s: cannot start the call", method);
    } else {
        grpc_completion_queue_pluck(st->cq, &st->tag_start, gpr_inf_future(GPR_CLOCK_REALTIME),
                                    NULL);
        /* the status batch runs alongside the reads; it completes when the call ends */
        grpc_op sop;
        memset(&sop, 0, sizeof sop);
        sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        sop.data.recv_status_on_client.trailing_metadata = &st->trailing_md;
        sop.data.recv_status_on_client.status = &st->code;
        sop.data.recv_status_on_client.status_details = &st->details;
        if (grpc_call_start_batch(st->call, &sop, 1, &st->tag_status, NULL) != GRPC_CALL_OK)
            s = kvl__errorf(KVL_ERR_INTERNAL, "rpc: %s: cannot start the status op", method);
        else
            st->status_pending = 1;
    }
    call_md_clear(&cm);
    grpc_byte_buffer_destroy(bb);
    if (s != KVL_OK) {
        kvl__rpc_stream_free(st);
        return s;
    }
    *out = st;
    return KVL_OK;
}

int kvl__rpc_stream_read(kvl__rpc_stream *st, uint8_t **data, size_t *len) {
    *data = NULL;
    *len = 0;
    if (!st || st->ended) return 0;
    grpc_byte_buffer *bb = NULL;
    grpc_op op[2];
    memset(op, 0, sizeof op);
    size_t nop = 0;
    if (!st->md_received) {
        op[nop].op = GRPC_OP_RECV_INITIAL_METADATA;
        op[nop++].data.recv_initial_metadata.recv_initial_metadata = &st->initial_md;
        st->md_received = 1;
    }
    op[nop].op = GRPC_OP_RECV_MESSAGE;
    op[nop++].data.recv_message.recv_message = &bb;
    if (grpc_call_start_batch(st->call, op, nop, &st->tag_read, NULL) != GRPC_CALL_OK) {
        st->ended = 1;
        return 0;
    }
    grpc_event ev = grpc_completion_queue_pluck(st->cq, &st->tag_read,
                                                gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE || !ev.success || !bb) {
        if (bb) grpc_byte_buffer_destroy(bb);
        st->ended = 1;
        return 0;
    }
    kvl_status s = kvl__rpc_bb_read(bb, data, len);
    grpc_byte_buffer_destroy(bb);
    if (s != KVL_OK) return s;
    return 1;
}

static void wait_status(kvl__rpc_stream *st) {
    if (!st->status_pending) return;
    grpc_completion_queue_pluck(st->cq, &st->tag_status, gpr_inf_future(GPR_CLOCK_REALTIME),
                                NULL);
    st->status_pending = 0;
    st->status_done = 1;
}

kvl_status kvl__rpc_stream_finish(kvl__rpc_stream *st, kvl__rpc_result *res) {
    if (!st || !res) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: stream finish: NULL");
    memset(res, 0, sizeof *res);
    /* drain unread messages so the status can arrive */
    uint8_t *d;
    size_t n;
    while (!st->ended && kvl__rpc_stream_read(st, &d, &n) == 1) free(d);
    wait_status(st);
    res->code = st->status_done ? st->code : GRPC_STATUS_INTERNAL;
    res->message = st->status_done ? kvl__rpc_slice_strdup(st->details)
                                   : strdup("stream failed to start");
    if (!res->message) return kvl__errorf(KVL_ERR_NOMEM, "rpc: status message");
    return KVL_OK;
}

void kvl__rpc_stream_cancel(kvl__rpc_stream *st) {
    if (st && st->call) grpc_call_cancel(st->call, NULL);
}

void kvl__rpc_stream_free(kvl__rpc_stream *st) {
    if (!st) return;
    if (st->call) {
        if (st->status_pending) {
            grpc_call_cancel(st->call, NULL);
            wait_status(st);
        }
        grpc_call_unref(st->call);
    }
    grpc_slice_unref(st->details);
    grpc_metadata_array_destroy(&st->initial_md);
    grpc_metadata_array_destroy(&st->trailing_md);
    if (st->cq) cq_destroy(st->cq);
    free(st);
}
