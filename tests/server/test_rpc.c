/* tests/server/test_rpc.c: the rpc/ layer end to end in one process: unary, server streaming,
 * deadlines, client cancellation seen by the handler, unknown methods, health checking, handler
 * threads kept for the next call (and a burst of concurrent calls still served, handlers that
 * block while the others start). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/types.h>

#include <cmocka.h>

#include "clock.h"
#include "kvlingo/status.h"
#include "rpc.h"
#include "grpc/health/v1/health.pb-c.h"

static const kvl__rpc_tls plaintext = {.insecure = 1};

typedef struct fixture {
    kvl__rpc_server *srv;
    kvl__rpc_client *cli;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int cancel_seen;
    int gathered;   /* Gather handlers whose message was sent */
} fixture;

static void echo(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    if (len > 0 && req[0] == 'E') {
        kvl__rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, "bad request: %d bytes", (int)len);
        return;
    }
    kvl__rpc_call_reply(call, req, len);
}

static void count(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    int n = len > 0 ? req[0] : 0;
    for (int i = 0; i < n; i++) {
        uint8_t b = (uint8_t)i;
        if (kvl__rpc_call_send(call, &b, 1) != KVL_OK) return;
    }
    kvl__rpc_call_finish(call, GRPC_STATUS_OK, NULL);
}

/* replies "<len>:<value>" of request metadata x-test, read into a buffer of req[0] bytes
 * (64 when the request is empty); "big" when it does not fit; "auth:<value>" instead when the
 * call has an authorization header */
static void md_echo(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    char buf[64], out[96];
    size_t cap = len > 0 ? req[0] : sizeof buf;
    size_t n = kvl__rpc_call_metadata(call, "x-test", buf, cap);
    if (n == SIZE_MAX) snprintf(out, sizeof out, "big");
    else snprintf(out, sizeof out, "%zu:%s", n, n ? buf : "");
    if (kvl__rpc_call_metadata(call, "x-absent", buf, sizeof buf) != 0) snprintf(out, sizeof out, "absent?");
    size_t an = kvl__rpc_call_metadata(call, "authorization", buf, sizeof buf);
    if (an && an != SIZE_MAX) snprintf(out, sizeof out, "auth:%s", buf);
    if (user) {   /* the streaming variant sends it twice */
        kvl__rpc_call_send(call, (const uint8_t *)out, strlen(out));
        kvl__rpc_call_send(call, (const uint8_t *)out, strlen(out));
        kvl__rpc_call_finish(call, GRPC_STATUS_OK, NULL);
        return;
    }
    kvl__rpc_call_reply(call, (const uint8_t *)out, strlen(out));
}

static void on_cancel(void *arg) {
    fixture *f = arg;
    pthread_mutex_lock(&f->mu);
    f->cancel_seen = 1;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* streams one message then waits until the client goes away */
static void hang(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    fixture *f = user;
    uint8_t b = 42;
    kvl__rpc_call_send(call, &b, 1);
    kvl__rpc_call_on_cancel(call, on_cancel, f);
    pthread_mutex_lock(&f->mu);
    while (!f->cancel_seen) pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    assert_true(kvl__rpc_call_cancelled(call));
    /* sends after cancellation fail cleanly */
    assert_int_equal(kvl__rpc_call_send(call, &b, 1), KVL_ERR_CANCELLED);
}

/* replies with the handler thread's kernel id (not reused soon after a thread ends, unlike
 * pthread_t) */
static void whoami(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    (void)req, (void)len, (void)user;
    pid_t me = (pid_t)syscall(SYS_gettid);
    if (len > 0) usleep(20000);   /* a slow call: concurrent calls need threads of their own */
    kvl__rpc_call_reply(call, (const uint8_t *)&me, sizeof me);
}

/* a stream that sends nothing until the client goes away (a node's long prefill) */
static void late(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    (void)req, (void)len;
    fixture *f = user;
    kvl__rpc_call_on_cancel(call, on_cancel, f);
    pthread_mutex_lock(&f->mu);
    while (!f->cancel_seen) pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
}

/* sends one message, then waits (up to 5 s) until every one of req[0] concurrent Gather calls
 * has sent its own: each send completes only when some thread polls the server's queue while
 * the handlers before it block, so the poll role must pass on as each handler starts */
static void gather(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    fixture *f = user;
    const int want = len > 0 ? req[0] : 1;
    uint8_t b = 7;
    if (kvl__rpc_call_send(call, &b, 1) != KVL_OK) return;
    pthread_mutex_lock(&f->mu);
    f->gathered++;
    pthread_cond_broadcast(&f->cv);
    int64_t until = kvl__now_ms() + 5000;
    while (f->gathered < want && kvl__now_ms() < until) {
        pthread_mutex_unlock(&f->mu);
        usleep(1000);
        pthread_mutex_lock(&f->mu);
    }
    const int all = f->gathered >= want;
    pthread_mutex_unlock(&f->mu);
    kvl__rpc_call_finish(call, all ? GRPC_STATUS_OK : GRPC_STATUS_DEADLINE_EXCEEDED,
                         all ? NULL : "the other handlers' sends did not complete");
}

static void slow(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    while (!kvl__rpc_call_cancelled(call)) usleep(10000);
    kvl__rpc_call_finish(call, GRPC_STATUS_ABORTED, "too late");
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    kvl__rpc_server_params p = kvl__rpc_server_default_params();
    p.tls = &plaintext;
    p.listen = "127.0.0.1:0";
    assert_int_equal(kvl__rpc_server_create(&p, &f->srv), KVL_OK);
    assert_int_equal(kvl__rpc_server_add_method(f->srv, "/t.S/Echo", KVL_RPC_UNARY, echo, f), 0);
    assert_int_equal(kvl__rpc_server_add_method(f->srv, "/t.S/Count", KVL_RPC_SERVER_STREAM,
                                               count, f), 0);
    assert_int_equal(kvl__rpc_server_add_method(f->srv, "/t.S/Hang", KVL_RPC_SERVER_STREAM,
                                               hang, f), 0);
    assert_int_equal(kvl__rpc_server_add_method(f->srv, "/t.S/Slow", KVL_RPC_UNARY, slow, f), 0);
    assert_int_equal(kvl__rpc_server_add_method(f->srv, "/t.S/Late", KVL_RPC_SERVER_STREAM, late, f), 0);
    assert_int_equal(kvl__rpc_server_add_method(f->srv, "/t.S/Who", KVL_RPC_UNARY, whoami, f), 0);
    assert_int_equal(kvl__rpc_server_add_method(f->srv, "/t.S/Gather", KVL_RPC_SERVER_STREAM, gather, f), 0);
    assert_int_equal(kvl__rpc_server_add_method(f->srv, "/t.S/Md", KVL_RPC_UNARY, md_echo, NULL), 0);
    assert_int_equal(kvl__rpc_server_add_method(f->srv, "/t.S/MdStream", KVL_RPC_SERVER_STREAM,
                                               md_echo, f), 0);
    assert_int_not_equal(kvl__rpc_server_add_method(f->srv, "/t.S/Echo", KVL_RPC_UNARY, echo, f), 0);
    assert_int_equal(kvl__rpc_server_start(f->srv), KVL_OK);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", kvl__rpc_server_port(f->srv));
    assert_int_equal(kvl__rpc_client_create(target, 0, &plaintext, &f->cli), KVL_OK);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    kvl__rpc_client_free(f->cli);
    kvl__rpc_server_free(f->srv);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
    return 0;
}

static void test_unary(void **state) {
    fixture *f = *state;
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_client_unary(f->cli, "/t.S/Echo", (const uint8_t *)"hello", 5, 5000,
                                          &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_int_equal(r.len, 5);
    assert_memory_equal(r.data, "hello", 5);
    kvl__rpc_result_clear(&r);
    /* empty message */
    assert_int_equal(kvl__rpc_client_unary(f->cli, "/t.S/Echo", NULL, 0, 5000, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_int_equal(r.len, 0);
    kvl__rpc_result_clear(&r);
    /* error status with message */
    assert_int_equal(kvl__rpc_client_unary(f->cli, "/t.S/Echo", (const uint8_t *)"Ex", 2, 5000,
                                          &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_string_equal(r.message, "bad request: 2 bytes");
    kvl__rpc_result_clear(&r);
    /* unknown method */
    assert_int_equal(kvl__rpc_client_unary(f->cli, "/t.S/Nope", NULL, 0, 5000, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_UNIMPLEMENTED);
    assert_non_null(strstr(r.message, "/t.S/Nope"));
    kvl__rpc_result_clear(&r);
}

typedef struct who_arg {
    kvl__rpc_client *cli;
    pid_t got;
    int ok;
} who_arg;

/* The unary call in halves: start returns while the handler is still busy (Who with a
 * request sleeps 20 ms), wait(0) says "not yet" then, and the call ends by itself while nobody
 * waits on it (this process's server poller drives gRPC): after a sleep, wait(0) says done and
 * finish hands over the answer.  A call that fails still finishes (its status), a deadline
 * ends a call nobody waits on, and the _pb halves unpack. */
static void test_unary_halves(void **state) {
    fixture *f = *state;
    kvl__rpc_unary *u = NULL;
    const uint8_t slow_req[1] = {1};
    assert_int_equal(kvl__rpc_unary_start(f->cli, "/t.S/Who", slow_req, 1, 5000, &u), KVL_OK);
    assert_int_equal(kvl__rpc_unary_wait(u, 0), 0);
    double t0 = kvl__now_s();
    while (kvl__now_s() - t0 < 5.0) {   /* nobody in this call's queue meanwhile */
        usleep(5000);
        if (kvl__rpc_unary_wait(u, 0)) break;
    }
    assert_int_equal(kvl__rpc_unary_wait(u, 0), 1);
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_unary_finish(u, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_int_equal(r.len, sizeof(pid_t));
    kvl__rpc_result_clear(&r);
    /* a refusal */
    const uint8_t bad[2] = {'E', 'x'};
    assert_int_equal(kvl__rpc_unary_start(f->cli, "/t.S/Echo", bad, 2, 5000, &u), KVL_OK);
    assert_int_equal(kvl__rpc_unary_finish(u, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(r.message, "bad request"));
    kvl__rpc_result_clear(&r);
    /* a deadline passes while nobody waits: the call ends with it */
    assert_int_equal(kvl__rpc_unary_start(f->cli, "/t.S/Slow", NULL, 0, 100, &u), KVL_OK);
    usleep(400000);
    assert_int_equal(kvl__rpc_unary_wait(u, 1000), 1);
    assert_int_equal(kvl__rpc_unary_finish(u, &r), KVL_OK);
    assert_true(r.code == GRPC_STATUS_DEADLINE_EXCEEDED || r.code == GRPC_STATUS_ABORTED);
    kvl__rpc_result_clear(&r);
    /* protobuf halves: a health check */
    Grpc__Health__V1__HealthCheckRequest hq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    hq.service = "";
    assert_int_equal(kvl__rpc_unary_start_pb(f->cli, "/grpc.health.v1.Health/Check", &hq.base, 5000, &u),
                     KVL_OK);
    Grpc__Health__V1__HealthCheckResponse *hr = NULL;
    assert_int_equal(kvl__rpc_unary_finish_pb(u, &grpc__health__v1__health_check_response__descriptor,
                                              (ProtobufCMessage **)&hr, &r),
                     KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_non_null(hr);
    assert_int_equal(hr->status, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    protobuf_c_message_free_unpacked(&hr->base, NULL);
    kvl__rpc_result_clear(&r);
}

static void *call_who_slow(void *p) {
    who_arg *w = p;
    kvl__rpc_result r;
    w->ok = kvl__rpc_client_unary(w->cli, "/t.S/Who", (const uint8_t *)"s", 1, 5000, &r) == KVL_OK &&
            r.code == GRPC_STATUS_OK && r.len == sizeof(pid_t);
    if (w->ok) memcpy(&w->got, r.data, sizeof w->got);
    kvl__rpc_result_clear(&r);
    return NULL;
}

static void test_thread_reuse(void **state) {
    fixture *f = *state;
    pid_t seen[20];
    int distinct = 0;
    /* calls one after another run on kept threads, not a new one each (the few kept from the
     * tests before take turns) */
    for (int i = 0; i < 20; i++) {
        kvl__rpc_result r;
        assert_int_equal(kvl__rpc_client_unary(f->cli, "/t.S/Who", NULL, 0, 5000, &r), KVL_OK);
        assert_int_equal(r.code, GRPC_STATUS_OK);
        assert_int_equal(r.len, sizeof(pid_t));
        pid_t t;
        memcpy(&t, r.data, sizeof t);
        kvl__rpc_result_clear(&r);
        int known = 0;
        for (int j = 0; j < distinct; j++) known |= seen[j] == t;
        if (!known) seen[distinct++] = t;
        usleep(2000);   /* the thread is back waiting before the next call */
    }
    assert_true(distinct <= 8);
    /* a burst of concurrent slow calls: each gets a thread, all answer */
    enum { N = 24 };
    who_arg w[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        w[i] = (who_arg){.cli = f->cli};
        assert_int_equal(pthread_create(&th[i], NULL, call_who_slow, &w[i]), 0);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    int side_by_side = 0;
    for (int i = 0; i < N; i++) {
        assert_true(w[i].ok);
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= w[i].got == w[j].got;
        side_by_side += !dup;
    }
    assert_true(side_by_side >= 8);   /* ran side by side, not queued behind one thread */
}

/* Handlers that block while others start: every call is received and every send completes
 * (the queue keeps a poller while the threads that received calls run their handlers). */
static void test_handlers_block_together(void **state) {
    fixture *f = *state;
    enum { N = 12 };
    uint8_t n = N;
    kvl__rpc_stream *st[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(kvl__rpc_client_stream_open(f->cli, "/t.S/Gather", &n, 1, 10000, &st[i]), KVL_OK);
    for (int i = 0; i < N; i++) {
        uint8_t *d;
        size_t len;
        assert_int_equal(kvl__rpc_stream_read(st[i], &d, &len), 1);
        assert_int_equal(len, 1);
        free(d);
        assert_int_equal(kvl__rpc_stream_read(st[i], &d, &len), 0);
        kvl__rpc_result r;
        assert_int_equal(kvl__rpc_stream_finish(st[i], &r), KVL_OK);
        assert_int_equal(r.code, GRPC_STATUS_OK);
        kvl__rpc_result_clear(&r);
        kvl__rpc_stream_free(st[i]);
    }
    assert_int_equal(f->gathered, N);
}

static void test_deadline(void **state) {
    fixture *f = *state;
    kvl__rpc_result r;
    int64_t t0 = kvl__now_ms();
    assert_int_equal(kvl__rpc_client_unary(f->cli, "/t.S/Slow", NULL, 0, 200, &r), KVL_OK);
    /* Client and server both hold the deadline: usually the client's own timer fires first
     * (DEADLINE_EXCEEDED), but on a loaded machine the server can notice first, and the slow
     * handler's late ABORTED status then wins the race.  Either way the call ends near the
     * deadline and never hangs. */
    if (r.code != GRPC_STATUS_DEADLINE_EXCEEDED && r.code != GRPC_STATUS_ABORTED)
        fail_msg("Slow call ended with status %d (%s)", r.code, r.message ? r.message : "");
    int64_t took = kvl__now_ms() - t0;
    assert_true(took >= 150 && took < 3000);
    kvl__rpc_result_clear(&r);
    /* the server keeps serving */
    assert_int_equal(kvl__rpc_client_unary(f->cli, "/t.S/Echo", (const uint8_t *)"x", 1, 5000, &r),
                     KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    kvl__rpc_result_clear(&r);
}

static void test_stream(void **state) {
    fixture *f = *state;
    uint8_t n = 50;
    kvl__rpc_stream *st;
    assert_int_equal(kvl__rpc_client_stream_open(f->cli, "/t.S/Count", &n, 1, 5000, &st), KVL_OK);
    int got = 0;
    uint8_t *d;
    size_t len;
    while (kvl__rpc_stream_read(st, &d, &len) == 1) {
        assert_int_equal(len, 1);
        assert_int_equal(d[0], got);
        got++;
        free(d);
    }
    assert_int_equal(got, 50);
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_stream_finish(st, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    kvl__rpc_result_clear(&r);
    kvl__rpc_stream_free(st);
}

static void test_cancel(void **state) {
    fixture *f = *state;
    f->cancel_seen = 0;
    kvl__rpc_stream *st;
    assert_int_equal(kvl__rpc_client_stream_open(f->cli, "/t.S/Hang", NULL, 0, 10000, &st), KVL_OK);
    uint8_t *d;
    size_t len;
    assert_int_equal(kvl__rpc_stream_read(st, &d, &len), 1);
    assert_int_equal(d[0], 42);
    free(d);
    kvl__rpc_stream_cancel(st);
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_stream_finish(st, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_CANCELLED);
    kvl__rpc_result_clear(&r);
    kvl__rpc_stream_free(st);
    pthread_mutex_lock(&f->mu);
    while (!f->cancel_seen) pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    while (kvl__rpc_server_active_calls(f->srv) > 0) usleep(1000);
}

/* Opening a stream does not wait for the server's first message: the caller gets its handle at
 * once and can cancel a call whose server has not sent anything yet (it blocked until the
 * server's first message, or the deadline, before). */
static void test_cancel_before_first_message(void **state) {
    fixture *f = *state;
    f->cancel_seen = 0;
    kvl__rpc_stream *st;
    int64_t t0 = kvl__now_ms();
    assert_int_equal(kvl__rpc_client_stream_open(f->cli, "/t.S/Late", NULL, 0, 20000, &st), KVL_OK);
    assert_true(kvl__now_ms() - t0 < 2000);
    while (kvl__rpc_server_active_calls(f->srv) == 0) usleep(1000);   /* the handler runs, silent */
    kvl__rpc_stream_cancel(st);
    uint8_t *d = NULL;
    size_t len = 0;
    assert_int_equal(kvl__rpc_stream_read(st, &d, &len), 0);
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_stream_finish(st, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_CANCELLED);
    kvl__rpc_result_clear(&r);
    kvl__rpc_stream_free(st);
    assert_true(kvl__now_ms() - t0 < 5000);
    pthread_mutex_lock(&f->mu);
    while (!f->cancel_seen) pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    while (kvl__rpc_server_active_calls(f->srv) > 0) usleep(1000);
}

static void test_health(void **state) {
    fixture *f = *state;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "";
    ProtobufCMessage *resp;
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_client_unary_pb(f->cli, "/grpc.health.v1.Health/Check", &req.base,
                                             &grpc__health__v1__health_check_response__descriptor,
                                             5000, &resp, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_int_equal(((Grpc__Health__V1__HealthCheckResponse *)resp)->status,
                     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    protobuf_c_message_free_unpacked(resp, NULL);
    kvl__rpc_result_clear(&r);
    req.service = "kvlingo.v1.Nope";
    assert_int_equal(kvl__rpc_client_unary_pb(f->cli, "/grpc.health.v1.Health/Check", &req.base,
                                             &grpc__health__v1__health_check_response__descriptor,
                                             5000, &resp, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_NOT_FOUND);
    kvl__rpc_result_clear(&r);
    /* malformed protobuf */
    uint8_t junk[] = {0xff, 0xff, 0xff};
    assert_int_equal(kvl__rpc_client_unary(f->cli, "/grpc.health.v1.Health/Check", junk, 3, 5000,
                                          &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_INVALID_ARGUMENT);
    kvl__rpc_result_clear(&r);
}

static void test_health_watch(void **state) {
    fixture *f = *state;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "kvlingo.v1.Test";
    assert_int_equal(kvl__rpc_server_set_health(f->srv, "kvlingo.v1.Test", 1), KVL_OK);
    uint8_t buf[64];
    size_t len = grpc__health__v1__health_check_request__pack(&req, buf);
    kvl__rpc_stream *st;
    assert_int_equal(kvl__rpc_client_stream_open(f->cli, "/grpc.health.v1.Health/Watch", buf, len,
                                                10000, &st), KVL_OK);
    int want[2] = {GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING,
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING};
    for (int i = 0; i < 2; i++) {
        uint8_t *d;
        size_t n;
        assert_int_equal(kvl__rpc_stream_read(st, &d, &n), 1);
        Grpc__Health__V1__HealthCheckResponse *r =
            grpc__health__v1__health_check_response__unpack(NULL, n, d);
        assert_non_null(r);
        assert_int_equal(r->status, want[i]);
        grpc__health__v1__health_check_response__free_unpacked(r, NULL);
        free(d);
        if (i == 0) kvl__rpc_server_set_health(f->srv, "kvlingo.v1.Test", 0);
    }
    kvl__rpc_stream_cancel(st);
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_stream_finish(st, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_CANCELLED);
    kvl__rpc_result_clear(&r);
    kvl__rpc_stream_free(st);
}

/* unary /t.S/Md with a read buffer of `cap` bytes (0: the handler's default) */
static void expect_md(kvl__rpc_client *cli, uint8_t cap, const char *want) {
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_client_unary(cli, "/t.S/Md", &cap, cap ? 1 : 0, 5000, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    char got[128];
    snprintf(got, sizeof got, "%.*s", (int)r.len, r.data ? (const char *)r.data : "");
    assert_string_equal(got, want);
    kvl__rpc_result_clear(&r);
}

static void test_metadata(void **state) {
    fixture *f = *state;
    kvl__rpc_client *cli;
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", kvl__rpc_server_port(f->srv));
    assert_int_equal(kvl__rpc_client_create(target, 0, &plaintext, &cli), KVL_OK);
    expect_md(cli, 0, "0:");                                 /* absent */
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-test", "hello world"), KVL_OK);
    expect_md(cli, 0, "11:hello world");
    expect_md(cli, 12, "11:hello world");                    /* exactly fits with its NUL */
    expect_md(cli, 11, "big");                               /* one byte short: nothing copied */
    /* streams carry it too */
    kvl__rpc_stream *st;
    assert_int_equal(kvl__rpc_client_stream_open(cli, "/t.S/MdStream", NULL, 0, 5000, &st), KVL_OK);
    for (int i = 0; i < 2; i++) {
        uint8_t *d;
        size_t n;
        assert_int_equal(kvl__rpc_stream_read(st, &d, &n), 1);
        assert_int_equal(n, 14);
        assert_memory_equal(d, "11:hello world", 14);
        free(d);
    }
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_stream_finish(st, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    kvl__rpc_result_clear(&r);
    kvl__rpc_stream_free(st);
    /* replace, then remove */
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-test", "v2"), KVL_OK);
    expect_md(cli, 0, "2:v2");
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-test", NULL), KVL_OK);
    expect_md(cli, 0, "0:");
    /* bad keys and values are refused, naming the key */
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "X-Test", "v"), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "grpc-timeout", "v"), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-bin", "v"), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "", "v"), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-test", "line\nbreak"), KVL_ERR_INVALID_ARG);
    assert_non_null(strstr(kvl_last_error(), "x-test"));
    /* bounded: KVL_RPC_CLIENT_MAX_METADATA keys, then RANGE; replacing one still works */
    for (int i = 0; i < KVL_RPC_CLIENT_MAX_METADATA; i++) {
        char k[16];
        snprintf(k, sizeof k, "x-k%d", i);
        assert_int_equal(kvl__rpc_client_set_metadata(cli, k, "v"), KVL_OK);
    }
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-test", "v"), KVL_ERR_RANGE);
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-k3", "again"), KVL_OK);
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-k0", NULL), KVL_OK);
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-test", "last"), KVL_OK);
    expect_md(cli, 0, "4:last");
    /* another client of the same server sends none of it */
    expect_md(f->cli, 0, "0:");
    kvl__rpc_client_free(cli);
    /* an API key as "authorization: Bearer KEY"; "" or NULL takes it away; a key the value
     * rules refuse is refused */
    assert_int_equal(kvl__rpc_client_create(target, 0, &plaintext, &cli), KVL_OK);
    assert_int_equal(kvl__rpc_client_set_bearer(cli, "k-123"), KVL_OK);
    expect_md(cli, 0, "auth:Bearer k-123");
    assert_int_equal(kvl__rpc_client_set_bearer(cli, ""), KVL_OK);
    expect_md(cli, 0, "0:");
    assert_int_equal(kvl__rpc_client_set_bearer(cli, "k-1"), KVL_OK);
    assert_int_equal(kvl__rpc_client_set_bearer(cli, NULL), KVL_OK);
    expect_md(cli, 0, "0:");
    assert_int_equal(kvl__rpc_client_set_bearer(cli, "two\nlines"), KVL_ERR_INVALID_ARG);
    expect_md(cli, 0, "0:");
    kvl__rpc_client_free(cli);
}

/* a plaintext health-only server that mirrors another server's health (params.health_of) */
static void test_health_mirror(void **state) {
    fixture *f = *state;
    kvl__rpc_server_params p = kvl__rpc_server_default_params();
    p.tls = &plaintext;
    p.health_of = f->srv;
    kvl__rpc_server *hs;
    assert_int_equal(kvl__rpc_server_create(&p, &hs), KVL_OK);
    assert_int_equal(kvl__rpc_server_start(hs), KVL_OK);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", kvl__rpc_server_port(hs));
    kvl__rpc_client *cli;
    assert_int_equal(kvl__rpc_client_create(target, 0, &plaintext, &cli), KVL_OK);
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "kvlingo.v1.Mirror";
    ProtobufCMessage *resp;
    kvl__rpc_result r;
    int want[3] = {-1, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING,
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING};
    for (int i = 0; i < 3; i++) {
        if (i == 1) assert_int_equal(kvl__rpc_server_set_health(f->srv, "kvlingo.v1.Mirror", 1), KVL_OK);
        if (i == 2) assert_int_equal(kvl__rpc_server_set_health(f->srv, "kvlingo.v1.Mirror", 0), KVL_OK);
        assert_int_equal(kvl__rpc_client_unary_pb(cli, "/grpc.health.v1.Health/Check", &req.base,
                                                 &grpc__health__v1__health_check_response__descriptor,
                                                 5000, &resp, &r), KVL_OK);
        if (want[i] < 0) {   /* unknown to the mirrored server */
            assert_int_equal(r.code, GRPC_STATUS_NOT_FOUND);
        } else {
            assert_int_equal(r.code, GRPC_STATUS_OK);
            assert_int_equal(((Grpc__Health__V1__HealthCheckResponse *)resp)->status, want[i]);
            protobuf_c_message_free_unpacked(resp, NULL);
        }
        kvl__rpc_result_clear(&r);
    }
    /* only health is served there */
    assert_int_equal(kvl__rpc_client_unary(cli, "/t.S/Echo", NULL, 0, 5000, &r), KVL_OK);
    assert_int_equal(r.code, GRPC_STATUS_UNIMPLEMENTED);
    kvl__rpc_result_clear(&r);
    kvl__rpc_client_free(cli);
    kvl__rpc_server_free(hs);
}

/* TLS settings are explicit: none at all is refused, naming what is missing */
static void test_tls_required(void **state) {
    (void)state;
    kvl__rpc_server_params p = kvl__rpc_server_default_params();
    kvl__rpc_server *srv = NULL;
    assert_int_equal(kvl__rpc_server_create(&p, &srv), KVL_ERR_INVALID_ARG);
    assert_non_null(strstr(kvl_last_error(), "no TLS settings"));
    kvl__rpc_tls half = {.cert_pem = "x"};
    p.tls = &half;
    assert_int_equal(kvl__rpc_server_create(&p, &srv), KVL_ERR_INVALID_ARG);
    assert_non_null(strstr(kvl_last_error(), "certificate and its key"));
    kvl__rpc_client *cli = NULL;
    assert_int_equal(kvl__rpc_client_create("127.0.0.1:1", 0, NULL, &cli), KVL_ERR_INVALID_ARG);
    kvl__rpc_tls noca = {.insecure = 0};
    assert_int_equal(kvl__rpc_client_create("127.0.0.1:1", 0, &noca, &cli), KVL_ERR_INVALID_ARG);
    assert_non_null(strstr(kvl_last_error(), "CA"));
    assert_null(cli);
}

static void test_unreachable(void **state) {
    kvl__rpc_client *cli;
    assert_int_equal(kvl__rpc_client_create("127.0.0.1:1", 0, &plaintext, &cli), KVL_OK);
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_client_unary(cli, "/t.S/Echo", NULL, 0, 2000, &r), KVL_OK);
    assert_true(r.code == GRPC_STATUS_UNAVAILABLE || r.code == GRPC_STATUS_DEADLINE_EXCEEDED);
    kvl__rpc_result_clear(&r);
    kvl__rpc_client_free(cli);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),   cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_unary_halves),
        cmocka_unit_test(test_thread_reuse), cmocka_unit_test(test_handlers_block_together),
        cmocka_unit_test(test_stream),  cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_cancel_before_first_message),
        cmocka_unit_test(test_health),  cmocka_unit_test(test_health_watch),
        cmocka_unit_test(test_unreachable), cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_health_mirror), cmocka_unit_test(test_tls_required),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
