/* service/http.c: /metrics and /healthz over libmicrohttpd (http.h). */
#include "http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "error.h"
#include "log.h"

struct kvl__svc_http {
    struct MHD_Daemon *mhd;
    kvl__svc_prom *prom;
    kvl__svc_health_fn health;
    void *arg;
    int port;
    char err[200];   /* libmicrohttpd's last message (mhd_log) */
};

/* libmicrohttpd's messages: kept for the start's error and logged as the process's other
 * lines are (its own logger writes bare lines to stderr, "Failed to bind to port 0" for an
 * address given by socket address) */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    kvl__svc_http *h = cls;
    vsnprintf(h->err, sizeof h->err, fmt, ap);
    size_t n = strlen(h->err);
    while (n && (h->err[n - 1] == '\n' || h->err[n - 1] == '\r')) h->err[--n] = '\0';
    char q[sizeof h->err + 64];
    kvl__svc_log("warn", "msg=http_server_error detail=%s", kvl__svc_log_q(q, sizeof q, h->err));
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, const char *type,
                             kvl__svc_text *b) {
    if (b->oom || !b->data) {
        free(b->data);
        return MHD_NO;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(b->len, b->data, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(b->data);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    kvl__svc_http *h = cls;
    kvl__svc_text b = {0};
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        kvl__svc_text_printf(&b, "method not allowed\n");
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", &b);
    }
    if (!strcmp(url, "/metrics")) {
        kvl__svc_prom_render(h->prom, &b);
        if (!b.data) kvl__svc_text_printf(&b, "%s", "");   /* an empty registry is a valid body */
        return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4", &b);
    }
    if (!strcmp(url, "/healthz")) {
        int ok = !h->health || h->health(h->arg);
        kvl__svc_text_printf(&b, ok ? "ok\n" : "draining\n");
        return reply(conn, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain", &b);
    }
    kvl__svc_text_printf(&b, "not found: try /metrics or /healthz\n");
    return reply(conn, MHD_HTTP_NOT_FOUND, "text/plain", &b);
}

kvl_status kvl__svc_http_parse_addr(const char *what, const char *addr, int allow_port0,
                                    struct sockaddr_in *sa) {
    char host[256];
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "%s '%s': expected HOST:PORT", what, addr ? addr : "");
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || port < (allow_port0 ? 0 : 1) || port > 65535)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "%s '%s': bad port", what, addr);
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "%s '%s': host must be an IPv4 address", what,
                          addr);
    return KVL_OK;
}

kvl_status kvl__svc_http_start(const char *what, const char *addr, int allow_port0,
                               kvl__svc_prom *prom, kvl__svc_health_fn health, void *arg,
                               kvl__svc_http **out) {
    *out = NULL;
    struct sockaddr_in sa;
    kvl_status st = kvl__svc_http_parse_addr(what, addr, allow_port0, &sa);
    if (st != KVL_OK) return st;
    int port = ntohs(sa.sin_port);
    kvl__svc_http *h = calloc(1, sizeof *h);
    if (!h) return kvl__errorf(KVL_ERR_NOMEM, "metrics");
    h->prom = prom;
    h->health = health;
    h->arg = arg;
    /* bounded: epoll (select stops at FD_SETSIZE), at most KVL_SVC_HTTP_MAX_CONN connections
     * and KVL_SVC_HTTP_MAX_PER_IP from one address (excess ones are closed at once), idle ones
     * closed after KVL_SVC_HTTP_IDLE_S: a flood of slow clients from one host cannot keep a
     * probe from another host out */
    h->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG,
                              (uint16_t)port, NULL, NULL, on_request, h,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,   /* first, to have every message */
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)KVL_SVC_HTTP_IDLE_S,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)KVL_SVC_HTTP_MAX_CONN,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)KVL_SVC_HTTP_MAX_PER_IP,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)KVL_SVC_HTTP_CONN_MEMORY,
                              MHD_OPTION_END);
    if (!h->mhd) {
        kvl_status st = kvl__errorf(KVL_ERR_IO, "metrics: cannot listen on %s%s%s%s", addr, h->err[0] ? " (" : "",
                                   h->err, h->err[0] ? ")" : "");
        free(h);
        return st;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info && info->port ? info->port : (int)port;
    *out = h;
    return KVL_OK;
}

int kvl__svc_http_port(const kvl__svc_http *h) { return h ? h->port : 0; }

void kvl__svc_http_stop(kvl__svc_http *h) {
    if (!h) return;
    if (h->mhd) MHD_stop_daemon(h->mhd);
    free(h);
}
