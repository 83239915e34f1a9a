/* rpc/health.c: grpc.health.v1.Health (Check, Watch) served by every kvl__rpc_server
 * (https://github.com/grpc/grpc/blob/master/doc/health-checking.md). */
#include "server_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "grpc/health/v1/health.pb-c.h"

kvl_status kvl__rpc_server_set_health(kvl__rpc_server *srv, const char *service, int serving) {
    if (!srv || !service) return kvl__errorf(KVL_ERR_INVALID_ARG, "rpc: set_health: NULL");
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < srv->n_health; i++) {
        if (strcmp(srv->health[i].service, service) == 0) {
            srv->health[i].serving = serving ? 1 : 0;
            pthread_mutex_unlock(&srv->mu);
            return KVL_OK;
        }
    }
    kvl__rpc_health_entry *h = realloc(srv->health, (size_t)(srv->n_health + 1) * sizeof *h);
    char *name = strdup(service);
    if (!h || !name) {
        if (h) srv->health = h;
        free(name);
        pthread_mutex_unlock(&srv->mu);
        return kvl__errorf(KVL_ERR_NOMEM, "rpc: health table");
    }
    srv->health = h;
    h[srv->n_health++] = (kvl__rpc_health_entry){name, serving ? 1 : 0};
    pthread_mutex_unlock(&srv->mu);
    return KVL_OK;
}

void kvl__rpc_health_free(kvl__rpc_server *srv) {
    for (int i = 0; i < srv->n_health; i++) free(srv->health[i].service);
    free(srv->health);
    srv->health = NULL;
    srv->n_health = 0;
}

/* -1: unknown service; else 0/1 */
static int lookup(kvl__rpc_server *srv, const char *service) {
    int v = -1;
    if (srv->health_src) {   /* a health-only server answers for the server it mirrors */
        pthread_mutex_lock(&srv->mu);
        int stopping = srv->stopping;
        pthread_mutex_unlock(&srv->mu);
        v = lookup(srv->health_src, service);
        return stopping && v > 0 ? 0 : v;
    }
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < srv->n_health; i++)
        if (strcmp(srv->health[i].service, service) == 0) v = srv->health[i].serving;
    if (srv->stopping) v = v < 0 ? v : 0;
    pthread_mutex_unlock(&srv->mu);
    return v;
}

static Grpc__Health__V1__HealthCheckResponse__ServingStatus to_pb(int v, int watch) {
    if (v < 0)
        return watch ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN
                     : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__UNKNOWN;
    return v ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
             : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

void kvl__rpc_health_check(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvl__rpc_server *srv = user;
    Grpc__Health__V1__HealthCheckRequest *in =
        grpc__health__v1__health_check_request__unpack(NULL, len, req);
    if (!in) {
        kvl__rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                            "malformed HealthCheckRequest (%zu bytes)", len);
        return;
    }
    int v = lookup(srv, in->service);
    if (v < 0) {
        kvl__rpc_call_finish(call, GRPC_STATUS_NOT_FOUND, "unknown service '%s'", in->service);
    } else {
        Grpc__Health__V1__HealthCheckResponse out = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        out.status = to_pb(v, 0);
        kvl__rpc_call_reply_pb(call, &out.base);
    }
    grpc__health__v1__health_check_request__free_unpacked(in, NULL);
}

/* Watch: send the status now and whenever it changes; the stream stays open until the client
 * cancels or the server shuts down (polling every 100 ms keeps this free of extra hooks). */
void kvl__rpc_health_watch(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvl__rpc_server *srv = user;
    Grpc__Health__V1__HealthCheckRequest *in =
        grpc__health__v1__health_check_request__unpack(NULL, len, req);
    if (!in) {
        kvl__rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                            "malformed HealthCheckRequest (%zu bytes)", len);
        return;
    }
    int last = -2;
    for (;;) {
        int v = lookup(srv, in->service);
        if (v != last) {
            Grpc__Health__V1__HealthCheckResponse out =
                GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
            out.status = to_pb(v, 1);
            if (kvl__rpc_call_send_pb(call, &out.base) != KVL_OK) break;
            last = v;
        }
        pthread_mutex_lock(&srv->mu);
        int stopping = srv->stopping;
        pthread_mutex_unlock(&srv->mu);
        if (stopping || kvl__rpc_call_cancelled(call)) break;
        usleep(100 * 1000);
    }
    kvl__rpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    grpc__health__v1__health_check_request__free_unpacked(in, NULL);
}
