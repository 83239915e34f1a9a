/* router/metrics.c: counters and histograms with labels, rendered as Prometheus text. */
#include "metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "error.h"

#define MAX_SERIES 512
#define MAX_BUCKETS 16

typedef struct series {
    char name[64];
    char labels[192];
    int is_hist;
    double value;                 /* counter                                                    */
    const double *bounds;         /* histogram                                                  */
    int n_bounds;
    unsigned long long counts[MAX_BUCKETS];
    double sum;
    unsigned long long count;
} series;

struct kvr_metrics {
    pthread_mutex_t mu;
    series *s;
    int n;
    void (*gauges)(void *, kvr_textbuf *);
    void *gauges_arg;
    struct MHD_Daemon *http;
    int port;
};

static const double k_ttft_bounds[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                       0.1,    0.2,   0.5,   1,     2,    5};
static const double k_kl_bounds[] = {0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10};
static const double k_ledger_bounds[] = {5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                                         5e-3, 1e-2, 2.5e-2, 5e-2, 0.1};

static const struct { const char *name, *type, *help; } k_help[] = {
    {"kvlingo_router_turns_total", "counter", "Turns answered, by model and switch mode."},
    {"kvlingo_router_switches_total", "counter", "Turns that moved a session between models, by pair and mode."},
    {"kvlingo_router_fallbacks_total", "counter", "Switches that re-prefilled instead of translating, by reason."},
    {"kvlingo_router_switch_ttft_seconds", "histogram", "Time to first token of turns that moved the context."},
    {"kvlingo_router_turn_ttft_seconds", "histogram", "Time to first token of every turn."},
    {"kvlingo_router_shadow_kl_nats", "histogram", "Guardrail: KL(native || translated) of the first token."},
    {"kvlingo_router_ledger_write_seconds", "histogram", "Duration of ledger write transactions."},
    {"kvlingo_router_errors_total", "counter", "Turns that ended in an error, by gRPC code."},
    {"kvlingo_router_shadow_dropped_total", "counter", "Guardrail samples dropped (queue full)."},
};

void kvr_textbuf_printf(kvr_textbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (w < 0) { b->oom = 1; return; }
        if (b->data && (size_t)w < b->cap - b->len) { b->len += (size_t)w; return; }
        size_t nc = (b->cap + (size_t)w + 1) * 2;
        char *nd = realloc(b->data, nc);
        if (!nd) { b->oom = 1; return; }
        b->data = nd;
        b->cap = nc;
    }
}

kvl_status kvr_metrics_create(kvr_metrics **out) {
    *out = NULL;
    kvr_metrics *m = calloc(1, sizeof *m);
    if (!m) return kvl__errorf(KVL_ERR_NOMEM, "metrics");
    m->s = calloc(MAX_SERIES, sizeof *m->s);
    if (!m->s || pthread_mutex_init(&m->mu, NULL)) {
        free(m->s);
        free(m);
        return kvl__errorf(KVL_ERR_NOMEM, "metrics");
    }
    *out = m;
    return KVL_OK;
}

void kvr_metrics_free(kvr_metrics *m) {
    if (!m) return;
    if (m->http) MHD_stop_daemon(m->http);
    pthread_mutex_destroy(&m->mu);
    free(m->s);
    free(m);
}

void kvr_metrics_set_gauges(kvr_metrics *m, void (*fn)(void *, kvr_textbuf *), void *arg) {
    pthread_mutex_lock(&m->mu);
    m->gauges = fn;
    m->gauges_arg = arg;
    pthread_mutex_unlock(&m->mu);
}

/* Find or add a series; NULL when the table is full (new label sets are then not recorded:
 * bounded memory beats an unbounded label explosion). */
static series *get_locked(kvr_metrics *m, const char *name, const char *labels, int hist) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->s[i].name, name) && !strcmp(m->s[i].labels, labels)) return &m->s[i];
    if (m->n >= MAX_SERIES) return NULL;
    series *s = &m->s[m->n++];
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->labels, sizeof s->labels, "%s", labels);
    s->is_hist = hist;
    if (hist) {
        if (strstr(name, "_kl_")) { s->bounds = k_kl_bounds; s->n_bounds = (int)(sizeof k_kl_bounds / sizeof(double)); }
        else if (strstr(name, "ledger")) { s->bounds = k_ledger_bounds; s->n_bounds = (int)(sizeof k_ledger_bounds / sizeof(double)); }
        else { s->bounds = k_ttft_bounds; s->n_bounds = (int)(sizeof k_ttft_bounds / sizeof(double)); }
    }
    return s;
}

void kvr_metrics_inc(kvr_metrics *m, const char *name, const char *labels, double delta) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    series *s = get_locked(m, name, labels ? labels : "", 0);
    if (s) s->value += delta;
    pthread_mutex_unlock(&m->mu);
}

void kvr_metrics_observe(kvr_metrics *m, const char *name, const char *labels, double v) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    series *s = get_locked(m, name, labels ? labels : "", 1);
    if (s) {
        for (int b = 0; b < s->n_bounds; b++)
            if (v <= s->bounds[b]) s->counts[b]++;
        s->sum += v;
        s->count++;
    }
    pthread_mutex_unlock(&m->mu);
}

static void help_line(kvr_textbuf *b, const char *name) {
    for (size_t i = 0; i < sizeof k_help / sizeof k_help[0]; i++)
        if (!strcmp(k_help[i].name, name)) {
            kvr_textbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, k_help[i].help, name,
                               k_help[i].type);
            return;
        }
    kvr_textbuf_printf(b, "# TYPE %s untyped\n", name);
}

void kvr_metrics_render(kvr_metrics *m, kvr_textbuf *b) {
    pthread_mutex_lock(&m->mu);
    /* group the series of one name together, in first-seen order */
    for (int i = 0; i < m->n; i++) {
        int first = 1;
        for (int j = 0; j < i; j++) first &= strcmp(m->s[j].name, m->s[i].name) != 0;
        if (!first) continue;
        help_line(b, m->s[i].name);
        for (int j = i; j < m->n; j++) {
            series *s = &m->s[j];
            if (strcmp(s->name, m->s[i].name)) continue;
            const char *sep = s->labels[0] ? "," : "";
            if (!s->is_hist) {
                kvr_textbuf_printf(b, "%s%s%s%s %.17g\n", s->name, s->labels[0] ? "{" : "",
                                   s->labels, s->labels[0] ? "}" : "", s->value);
                continue;
            }
            for (int k = 0; k < s->n_bounds; k++)
                kvr_textbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", s->name, s->labels, sep,
                                   s->bounds[k], s->counts[k]);
            kvr_textbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", s->name, s->labels, sep, s->count);
            kvr_textbuf_printf(b, "%s_sum%s%s%s %.17g\n", s->name, s->labels[0] ? "{" : "", s->labels,
                               s->labels[0] ? "}" : "", s->sum);
            kvr_textbuf_printf(b, "%s_count%s%s%s %llu\n", s->name, s->labels[0] ? "{" : "",
                               s->labels, s->labels[0] ? "}" : "", s->count);
        }
    }
    void (*g)(void *, kvr_textbuf *) = m->gauges;
    void *ga = m->gauges_arg;
    pthread_mutex_unlock(&m->mu);
    if (g) g(ga, b);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    kvr_metrics *m = cls;
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        static const char msg[] = "method not allowed\n";
        struct MHD_Response *r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_METHOD_NOT_ALLOWED, r);
        MHD_destroy_response(r);
        return ret;
    }
    kvr_textbuf b = {0};
    unsigned code = MHD_HTTP_OK;
    if (!strcmp(url, "/metrics")) kvr_metrics_render(m, &b);
    else if (!strcmp(url, "/healthz")) kvr_textbuf_printf(&b, "ok\n");
    else { code = MHD_HTTP_NOT_FOUND; kvr_textbuf_printf(&b, "not found (try /metrics)\n"); }
    if (b.oom || !b.data) { free(b.data); return MHD_NO; }
    struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(b.data); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", code == MHD_HTTP_OK && !strcmp(url, "/metrics")
                                                   ? "text/plain; version=0.0.4" : "text/plain");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

kvl_status kvr_metrics_serve(kvr_metrics *m, const char *listen) {
    char host[128];
    const char *colon = strrchr(listen, ':');
    if (!colon || (size_t)(colon - listen) >= sizeof host)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "metrics: '%s' is not host:port", listen);
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "metrics: '%s': an IPv4 address is required", listen);
    m->http = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                               on_request, m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                               MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!m->http) return kvl__errorf(KVL_ERR_IO, "metrics: cannot listen on %s", listen);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->http, MHD_DAEMON_INFO_BIND_PORT);
    m->port = info ? info->port : atoi(colon + 1);
    return KVL_OK;
}

int kvr_metrics_port(const kvr_metrics *m) { return m->port; }
