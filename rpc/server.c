/* rpc/server.c: server lifecycle and the worker threads that drive the completion queue.
 * One worker at a time polls the queue; the one that receives a call's request runs its
 * handler and passes the poll role on (see rpc.h "Server model"). */
#include "server_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>

#include "clock.h"
#include "error.h"

/* Health checks keep reserved capacity: Health/Check has slots of its own, outside max_calls,
 * so that a server whose every slot is taken (long streams, Watch floods) still answers the
 * orchestrator's probe; Health/Watch streams are capped, so they cannot take every slot. */
#define KVL_RPC_CHECK_SLOTS 16
#define KVL_RPC_WATCH_MAX 32
/* A Health/Check's answer that its client does not take within this long ends the call: a
 * client that opens checks on a connection whose window it keeps at 0 would otherwise hold
 * the reserved slots for the whole send_stall_ms (120 s) and fail the real probe meanwhile. */
#define KVL_RPC_CHECK_STALL_MS 2000
/* Memory gRPC may take for all of a server's connections and streams (its resource quota). */
#define KVL_RPC_SERVER_MEMORY (256u << 20)

/* Accept this many calls concurrently at the gRPC level (outstanding request_call slots). */
#define KVL_RPC_ACCEPT_SLOTS 8

kvl__rpc_server_params kvl__rpc_server_default_params(void) {
    kvl__rpc_server_params p = {.listen = "127.0.0.1:0", .max_calls = 256,
                               .max_message_bytes = 64 << 20};
    return p;
}

/* Checked before anything is created, so the caller learns which setting is missing. */
static kvl_status check_server_tls(const kvl__rpc_tls *t, const char *listen) {
    if (!t)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: server %s: no TLS settings (TLS, or insecure "
                          "by name)", listen);
    if (t->insecure) return KVL_OK;
    if (!t->cert_pem || !t->cert_pem[0] || !t->key_pem || !t->key_pem[0])
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: server %s: TLS needs a certificate and its key",
                          listen);
    if (t->require_client_cert && (!t->ca_pem || !t->ca_pem[0]))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: server %s: client certificates are required "
                          "but no CA is given to verify them", listen);
    return KVL_OK;
}

static grpc_server_credentials *server_credentials(const kvl__rpc_tls *t) {
    if (t->insecure) return grpc_insecure_server_credentials_create();
    grpc_ssl_pem_key_cert_pair pair = {.private_key = t->key_pem, .cert_chain = t->cert_pem};
    const char *ca = t->ca_pem && t->ca_pem[0] ? t->ca_pem : NULL;
    /* mutual TLS: the handshake itself refuses a client whose certificate does not chain to
     * the fleet CA, before any method runs */
    grpc_ssl_client_certificate_request_type req =
        t->require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
        : ca ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
    return grpc_ssl_server_credentials_create_ex(ca, &pair, 1, req, NULL);
}

kvl_status kvl__rpc_server_create(const kvl__rpc_server_params *params, kvl__rpc_server **out) {
    if (!params || !params->listen || !out)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: server params and listen address required");
    *out = NULL;
    kvl_status tst = check_server_tls(params->tls, params->listen);
    if (tst != KVL_OK) return tst;
    kvl__rpc_server *srv = calloc(1, sizeof *srv);
    if (!srv) return kvl__errorf(KVL_ERR_NOMEM, "rpc: server");
    kvl__rpc_init();
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);
    pthread_cond_init(&srv->work_cv, NULL);
    srv->max_calls = params->max_calls > 0 ? params->max_calls : 256;
    srv->send_stall_ms = params->send_stall_ms > 0 ? params->send_stall_ms : 120000;
    srv->health_src = params->health_of;
    grpc_arg args[5];
    grpc_channel_args cargs;
    kvl__rpc_message_limits(params->max_message_bytes, args, &cargs);
    /* no SO_REUSEPORT: a second server on a port another one holds must fail at start, not
     * share the port (calls would alternate between the two processes) */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
    args[2].value.integer = 0;
    /* Calls are admitted (max_calls) once their request message has arrived; before that a
     * stream costs memory only.  One connection may hold no more streams than the server
     * would ever run (10,000 header-only streams on one took 125 MB), and what all connections'
     * streams and buffers take is bounded by a memory quota, under which gRPC shrinks its
     * flow-control windows and refuses new streams (50 streams announcing 60 MiB requests
     * and sending 2 MB each held 90 MB). */
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS;
    args[3].value.integer = srv->max_calls + KVL_RPC_CHECK_SLOTS;   /* Watch streams count in max_calls */
    srv->quota = grpc_resource_quota_create("kvl-rpc-server");
    if (!srv->quota) {
        kvl__rpc_server_free(srv);
        return kvl__errorf(KVL_ERR_NOMEM, "rpc: grpc_resource_quota_create failed");
    }
    grpc_resource_quota_resize(srv->quota, KVL_RPC_SERVER_MEMORY);
    args[4].type = GRPC_ARG_POINTER;
    args[4].key = (char *)GRPC_ARG_RESOURCE_QUOTA;
    args[4].value.pointer.p = srv->quota;
    args[4].value.pointer.vtable = grpc_resource_quota_arg_vtable();
    cargs.num_args = 5;
    srv->server = grpc_server_create(&cargs, NULL);
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    if (!srv->server || !srv->cq) {
        kvl__rpc_server_free(srv);
        return kvl__errorf(KVL_ERR_NOMEM, "rpc: grpc_server_create failed");
    }
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
    grpc_server_credentials *creds = server_credentials(params->tls);
    if (!creds) {
        kvl__rpc_server_free(srv);
        return kvl__errorf(KVL_ERR_INTERNAL, "rpc: gRPC refused the TLS settings of %s", params->listen);
    }
    srv->port = grpc_server_add_http2_port(srv->server, params->listen, creds);
    grpc_server_credentials_release(creds);
    if (srv->port <= 0) {
        kvl__rpc_server_free(srv);
        return kvl__errorf(KVL_ERR_IO, "rpc: cannot listen on '%s' (address in use or invalid)",
                          params->listen);
    }
    srv->t_shutdown.kind = TAG_SHUTDOWN;
    kvl_status st = kvl__rpc_server_add_method(srv, "/grpc.health.v1.Health/Check", KVL_RPC_UNARY,
                                              kvl__rpc_health_check, srv);
    if (st == KVL_OK)
        st = kvl__rpc_server_add_method(srv, "/grpc.health.v1.Health/Watch",
                                       KVL_RPC_SERVER_STREAM, kvl__rpc_health_watch, srv);
    if (st == KVL_OK) st = kvl__rpc_server_set_health(srv, "", 1);
    if (st != KVL_OK) {
        kvl__rpc_server_free(srv);
        return st;
    }
    *out = srv;
    return KVL_OK;
}

kvl_status kvl__rpc_server_add_method(kvl__rpc_server *srv, const char *path, kvl__rpc_kind kind,
                                     kvl__rpc_handler handler, void *user) {
    if (!srv || !path || !handler || path[0] != '/' || !strchr(path + 1, '/'))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: method path '%s' must be /pkg.Service/Method",
                          path ? path : "(null)");
    if (srv->started) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: add_method after start");
    for (int i = 0; i < srv->n_methods; i++)
        if (strcmp(srv->methods[i].path, path) == 0)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: method '%s' registered twice", path);
    kvl__rpc_method *m = realloc(srv->methods, (size_t)(srv->n_methods + 1) * sizeof *m);
    if (!m) return kvl__errorf(KVL_ERR_NOMEM, "rpc: method table");
    srv->methods = m;
    char *p = strdup(path);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "rpc: method path");
    m[srv->n_methods++] = (kvl__rpc_method){.path = p, .kind = kind, .fn = handler, .user = user};
    return KVL_OK;
}

int kvl__rpc_server_port(const kvl__rpc_server *srv) { return srv ? srv->port : -1; }

int kvl__rpc_server_active_calls(const kvl__rpc_server *srv) {
    kvl__rpc_server *s = (kvl__rpc_server *)srv;
    pthread_mutex_lock(&s->mu);
    int n = s->active;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Post one grpc_server_request_call slot.  Called with srv->mu NOT held. */
static void post_request(kvl__rpc_server *srv) {
    kvl__rpc_call *c = calloc(1, sizeof *c);
    if (!c) return;   /* the remaining slots keep accepting */
    c->srv = srv;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;   /* the send's stall bound is timed on it: a wall-clock step must not end a call */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    c->t_new = (kvl__rpc_tag){TAG_NEW_CALL, c};
    c->t_recv = (kvl__rpc_tag){TAG_RECV_MSG, c};
    c->t_close = (kvl__rpc_tag){TAG_RECV_CLOSE, c};
    c->t_send = (kvl__rpc_tag){TAG_SEND, c};
    c->refs = 1;   /* the request slot */
    pthread_mutex_lock(&srv->mu);
    srv->n_calls++;
    srv->n_requests++;
    pthread_mutex_unlock(&srv->mu);
    grpc_call_error e = grpc_server_request_call(srv->server, &c->call, &c->details, &c->md,
                                                 srv->cq, srv->cq, &c->t_new);
    if (e != GRPC_CALL_OK) {
        pthread_mutex_lock(&srv->mu);
        srv->n_requests--;
        pthread_mutex_unlock(&srv->mu);
        kvl__rpc_call_unref(c);
    }
}


typedef enum { CALL_GENERAL = 0, CALL_CHECK = 1, CALL_WATCH = 2 } call_class;

typedef struct handler_job {
    kvl__rpc_call *call;
    uint8_t *req;
    size_t len;
    call_class cls;
} handler_job;

/* Worker threads outlive their call: a thread that finished waits up to KVL_RPC_IDLE_S to take
 * the poll role again, and at most KVL_RPC_IDLE_MAX wait at once, so a burst's threads go away
 * and a steady stream of calls creates none (a thread start costs tens of microseconds, an
 * appreciable part of a sub-millisecond call). */
#define KVL_RPC_IDLE_MAX 8
#define KVL_RPC_IDLE_S 30

/* srv->mu held: the call's place is given back */
static void release_slot(kvl__rpc_server *srv, call_class cls) {
    srv->active--;
    if (cls == CALL_CHECK) srv->n_check--;
    if (cls == CALL_WATCH) srv->n_watch--;
    pthread_cond_broadcast(&srv->cv);
}

static void run_job(handler_job *job) {
    kvl__rpc_call *c = job->call;
    kvl_clear_error();
    c->m->fn(c, job->req, job->len, c->m->user);
    if (!c->finished)
        kvl__rpc_call_finish(c, GRPC_STATUS_INTERNAL, "handler of %s did not reply", c->method);
    /* no cancel callback may run after the handler returned (rpc.h promise) */
    pthread_mutex_lock(&c->mu);
    c->cancel_fn = NULL;
    while (c->cancel_running) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    call_class cls = job->cls;
    free(job->req);
    free(job);
    kvl__rpc_server *srv = c->srv;
    pthread_mutex_lock(&srv->mu);
    release_slot(srv, cls);
    pthread_mutex_unlock(&srv->mu);
    kvl__rpc_call_unref(c);
}

static handler_job *poll_until_job(kvl__rpc_server *srv);

/* A worker: polls the queue until it receives a call's request, runs that call's handler (the
 * poll role went to another worker meanwhile), then waits to poll again or leaves.  The last
 * poller leaves when the queue is shut down. */
static void *worker_main(void *arg) {
    kvl__rpc_server *srv = arg;
    pthread_setname_np(pthread_self(), "rpc-worker");
    for (;;) {
        handler_job *job = poll_until_job(srv);
        if (!job) {
            pthread_mutex_lock(&srv->mu);
            srv->n_threads--;
            srv->poll_exited = 1;
            pthread_cond_broadcast(&srv->cv);
            pthread_mutex_unlock(&srv->mu);
            return NULL;
        }
        run_job(job);
        pthread_mutex_lock(&srv->mu);
        int poll = 0;
        if (srv->poll_wanted || (!srv->stopping && srv->n_idle < KVL_RPC_IDLE_MAX)) {
            srv->n_idle++;
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += KVL_RPC_IDLE_S;
            int rc = 0;
            while (!srv->poll_wanted && !srv->stopping && rc == 0)
                rc = pthread_cond_timedwait(&srv->work_cv, &srv->mu, &until);
            if (srv->poll_wanted) {
                /* the poller that passed the role on counted one idle worker out of n_idle */
                srv->poll_wanted = 0;
                poll = 1;
            } else {
                srv->n_idle--;
            }
        }
        if (!poll) {
            srv->n_threads--;
            pthread_cond_broadcast(&srv->cv);
            pthread_mutex_unlock(&srv->mu);
            return NULL;
        }
        pthread_mutex_unlock(&srv->mu);
    }
}

/* A new detached worker, which starts as the poller; srv->n_threads counts it already.
 * Returns 0, or -1 when no thread could be started. */
static int start_worker(kvl__rpc_server *srv) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, worker_main, srv);
    pthread_attr_destroy(&attr);
    return rc == 0 ? 0 : -1;
}

static const kvl__rpc_method *find_method(kvl__rpc_server *srv, const char *path) {
    for (int i = 0; i < srv->n_methods; i++)
        if (strcmp(srv->methods[i].path, path) == 0) return &srv->methods[i];
    return NULL;
}

static void on_new_call(kvl__rpc_server *srv, kvl__rpc_call *c, int ok) {
    pthread_mutex_lock(&srv->mu);
    srv->n_requests--;
    int stopping = srv->stopping;
    pthread_mutex_unlock(&srv->mu);
    if (!ok) {                       /* server shutting down: the slot is returned unused */
        kvl__rpc_call_unref(c);
        return;
    }
    if (!stopping) post_request(srv);
    c->method = kvl__rpc_slice_strdup(c->details.method);
    c->peer = grpc_call_get_peer(c->call);
    c->deadline = gpr_convert_clock_type(c->details.deadline, GPR_CLOCK_MONOTONIC);
    /* RECV_CLOSE_ON_SERVER completes when the call ends; its `cancelled` flag is how a server
     * learns about client cancellation, deadline expiry and dropped connections. */
    grpc_op close_op = {.op = GRPC_OP_RECV_CLOSE_ON_SERVER};
    close_op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
    if (grpc_call_start_batch(c->call, &close_op, 1, &c->t_close, NULL) != GRPC_CALL_OK) {
        pthread_mutex_lock(&c->mu);
        c->refs--;
        c->close_done = 1;
        c->cancelled = 1;
        pthread_mutex_unlock(&c->mu);
    }
    grpc_op recv_op = {.op = GRPC_OP_RECV_MESSAGE};
    recv_op.data.recv_message.recv_message = &c->recv_buf;
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
    if (grpc_call_start_batch(c->call, &recv_op, 1, &c->t_recv, NULL) != GRPC_CALL_OK) {
        kvl__rpc_call_unref(c);
        kvl__rpc_call_reject(c, GRPC_STATUS_INTERNAL, "cannot receive the request");
    }
    kvl__rpc_call_unref(c);   /* the request slot's ref */
}

/* The request of call `c` arrived (on the polling thread).  Returns the admitted call's job,
 * which this thread runs once it has passed the poll role on, or NULL (answered here). */
static handler_job *on_request_message(kvl__rpc_server *srv, kvl__rpc_call *c, int ok) {
    if (!ok || !c->recv_buf) {
        kvl__rpc_call_reject(c, GRPC_STATUS_INVALID_ARGUMENT, "expected one request message");
        kvl__rpc_call_unref(c);
        return NULL;
    }
    c->m = find_method(srv, c->method);
    if (!c->m) {
        char msg[300];
        snprintf(msg, sizeof msg, "unknown method %s", c->method);
        kvl__rpc_call_reject(c, GRPC_STATUS_UNIMPLEMENTED, msg);
        kvl__rpc_call_unref(c);
        return NULL;
    }
    handler_job *job = calloc(1, sizeof *job);
    if (!job || kvl__rpc_bb_read(c->recv_buf, &job->req, &job->len) != KVL_OK) {
        free(job);
        kvl__rpc_call_reject(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot buffer the request");
        kvl__rpc_call_unref(c);
        return NULL;
    }
    grpc_byte_buffer_destroy(c->recv_buf);
    c->recv_buf = NULL;
    job->call = c;
    job->cls = c->m->fn == kvl__rpc_health_check ? CALL_CHECK
               : c->m->fn == kvl__rpc_health_watch ? CALL_WATCH : CALL_GENERAL;
    c->stall_ms = job->cls == CALL_CHECK && srv->send_stall_ms > KVL_RPC_CHECK_STALL_MS ? KVL_RPC_CHECK_STALL_MS
                                                                                        : srv->send_stall_ms;
    pthread_mutex_lock(&srv->mu);
    const char *why = NULL;
    if (job->cls == CALL_CHECK) {
        if (srv->n_check >= KVL_RPC_CHECK_SLOTS) why = "server busy: too many health checks at once";
    } else if (srv->active - srv->n_check >= srv->max_calls) {
        why = "server busy: too many calls";
    } else if (job->cls == CALL_WATCH && srv->n_watch >= KVL_RPC_WATCH_MAX) {
        why = "server busy: too many Health/Watch streams";
    }
    if (!why) {
        srv->active++;
        if (job->cls == CALL_CHECK) srv->n_check++;
        if (job->cls == CALL_WATCH) srv->n_watch++;
    }
    pthread_mutex_unlock(&srv->mu);
    if (why) {
        free(job->req);
        free(job);
        kvl__rpc_call_reject(c, GRPC_STATUS_RESOURCE_EXHAUSTED, why);
        kvl__rpc_call_unref(c);
        return NULL;
    }
    /* the recv ref becomes the handler's ref.  The handler runs on this thread, which has the
     * request in hand: handing it to another thread put a wake-up (40-60 us on a 2-vCPU host,
     * measured per call) on the call's path.  The poll role goes to an idle worker, else to a
     * new one, and that wake-up overlaps the handler. */
    pthread_mutex_lock(&srv->mu);
    if (srv->n_idle > 0) {
        srv->n_idle--;
        srv->poll_wanted = 1;
        pthread_cond_signal(&srv->work_cv);
        pthread_mutex_unlock(&srv->mu);
        return job;
    }
    srv->n_threads++;
    pthread_mutex_unlock(&srv->mu);
    if (start_worker(srv) == 0) return job;
    /* no thread to poll while this one runs the handler: the call is refused, this thread polls on */
    pthread_mutex_lock(&srv->mu);
    srv->n_threads--;
    release_slot(srv, job->cls);
    pthread_mutex_unlock(&srv->mu);
    free(job->req);
    free(job);
    kvl__rpc_call_reject(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot start a worker thread");
    kvl__rpc_call_unref(c);
    return NULL;
}

/* After the shutdown tag and the last call, the queue can be shut down: the poller then sees
 * GRPC_QUEUE_SHUTDOWN and exits.  Called after every event and whenever a call is destroyed
 * (the last unref may happen on a handler thread). */
void kvl__rpc_server_maybe_close_cq(kvl__rpc_server *srv) {
    pthread_mutex_lock(&srv->mu);
    int done = srv->shutdown_done && srv->n_calls == 0 && srv->n_requests == 0 && !srv->freed_cq;
    if (done) srv->freed_cq = 1;
    pthread_mutex_unlock(&srv->mu);
    if (done) grpc_completion_queue_shutdown(srv->cq);
}

/* The poll role: take the queue's events until one is an admitted call's request (its job is
 * returned, the role passed on) or the queue is shut down (NULL). */
static handler_job *poll_until_job(kvl__rpc_server *srv) {
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                                   NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) return NULL;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        kvl__rpc_tag *tag = ev.tag;
        kvl__rpc_call *c = tag->call;
        switch (tag->kind) {
        case TAG_NEW_CALL: on_new_call(srv, c, ev.success); break;
        case TAG_RECV_MSG: {
            handler_job *job = on_request_message(srv, c, ev.success);
            if (job) return job;
            break;
        }
        case TAG_RECV_CLOSE:
            if (c->close_cancelled) kvl__rpc_call_mark_cancelled(c);
            pthread_mutex_lock(&c->mu);
            c->close_done = 1;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
            kvl__rpc_call_unref(c);
            break;
        case TAG_SEND:
            /* mark first: once send_pending drops, the waiting handler may return and the
             * call may be destroyed, so `c` must not be touched after the unlock below */
            if (!ev.success) kvl__rpc_call_mark_cancelled(c);
            pthread_mutex_lock(&c->mu);
            c->send_pending = 0;
            c->send_ok = ev.success;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
            break;
        case TAG_REJECT: kvl__rpc_call_unref(c); break;
        case TAG_SHUTDOWN:
            pthread_mutex_lock(&srv->mu);
            srv->shutdown_done = 1;
            pthread_cond_broadcast(&srv->cv);
            pthread_mutex_unlock(&srv->mu);
            break;
        }
        kvl__rpc_server_maybe_close_cq(srv);
    }
}

kvl_status kvl__rpc_server_start(kvl__rpc_server *srv) {
    if (!srv) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: NULL server");
    if (srv->started) return KVL_OK;
    grpc_server_start(srv->server);
    srv->started = 1;
    for (int i = 0; i < KVL_RPC_ACCEPT_SLOTS; i++) post_request(srv);
    pthread_mutex_lock(&srv->mu);
    srv->n_threads++;
    pthread_mutex_unlock(&srv->mu);
    if (start_worker(srv) != 0) {
        pthread_mutex_lock(&srv->mu);
        srv->n_threads--;
        pthread_mutex_unlock(&srv->mu);
        srv->started = 0;
        return kvl__errorf(KVL_ERR_INTERNAL, "rpc: cannot start the poller thread");
    }
    return KVL_OK;
}

void kvl__rpc_server_shutdown(kvl__rpc_server *srv, int64_t grace_ms) {
    if (!srv) return;
    pthread_mutex_lock(&srv->mu);
    if (srv->stopping) {
        pthread_mutex_unlock(&srv->mu);
        return;
    }
    srv->stopping = 1;
    for (int i = 0; i < srv->n_health; i++) srv->health[i].serving = 0;
    pthread_cond_broadcast(&srv->cv);
    pthread_cond_broadcast(&srv->work_cv);   /* idle workers exit (one passed the poll role polls) */
    pthread_mutex_unlock(&srv->mu);
    if (!srv->started) {
        /* a server that bound its port but never started (a later start-up step failed) must
         * still be shut down before it is destroyed; with no poller, the notification stays in
         * the queue that kvl__rpc_server_free drains */
        if (srv->server && srv->port > 0) grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->t_shutdown);
        return;
    }
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->t_shutdown);
    /* grace period: let running handlers answer */
    int64_t until = kvl__now_ms() + (grace_ms > 0 ? grace_ms : 0);
    pthread_mutex_lock(&srv->mu);
    while (srv->active > 0 && kvl__now_ms() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&srv->cv, &srv->mu, &ts);
    }
    pthread_mutex_unlock(&srv->mu);
    grpc_server_cancel_all_calls(srv->server);
    /* the queue shuts down once every call is gone; its last poller then leaves */
    pthread_mutex_lock(&srv->mu);
    while (!srv->poll_exited) pthread_cond_wait(&srv->cv, &srv->mu);
    pthread_mutex_unlock(&srv->mu);
    srv->started = 0;
}

void kvl__rpc_server_free(kvl__rpc_server *srv) {
    if (!srv) return;
    kvl__rpc_server_shutdown(srv, 0);
    /* idle workers hold no call but wait on srv: they leave at once on stopping */
    pthread_mutex_lock(&srv->mu);
    while (srv->n_threads > srv->active) pthread_cond_wait(&srv->cv, &srv->mu);
    pthread_mutex_unlock(&srv->mu);
    if (srv->server) grpc_server_destroy(srv->server);
    if (srv->quota) grpc_resource_quota_unref(srv->quota);   /* the server took its own ref */
    if (srv->cq) {
        if (!srv->freed_cq) {
            grpc_completion_queue_shutdown(srv->cq);
            while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
                       .type != GRPC_QUEUE_SHUTDOWN) {
            }
        }
        grpc_completion_queue_destroy(srv->cq);
    }
    for (int i = 0; i < srv->n_methods; i++) free(srv->methods[i].path);
    free(srv->methods);
    kvl__rpc_health_free(srv);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cv);
    pthread_cond_destroy(&srv->work_cv);
    free(srv);
    kvl__rpc_shutdown();
}
