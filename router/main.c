/* router/main.c: kvlingo-router, the client-facing router of a kvlingo fleet.
 *
 *   kvlingo-router --config fleet.yaml [--check]
 *
 * libuv runs the process: SIGHUP reloads the policy and guardrail settings (sessions are kept),
 * SIGTERM/SIGINT stop (running turns get a grace period), timers re-probe nodes and expire idle
 * sessions.  gRPC and the metrics endpoint run on their own threads. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "router.h"
#include "log.h"

#define PROBE_MS 2000
#define FULL_PROBE_EVERY 5      /* every 5th probe asks healthy nodes too (sessions, translators) */

typedef struct app {
    kvr_router *r;
    uv_loop_t loop;
    uv_signal_t sighup, sigterm, sigint;
    uv_timer_t probe, expire;
    int probes;
} app;

static void on_hup(uv_signal_t *h, int sig) {
    app *a = h->data;
    (void)sig;
    if (kvr_router_reload(a->r))
        kvl__svc_log_text("warn", "reload failed, keeping the old policy: %s", kvl_last_error());
}

static void on_term(uv_signal_t *h, int sig) {
    app *a = h->data;
    kvl__svc_log_text("info", "signal %d: stopping", sig);
    uv_stop(&a->loop);
}

static void on_probe(uv_timer_t *t) {
    app *a = t->data;
    kvr_registry_refresh(a->r->reg, ++a->probes % FULL_PROBE_EVERY != 0, 1000);
    kvr_router_sync_pairs(a->r);
}

static void on_expire(uv_timer_t *t) {
    app *a = t->data;
    kvr_router_expire(a->r);
}

static void usage(FILE *f) {
    fputs("usage: kvlingo-router --config fleet.yaml [--check]\n"
          "  --config FILE   fleet configuration (see router/config.h for every key)\n"
          "  --check         validate the configuration and exit\n", f);
}

int main(int argc, char **argv) {
    kvl__svc_log_init("router");
    const char *config = NULL;
    int check = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 0; }
        else { fprintf(stderr, "kvlingo-router: unknown argument '%s'\n", argv[i]); usage(stderr); return 2; }
    }
    if (!config) { usage(stderr); return 2; }
    signal(SIGPIPE, SIG_IGN);
    kvr_config *cfg = NULL;
    kvl_status s = kvr_config_load(config, &cfg);
    if (!s) s = kvr_policy_check(cfg);
    if (s) {
        fprintf(stderr, "kvlingo-router: %s\n", kvl_last_error());
        kvr_config_free(cfg);
        return 1;
    }
    if (check) { printf("%s: ok (policy %s, %d nodes)\n", config, cfg->policy_name, cfg->n_nodes); kvr_config_free(cfg); return 0; }

    app a;
    memset(&a, 0, sizeof a);
    s = kvr_router_create(cfg, &a.r);
    if (s) { fprintf(stderr, "kvlingo-router: %s\n", kvl_last_error()); return 1; }
    s = kvr_router_serve(a.r);
    if (s) {
        fprintf(stderr, "kvlingo-router: %s\n", kvl_last_error());
        kvr_router_free(a.r);
        return 1;
    }
    printf("kvlingo-router: listening on %s port %d", a.r->cfg->listen, kvl__rpc_server_port(a.r->server));
    if (a.r->cfg->metrics) printf(", metrics port %d", kvr_metrics_port(a.r->metrics));
    printf("\n");
    fflush(stdout);

    int exit_code = 0;
    int rc = uv_loop_init(&a.loop);
    if (rc) { fprintf(stderr, "kvlingo-router: uv_loop_init: %s\n", uv_strerror(rc)); kvr_router_free(a.r); return 1; }
    /* memset(0) above: a handle never initialised has loop == NULL and is not closed */
    a.sighup.data = a.sigterm.data = a.sigint.data = &a;
    a.probe.data = a.expire.data = &a;
    uint64_t exp_ms = (uint64_t)(a.r->cfg->session_ttl_s * 1000 / 4);
    if (exp_ms < 500) exp_ms = 500;
    if (exp_ms > 60000) exp_ms = 60000;
    if ((rc = uv_signal_init(&a.loop, &a.sighup)) || (rc = uv_signal_init(&a.loop, &a.sigterm)) ||
        (rc = uv_signal_init(&a.loop, &a.sigint)) || (rc = uv_timer_init(&a.loop, &a.probe)) ||
        (rc = uv_timer_init(&a.loop, &a.expire)) ||
        (rc = uv_signal_start(&a.sighup, on_hup, SIGHUP)) ||
        (rc = uv_signal_start(&a.sigterm, on_term, SIGTERM)) ||
        (rc = uv_signal_start(&a.sigint, on_term, SIGINT)) ||
        (rc = uv_timer_start(&a.probe, on_probe, PROBE_MS, PROBE_MS)) ||
        (rc = uv_timer_start(&a.expire, on_expire, exp_ms, exp_ms))) {
        /* handles initialised so far are closed below; the loop then has nothing to run */
        fprintf(stderr, "kvlingo-router: libuv: %s\n", uv_strerror(rc));
        exit_code = 1;
    }

    if (!exit_code) uv_run(&a.loop, UV_RUN_DEFAULT);

    uv_handle_t *hs[] = {(uv_handle_t *)&a.sighup, (uv_handle_t *)&a.sigterm, (uv_handle_t *)&a.sigint,
                         (uv_handle_t *)&a.probe, (uv_handle_t *)&a.expire};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (hs[i]->loop == &a.loop && !uv_is_closing(hs[i])) uv_close(hs[i], NULL);
    uv_run(&a.loop, UV_RUN_DEFAULT);
    /* Stopping: closing the signal handles restored the default disposition; a repeated
     * SIGTERM/SIGINT must not cut the ledger's orderly close short. */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    uv_loop_close(&a.loop);
    kvr_router_free(a.r);
    kvl__svc_log_text("info", "stopped");
    return exit_code;
}
