/* router/main.c: kvlingo-router, the client-facing router of a kvlingo fleet.
 *
 *   kvlingo-router --config fleet.yaml [--check]
 *
 * The service loop (service/loop.h, libuv) runs the process: SIGHUP reloads the policy and
 * guardrail settings (sessions are kept), SIGTERM/SIGINT stop (running turns get a grace
 * period), timers re-probe nodes and expire idle sessions.  gRPC and the metrics endpoint run
 * on their own threads. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "loop.h"
#include "openai.h"
#include "router.h"
#include "tls.h"
#include "yamlcfg.h"
#include "error.h"
#include "kvlingo/version.h"

#define PROBE_MS 2000
#define FULL_PROBE_EVERY 5      /* every 5th probe asks healthy nodes too (sessions, translators) */

typedef struct app {
    kvr_router *r;
    int probes;
} app;

static void on_hup(void *arg) {
    app *a = arg;
    if (kvr_router_reload(a->r))
        kvl__svc_log_text("warn", "reload failed, keeping the old policy: %s", kvl_last_error());
    if (kvr_auth_reload(a->r))
        kvl__svc_log_text("warn", "key file reload failed, keeping the old keys: %s", kvl_last_error());
}

/* No drain check: the loop stops at once; running turns get their grace period in
 * kvr_router_free (the gRPC server's shutdown). */
static void on_term(void *arg, int sig) {
    (void)arg;
    kvl__svc_log_text("info", "signal %d: stopping", sig);
}

static void on_probe(void *arg) {
    app *a = arg;
    kvr_registry_refresh(a->r->reg, ++a->probes % FULL_PROBE_EVERY != 0, 1000);
    kvr_router_sync_pairs(a->r);
    kvr_auth_poll(a->r, kvr_wall_now());
}

static void on_expire(void *arg) {
    app *a = arg;
    kvr_router_expire(a->r);
}

static void on_start(void *arg) {
    app *a = arg;
    /* the address as configured, with the port the server holds (the configured one, or the
     * one chosen for port 0) */
    const char *listen = a->r->cfg->listen, *colon = strrchr(listen, ':');
    int host_len = colon ? (int)(colon - listen) : (int)strlen(listen);
    printf("kvlingo-router: listening on %.*s:%d", host_len, listen, kvl__rpc_server_port(a->r->server));
    if (a->r->cfg->metrics) printf(", metrics port %d", kvr_metrics_port(a->r->metrics));
    if (a->r->http) printf(", http port %d", kvr_oai_http_port(a->r->http));
    if (a->r->health_server) printf(", health port %d", kvl__rpc_server_port(a->r->health_server));
    printf(", %s", a->r->cfg->insecure ? "plaintext" : "TLS");
    printf("\n");
    fflush(stdout);
}

static void usage(FILE *f) {
    fputs("usage: kvlingo-router --config FILE.yaml [--http-listen HOST:PORT] [--insecure] [--check]\n"
          "Routes chat turns across a fleet of kvld nodes (kvlingo.v1.Router).  Options (--key value\n"
          "or --key=value):\n"
          "  --config FILE.yaml   fleet configuration: listen, nodes, policy, ledger, guardrail\n"
          "                       (router/README.md and router/config.h list every key); required\n"
          "  --http-listen HOST:PORT  serve the OpenAI-compatible HTTP API there (POST\n"
          "                       /v1/chat/completions, /v1/completions, GET /v1/models, /health,\n"
          "                       /ready); overrides the file's http_listen; port 0 picks one\n"
          "  --api-keys FILE      API keys -> tenants (YAML; overrides the file's api_keys; re-read\n"
          "                       on SIGHUP); without keys every client is tenant \"default\",\n"
          "                       which a start allows only with --insecure\n"
          "  --ticket-key-file FILE  the fleet's transfer-ticket key (>= 32 bytes, the nodes' too);\n"
          "                       overrides the file's ticket_key_file\n"
          "  --insecure           plaintext gRPC to clients and nodes, without TLS (the file's\n"
          "                       insecure: true does the same)\n"
          "  --check              run every check a start runs short of binding ports and loading\n"
          "                       weights (paths shown resolved), print the summary and exit\n"
          "  --version            version, git commit, build options, backends\n"
          "  -h, --help           this text\n", f);
}

int main(int argc, char **argv) {
    kvl__svc_log_init("router");
    kvl__rpc_log_to(kvl__svc_log);   /* gRPC core's own lines in the same logfmt */
    const char *config = NULL, *http_listen = NULL, *api_keys = NULL, *ticket_key = NULL;
    int check = 0, insecure = 0;
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'}, {"check", no_argument, NULL, 'k'},
        {"http-listen", required_argument, NULL, 'H'}, {"insecure", no_argument, NULL, 'I'},
        {"api-keys", required_argument, NULL, 'A'},
        {"ticket-key-file", required_argument, NULL, 'T'},
        {"version", no_argument, NULL, 'V'},      {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case 'k': check = 1; break;
        case 'H': http_listen = optarg; break;
        case 'T': ticket_key = optarg; break;
        case 'I': insecure = 1; break;
        case 'A': api_keys = optarg; break;
        case 'V': kvl_version_print(stdout, "kvlingo-router"); return 0;
        case 'h': usage(stdout); return 0;
        case ':': fprintf(stderr, "kvlingo-router: %s needs a value\n", argv[optind - 1]); usage(stderr); return 2;
        default: fprintf(stderr, "kvlingo-router: unknown option '%s'\n", argv[optind - 1]); usage(stderr); return 2;
        }
    }
    if (optind < argc) { fprintf(stderr, "kvlingo-router: unexpected argument '%s'\n", argv[optind]); usage(stderr); return 2; }
    if (!config) { fprintf(stderr, "kvlingo-router: --config FILE.yaml is required\n"); usage(stderr); return 2; }
    signal(SIGPIPE, SIG_IGN);
    kvr_config *cfg = NULL;
    kvl_status s = kvr_config_load(config, &cfg);
    if (!s) s = kvr_policy_check(cfg);
    if (!s && insecure) cfg->insecure = 1;   /* the flag wins over the file's key */
    if (!s && api_keys) {   /* the flag wins over the file's key; relative to the working directory */
        char *dup = api_keys[0] ? strdup(api_keys) : NULL;
        if (!dup) s = kvl__errorf(KVL_ERR_INVALID_ARG, "--api-keys needs a file");
        else {
            free(cfg->api_keys);
            cfg->api_keys = dup;
            cfg->api_keys_line = 0;
        }
    }
    if (!s && http_listen) {   /* the flag wins over the file's key */
        char *dup = strdup(http_listen);
        if (!dup) s = kvl__errorf(KVL_ERR_NOMEM, "--http-listen");
        else if (kvl__svc_check_hostport("--http-listen", dup, 1) != KVL_OK) {
            s = kvl__errorf(KVL_ERR_INVALID_ARG, "--http-listen '%s' is not host:port (a port in [0, 65535])", dup);
            free(dup);
        } else {
            free(cfg->http_listen);
            cfg->http_listen = dup;
        }
    }
    if (!s && ticket_key) {   /* the flag wins over the file's key */
        free(cfg->ticket_key_file);
        if (!(cfg->ticket_key_file = strdup(ticket_key))) s = kvl__errorf(KVL_ERR_NOMEM, "--ticket-key-file");
    }
    if (s) {
        fprintf(stderr, "kvlingo-router: %s\n", kvl_last_error());
        kvr_config_free(cfg);
        return 1;
    }
    if (!cfg->insecure) {
        /* a fleet that is not insecure needs TLS, transfer tickets and API keys: one line names
         * every piece that is missing */
        char why[2048];
        size_t n = 0;
        why[0] = 0;
        if (!cfg->tls_cert && !cfg->tls_key && !cfg->tls_ca)
            n += (size_t)snprintf(why + n, sizeof why - n, "%s", KVL_SVC_TLS_REQUIRED_MSG);
        if (!cfg->ticket_key_file && n < sizeof why)
            n += (size_t)snprintf(why + n, sizeof why - n, "%sno transfer-ticket key: give ticket_key_file: "
                                  "in %s (or --ticket-key-file FILE; the nodes' key)", n ? "; " : "", config);
        if (!cfg->api_keys && n < sizeof why)
            n += (size_t)snprintf(why + n, sizeof why - n, "%sno api_keys: without a key file every client "
                                  "could read every session; give api_keys: FILE (or --api-keys FILE)",
                                  n ? "; " : "");
        if (n) {
            fprintf(stderr, "kvlingo-router: %s%s; or insecure: true / --insecure for a development fleet "
                    "(plaintext gRPC, anonymous clients as tenant \"default\", spans without tickets)\n",
                    check ? "--check: " : "", why);
            kvr_config_free(cfg);
            return 1;
        }
    }
    if (!check && !cfg->ticket_key_file)
        kvl__svc_log_text("warn", "insecure and no ticket_key_file: span moves carry no transfer ticket");
    if (check) {
        s = kvr_router_check(cfg, stdout);
        if (s) fprintf(stderr, "kvlingo-router: --check: %s\n", kvl_last_error());
        else printf("%s: ok (policy %s, %d nodes)\n", config, cfg->policy_name, cfg->n_nodes);
        kvr_config_free(cfg);
        return s ? 1 : 0;
    }

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
    uint64_t exp_ms = (uint64_t)(a.r->cfg->session_ttl_s * 1000 / 4);
    if (exp_ms < 500) exp_ms = 500;
    if (exp_ms > 60000) exp_ms = 60000;
    kvl__svc_loop_cfg loop = {
        .arg = &a,
        .on_start = on_start,
        .on_drain = on_term,
        .drain_timeout_ms = -1,
        .on_hup = on_hup,
        .timers = {{PROBE_MS, on_probe}, {(unsigned)exp_ms, on_expire}},
    };
    int exit_code = 0;
    if (kvl__svc_loop_run(&loop)) {
        fprintf(stderr, "kvlingo-router: %s\n", kvl_last_error());
        exit_code = 1;
    }
    kvr_router_free(a.r);
    kvl__svc_log_text("info", "stopped");
    return exit_code;
}
