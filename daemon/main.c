/* daemon/main.c: kvld entry point.  The main thread runs the service loop (service/loop.h) that
 * owns signals and timers; gRPC handlers, the scheduler, the transport and the metrics endpoint
 * run on their own threads.  SIGTERM/SIGINT drain: new work is refused (UNAVAILABLE), health
 * turns NOT_SERVING, running streams finish, then the process exits 0 (or after
 * --drain-timeout-ms). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "loop.h"
#include "node.h"
#include "peers.h"
#include "tls.h"
#include "kvlingo/backend.h"
#include "kvlingo/version.h"

/* Transfer tickets: a readable key of at least 32 bytes, or --insecure for a fleet without
 * them (warned at start).  0 (with the reason on stderr) when the node must not start. */
static int tickets_settled(const kvld_config *cfg, const char *pre) {
    if (cfg->ticket_key_file[0]) {
        kvl__ticket_key k;
        kvl_status st = kvl__ticket_key_load(cfg->ticket_key_file, &k);
        memset(&k, 0, sizeof k);
        if (st == KVL_OK) kvl__svc_warn_if_world_readable("ticket_key_file", cfg->ticket_key_file);
        if (st == KVL_OK) return 1;
        fprintf(stderr, "kvld: %s%s (ticket_key_file)\n", pre, kvl_last_error());
        return 0;
    }
    if (cfg->insecure) return 1;
    fprintf(stderr, "kvld: %sno transfer-ticket key: give --ticket-key-file FILE (YAML ticket_key_file:, "
            "the fleet's key, the router's too), or --insecure for a development fleet where spans "
            "move without tickets (and gRPC runs without TLS)\n", pre);
    return 0;
}

/* --check: the settings parsed; the files they name exist (paths shown resolved); nothing is
 * bound or loaded. */
static int check_settings(const kvld_config *cfg) {
    char res[PATH_MAX], path[PATH_MAX + 32];
    int bad = 0;
    char note[PATH_MAX + 96];
    if (!realpath(cfg->model, res)) {
        int e = errno;
        fprintf(stderr, "kvld: --check: model '%s': %s%s\n", cfg->model, strerror(e),
                kvld_config_cwd_note(cfg->model, note, sizeof note));
        return 1;
    }
    snprintf(path, sizeof path, "%s/config.json", res);
    if (access(path, R_OK)) {
        fprintf(stderr, "kvld: --check: model '%s' (resolved %s): no readable config.json\n", cfg->model, res);
        bad = 1;
    }
    printf("model: %s\n", res);
    if (cfg->translators[0]) {
        char tres[PATH_MAX];
        struct stat sb;
        if (!realpath(cfg->translators, tres) || stat(tres, &sb) || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "kvld: --check: translators '%s': not a directory%s\n", cfg->translators,
                    kvld_config_cwd_note(cfg->translators, note, sizeof note));
            bad = 1;
        } else {
            printf("translators: %s\n", tres);
        }
    }
    kvl_device d;
    int idx;
    if (kvl_device_parse(cfg->device, &d, &idx) != KVL_OK) {
        fprintf(stderr, "kvld: --check: %s\n", kvl_last_error());
        bad = 1;
    }
    printf("peers: %s\n", cfg->peers[0] ? cfg->peers : "none");
    printf("insecure: %s\n", cfg->insecure ? "yes (plaintext gRPC)" : "no");
    kvl__svc_tls tls;
    if (kvld_config_tls(cfg, &tls) != KVL_OK) {
        fprintf(stderr, "kvld: --check: %s\n", kvl_last_error());
        bad = 1;
    } else if (tls.cert_pem) {
        printf("tls: %s (until %s), client certificates required, CA %s\n", tls.subject,
               tls.not_after, cfg->tls_ca);
    }
    kvl__svc_tls_free(&tls);
    printf("health_listen: %s\n", cfg->health_listen[0] ? cfg->health_listen : "off");
    if (!tickets_settled(cfg, "--check: ")) bad = 1;
    else printf("transfer tickets: %s%s\n", cfg->ticket_key_file[0] ? "key " : "off (insecure, no ticket key)",
                cfg->ticket_key_file);
    printf("advertise: %s\nsession_idle_ttl_s: %d\nimport_timeout_ms: %d\n",
           cfg->advertise[0] ? cfg->advertise : cfg->listen, cfg->session_idle_ttl_s, cfg->import_timeout_ms);
    printf("listen: %s\nmetrics: %s\ntransport: %s\ndevice: %s\nmax_sessions: %d\n%s\n", cfg->listen,
           cfg->metrics[0] ? cfg->metrics : "off", cfg->transport, cfg->device, cfg->max_sessions,
           bad ? "check failed" : "ok");
    return bad;
}

static void begin_drain(void *arg, int signum) {
    kvld_node *n = arg;
    n->draining = 1;
    kvl__rpc_server_set_health(n->rpc, "", 0);
    kvl__rpc_server_set_health(n->rpc, "kvlingo.v1.Node", 0);
    kvld_metrics_set(n->metrics, KVLD_G_DRAINING, 1);
    kvl__svc_log("info", "msg=draining signal=%s work_in_flight=%d",
                 signum == SIGTERM ? "SIGTERM" : "SIGINT",
                 __atomic_load_n(&n->work_in_flight, __ATOMIC_SEQ_CST));
}

/* While draining: done once no work is left (or the loop's timeout has passed). */
static int drain_check(void *arg, double waited_s, int timed_out) {
    kvld_node *n = arg;
    int busy = __atomic_load_n(&n->work_in_flight, __ATOMIC_SEQ_CST) + kvld_sched_active(n->sched);
    if (busy && !timed_out) return 0;
    kvl__svc_log("info", "msg=drained busy=%d waited_s=%.3f", busy, waited_s);
    return 1;
}

/* Every 200 ms: expire idle sessions, refresh the gauges computed from the session table and
 * the transport's drop counter. */
static void on_tick(void *arg) {
    kvld_node *n = arg;
    static uint64_t dropped_seen, abandoned_seen;
    int expired = kvld_sessions_expire(n->sessions, (double)n->cfg.session_idle_ttl_s);
    for (int i = 0; i < expired; i++) kvld_metrics_refuse(n->metrics, KVLD_R_SESSION_EXPIRED);
    if (expired)
        kvl__svc_log("info", "msg=sessions_expired count=%d idle_ttl_s=%d", expired, n->cfg.session_idle_ttl_s);
    uint64_t dropped = kvl__transport_unmatched_dropped(n->transport);
    if (dropped > dropped_seen) {
        kvld_metrics_add(n->metrics, KVLD_C_UCX_UNMATCHED_DROPPED, dropped - dropped_seen);
        dropped_seen = dropped;
    }
    static uint64_t kept_seen;
    uint64_t kept = kvl__transport_sends_kept(n->transport);
    if (kept > kept_seen) {
        kvld_metrics_add(n->metrics, KVLD_C_UCX_SEND_KEPT, kept - kept_seen);
        kept_seen = kept;
    }
    uint64_t abandoned = kvl__transport_receives_abandoned(n->transport);
    if (abandoned > abandoned_seen) {
        kvld_metrics_add(n->metrics, KVLD_C_UCX_RECV_ABANDONED, abandoned - abandoned_seen);
        abandoned_seen = abandoned;
    }
    static uint64_t evicted_seen;
    uint64_t evicted = kvl__transport_peers_evicted(n->transport);
    if (evicted > evicted_seen) {
        kvld_metrics_add(n->metrics, KVLD_C_UCX_EP_EVICTED, evicted - evicted_seen);
        evicted_seen = evicted;
    }
    kvld_metrics_set(n->metrics, KVLD_G_UCX_ENDPOINTS, (double)kvl__transport_peers_open(n->transport));
    kvld_metrics_set(n->metrics, KVLD_G_SESSIONS, kvld_sessions_count(n->sessions));
    kvld_metrics_set(n->metrics, KVLD_G_CACHE_BYTES,
                     (double)kvld_sessions_cache_bytes(n->sessions));
}

/* SIGHUP: the command line is read again (flags, and the --config file they name, flags
 * winning) and its `peers` becomes the fleet: a membership change without a restart.  Every
 * other setting stays as it started; a line that no longer parses changes nothing. */
static void on_hup(void *arg) {
    kvld_node *n = arg;
    kvld_config *next = malloc(sizeof *next);
    if (!next) {
        kvl__svc_log("error", "msg=reload_failed err=\"out of memory\"");
        return;
    }
    kvld_config_defaults(next);
    kvld_cli_mode mode;
    kvl_status st = kvld_config_parse_cli(next, n->argc, n->argv, &mode);
    if (st == KVL_OK) st = kvld_peers_reload(n, next->peers);
    if (st != KVL_OK)
        kvl__svc_log("error", "msg=reload_failed err=\"%s\" note=\"the fleet is as it was\"", kvl_last_error());
    char changed[512];
    if (st == KVL_OK && kvld_config_changed(&n->cfg, next, changed, sizeof changed))
        kvl__svc_log("warn", "msg=reload_ignored keys=%s note=\"SIGHUP applies peers only: restart kvld to "
                     "apply these\"", changed);
    free(next);
}

static void on_start(void *arg) {
    kvld_node *n = arg;
    const kvld_config *cfg = &n->cfg;
    const kvl_model_config *mc = kvl_model_config_get(n->model);
    /* the port line is what scripts wait for (it says which port "HOST:0" got) */
    kvl__svc_log("info", "msg=serving model=%s hash=%s arch=%s listen=%s port=%d metrics=%s "
                 "transport=%s translators=%d max_sessions=%d max_context=%d device=%s "
                 "weights_dtype=%s kv_dtype=%s warmup_ms=%.1f peers=%s tls=%s health_port=%d",
                 kvl_model_name(n->model), kvl_model_hash(n->model), mc->architecture,
                 cfg->listen, kvl__rpc_server_port(n->rpc), cfg->metrics[0] ? cfg->metrics : "-",
                 cfg->transport, n->translators.n, cfg->max_sessions, n->max_context, cfg->device,
                 kvl_weights_dtype_name(kvl_model_weights_dtype(n->model)),
                 kvl_kv_dtype_name(kvl_model_kv_dtype(n->model)), n->warmup_ms,
                 cfg->peers[0] ? cfg->peers : "-", cfg->insecure ? "off" : "mutual",
                 n->health_rpc ? kvl__rpc_server_port(n->health_rpc) : 0);
}

int main(int argc, char **argv) {
    kvl__svc_log_init("kvld");
    kvl__rpc_log_to(kvl__svc_log);   /* gRPC core's own lines in the same logfmt */
    kvld_config cfg;
    kvld_config_defaults(&cfg);
    kvld_cli_mode mode;
    if (kvld_config_parse_cli(&cfg, argc, argv, &mode) != KVL_OK) {
        fprintf(stderr, "kvld: %s\n(kvld --help lists every option)\n", kvl_last_error());
        return 2;
    }
    if (mode == KVLD_CLI_HELP) {
        fputs(kvld_config_usage(), stdout);
        return 0;
    }
    if (mode == KVLD_CLI_VERSION) {
        kvl_version_print(stdout, "kvld");
        return 0;
    }
    if (mode == KVLD_CLI_CHECK) return check_settings(&cfg);
    if (!cfg.insecure && (!cfg.ticket_key_file[0] || (!cfg.tls_cert[0] && !cfg.tls_key[0] && !cfg.tls_ca[0]))) {
        /* a node that is not insecure needs TLS and the fleet's ticket key: one line names both */
        int no_tls = !cfg.tls_cert[0] && !cfg.tls_key[0] && !cfg.tls_ca[0], no_key = !cfg.ticket_key_file[0];
        fprintf(stderr, "kvld: %s%s%s; or --insecure for a development fleet (plaintext gRPC, spans "
                "without tickets)\n", no_tls ? KVL_SVC_TLS_REQUIRED_MSG : "", no_tls && no_key ? "; " : "",
                no_key ? "no transfer-ticket key: give --ticket-key-file FILE (YAML ticket_key_file:, the "
                         "fleet's key, the router's too)" : "");
        return 1;
    }
    if (!tickets_settled(&cfg, "")) return 2;
    if (!cfg.ticket_key_file[0])
        kvl__svc_log("warn", "msg=tickets_off note=\"insecure and no ticket_key_file: spans move on any "
                     "caller's ExportSpan/ImportSpan, without a router-issued ticket\"");
    /* a peer that closes a socket must not kill the node */
    signal(SIGPIPE, SIG_IGN);
    kvld_node *node = NULL;
    kvl_status st = kvld_node_create(&cfg, &node);
    if (st != KVL_OK) {
        char note[PATH_MAX + 96];
        struct stat sb;
        /* a model directory that is not there: whose working directory the path was read against */
        kvld_config_cwd_note(strstr(kvl_last_error(), "loading the model") && stat(cfg.model, &sb) != 0 ? cfg.model : NULL,
                      note, sizeof note);
        kvl__svc_log("error", "msg=startup_failed err=\"%s%s\"", kvl_last_error(), note);
        return 1;
    }
    /* warm before serving: the health check turns SERVING only once a request would find the
     * node warm */
    st = kvld_warmup(node);
    if (st != KVL_OK) {
        kvl__svc_log("error", "msg=startup_failed err=\"%s\"", kvl_last_error());
        kvld_node_free(node);
        return 1;
    }
    node->argc = argc;
    node->argv = argv;
    st = kvld_node_serve(node);
    if (st == KVL_OK) st = kvld_peers_start(node);
    if (st != KVL_OK) {
        kvl__svc_log("error", "msg=startup_failed err=\"%s\"", kvl_last_error());
        kvld_node_free(node);
        return 1;
    }
    kvl__svc_loop_cfg loop = {
        .arg = node,
        .on_start = on_start,
        .on_drain = begin_drain,
        .drain_check = drain_check,
        .drain_poll_ms = 200,
        .drain_timeout_ms = cfg.drain_timeout_ms,
        .on_hup = on_hup,
        .timers = {{200, on_tick}},
    };
    st = kvl__svc_loop_run(&loop);
    if (st != KVL_OK) {
        kvl__svc_log("error", "msg=libuv_failed err=\"%s\"", kvl_last_error());
        kvld_node_free(node);
        return 1;
    }
    kvl__rpc_server_shutdown(node->rpc, 2000);
    kvld_node_free(node);
    kvl__svc_log("info", "msg=exit code=0");
    return 0;
}
