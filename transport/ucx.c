/* transport/ucx.c: the UCX (UCP tag API) transport.  One context and one worker per transport;
 * a progress thread drives the worker, and every ucp_* call is made under one mutex (the worker
 * is created UCS_THREAD_MODE_SERIALIZED: our mutex does the serialising, which is cheaper than
 * UCX's MULTI mode locks).  A thread waiting for its request drives the worker itself; the
 * progress thread sleeps meanwhile and drives it only while nobody waits.
 *
 * Failure handling.  Endpoints default to UCP_ERR_HANDLING_MODE_NONE because UCX 1.13 has no
 * peer-failure handler for its shared-memory transports (sysv, posix): asking for
 * UCP_ERR_HANDLING_MODE_PEER makes UCX move same-host traffic to TCP on loopback, at about half
 * the bandwidth.  A dead peer is detected instead by (a) the gRPC ImportSpan call that brackets
 * every transfer (its cancellation cancels the receive), and (b) the send deadline, after which
 * the endpoint is force-closed, which completes its requests.  KVL_UCX_ERR_MODE=peer selects
 * UCX's own failure detection for fleets where the transports support it (RDMA, TCP). */
#include "ucx_internal.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "clock.h"
#include "error.h"



/* Unexpected messages (no posted receive matched their tag: a guessed tag, or a transfer whose
 * import already ended) would stay in UCX's unexpected queue for ever; they are received into
 * one scratch buffer (a longer one is truncated, which releases it too) and dropped.  Bounded
 * work per pass so that a flood cannot starve the worker. */
#define DRAIN_SCRATCH (64 * 1024)
#define DRAIN_PER_PASS 256
#define DRAIN_IN_FLIGHT 64
/* A drain not done after this long matched a message whose sender died mid-way: it may never
 * complete, so it stops counting against DRAIN_IN_FLIGHT and as work due (else a few dead
 * senders would stop all draining, and keep the progress thread polling for ever). */
#define DRAIN_STUCK_S 10.0

typedef struct drain_op {
    ucx_transport *u;
    double t0;                   /* when it was posted (kvl__now_s) */
    int stuck;
    struct drain_op *next;
} drain_op;

static void drain_unexpected(ucx_transport *u);

/* cv waits on CLOCK_MONOTONIC (see kvl__transport_ucx_create): a step of the wall clock does
 * not stretch a 1 ms wait. */
static void cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    while (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

/* Progress, for what no waiting thread drives: a posted receive whose owner is elsewhere (a
 * pull in push mode is in its gRPC call), wire-up requests from peers, unexpected messages.
 * While a thread waits in wait_op it drives the worker and this thread sleeps: two threads
 * spinning on one worker would take both cores of a small node from its forward pass and
 * translation.  With requests in flight and nothing to do, it naps 50 us between polls (the
 * delay a peer's rendezvous start can see); with none, 1 ms while the worker was in use (this
 * thread found work, or another thread drove it) in the last PROGRESS_QUIET_S, else
 * PROGRESS_IDLE_US: a node nobody sends to wakes 100 times a second, not 1,000 (measured: an
 * idle kvld took 1.4% of a core, 0.4% now; each wake-up also took its core from a running
 * forward pass for a moment).  What only this thread drives then waits that much longer once:
 * the first message of a peer's wire-up or of a stray sender. */
#define PROGRESS_QUIET_S 0.1
#define PROGRESS_IDLE_US 10000

static void *progress_main(void *arg) {
    ucx_transport *u = arg;
    pthread_setname_np(pthread_self(), "ucx-progress");
    int idle = 0;
    double last_busy = kvl__now_s();
    pthread_mutex_lock(&u->mu);
    while (!u->stop) {
        if (u->waiters > 0) {   /* a thread drives the worker: it is in use */
            last_busy = kvl__now_s();
            cond_wait_ms(&u->cv, &u->mu, 1);
            continue;
        }
        /* in batches, so that a message nobody posted a receive for is matched and dropped
         * while it streams in, not kept fragment by fragment until the stream ends */
        unsigned n = 0;
        while (n < 64 && ucp_worker_progress(u->worker)) n++;
        drain_unexpected(u);
        int busy = u->outstanding - u->n_orphans - u->n_stuck > 0;
        pthread_mutex_unlock(&u->mu);
        const double now = kvl__now_s();
        if (busy || n > 0) last_busy = now;
        if (busy && n > 0) {
            idle = 0;
            sched_yield();
        } else if (busy) {
            if (++idle > 16) usleep(50);
            else sched_yield();
        } else {
            idle = 0;
            usleep(now - last_busy < PROGRESS_QUIET_S ? 1000 : PROGRESS_IDLE_US);
        }
        pthread_mutex_lock(&u->mu);
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

/* Callbacks run inside ucp_worker_progress, i.e. with u->mu held. */
static void complete(ucx_transport *u, ucx_op *op, ucs_status_t status, void *request) {
    op->status = status;
    op->done = 1;
    op->req = NULL;
    u->outstanding--;
    ucp_request_free(request);
    pthread_cond_broadcast(&u->cv);
}

/* user_data of every request: the op and its transport (callbacks get only user_data). */
typedef struct op_with_t {
    ucx_op op;
    ucx_transport *u;
    int orphan;   /* given up on: the callback (or ucx_free) frees it */
    struct op_with_t *next_orphan;
    void *buf;                          /* the send's or receive's buffer                       */
    kvl__transport_release_fn release;  /* an orphan's buffer goes back through it (or NULL)    */
    void *release_arg;
} op_with_t;

/* mu held: forget an orphan that completed */
static void unlink_orphan(ucx_transport *u, op_with_t *o);

static void send_cb(void *request, ucs_status_t status, void *user_data) {
    op_with_t *o = user_data;
    complete(o->u, &o->op, status, request);
    if (o->orphan) {   /* the send outlived its call: its buffer goes back now */
        unlink_orphan(o->u, o);
        if (o->release) o->release(o->release_arg, o->buf);
        free(o);
    }
}

static void recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                    void *user_data) {
    op_with_t *o = user_data;
    if (status == UCS_OK && info) o->op.length = info->length;
    complete(o->u, &o->op, status, request);
    if (o->orphan) {   /* abandoned by ucx_recv_free: its buffer was never reused, and goes back now */
        unlink_orphan(o->u, o);
        if (o->release) o->release(o->release_arg, o->buf);
        free(o);
    }
}

static void drain_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                     void *user_data) {
    drain_op *d = user_data;
    ucx_transport *u = d->u;
    u->outstanding--;
    if (d->stuck) u->n_stuck--;
    else u->drains--;
    for (drain_op **pp = &u->drain_list; *pp; pp = &(*pp)->next)
        if (*pp == d) { *pp = d->next; break; }
    free(d);
    __atomic_add_fetch(&u->base.unmatched_dropped, 1, __ATOMIC_RELAXED);
    ucp_request_free(request);
}

/* mu held: drains posted more than DRAIN_STUCK_S ago stop counting as in flight.  The list is
 * newest first, so the walk ends at the first one marked already: the rest are older. */
static void mark_stuck_drains(ucx_transport *u, double now) {
    for (drain_op *d = u->drain_list; d && !d->stuck; d = d->next)
        if (now - d->t0 > DRAIN_STUCK_S) {
            d->stuck = 1;
            u->drains--;
            u->n_stuck++;
        }
}

/* mu held */
static void drain_unexpected(ucx_transport *u) {
    if (u->drain_list) mark_stuck_drains(u, kvl__now_s());
    for (int i = 0; i < DRAIN_PER_PASS && u->drains < DRAIN_IN_FLIGHT; i++) {
        drain_op *d = calloc(1, sizeof *d);   /* before the probe, which takes the message */
        if (!d) return;                       /* the message waits for the next pass */
        ucp_tag_recv_info_t info;
        ucp_tag_message_h m = ucp_tag_probe_nb(u->worker, 0, 0, 1, &info);
        if (!m) {
            free(d);
            return;
        }
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof prm);
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        prm.cb.recv = drain_cb;
        prm.user_data = d;
        d->u = u;
        d->t0 = kvl__now_s();
        /* listed and counted before the call: its callback may run inside it (a message longer
         * than the scratch ends at once, truncated), and then unlists, uncounts and frees it */
        d->next = u->drain_list;
        u->drain_list = d;
        u->outstanding++;
        u->drains++;
        ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(u->worker, u->scratch, DRAIN_SCRATCH, m, &prm);
        if (r == NULL || UCS_PTR_IS_ERR(r)) {   /* done at once (no callback), or refused: gone either way */
            for (drain_op **pp = &u->drain_list; *pp; pp = &(*pp)->next)
                if (*pp == d) { *pp = d->next; break; }
            free(d);
            u->outstanding--;
            u->drains--;
            __atomic_add_fetch(&u->base.unmatched_dropped, 1, __ATOMIC_RELAXED);
        }
    }
}

static void ucx_free(kvl__transport *t);

/* Eager or rendezvous.  UCX's own threshold ("auto") sends a span of more than a few KB by
 * rendezvous: the sender announces it, the receiver answers, then the data moves, each step
 * waiting for the other process's progress loop.  Between two nodes on one host that exchange
 * cost more than the data: measured on a 2-core host (bench_switch.py, qwen3-a -> qwen3-b,
 * medians of 9, two runs each), the target's wait for the whole span was 0.63-0.66 ms for a
 * 64-token span of 131 KB, 0.64-0.75 ms at 512 tokens (1 MB) and 1.53-1.77 ms at 2048 (4.2 MB),
 * against 0.05-0.06, 0.24-0.31 and 0.86-1.09 ms sent eagerly (copied through the shared-memory
 * segments as the receiver takes them).  With CMA left out (below), larger spans gain too, so
 * the limit is 32 MB there: qwen3-b -> qwen3-a at 2048 tokens (a 12.6 MB span) switched in
 * 14.2-15.0 ms by rendezvous, 10.0-11.3 ms eagerly, and a 50 MB span of Qwen2.5-0.5B's shape
 * waited 10.2-11.6 ms against 5.1-5.9 (same host; between hosts over TCP not measured).  The
 * limit bounds what one message a receiver has no receive for can make UCX hold before
 * drain_unexpected matches it (its fragments are kept until then; the progress loop below
 * drains between bounded batches): spans past it, a large model's long context, go by
 * rendezvous, whose announcement alone waits.  With CMA in use (the operator's UCX_TLS, or peer
 * failure handling) it stays 8 MB.  Where an RDMA device is present, rendezvous is how a span
 * moves without copies between hosts, so UCX's threshold stays.  UCX_RNDV_THRESH in the
 * environment overrides all of these. */
#define KVL_UCX_EAGER_MAX "32mb"
#define KVL_UCX_EAGER_MAX_CMA "8mb"

static int rdma_device_present(void) {
    DIR *d = opendir("/sys/class/infiniband");
    if (!d) return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) found = e->d_name[0] != '.';
    closedir(d);
    return found;
}

static void ucx_address(const kvl__transport *t, const uint8_t **addr, size_t *len) {
    const ucx_transport *u = (const ucx_transport *)t;
    *addr = (const uint8_t *)u->addr;
    *len = u->addr_len;
}

/* How long a cancelled receive may take to complete before it is abandoned. */
#ifndef KVL_UCX_CANCEL_WAIT_MS
#define KVL_UCX_CANCEL_WAIT_MS 2000
#endif

/* Wait (mu held) until op done, cancel requested or deadline; cancels a receive on the way out,
 * so that, once op->done, `op` and its buffer are free to reuse (a receive still not done after
 * KVL_UCX_CANCEL_WAIT_MS is the caller's to abandon). */
static kvl_status wait_op(ucx_transport *u, ucx_op *op, int64_t timeout_ms,
                          const volatile int *cancel, const char *what, int is_recv) {
    int64_t until = timeout_ms > 0 ? kvl__now_ms() + timeout_ms : INT64_MAX;
    kvl_status st = KVL_OK;
    unsigned idle = 0;
    u->waiters++;
    while (!op->done) {
        if (cancel && *cancel) {
            st = kvl__errorf(KVL_ERR_CANCELLED, "transport: %s cancelled", what);
            break;
        }
        if ((idle & 255) == 0 && kvl__now_ms() >= until) {
            st = kvl__errorf(KVL_ERR_IO, "transport: %s timed out after %lld ms", what,
                            (long long)timeout_ms);
            break;
        }
        /* the waiting thread drives the worker itself: handing progress to another thread
         * would add a wake-up to every message */
        if (ucp_worker_progress(u->worker) || op->done) {
            idle = 0;
            continue;
        }
        idle++;
        /* the progress thread sleeps while this one waits: drop what nobody will receive here */
        if ((idle & 63) == 1) drain_unexpected(u);
        pthread_mutex_unlock(&u->mu);
        if (idle > 20000) usleep(100);   /* nothing for a while (peer not sending yet) */
        else sched_yield();
        pthread_mutex_lock(&u->mu);
    }
    /* receives can be cancelled; a send in flight is ended by force-closing its endpoint
     * (ucx_send), since UCX cannot cancel a rendezvous send.  A receive that already matched
     * a message cannot be cancelled either: it completes when the message does, and a sender
     * killed mid-message never finishes it (seen: a kvld importing a span waited forever
     * after its source was killed during the transfer).  So the wait is bounded; the caller
     * (ucx_recv_free) abandons a receive still pending after it. */
    if (is_recv && !op->done && op->req) {
        ucp_request_cancel(u->worker, op->req);
        const int64_t give_up = kvl__now_ms() + KVL_UCX_CANCEL_WAIT_MS;
        while (!op->done && kvl__now_ms() < give_up) {
            ucp_worker_progress(u->worker);
            if (!op->done) cond_wait_ms(&u->cv, &u->mu, 1);
        }
    }
    if (--u->waiters == 0) pthread_cond_broadcast(&u->cv);   /* the progress thread resumes */
    return st;
}

static kvl_status ucx_recv_post(kvl__transport *t, uint64_t tag, void *buf, size_t len,
                                kvl__transport_recv **out) {
    ucx_transport *u = (ucx_transport *)t;
    op_with_t *o = calloc(1, sizeof *o);
    if (!o) return kvl__errorf(KVL_ERR_NOMEM, "transport: recv");
    o->u = u;
    o->buf = buf;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    prm.cb.recv = recv_cb;
    prm.user_data = o;
    pthread_mutex_lock(&u->mu);
    ucs_status_ptr_t r = ucp_tag_recv_nbx(u->worker, buf, len, tag, (ucp_tag_t)-1, &prm);
    if (UCS_PTR_IS_ERR(r)) {
        pthread_mutex_unlock(&u->mu);
        free(o);
        return kvl__errorf(KVL_ERR_IO, "transport: ucp_tag_recv_nbx: %s",
                          ucs_status_string(UCS_PTR_STATUS(r)));
    }
    u->outstanding++;
    o->op.req = r;
    pthread_mutex_unlock(&u->mu);
    /* op_with_t starts with the ucx_op, so the handle type is the same allocation */
    *out = (kvl__transport_recv *)o;
    return KVL_OK;
}

static kvl_status ucx_recv_wait(kvl__transport *t, kvl__transport_recv *r, int64_t timeout_ms,
                                const volatile int *cancel, size_t *received) {
    ucx_transport *u = (ucx_transport *)t;
    *received = 0;
    pthread_mutex_lock(&u->mu);
    kvl_status st = wait_op(u, &r->op, timeout_ms, cancel, "receive", 1);
    ucs_status_t us = r->op.status;
    size_t got = r->op.length;
    pthread_mutex_unlock(&u->mu);
    if (st != KVL_OK) return st;
    if (us == UCS_ERR_MESSAGE_TRUNCATED)
        return kvl__errorf(KVL_ERR_RANGE, "transport: payload larger than announced");
    if (us != UCS_OK)
        return kvl__errorf(KVL_ERR_IO, "transport: receive failed: %s", ucs_status_string(us));
    *received = got;
    return KVL_OK;
}

/* Drive the worker until the receive completes or wait_us passes; never cancels it (the caller
 * is watching something else as well, and comes back). */
static int ucx_recv_poll(kvl__transport *t, kvl__transport_recv *r, int64_t wait_us) {
    ucx_transport *u = (ucx_transport *)t;
    const double until = kvl__now_s() + (double)wait_us * 1e-6;
    unsigned idle = 0;
    pthread_mutex_lock(&u->mu);
    u->waiters++;
    while (!r->op.done) {
        /* the time is looked at on every pass: a worker kept busy by other transfers (or a
         * flood) must not hold a caller that asked for one look */
        if (ucp_worker_progress(u->worker) || r->op.done) {
            idle = 0;
            if (r->op.done || kvl__now_s() >= until) break;
            continue;
        }
        if (kvl__now_s() >= until) break;
        /* the progress thread sleeps while this one waits (wait_op) */
        if ((++idle & 63) == 1) drain_unexpected(u);
        pthread_mutex_unlock(&u->mu);
        sched_yield();
        pthread_mutex_lock(&u->mu);
    }
    const int done = r->op.done;
    if (--u->waiters == 0) pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    return done;
}

static void unlink_orphan(ucx_transport *u, op_with_t *o) {
    for (op_with_t **pp = &u->orphans; *pp; pp = &(*pp)->next_orphan) {
        if (*pp == o) {
            *pp = o->next_orphan;
            u->n_orphans--;
            return;
        }
    }
}

static int ucx_recv_free(kvl__transport *t, kvl__transport_recv *r, kvl__transport_release_fn release,
                         void *release_arg) {
    ucx_transport *u = (ucx_transport *)t;
    pthread_mutex_lock(&u->mu);
    static const int yes = 1;
    wait_op(u, &r->op, 0, &yes, "receive", 1);
    const int done = r->op.done;
    if (!done) {   /* matched, and its sender stopped mid-message: the callback frees it */
        op_with_t *o = (op_with_t *)r;
        o->release = release;
        o->release_arg = release_arg;
        o->orphan = 1;
        o->next_orphan = u->orphans;
        u->orphans = o;
        u->n_orphans++;
        __atomic_add_fetch(&u->base.receives_abandoned, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&u->mu);
    if (done) free(r);
    return done;
}

/* One request on the endpoint to `addr`, waited for: a tagged send of buf[0..len), or (flush)
 * an endpoint flush, which completes once the endpoint's lanes are wired up with the peer. */
static kvl_status peer_op(ucx_transport *u, const uint8_t *addr, size_t addr_len, int flush,
                          uint64_t tag, const void *buf, size_t len, int64_t timeout_ms,
                          const volatile int *cancel, kvl__transport_release_fn release,
                          void *release_arg, int *kept) {
    const char *what = flush ? "connect" : "send";
    /* cancelled before it started: nothing is sent.  Checked here, not only in wait_op, since
     * an eager send the peer takes at once completes inside ucp_tag_send_nbx (its callback
     * runs there), and the wait then never looks at the flag */
    if (cancel && *cancel) return kvl__errorf(KVL_ERR_CANCELLED, "transport: %s cancelled", what);
    /* heap-allocated: if the peer stalls, the request may outlive this call (see orphan) */
    op_with_t *o = calloc(1, sizeof *o);
    if (!o) return kvl__errorf(KVL_ERR_NOMEM, "transport: %s", what);
    o->u = u;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       (flush ? 0 : UCP_OP_ATTR_FLAG_NO_IMM_CMPL);
    prm.cb.send = send_cb;
    prm.user_data = o;
    pthread_mutex_lock(&u->mu);
    ucx_peer *p = NULL;
    kvl_status st = kvl__ucx_get_peer(u, addr, addr_len, &p);
    if (st != KVL_OK) {
        pthread_mutex_unlock(&u->mu);
        free(o);
        return st;
    }
    ucs_status_ptr_t r = flush ? ucp_ep_flush_nbx(p->ep, &prm) : ucp_tag_send_nbx(p->ep, buf, len, tag, &prm);
    if (r == NULL) {   /* a flush with nothing to wait for */
        pthread_mutex_unlock(&u->mu);
        free(o);
        return KVL_OK;
    }
    const uint64_t peer_id = p->id;   /* p itself is not used after the wait: mu is released there */
    if (UCS_PTR_IS_ERR(r)) {
        kvl__ucx_drop_peer(u, peer_id);
        pthread_mutex_unlock(&u->mu);
        free(o);
        return kvl__errorf(KVL_ERR_IO, "transport: %s to peer failed: %s", what,
                          ucs_status_string(UCS_PTR_STATUS(r)));
    }
    u->outstanding++;
    o->op.req = r;
    p->busy++;
    st = wait_op(u, &o->op, timeout_ms, cancel, what, 0);
    kvl__ucx_peer_idle(u, peer_id);
    if (st == KVL_OK && o->op.status != UCS_OK) {
        st = kvl__errorf(KVL_ERR_IO, "transport: %s failed (peer gone?): %s", what,
                        ucs_status_string(o->op.status));
        kvl__ucx_drop_peer(u, peer_id);
    } else if (st != KVL_OK) {
        /* timed out or cancelled: the peer stopped taking data; end the request by closing
         * the endpoint, and never reuse it */
        kvl__ucx_drop_peer(u, peer_id);
    }
    if (o->op.done) {
        free(o);
    } else {
        /* force-closing the endpoint does not end a send over shared memory: a peer that
         * resumes takes the rest from buf, which therefore stays the transport's until then */
        o->buf = (void *)buf;
        o->release = release;
        o->release_arg = release_arg;
        if (kept) *kept = 1;
        __atomic_add_fetch(&u->base.sends_kept, 1, __ATOMIC_RELAXED);
        o->orphan = 1;
        o->next_orphan = u->orphans;
        u->orphans = o;
        u->n_orphans++;
    }
    pthread_mutex_unlock(&u->mu);
    return st;
}

static kvl_status ucx_send(kvl__transport *t, const uint8_t *addr, size_t addr_len, uint64_t tag,
                           const void *buf, size_t len, int64_t timeout_ms,
                           const volatile int *cancel, kvl__transport_release_fn release,
                           void *release_arg, int *kept) {
    return peer_op((ucx_transport *)t, addr, addr_len, 0, tag, buf, len, timeout_ms, cancel, release,
                   release_arg, kept);
}

/* Create the endpoint and flush it: the wire-up the first send would otherwise wait for. */
static kvl_status ucx_connect(kvl__transport *t, const uint8_t *addr, size_t addr_len,
                              int64_t timeout_ms) {
    return peer_op((ucx_transport *)t, addr, addr_len, 1, 0, NULL, 0, timeout_ms, NULL, NULL, NULL, NULL);
}

static const kvl__transport_ops ucx_ops = {
    .kind = "ucx",
    .free = ucx_free,
    .address = ucx_address,
    .recv_post = ucx_recv_post,
    .recv_wait = ucx_recv_wait,
    .recv_poll = ucx_recv_poll,
    .recv_free = ucx_recv_free,
    .send = ucx_send,
    .connect = ucx_connect,
};

kvl_status kvl__transport_ucx_create(kvl__transport **out) {
    ucx_transport *u = calloc(1, sizeof *u);
    if (!u) return kvl__errorf(KVL_ERR_NOMEM, "transport: ucx");
    u->base.ops = &ucx_ops;
    pthread_mutex_init(&u->mu, NULL);
    if (!(u->scratch = malloc(DRAIN_SCRATCH))) {
        pthread_mutex_destroy(&u->mu);
        free(u);
        return kvl__errorf(KVL_ERR_NOMEM, "transport: ucx scratch buffer");
    }
    pthread_condattr_t ca;   /* cond_wait_ms waits on the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&u->cv, &ca);
    pthread_condattr_destroy(&ca);
    const char *em = getenv("KVL_UCX_ERR_MODE");
    u->err_mode_peer = em && strcmp(em, "peer") == 0;
    const char *mp = getenv("KVL_UCX_MAX_PEERS");
    long maxp = mp ? strtol(mp, NULL, 10) : 0;
    u->max_peers = maxp >= 1 && maxp <= 1000000 ? (int)maxp : KVL_UCX_MAX_PEERS_DEFAULT;
    ucp_config_t *cfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        ucx_free(&u->base);
        return kvl__errorf(KVL_ERR_IO, "transport: ucp_config_read: %s", ucs_status_string(s));
    }
    /* Without failure handling (above), a CMA zero-copy read from a peer that died in the middle
     * of a transfer is a fatal error in UCX 1.13 (process_vm_readv fails and UCX aborts the
     * reader): a source killed mid-export would take its target down with it.  So CMA is left
     * out unless the operator names the transports (UCX_TLS) or asks for failure handling;
     * same-host spans then go through shared memory, a dead peer's transfer stalls, and the
     * send deadline and the ImportSpan call end it as for any other peer. */
    const int no_cma = !u->err_mode_peer && !getenv("UCX_TLS");
    if (no_cma) {
        s = ucp_config_modify(cfg, "TLS", "^cma");
        if (s != UCS_OK) {
            ucp_config_release(cfg);
            ucx_free(&u->base);
            return kvl__errorf(KVL_ERR_IO, "transport: ucp_config_modify(TLS=^cma): %s",
                               ucs_status_string(s));
        }
    }
    /* Spans up to KVL_UCX_EAGER_MAX go eagerly where no RDMA device is present (see above). */
    if (!getenv("UCX_RNDV_THRESH") && !rdma_device_present()) {
        const char *eager = no_cma ? KVL_UCX_EAGER_MAX : KVL_UCX_EAGER_MAX_CMA;
        s = ucp_config_modify(cfg, "RNDV_THRESH", eager);
        if (s != UCS_OK) {
            ucp_config_release(cfg);
            ucx_free(&u->base);
            return kvl__errorf(KVL_ERR_IO, "transport: ucp_config_modify(RNDV_THRESH=%s): %s", eager,
                               ucs_status_string(s));
        }
    }
    ucp_params_t prm;
    memset(&prm, 0, sizeof prm);
    prm.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    prm.features = UCP_FEATURE_TAG;
    prm.mt_workers_shared = 0;
    s = ucp_init(&prm, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) {
        u->ctx = NULL;
        ucx_free(&u->base);
        return kvl__errorf(KVL_ERR_IO, "transport: ucp_init: %s", ucs_status_string(s));
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    s = ucp_worker_create(u->ctx, &wp, &u->worker);
    if (s != UCS_OK) {
        u->worker = NULL;
        ucx_free(&u->base);
        return kvl__errorf(KVL_ERR_IO, "transport: ucp_worker_create: %s", ucs_status_string(s));
    }
    s = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len);
    if (s != UCS_OK) {
        u->addr = NULL;
        ucx_free(&u->base);
        return kvl__errorf(KVL_ERR_IO, "transport: ucp_worker_get_address: %s",
                          ucs_status_string(s));
    }
    if (pthread_create(&u->progress, NULL, progress_main, u) != 0) {
        ucx_free(&u->base);
        return kvl__errorf(KVL_ERR_INTERNAL, "transport: cannot start the progress thread");
    }
    u->progress_started = 1;
    *out = &u->base;
    return KVL_OK;
}

static void ucx_free(kvl__transport *t) {
    ucx_transport *u = (ucx_transport *)t;
    if (u->progress_started) {
        pthread_mutex_lock(&u->mu);
        u->stop = 1;
        pthread_mutex_unlock(&u->mu);
        pthread_join(u->progress, NULL);
    }
    kvl__ucx_drop_all_peers(u);
    if (u->addr) ucp_worker_release_address(u->worker, u->addr);
    if (u->worker) ucp_worker_destroy(u->worker);
    /* the worker is gone, so no callback can touch the abandoned sends and receives any more */
    while (u->orphans) {
        op_with_t *o = u->orphans;
        u->orphans = o->next_orphan;
        if (o->release) o->release(o->release_arg, o->buf);
        free(o);
    }
    while (u->drain_list) {
        drain_op *d = u->drain_list;
        u->drain_list = d->next;
        free(d);
    }
    if (u->ctx) ucp_cleanup(u->ctx);
    pthread_mutex_destroy(&u->mu);
    pthread_cond_destroy(&u->cv);
    free(u->scratch);
    free(u);
}
