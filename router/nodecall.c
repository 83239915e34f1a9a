/* router/nodecall.c: typed Node-service calls (see nodecall.h). */
#include "nodecall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define NODE_SVC "/kvlingo.v1.Node/"

static kvl_status call(kvr_node *n, const char *method, const ProtobufCMessage *req,
                       const ProtobufCMessageDescriptor *desc, int64_t timeout_ms,
                       ProtobufCMessage **resp, grpc_status_code *code) {
    char path[96];
    snprintf(path, sizeof path, NODE_SVC "%s", method);
    kvl__rpc_result res = {0};
    kvl_status s = kvl__rpc_client_unary_pb(n->cli, path, req, desc, timeout_ms, resp, &res);
    if (code) *code = s ? GRPC_STATUS_INTERNAL : res.code;
    if (!s && res.code != GRPC_STATUS_OK) {
        s = kvl__rpc_status_to_kvl(res.code);
        if (s == KVL_OK) s = KVL_ERR_INTERNAL;
        kvl__errorf(s, "node %s: %s: %s: %s", n->name, method, kvl__rpc_status_name(res.code),
                   res.message ? res.message : "");
    } else if (s) {
        kvl__error_prefix(s, n->name);
    }
    kvl__rpc_result_clear(&res);
    return s;
}

kvl_status kvr_node_info(kvr_node *n, int64_t timeout_ms, Kvlingo__V1__InfoResponse **out,
                         grpc_status_code *code) {
    Kvlingo__V1__InfoRequest req = KVLINGO__V1__INFO_REQUEST__INIT;
    *out = NULL;
    return call(n, "Info", &req.base, &kvlingo__v1__info_response__descriptor, timeout_ms,
                (ProtobufCMessage **)out, code);
}

kvl_status kvr_node_session_info(kvr_node *n, const char *sid, int64_t timeout_ms,
                                 kvr_node_session *out, grpc_status_code *code) {
    Kvlingo__V1__SessionInfoRequest req = KVLINGO__V1__SESSION_INFO_REQUEST__INIT;
    req.session_id = (char *)sid;
    Kvlingo__V1__SessionInfoResponse *resp = NULL;
    grpc_status_code c = GRPC_STATUS_OK;
    memset(out, 0, sizeof *out);
    kvl_status s = call(n, "SessionInfo", &req.base, &kvlingo__v1__session_info_response__descriptor,
                        timeout_ms, (ProtobufCMessage **)&resp, &c);
    if (code) *code = c;
    if (c == GRPC_STATUS_NOT_FOUND) { kvl_clear_error(); return KVL_OK; }   /* found = 0 */
    if (s) return s;
    out->found = 1;
    out->tokens = resp->token_count;
    out->cached = resp->cached_count;
    out->imported = resp->imported_count;
    out->idle = !resp->state || !resp->state[0] || !strcmp(resp->state, "idle");
    snprintf(out->sha256, sizeof out->sha256, "%s", resp->tokens_sha256 ? resp->tokens_sha256 : "");
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return KVL_OK;
}

kvl_status kvr_node_open(kvr_node *n, const char *sid, int64_t timeout_ms, grpc_status_code *code) {
    Kvlingo__V1__OpenSessionRequest req = KVLINGO__V1__OPEN_SESSION_REQUEST__INIT;
    req.session_id = (char *)sid;
    Kvlingo__V1__OpenSessionResponse *resp = NULL;
    kvl_status s = call(n, "OpenSession", &req.base, &kvlingo__v1__open_session_response__descriptor,
                        timeout_ms, (ProtobufCMessage **)&resp, code);
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    return s;
}

kvl_status kvr_node_append(kvr_node *n, const char *sid, const int32_t *ids, int count,
                           int64_t timeout_ms, unsigned *token_count, grpc_status_code *code) {
    Kvlingo__V1__AppendRequest req = KVLINGO__V1__APPEND_REQUEST__INIT;
    req.session_id = (char *)sid;
    req.n_tokens = (size_t)count;
    req.tokens = (int32_t *)ids;
    req.prefill = 0;
    Kvlingo__V1__AppendResponse *resp = NULL;
    kvl_status s = call(n, "Append", &req.base, &kvlingo__v1__append_response__descriptor,
                        timeout_ms, (ProtobufCMessage **)&resp, code);
    if (!s && token_count) *token_count = resp->token_count;
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    return s;
}

kvl_status kvr_node_replace_tail(kvr_node *n, const char *sid, unsigned keep, const int32_t *ids,
                                 int count, int64_t timeout_ms, unsigned *token_count,
                                 grpc_status_code *code) {
    Kvlingo__V1__AppendRequest req = KVLINGO__V1__APPEND_REQUEST__INIT;
    req.session_id = (char *)sid;
    req.n_tokens = (size_t)count;
    req.tokens = (int32_t *)ids;
    req.truncate = 1;
    req.truncate_to = keep;
    Kvlingo__V1__AppendResponse *resp = NULL;
    kvl_status s = call(n, "Append", &req.base, &kvlingo__v1__append_response__descriptor,
                        timeout_ms, (ProtobufCMessage **)&resp, code);
    if (!s && token_count) *token_count = resp->token_count;
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    return s;
}

kvl_status kvr_node_drop(kvr_node *n, const char *sid, int64_t timeout_ms, grpc_status_code *code) {
    Kvlingo__V1__DropSessionRequest req = KVLINGO__V1__DROP_SESSION_REQUEST__INIT;
    req.session_id = (char *)sid;
    Kvlingo__V1__DropSessionResponse *resp = NULL;
    grpc_status_code c = GRPC_STATUS_OK;
    kvl_status s = call(n, "DropSession", &req.base, &kvlingo__v1__drop_session_response__descriptor,
                        timeout_ms, (ProtobufCMessage **)&resp, &c);
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    if (code) *code = c;
    if (c == GRPC_STATUS_NOT_FOUND) { kvl_clear_error(); return KVL_OK; }   /* already gone */
    return s;
}

/* A transfer ticket for moving [from, to) of session sid from src to dst (window: any range
 * inside it), valid through timeout_ms and some clock skew; written to tb[KVL_TICKET_MAX]. */
static kvl_status make_ticket(const kvl__ticket_key *key, const kvr_node *src, const kvr_node *dst,
                              const char *sid, unsigned from, unsigned to, int replace, int window,
                              int64_t timeout_ms, uint8_t *tb, size_t *tl) {
    kvl__ticket t;
    memset(&t, 0, sizeof t);
    snprintf(t.src_session, sizeof t.src_session, "%s", sid);
    snprintf(t.dst_session, sizeof t.dst_session, "%s", sid);
    snprintf(t.source, sizeof t.source, "%s", src->address);
    snprintf(t.target, sizeof t.target, "%s", dst->address);
    t.t0 = from;
    t.t1 = to;
    t.replace = replace != 0;
    t.window = window != 0;
    /* valid through the call's deadline and a little clock skew between the hosts */
    int64_t life = (timeout_ms > 0 ? timeout_ms : 30000) + 10000;
    if (life > KVL_TICKET_MAX_LIFETIME_MS - 1000) life = KVL_TICKET_MAX_LIFETIME_MS - 1000;
    t.expiry_ms = kvl__ticket_now_ms() + (uint64_t)life;
    kvl_status ts = kvl__ticket_new_nonce(&t);
    if (!ts) ts = kvl__ticket_encode(key, &t, tb, KVL_TICKET_MAX, tl);
    return ts ? kvl__error_prefix(ts, "transfer ticket") : KVL_OK;
}

kvl_status kvr_node_export(kvr_node *src, const kvr_node *dst, const char *sid, unsigned from,
                           unsigned to, int replace, int64_t timeout_ms, int64_t grace_ms,
                           const kvl__ticket_key *key, kvr_export_result *out,
                           grpc_status_code *code) {
    Kvlingo__V1__ExportSpanRequest req = KVLINGO__V1__EXPORT_SPAN_REQUEST__INIT;
    uint8_t tb[KVL_TICKET_MAX];
    if (key) {
        size_t tl = 0;
        kvl_status ts = make_ticket(key, src, dst, sid, from, to, replace, 0, timeout_ms, tb, &tl);
        if (ts) {
            if (code) *code = GRPC_STATUS_INTERNAL;
            return ts;
        }
        req.ticket.data = tb;
        req.ticket.len = tl;
    }
    req.session_id = (char *)sid;
    req.from = from;
    req.to = to;
    req.peer = (char *)dst->address;
    req.replace = replace != 0;
    req.timeout_ms = (uint32_t)(timeout_ms > 0 ? timeout_ms : 0);
    Kvlingo__V1__ExportSpanResponse *resp = NULL;
    memset(out, 0, sizeof *out);
    /* the rpc deadline leaves the node time to report its own timeout first */
    kvl_status s = call(src, "ExportSpan", &req.base, &kvlingo__v1__export_span_response__descriptor,
                        timeout_ms + (grace_ms > 0 ? grace_ms : 0), (ProtobufCMessage **)&resp, code);
    if (!s) {
        out->t0 = resp->t0;
        out->t1 = resp->t1;
        out->peer_tokens = resp->peer_token_count;
        out->payload_bytes = resp->payload_bytes;
        out->transfer_s = resp->transfer_seconds;
        out->translate_s = resp->translate_seconds;
        out->export_s = resp->export_seconds;
        out->total_s = resp->total_seconds;
        snprintf(out->peer_sha256, sizeof out->peer_sha256, "%s",
                 resp->peer_tokens_sha256 ? resp->peer_tokens_sha256 : "");
    }
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    return s;
}

static void gen_request(Kvlingo__V1__GenerateRequest *req, const char *sid, const kvr_gen_params *p) {
    req->session_id = (char *)sid;
    req->max_tokens = p->max_tokens;
    req->temperature = p->temperature;
    req->top_k = p->top_k;
    req->top_p = p->top_p;
    req->seed = p->seed;
    req->stop_at_eos = p->stop_at_eos != 0;
    req->return_logprobs = p->return_logprobs != 0;
    req->n_stop_tokens = p->n_stop > 0 ? (size_t)p->n_stop : 0;
    req->stop_tokens = (int32_t *)p->stop_ids;
}

static kvl_status open_stream(kvr_node *n, const char *method, const ProtobufCMessage *req,
                              int64_t timeout_ms, kvl__rpc_stream **out) {
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return kvl__errorf(KVL_ERR_NOMEM, "%s request", method);
    protobuf_c_message_pack(req, buf);
    char path[96];
    snprintf(path, sizeof path, NODE_SVC "%s", method);
    kvl_status s = kvl__rpc_client_stream_open(n->cli, path, buf, len, timeout_ms, out);
    free(buf);
    if (s) kvl__error_prefix(s, n->name);
    return s;
}

kvl_status kvr_node_continue(kvr_node *n, const kvr_continue_req *c, const kvr_gen_params *p,
                             int64_t timeout_ms, kvl__rpc_stream **out) {
    Kvlingo__V1__ContinueRequest req = KVLINGO__V1__CONTINUE_REQUEST__INIT;
    Kvlingo__V1__GenerateRequest g = KVLINGO__V1__GENERATE_REQUEST__INIT;
    Kvlingo__V1__SpanPull pull = KVLINGO__V1__SPAN_PULL__INIT;
    uint8_t tb[KVL_TICKET_MAX];
    gen_request(&g, "", p);
    req.session_id = (char *)c->sid;
    req.held = c->held;
    req.held_sha256 = (char *)(c->held_sha256 ? c->held_sha256 : "");
    req.n_context = c->n_context > 0 ? (size_t)c->n_context : 0;
    req.context = (int32_t *)c->context;
    req.n_input = c->n_input > 0 ? (size_t)c->n_input : 0;
    req.input = (int32_t *)c->input;
    req.native_only = c->native_only != 0;
    req.pull_only = c->pull_only != 0;
    req.generate = c->pull_only ? NULL : &g;
    if (c->source) {
        pull.source = (char *)c->source->address;
        pull.source_tokens = c->source_tokens;
        pull.source_sha256 = (char *)(c->source_sha256 ? c->source_sha256 : "");
        pull.timeout_ms = (uint32_t)(c->pull_timeout_ms > 0 ? c->pull_timeout_ms : 0);
        if (c->key) {
            size_t tl = 0;
            /* the nodes settle the range: the target's cache to what the source caches */
            kvl_status ts = make_ticket(c->key, c->source, n, c->sid, 0, c->source_tokens, 0, 1,
                                        c->pull_timeout_ms, tb, &tl);
            if (ts) return ts;
            pull.ticket.data = tb;
            pull.ticket.len = tl;
        }
        req.pull = &pull;
    }
    return open_stream(n, "ContinueTurn", &req.base, timeout_ms, out);
}

kvl_status kvr_node_generate(kvr_node *n, const char *sid, const kvr_gen_params *p,
                             int64_t timeout_ms, kvl__rpc_stream **out) {
    Kvlingo__V1__GenerateRequest req = KVLINGO__V1__GENERATE_REQUEST__INIT;
    gen_request(&req, sid, p);
    return open_stream(n, "Generate", &req.base, timeout_ms, out);
}

int kvr_node_gen_next(kvr_node *n, kvl__rpc_stream *st, Kvlingo__V1__GenerateResponse **msg,
                      grpc_status_code *code) {
    uint8_t *data = NULL;
    size_t len = 0;
    *msg = NULL;
    if (code) *code = GRPC_STATUS_OK;
    int r = kvl__rpc_stream_read(st, &data, &len);
    if (r < 0) return r;
    if (r == 0) {
        kvl__rpc_result res = {0};
        kvl_status s = kvl__rpc_stream_finish(st, &res);
        if (s) return s;
        if (code) *code = res.code;
        if (res.code != GRPC_STATUS_OK)
            kvl__errorf(kvl__rpc_status_to_kvl(res.code), "node %s: turn stream (Generate or ContinueTurn): %s: %s",
                        n->name, kvl__rpc_status_name(res.code), res.message ? res.message : "");
        kvl__rpc_result_clear(&res);
        return 0;
    }
    *msg = kvlingo__v1__generate_response__unpack(NULL, len, data);
    free(data);
    if (!*msg) {
        if (code) *code = GRPC_STATUS_INTERNAL;
        return kvl__errorf(KVL_ERR_FORMAT, "node %s: turn stream: malformed message", n->name);
    }
    return 1;
}
