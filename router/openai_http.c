/* router/openai_http.c: the OpenAI-compatible HTTP server of kvlingo-router (libmicrohttpd).
 *
 * A thread per connection (MHD_USE_THREAD_PER_CONNECTION), bounded by http_max_connections, so
 * a turn that runs for seconds (a long prefill, a streamed reply) blocks only its own
 * connection.  A streamed reply runs its turn on a worker thread that writes server-sent
 * events into a buffer the connection thread drains (MHD_create_response_from_callback); the
 * response (and its x-kvlingo-* headers) is queued at the first token, so a turn that fails
 * before any token still gets a proper HTTP status and OpenAI error body.  A client that goes
 * away cancels its turn.  Request bodies are bounded (413 past http_max_body_bytes). */
#include "openai.h"
#include "http.h"
#include "router.h"
#include "log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "clock.h"
#include "error.h"

struct kvr_oai_http {
    struct MHD_Daemon *mhd;
    kvr_router *r;
    long max_body;
    int port;
};

enum { EP_NONE, EP_CHAT, EP_COMPLETIONS, EP_MODELS, EP_HEALTH, EP_READY };

/* How long a request's body may take to arrive, from its headers: a client trickling an
 * endless body is cut off (silent connections are closed after http_idle_timeout_seconds by MHD). */
#define KVR_OAI_UPLOAD_S 60.0

/* How often a stream's connection thread, idle until the turn's first token, looks whether
 * its client went away. */
#define KVR_OAI_HUP_POLL_MS 20

typedef struct conn {
    int ep;
    unsigned status;              /* of the response queued (for the metric)                 */
    struct kvr_oai_http *h;
    char *body;
    size_t len, cap;
    size_t seen;                  /* body bytes read, kept or not                            */
    int refused;                  /* a response went out before the body was read            */
    int too_large;                /* the body outgrew max_body: dropped, answered 413        */
    double t0;
    kvr_tenant_info tenant;       /* the caller (Authorization: Bearer KEY)                  */
} conn;

/* ---- plain responses ------------------------------------------------------------------------ */

/* The connection whose request this thread runs (a thread per connection): queue() records
 * the status there for the requests metric without threading it through every caller. */
static _Thread_local conn *tl_conn;

static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *resp) {
    if (tl_conn) tl_conn->status = status;
    return MHD_queue_response(c, status, resp);
}

static enum MHD_Result send_buf(struct MHD_Connection *c, unsigned status, char *body,
                                const char *type, const char *allow) {
    if (!body) return MHD_NO;   /* out of memory: MHD closes the connection */
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) { free(body); return MHD_NO; }
    MHD_add_response_header(resp, "Content-Type", type);
    if (allow) MHD_add_response_header(resp, "Allow", allow);
    enum MHD_Result ret = queue(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, const kvr_oai_error *e, const char *allow) {
    kvl__svc_log_text("warn", "openai: %d %s: %s", e->http, e->code[0] ? e->code : e->type, e->message);
    return send_buf(c, (unsigned)e->http, kvr_oai_error_json(e), "application/json", allow);
}

static void add_turn_headers(struct MHD_Response *resp, const kvr_oai_run *u) {
    char cached[24];
    snprintf(cached, sizeof cached, "%d", u->res.cached_tokens);
    MHD_add_response_header(resp, "x-kvlingo-session", kvr_session_client_id(u->sid));
    MHD_add_response_header(resp, "x-kvlingo-model", u->model);
    MHD_add_response_header(resp, "x-kvlingo-node", u->node);
    MHD_add_response_header(resp, "x-kvlingo-switch", u->mode);
    MHD_add_response_header(resp, "x-kvlingo-cached-tokens", cached);
}

static int model_known(void *arg, const char *name) { return kvr_registry_model_known(arg, name); }

/* ---- streaming: a worker runs the turn, the connection thread sends what it wrote ----------- */

typedef struct stream {
    kvr_router *r;
    kvr_oai_req q;
    char session[KVR_ID_MAX];
    int has_session;
    kvr_tenant_info tenant;
    kvr_oai_run run;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *buf;                    /* SSE bytes not yet sent                                  */
    size_t len, cap, off;
    int started, done, gone, oom, rc;
    int fd;                       /* the client's socket (-1: unknown)                       */
    kvr_turn_cancel cancel;       /* the client went away before the first token             */
} stream;

static int put_locked(stream *s, const char *a, size_t n) {
    if (s->off && s->off == s->len) s->off = s->len = 0;
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n) cap *= 2;
        char *b = realloc(s->buf, cap);
        if (!b) { s->oom = 1; return -1; }
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, a, n);
    s->len += n;
    return 0;
}

/* One event "data: JSON\n\n" (json is freed). */
static int put_event(stream *s, char *json) {
    if (!json) {
        pthread_mutex_lock(&s->mu);
        s->oom = 1;
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    pthread_mutex_lock(&s->mu);
    int rc = put_locked(s, "data: ", 6) || put_locked(s, json, strlen(json)) || put_locked(s, "\n\n", 2);
    int gone = s->gone;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(json);
    return rc || gone;
}

static int st_start(void *arg, const kvr_oai_run *u) {
    stream *s = arg;
    (void)u;
    int rc = put_event(s, kvr_oai_chunk(s->q.chat, &s->run.res, 1, s->q.chat ? "" : NULL, NULL,
                                        s->q.include_usage));
    pthread_mutex_lock(&s->mu);
    s->started = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int st_text(void *arg, const char *text, size_t len) {
    stream *s = arg;
    char *t = malloc(len + 1);
    if (!t) return 1;
    memcpy(t, text, len);
    t[len] = 0;
    int rc = put_event(s, kvr_oai_chunk(s->q.chat, &s->run.res, 0, t, NULL, s->q.include_usage));
    free(t);
    return rc;
}

static void *st_worker(void *arg) {
    stream *s = arg;
    kvr_oai_sink sink = {.on_start = st_start, .on_text = st_text, .arg = s, .names_session = 1,
                         .cancel = &s->cancel};
    int rc = kvr_oai_run_turn(s->r, &s->q, s->has_session ? s->session : NULL, &s->tenant, &sink, &s->run);
    if (!rc) {
        put_event(s, kvr_oai_chunk(s->q.chat, &s->run.res, 0, s->q.chat ? NULL : "", s->run.finish,
                                   s->q.include_usage));
        if (s->q.include_usage) put_event(s, kvr_oai_chunk(s->q.chat, &s->run.res, 0, NULL, NULL, 2));
    }
    if (rc && s->started) {
        /* the turn failed after its first token (a node went down mid-reply): the client
         * gets the error as an event, as OpenAI streams do, instead of a silent end */
        kvl__svc_log_text("warn", "openai: stream failed after its first token: %s", s->run.err.message);
        put_event(s, kvr_oai_error_json(&s->run.err));
    }
    pthread_mutex_lock(&s->mu);
    if (!rc && s->started) put_locked(s, "data: [DONE]\n\n", 14);
    s->rc = rc;
    s->done = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static ssize_t st_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    stream *s = cls;
    pthread_mutex_lock(&s->mu);
    while (s->off == s->len && !s->done && !s->oom) pthread_cond_wait(&s->cv, &s->mu);
    ssize_t n;
    if (s->off < s->len) {
        size_t k = s->len - s->off < max ? s->len - s->off : max;
        memcpy(out, s->buf + s->off, k);
        s->off += k;
        n = (ssize_t)k;
    } else {
        n = s->oom ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void st_free(stream *s) {
    pthread_mutex_lock(&s->mu);
    s->gone = 1;   /* the worker's next token cancels the turn */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    kvr_oai_run_clear(&s->run);
    kvr_oai_req_clear(&s->q);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    kvr_turn_cancel_destroy(&s->cancel);
    free(s->buf);
    free(s);
}

static void st_free_cb(void *cls) { st_free(cls); }

static int fd_hung_up(int fd);

static enum MHD_Result run_stream(kvr_oai_http *h, struct MHD_Connection *c, kvr_oai_req *q,
                                  const char *session, const kvr_tenant_info *tenant) {
    stream *s = calloc(1, sizeof *s);
    kvr_oai_error e;
    if (!s) {
        kvr_oai_req_clear(q);
        kvr_oai_set_error(&e, 500, "server_error", NULL, NULL, "out of memory");
        return send_error(c, &e, NULL);
    }
    s->r = h->r;
    s->tenant = *tenant;
    s->q = *q;                    /* the stream owns the request now */
    memset(q, 0, sizeof *q);
    if (session) { snprintf(s->session, sizeof s->session, "%.*s", KVR_ID_MAX - 1, session); s->has_session = 1; }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    s->fd = ci ? ci->connect_fd : -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    kvr_turn_cancel_init(&s->cancel);
    if (pthread_create(&s->th, NULL, st_worker, s)) {
        kvr_oai_req_clear(&s->q);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        kvr_turn_cancel_destroy(&s->cancel);
        free(s);
        kvr_oai_set_error(&e, 503, "server_error", NULL, NULL, "cannot start a thread for the request");
        return send_error(c, &e, NULL);
    }
    /* until the first token this thread has nothing to send: it looks at the client's socket
     * every KVR_OAI_HUP_POLL_MS, and a client gone ends the turn at once (a long prefill, a
     * slow node) rather than when its first token fails to go out */
    pthread_mutex_lock(&s->mu);
    int hup = 0;
    while (!s->started && !s->done) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += KVR_OAI_HUP_POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (!hup && !s->started && !s->done && fd_hung_up(s->fd)) {
            hup = 1;
            kvr_turn_cancel_fire(&s->cancel);
        }
    }
    int failed = !s->started;
    pthread_mutex_unlock(&s->mu);
    if (failed) {   /* no token went out: a plain HTTP error */
        pthread_join(s->th, NULL);
        e = s->run.err;
        if (!s->rc) kvr_oai_set_error(&e, 500, "server_error", NULL, NULL, "the turn produced no output");
        kvr_oai_run_clear(&s->run);
        kvr_oai_req_clear(&s->q);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        kvr_turn_cancel_destroy(&s->cancel);
        free(s->buf);
        free(s);
        return send_error(c, &e, NULL);
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, st_read, s, st_free_cb);
    if (!resp) { st_free(s); return MHD_NO; }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    add_turn_headers(resp, &s->run);   /* written once, before the worker's next token */
    enum MHD_Result ret = queue(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ---- endpoints ---------------------------------------------------------------------------- */

/* A reply sent whole at the end: its client's connection is looked at as the text comes (a
 * poll, no read); one that went away cancels the turn, as a streaming client's does. */
typedef struct conn_watch {
    int fd;   /* -1: unknown */
} conn_watch;

/* 1 when the peer of socket fd closed or reset it (a poll, no read: a request body is read
 * whole before a turn starts, so nothing of the client's is consumed). */
static int fd_hung_up(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int client_gone(const conn_watch *w) { return fd_hung_up(w->fd); }

/* A reply sent whole: the turn runs on the connection's thread, so a watcher thread polls the
 * socket (and a pipe that ends it) for the whole turn and fires the turn's cancel when the
 * client goes away; before the first token nothing else would see it (watch_text's poll runs
 * at each piece of text). */
typedef struct hup_watch {
    int fd, stop[2];
    kvr_turn_cancel *cx;
    pthread_t th;
    int running;
} hup_watch;

static void *hup_main(void *arg) {
    hup_watch *w = arg;
    struct pollfd p[2] = {{.fd = w->fd, .events = POLLRDHUP}, {.fd = w->stop[0], .events = POLLIN}};
    for (;;) {
        int n = poll(p, 2, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 || p[1].revents) break;
        if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
            kvr_turn_cancel_fire(w->cx);
            break;
        }
    }
    return NULL;
}

/* Start watching fd for cx (nothing when fd is unknown or no thread can start: the client's
 * leaving is then seen at its first piece of text, as before). */
static void hup_watch_start(hup_watch *w, int fd, kvr_turn_cancel *cx) {
    w->running = 0;
    w->fd = fd;
    w->cx = cx;
    if (fd < 0 || pipe2(w->stop, O_CLOEXEC) != 0) return;
    if (pthread_create(&w->th, NULL, hup_main, w) != 0) {
        close(w->stop[0]);
        close(w->stop[1]);
        return;
    }
    w->running = 1;
}

static void hup_watch_stop(hup_watch *w) {
    if (!w->running) return;
    char b = 1;
    while (write(w->stop[1], &b, 1) < 0 && errno == EINTR) {}
    pthread_join(w->th, NULL);
    close(w->stop[0]);
    close(w->stop[1]);
    w->running = 0;
}

static int watch_start(void *arg, const kvr_oai_run *run) {
    (void)run;
    return client_gone(arg);
}

static int watch_text(void *arg, const char *text, size_t len) {
    (void)text;
    (void)len;
    return client_gone(arg);
}

static enum MHD_Result do_completion(kvr_oai_http *h, struct MHD_Connection *c, conn *cc) {
    kvr_oai_req q;
    kvr_oai_error e;
    const char *sess = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-kvlingo-session");
    if (kvr_oai_parse(cc->body ? cc->body : "", cc->len, cc->ep == EP_CHAT, h->r->cfg->max_new_tokens,
                      model_known, h->r->reg, &q, &e)) {
        kvr_oai_req_clear(&q);
        return send_error(c, &e, NULL);
    }
    if (q.stream) return run_stream(h, c, &q, sess, &cc->tenant);
    kvr_oai_run u;
    memset(&u, 0, sizeof u);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    conn_watch w = {ci ? ci->connect_fd : -1};
    kvr_turn_cancel cx;
    kvr_turn_cancel_init(&cx);
    kvr_oai_sink watch = {.on_start = watch_start, .on_text = watch_text, .arg = &w, .cancel = &cx};
    hup_watch hw;
    hup_watch_start(&hw, w.fd, &cx);
    int rc = kvr_oai_run_turn(h->r, &q, sess, &cc->tenant, &watch, &u);
    hup_watch_stop(&hw);
    kvr_turn_cancel_destroy(&cx);
    enum MHD_Result ret;
    if (rc) {
        ret = send_error(c, &u.err, NULL);
    } else {
        char *body = kvr_oai_body(q.chat, &u.res, u.text ? u.text : "", u.finish);
        struct MHD_Response *resp = body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
        if (!resp) {
            free(body);
            ret = MHD_NO;
        } else {
            MHD_add_response_header(resp, "Content-Type", "application/json");
            add_turn_headers(resp, &u);
            ret = queue(c, MHD_HTTP_OK, resp);
            MHD_destroy_response(resp);
        }
    }
    kvr_oai_run_clear(&u);
    kvr_oai_req_clear(&q);
    return ret;
}

static enum MHD_Result do_models(kvr_oai_http *h, struct MHD_Connection *c) {
    kvr_registry *reg = h->r->reg;
    const char *names[KVR_MAX_NODES];
    int n = 0;
    for (int i = 0; i < reg->n; i++) {
        int seen = 0;
        for (int j = 0; j < n && !seen; j++) seen = !strcmp(names[j], reg->nodes[i].model);
        if (!seen) names[n++] = reg->nodes[i].model;   /* immutable after create */
    }
    return send_buf(c, MHD_HTTP_OK, kvr_oai_models(names, n, 0), "application/json", NULL);
}

static enum MHD_Result do_health(kvr_oai_http *h, struct MHD_Connection *c, int ready) {
    int healthy = 0;
    kvr_registry *reg = h->r->reg;
    pthread_mutex_lock(&reg->mu);
    for (int i = 0; i < reg->n; i++) healthy += reg->nodes[i].healthy != 0;
    pthread_mutex_unlock(&reg->mu);
    char *b = malloc(96);
    if (!b) return MHD_NO;
    int ok = !ready || healthy > 0;
    snprintf(b, 96, "{\"status\":\"%s\",\"nodes_healthy\":%d,\"nodes\":%d}",
             ready ? (ok ? "ready" : "no healthy node") : "ok", healthy, reg->n);
    return send_buf(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, b, "application/json", NULL);
}

static int route(const char *url, const char **allow) {
    static const struct { const char *path; int ep; const char *allow; } routes[] = {
        {"/v1/chat/completions", EP_CHAT, "POST"}, {"/v1/completions", EP_COMPLETIONS, "POST"},
        {"/v1/models", EP_MODELS, "GET, HEAD"},    {"/health", EP_HEALTH, "GET, HEAD"},
        {"/ready", EP_READY, "GET, HEAD"}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) { *allow = routes[i].allow; return routes[i].ep; }
    return EP_NONE;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    kvr_oai_http *h = cls;
    conn *cc = *con_cls;
    kvr_oai_error e;
    tl_conn = cc;
    if (!cc) {   /* headers are in: route, check the method and the declared size */
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        cc->h = h;
        tl_conn = cc;
        cc->t0 = kvl__now_s();
        const char *allow = NULL;
        cc->ep = route(url, &allow);
        int post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        if (cc->ep == EP_NONE) {
            cc->refused = 1;
            kvr_oai_set_error(&e, 404, "invalid_request_error", NULL, "unknown_url",
                              "Unknown request URL: %.16s %.200s (this server has POST /v1/chat/completions, "
                              "POST /v1/completions, GET /v1/models, GET /health, GET /ready)", method, url);
            return send_error(c, &e, NULL);
        }
        if ((cc->ep == EP_CHAT || cc->ep == EP_COMPLETIONS) ? !post : !get) {
            cc->refused = 1;
            kvr_oai_set_error(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                              "%.16s is not allowed on %s (allowed: %s)", method, url, allow);
            return send_error(c, &e, allow);
        }
        /* the API needs a key (as OpenAI's does); health and readiness probes do not */
        if (cc->ep == EP_CHAT || cc->ep == EP_COMPLETIONS || cc->ep == EP_MODELS) {
            const char *reason = NULL;
            const char *av = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
            if (kvr_auth_value(h->r, av, 0, &cc->tenant, &reason) != KVR_AUTH_OK) {
                cc->refused = 1;
                if (!strcmp(reason, "missing"))
                    kvr_oai_set_error(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                                      "You didn't provide an API key. Send it in the Authorization header "
                                      "(Authorization: Bearer YOUR_KEY).");
                else
                    kvr_oai_set_error(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                                      "Incorrect API key provided.");
                return send_error(c, &e, NULL);
            }
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > (unsigned long long)h->max_body) {
            cc->refused = 1;
            kvr_oai_set_error(&e, 413, "invalid_request_error", NULL, "request_too_large",
                              "the request body is %s bytes, at most %ld (http_max_body_bytes)", cl, h->max_body);
            return send_error(c, &e, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        /* a body without Content-Length (chunked) that outgrows the bound: the rest is read
         * and dropped (MHD cannot answer in the middle of an upload), then 413.  Dropped only
         * up to as much again and for KVR_OAI_UPLOAD_S seconds: a client that keeps sending
         * (an endless chunked body) is disconnected instead of holding a connection slot.
         * A body on GET (the probes) is read the same way but never kept. */
        cc->seen += *upload_size;
        if (cc->seen > 2 * (size_t)h->max_body || kvl__now_s() - cc->t0 > KVR_OAI_UPLOAD_S) return MHD_NO;
        if (cc->len + *upload_size > (size_t)h->max_body) cc->too_large = 1;
        if (!cc->refused && !cc->too_large && (cc->ep == EP_CHAT || cc->ep == EP_COMPLETIONS)) {
            if (cc->len + *upload_size + 1 > cc->cap) {
                size_t cap = cc->cap ? cc->cap : 4096;
                while (cap < cc->len + *upload_size + 1) cap *= 2;
                char *b = realloc(cc->body, cap);
                if (!b) return MHD_NO;
                cc->body = b;
                cc->cap = cap;
            }
            memcpy(cc->body + cc->len, upload, *upload_size);
            cc->len += *upload_size;
            cc->body[cc->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->refused) return MHD_YES;
    if (cc->too_large) {
        cc->refused = 1;
        kvr_oai_set_error(&e, 413, "invalid_request_error", NULL, "request_too_large",
                          "the request body exceeds %ld bytes (http_max_body_bytes)", h->max_body);
        return send_error(c, &e, NULL);
    }
    switch (cc->ep) {
    case EP_CHAT:
    case EP_COMPLETIONS: return do_completion(h, c, cc);
    case EP_MODELS: return do_models(h, c);
    case EP_HEALTH: return do_health(h, c, 0);
    default: return do_health(h, c, 1);
    }
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode tc) {
    (void)cls;
    (void)c;
    (void)tc;
    conn *cc = *con_cls;
    if (!cc) return;
    static const char *const names[] = {"other", "chat_completions", "completions", "models", "health", "ready"};
    char lab[64], st[16];
    snprintf(st, sizeof st, cc->status ? "%u" : "none", cc->status);   /* none: closed unanswered */
    snprintf(lab, sizeof lab, "endpoint=\"%s\",status=\"%s\"", names[cc->ep], st);
    kvr_metrics_inc(cc->h->r->metrics, "kvlingo_router_http_requests_total", lab, 1);
    /* probes (health, ready, models) are not logged unless they fail */
    if (cc->ep == EP_CHAT || cc->ep == EP_COMPLETIONS || cc->status >= 400 || !cc->status)
        kvl__svc_log("info", "msg=http endpoint=%s status=%s ms=%.3f", names[cc->ep], st,
                     (kvl__now_s() - cc->t0) * 1e3);
    if (tl_conn == cc) tl_conn = NULL;
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

kvl_status kvr_oai_http_start(kvr_router *r, const char *addr, long max_conn, long max_body,
                              kvr_oai_http **out) {
    *out = NULL;
    struct sockaddr_in sa;
    kvl_status st = kvl__svc_http_parse_addr("http_listen", addr, 1, &sa);
    if (st != KVL_OK) return st;
    int port = ntohs(sa.sin_port);
    kvr_oai_http *h = calloc(1, sizeof *h);
    if (!h) return kvl__errorf(KVL_ERR_NOMEM, "http server");
    h->r = r;
    h->max_body = max_body;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    /* a connection holds a thread from its first byte, before any API key is seen: one client
     * address may hold only so many (else a few dozen sockets trickling headers would lock out
     * every client), and a silent one is closed */
    const unsigned per_ip = (unsigned)r->cfg->http_max_conn_per_ip, idle_s = (unsigned)r->cfg->http_idle_timeout_s;
    if (r->tls.cert_pem) {
        /* a router that runs TLS serves the OpenAI API over HTTPS with the same certificate
         * (the API key of a request must not cross the network in clear either) */
        if (!MHD_is_feature_supported(MHD_FEATURE_TLS)) {
            free(h);
            return kvl__errorf(KVL_ERR_UNSUPPORTED, "http_listen: this libmicrohttpd has no TLS; "
                               "the OpenAI API cannot serve HTTPS (run the router with insecure, "
                               "behind a TLS proxy)");
        }
        h->mhd = MHD_start_daemon(flags | MHD_USE_TLS, 0, NULL, NULL, on_request, h,
                                  MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn,
                                  MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
                                  MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
                                  MHD_OPTION_NOTIFY_COMPLETED, on_done, (void *)NULL,
                                  MHD_OPTION_HTTPS_MEM_KEY, r->tls.key_pem,
                                  MHD_OPTION_HTTPS_MEM_CERT, r->tls.cert_pem, MHD_OPTION_END);
    } else {
        h->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h,
                                  MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn,
                                  MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
                                  MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
                                  MHD_OPTION_NOTIFY_COMPLETED, on_done, (void *)NULL, MHD_OPTION_END);
    }
    if (!h->mhd) {
        free(h);
        return kvl__errorf(KVL_ERR_IO, "http_listen: cannot %s on %s", r->tls.cert_pem ? "serve HTTPS" : "listen", addr);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info && info->port ? info->port : (int)port;
    *out = h;
    return KVL_OK;
}

int kvr_oai_http_port(const kvr_oai_http *h) { return h ? h->port : 0; }

void kvr_oai_http_stop(kvr_oai_http *h) {
    if (!h) return;
    if (h->mhd) MHD_stop_daemon(h->mhd);
    free(h);
}
