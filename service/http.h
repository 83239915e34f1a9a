/* service/http.h: the HTTP endpoint of a server (libmicrohttpd, its own polling thread):
 *   GET /metrics   the registry's exposition text (Content-Type text/plain; version=0.0.4)
 *   GET /healthz   200 "ok", or 503 "draining" while the health callback says so
 * anything else is 404; methods other than GET and HEAD get 405. */
#ifndef KVL_SVC_HTTP_H
#define KVL_SVC_HTTP_H

#include "kvlingo/status.h"
#include "prom.h"

typedef struct kvl__svc_http kvl__svc_http;

/* The endpoint's bounds: connections at once, from one client address, seconds a connection
 * may stay idle (no byte) before it is closed, and the memory one connection's request may
 * take (a request line and headers: a scrape or a probe needs a few hundred bytes).  The idle
 * bound is MHD's, which a byte now and then resets: a client trickling a request holds its
 * place, so the per-address cap is what keeps slow clients from one host (or a few) from
 * taking the places of scrapes and probes from others. */
#define KVL_SVC_HTTP_MAX_CONN 256
#define KVL_SVC_HTTP_MAX_PER_IP 8
#define KVL_SVC_HTTP_IDLE_S 5
#define KVL_SVC_HTTP_CONN_MEMORY (16 * 1024)

struct sockaddr_in;

/* Parse "HOST:PORT" (HOST an IPv4 address or "localhost"; PORT 0 allowed when allow_port0) into
 * *sa for a listening socket.  KVL_ERR_INVALID_ARG naming `what` (the flag or key):
 * "WHAT 'ADDR': expected HOST:PORT" / "bad port" / "host must be an IPv4 address".  The one
 * parser of every HTTP endpoint's address (metrics, the router's OpenAI API). */
kvl_status kvl__svc_http_parse_addr(const char *what, const char *addr, int allow_port0,
                                    struct sockaddr_in *sa);

/* 1 while the server takes work, 0 while it drains.  Runs on the HTTP thread. */
typedef int (*kvl__svc_health_fn)(void *arg);

/* Listen on `addr` ("HOST:PORT", HOST an IPv4 address or "localhost"; PORT 0 picks a free
 * port when allow_port0 is set) and serve `prom` (borrowed: it must outlive the endpoint).
 * `health` may be NULL (always "ok"); `arg` is borrowed likewise.  Errors name `what` (the
 * flag or key the address came from): KVL_ERR_INVALID_ARG "WHAT 'ADDR': expected HOST:PORT" /
 * "bad port" / "host must be an IPv4 address"; KVL_ERR_IO "metrics: cannot listen on ADDR";
 * KVL_ERR_NOMEM.  Stop with kvl__svc_http_stop. */
kvl_status kvl__svc_http_start(const char *what, const char *addr, int allow_port0,
                               kvl__svc_prom *prom, kvl__svc_health_fn health, void *arg,
                               kvl__svc_http **out);

/* The port listened on (the one picked for PORT 0). */
int kvl__svc_http_port(const kvl__svc_http *h);

/* Stop the thread (waits for a running request) and free.  NULL is a no-op. */
void kvl__svc_http_stop(kvl__svc_http *h);

#endif
