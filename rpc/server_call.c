/* rpc/server_call.c: what a handler does with its call (reply, stream, finish, cancellation),
 * and the call's reference counting.  One send batch is in flight at a time; the handler thread
 * waits for it, which gives streaming calls gRPC's flow control for free. */
#include "server_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>

#include "error.h"

void kvl__rpc_call_destroy(kvl__rpc_call *c) {
    kvl__rpc_server *srv = c->srv;
    if (c->call) grpc_call_unref(c->call);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->recv_buf) grpc_byte_buffer_destroy(c->recv_buf);
    free(c->method);
    if (c->peer) gpr_free(c->peer);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    pthread_mutex_lock(&srv->mu);
    srv->n_calls--;
    pthread_mutex_unlock(&srv->mu);
    kvl__rpc_server_maybe_close_cq(srv);
}

void kvl__rpc_call_unref(kvl__rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left == 0) kvl__rpc_call_destroy(c);
}

void kvl__rpc_call_mark_cancelled(kvl__rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    if (c->cancelled) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    c->cancelled = 1;
    void (*fn)(void *) = c->cancel_fn;
    void *arg = c->cancel_arg;
    if (fn) c->cancel_running = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (!fn) return;
    /* run without c->mu: the callback may take application locks that a handler holds while
     * it calls into this API */
    fn(arg);
    pthread_mutex_lock(&c->mu);
    c->cancel_running = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void kvl__rpc_call_reject(kvl__rpc_call *c, grpc_status_code code, const char *msg) {
    grpc_slice details = grpc_slice_from_copied_string(msg);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[1].data.send_status_from_server.status = code;
    ops[1].data.send_status_from_server.status_details = &details;
    pthread_mutex_lock(&c->mu);
    c->refs++;
    c->finished = 1;
    c->initial_md_sent = 1;
    pthread_mutex_unlock(&c->mu);
    c->t_send.kind = TAG_REJECT;
    if (grpc_call_start_batch(c->call, ops, 2, &c->t_send, NULL) != GRPC_CALL_OK)
        kvl__rpc_call_unref(c);
    grpc_slice_unref(details);
}

const char *kvl__rpc_call_method(const kvl__rpc_call *call) { return call->method; }
const char *kvl__rpc_call_peer(const kvl__rpc_call *call) { return call->peer ? call->peer : ""; }

size_t kvl__rpc_call_metadata(const kvl__rpc_call *call, const char *key, char *buf, size_t cap) {
    if (!call || !key) return 0;
    size_t klen = strlen(key);
    for (size_t i = 0; i < call->md.count; i++) {
        const grpc_metadata *m = &call->md.metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) != klen ||
            memcmp(GRPC_SLICE_START_PTR(m->key), key, klen) != 0)
            continue;
        size_t n = GRPC_SLICE_LENGTH(m->value);
        if (!buf || cap == 0 || n > cap - 1) return SIZE_MAX;
        memcpy(buf, GRPC_SLICE_START_PTR(m->value), n);
        buf[n] = '\0';
        return n;
    }
    return 0;
}

size_t kvl__rpc_call_peer_cn(const kvl__rpc_call *call, char *buf, size_t cap) {
    if (!call || !call->call) return 0;
    grpc_auth_context *ctx = grpc_call_auth_context(call->call);
    if (!ctx) return 0;
    size_t n = 0;
    grpc_auth_property_iterator it =
        grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_CN_PROPERTY_NAME);
    const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
    if (p && p->value_length > 0) {
        n = p->value_length;
        if (!buf || cap == 0 || n > cap - 1) {
            n = SIZE_MAX;
        } else {
            memcpy(buf, p->value, n);
            buf[n] = '\0';
        }
    }
    grpc_auth_context_release(ctx);
    return n;
}

int64_t kvl__rpc_call_deadline_left_ms(const kvl__rpc_call *call) {
    gpr_timespec d = call->deadline;
    if (d.tv_sec >= INT64_MAX / 2) return INT64_MAX;
    gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
    return (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
}

int kvl__rpc_call_cancelled(const kvl__rpc_call *call) {
    kvl__rpc_call *c = (kvl__rpc_call *)call;
    pthread_mutex_lock(&c->mu);
    int v = c->cancelled;
    pthread_mutex_unlock(&c->mu);
    if (!v && kvl__rpc_call_deadline_left_ms(call) <= 0) v = 1;
    return v;
}

void kvl__rpc_call_on_cancel(kvl__rpc_call *c, void (*fn)(void *arg), void *arg) {
    pthread_mutex_lock(&c->mu);
    while (c->cancel_running) pthread_cond_wait(&c->cv, &c->mu);
    if (c->cancelled && fn) {
        c->cancel_fn = NULL;
        pthread_mutex_unlock(&c->mu);
        fn(arg);
        return;
    }
    c->cancel_fn = fn;
    c->cancel_arg = arg;
    pthread_mutex_unlock(&c->mu);
}

/* Why a send was ended, with the measures that ended it: this message's own wait (measured from
 * t_start, the send's start) when it is one, and the stream's waits in all when earlier sends
 * waited too (a reader in bursts whose one wait passed what was left of the bound must not read
 * as one that stopped reading; one whose earlier sends used the whole bound waited ~0 here). */
static void stall_message(char *why, size_t cap, int64_t spent_before_ms, struct timespec t_start, int stall_ms) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long long waited = (long long)(now.tv_sec - t_start.tv_sec) * 1000 + (now.tv_nsec - t_start.tv_nsec) / 1000000;
    if (spent_before_ms <= 0)
        snprintf(why, cap, "the client took no message for %d ms: the call is ended", stall_ms);
    else if (waited >= 1)
        snprintf(why, cap, "the client took no message for %lld ms, and its reads held this stream's messages "
                 "for %d ms in all: the call is ended", waited, stall_ms);
    else
        snprintf(why, cap, "the client's reads held this stream's messages for %d ms in all: the call is ended",
                 stall_ms);
}

/* Start a batch of send ops and wait for it.  `final` marks the call finished first. */
static kvl_status send_batch(kvl__rpc_call *c, grpc_op *ops, size_t n, int final) {
    pthread_mutex_lock(&c->mu);
    if (c->finished) {
        pthread_mutex_unlock(&c->mu);
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: %s already finished", c->method);
    }
    while (c->send_pending) pthread_cond_wait(&c->cv, &c->mu);
    if (final) c->finished = 1;
    c->send_pending = 1;
    pthread_mutex_unlock(&c->mu);
    c->t_send.kind = TAG_SEND;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL);
    pthread_mutex_lock(&c->mu);
    if (e != GRPC_CALL_OK) {
        c->send_pending = 0;
        pthread_mutex_unlock(&c->mu);
        return kvl__errorf(KVL_ERR_INTERNAL, "rpc: %s: grpc_call_start_batch error %d", c->method,
                          (int)e);
    }
    /* bounded: a client that stops reading holds the send for ever (flow control), and one
     * that reads a message now and then, each just within the bound, would hold the call (and
     * what its handler holds) for as long as the stream is long.  So stall_ms bounds both one
     * send's wait and the call's sends' waits all together: a reader that keeps up never waits
     * long, as HTTP/2's windows take messages ahead of its reads */
    const int stall_ms = c->stall_ms > 0 ? c->stall_ms : c->srv ? c->srv->send_stall_ms : 120000;
    const int64_t budget_ms = (int64_t)stall_ms - c->stall_spent_ms;
    const int64_t wait_ms = budget_ms > 0 ? budget_ms : 0;
    /* what ends this send, if it is ended, is said with both measures: this message's wait and,
     * where earlier sends waited too, the call's waits all together (a reader in bursts whose
     * one wait passed what was left of the bound must not read as one that stopped reading) */
    const int64_t spent_before_ms = c->stall_spent_ms;
    struct timespec t_start, dl;   /* the call's cv waits on the monotonic clock (server.c) */
    clock_gettime(CLOCK_MONOTONIC, &t_start);
    dl = t_start;
    dl.tv_sec += (time_t)(wait_ms / 1000);
    dl.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    int stalled = 0;
    char why[200] = "";   /* once stalled: what ended the send, for the client and the handler */
    while (c->send_pending) {
        if (stalled) {
            pthread_cond_wait(&c->cv, &c->mu);
        } else if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT && c->send_pending) {
            stalled = 1;
            pthread_mutex_unlock(&c->mu);
            stall_message(why, sizeof why, spent_before_ms, t_start, stall_ms);
            grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED, why, NULL);
            pthread_mutex_lock(&c->mu);
        }
    }
    struct timespec t_end;
    clock_gettime(CLOCK_MONOTONIC, &t_end);
    c->stall_spent_ms += (int64_t)(t_end.tv_sec - t_start.tv_sec) * 1000 +
                         (t_end.tv_nsec - t_start.tv_nsec) / 1000000;
    int ok = c->send_ok;
    pthread_mutex_unlock(&c->mu);
    if (stalled) return kvl__errorf(KVL_ERR_CANCELLED, "rpc: %s: %s", c->method, why);
    if (!ok) return kvl__errorf(KVL_ERR_CANCELLED, "rpc: %s: the call was cancelled", c->method);
    return KVL_OK;
}

/* Fill the ops for one message, optional status; returns the number of ops. */
static size_t build_ops(kvl__rpc_call *c, grpc_op *ops, grpc_byte_buffer *bb, int with_status,
                        grpc_status_code code, grpc_slice *details) {
    size_t n = 0;
    memset(ops, 0, 3 * sizeof *ops);
    pthread_mutex_lock(&c->mu);
    if (!c->initial_md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->initial_md_sent = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (bb) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = bb;
    }
    if (with_status) {
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = code;
        ops[n++].data.send_status_from_server.status_details = details;
    }
    return n;
}

static kvl_status send_msg(kvl__rpc_call *c, const uint8_t *msg, size_t len, int with_status) {
    grpc_byte_buffer *bb = kvl__rpc_bb_from(msg, len);
    if (!bb) return kvl__errorf(KVL_ERR_NOMEM, "rpc: message of %zu bytes", len);
    grpc_slice details = grpc_slice_from_static_string("");
    grpc_op ops[3];
    size_t n = build_ops(c, ops, bb, with_status, GRPC_STATUS_OK, &details);
    kvl_status st = send_batch(c, ops, n, with_status);
    grpc_byte_buffer_destroy(bb);
    return st;
}

kvl_status kvl__rpc_call_reply(kvl__rpc_call *c, const uint8_t *msg, size_t len) {
    return send_msg(c, msg, len, 1);
}

kvl_status kvl__rpc_call_send(kvl__rpc_call *c, const uint8_t *msg, size_t len) {
    if (c->m && c->m->kind != KVL_RPC_SERVER_STREAM)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: %s is unary: use kvl__rpc_call_reply",
                          c->method);
    return send_msg(c, msg, len, 0);
}

kvl_status kvl__rpc_call_finish(kvl__rpc_call *c, grpc_status_code code, const char *fmt, ...) {
    char buf[1024] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
    }
    grpc_slice details = grpc_slice_from_copied_string(buf);
    grpc_op ops[3];
    size_t n = build_ops(c, ops, NULL, 1, code, &details);
    kvl_status st = send_batch(c, ops, n, 1);
    grpc_slice_unref(details);
    return st;
}

kvl_status kvl__rpc_call_finish_kvl(kvl__rpc_call *c, kvl_status s) {
    const char *msg = kvl_last_error();
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", msg && msg[0] ? msg : kvl_strerror(s));
    return kvl__rpc_call_finish(c, kvl__rpc_status_from_kvl(s), "%s", copy);
}

kvl_status kvl__rpc_call_reply_pb(kvl__rpc_call *c, const ProtobufCMessage *msg) {
    uint8_t *buf;
    size_t len;
    kvl_status st = kvl__rpc_pack(msg, &buf, &len);
    if (st != KVL_OK) return kvl__rpc_call_finish_kvl(c, st);
    st = kvl__rpc_call_reply(c, buf, len);
    free(buf);
    return st;
}

kvl_status kvl__rpc_call_send_pb(kvl__rpc_call *c, const ProtobufCMessage *msg) {
    uint8_t *buf;
    size_t len;
    kvl_status st = kvl__rpc_pack(msg, &buf, &len);
    if (st != KVL_OK) return st;
    st = kvl__rpc_call_send(c, buf, len);
    free(buf);
    return st;
}
