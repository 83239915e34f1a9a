/* daemon/main.c: kvld entry point.  The main thread runs a libuv loop that owns signals and
 * timers; gRPC handlers, the scheduler, the transport and the metrics endpoint run on their own
 * threads.  SIGTERM/SIGINT drain: new work is refused (UNAVAILABLE), health turns NOT_SERVING,
 * running streams finish, then the process exits 0 (or after --drain-timeout-ms). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <uv.h>

#include "clock.h"
#include "error.h"
#include "log.h"
#include "node.h"

typedef struct kvld_main {
    kvld_node *node;
    uv_loop_t *loop;
    uv_signal_t sigterm, sigint;
    uv_timer_t tick;
    double drain_started;
    int exit_code;
} kvld_main;

static void begin_drain(kvld_main *m, const char *why) {
    if (m->node->draining) return;
    m->node->draining = 1;
    m->drain_started = kvl__now_s();
    kvl__rpc_server_set_health(m->node->rpc, "", 0);
    kvl__rpc_server_set_health(m->node->rpc, "kvlingo.v1.Node", 0);
    kvld_metrics_set(m->node->metrics, KVLD_G_DRAINING, 1);
    kvl__svc_log("info", "msg=draining signal=%s work_in_flight=%d", why,
             __atomic_load_n(&m->node->work_in_flight, __ATOMIC_SEQ_CST));
}

static void on_signal(uv_signal_t *h, int signum) {
    kvld_main *m = h->data;
    begin_drain(m, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* Every 200 ms: refresh gauges; while draining, stop the loop once no work is left. */
static void on_tick(uv_timer_t *t) {
    kvld_main *m = t->data;
    kvld_node *n = m->node;
    kvld_metrics_set(n->metrics, KVLD_G_SESSIONS, kvld_sessions_count(n->sessions));
    kvld_metrics_set(n->metrics, KVLD_G_CACHE_BYTES, (double)kvld_sessions_cache_bytes(n->sessions));
    if (!n->draining) return;
    int busy = __atomic_load_n(&n->work_in_flight, __ATOMIC_SEQ_CST) + kvld_sched_active(n->sched);
    double waited = kvl__now_s() - m->drain_started;
    if (busy == 0 || waited * 1000 > n->cfg.drain_timeout_ms) {
        kvl__svc_log("info", "msg=drained busy=%d waited_s=%.3f", busy, waited);
        uv_stop(m->loop);
    }
}

int main(int argc, char **argv) {
    kvl__svc_log_init("kvld");
    kvld_config cfg;
    kvld_config_defaults(&cfg);
    int help = 0;
    if (kvld_config_parse_args(&cfg, argc, argv, &help) != KVL_OK) {
        fprintf(stderr, "kvld: %s\n%s", kvl_last_error(), kvld_config_usage());
        return 2;
    }
    if (help) {
        fputs(kvld_config_usage(), stdout);
        return 0;
    }
    /* a peer that closes a socket must not kill the node */
    signal(SIGPIPE, SIG_IGN);
    kvld_main m = {0};
    kvl_status st = kvld_node_create(&cfg, &m.node);
    if (st != KVL_OK) {
        kvl__svc_log("error", "msg=startup_failed err=\"%s\"", kvl_last_error());
        return 1;
    }
    st = kvld_node_serve(m.node);
    if (st != KVL_OK) {
        kvl__svc_log("error", "msg=startup_failed err=\"%s\"", kvl_last_error());
        kvld_node_free(m.node);
        return 1;
    }
    m.loop = uv_default_loop();
    int rc = uv_signal_init(m.loop, &m.sigterm);
    if (!rc) rc = uv_signal_init(m.loop, &m.sigint);
    if (!rc) rc = uv_timer_init(m.loop, &m.tick);
    m.sigterm.data = m.sigint.data = m.tick.data = &m;
    if (!rc) rc = uv_signal_start(&m.sigterm, on_signal, SIGTERM);
    if (!rc) rc = uv_signal_start(&m.sigint, on_signal, SIGINT);
    if (!rc) rc = uv_timer_start(&m.tick, on_tick, 200, 200);
    if (rc) {
        kvl__svc_log("error", "msg=libuv_failed err=\"%s\"", uv_strerror(rc));
        kvld_node_free(m.node);
        return 1;
    }
    const kvl_model_config *mc = kvl_model_config_get(m.node->model);
    /* the port line is what scripts wait for (it says which port "HOST:0" got) */
    kvl__svc_log("info", "msg=serving model=%s hash=%s arch=%s listen=%s port=%d metrics=%s "
             "transport=%s translators=%d max_sessions=%d max_context=%d",
             kvl_model_name(m.node->model), kvl_model_hash(m.node->model), mc->architecture,
             cfg.listen, kvl__rpc_server_port(m.node->rpc), cfg.metrics[0] ? cfg.metrics : "-",
             cfg.transport, m.node->translators.n, cfg.max_sessions, m.node->max_context);
    uv_run(m.loop, UV_RUN_DEFAULT);
    uv_signal_stop(&m.sigterm);
    uv_signal_stop(&m.sigint);
    /* Drained: a repeated SIGTERM/SIGINT (an orchestrator's second kill, a test's stop) must not
     * cut the teardown short now that libuv has restored the default disposition. */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    uv_timer_stop(&m.tick);
    uv_close((uv_handle_t *)&m.sigterm, NULL);
    uv_close((uv_handle_t *)&m.sigint, NULL);
    uv_close((uv_handle_t *)&m.tick, NULL);
    uv_run(m.loop, UV_RUN_DEFAULT);   /* let the close callbacks run */
    uv_loop_close(m.loop);
    kvl__rpc_server_shutdown(m.node->rpc, 2000);
    kvld_node_free(m.node);
    kvl__svc_log("info", "msg=exit code=0");
    return 0;
}
