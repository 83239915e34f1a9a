/* router/router.c: lifecycle of the router context: create, serve, reload (SIGHUP), TTL expiry,
 * gauges, free. */
#include "router.h"
#include "openai.h"
#include "prefix.h"
#include "log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "nodecall.h"
#include "push_ahead.h"

/* Ended sessions stay visible to GetSession for this long before their rows are purged. */
#define ENDED_KEEP_S 86400.0
#define EXPIRE_BATCH 256

double kvr_wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void ledger_observer(void *arg, const char *op, int write, double seconds) {
    kvr_router *r = arg;
    char lab[96];
    snprintf(lab, sizeof lab, "backend=\"%s\",op=\"%s\"", kvr_ledger_backend(r->ledger), op);
    kvr_metrics_observe(r->metrics, "kvlingo_router_ledger_seconds", lab, seconds);
    if (write) kvr_metrics_observe(r->metrics, "kvlingo_router_ledger_write_seconds", "", seconds);
}

/* Absolute form of `p` for messages: realpath when it exists, else the current directory
 * prepended to a relative path. */
static void shown_path(const char *p, char *buf, size_t cap) {
    char tmp[PATH_MAX], cwd[PATH_MAX];
    if (realpath(p, tmp)) { snprintf(buf, cap, "%s", tmp); return; }
    if (p[0] != '/' && getcwd(cwd, sizeof cwd)) snprintf(tmp, sizeof tmp, "%s/%s", cwd, p);
    else snprintf(tmp, sizeof tmp, "%s", p);
    /* a path that does not exist: drop "." and resolve ".." lexically */
    size_t o = 0;
    for (char *save = NULL, *c = strtok_r(tmp, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (!strcmp(c, ".")) continue;
        if (!strcmp(c, "..")) {
            while (o > 0 && buf[o - 1] != '/') o--;
            if (o > 0) o--;
            continue;
        }
        o += (size_t)snprintf(buf + o, o < cap ? cap - o : 0, "/%s", c);
        if (o >= cap) { o = cap - 1; break; }
    }
    if (o == 0 && cap > 1) buf[o++] = '/';
    if (cap) buf[o < cap ? o : cap - 1] = 0;
}

/* The tokenizer of `tokenizer:` (a tokenizer.json or a model directory); errors name the key,
 * its line and the resolved path. */
static kvl_status load_tokenizer(const kvr_config *cfg, kvl_tokenizer **out) {
    char shown[PATH_MAX + 64];
    shown_path(cfg->tokenizer, shown, sizeof shown);
    struct stat stt;
    if (stat(cfg->tokenizer, &stt))
        return kvl__errorf(KVL_ERR_IO, "%s:%d: key 'tokenizer': '%s' resolves to %s, which does not "
                          "exist (relative paths are relative to the configuration file's directory)",
                          cfg->path, cfg->tokenizer_line, cfg->tokenizer_given ? cfg->tokenizer_given : "",
                          shown);
    kvl_status s = S_ISDIR(stt.st_mode) ? kvl_tokenizer_load_dir(cfg->tokenizer, out)
                                        : kvl_tokenizer_load(cfg->tokenizer, out);
    if (s) {
        char pre[PATH_MAX + 200];
        snprintf(pre, sizeof pre, "%s:%d: key 'tokenizer' (%s)", cfg->path, cfg->tokenizer_line, shown);
        kvl__error_prefix(s, pre);
    }
    return s;
}

/* Whether the tokenizer's chat template renders (an empty conversation): 1, else 0 with why. */
static int chat_template_renders(const kvl_tokenizer *tok, char *why, size_t cap) {
    char *text = NULL;
    kvl_status s = kvl_tokenizer_apply_chat_template(tok, NULL, 0, 1, &text);
    free(text);
    if (s) snprintf(why, cap, "%s", kvl_last_error());
    return !s;
}

/* The ledger's file must be writable, or its directory must exist and be writable.  A
 * PostgreSQL ledger is not contacted (a check must not migrate a shared database). */
static kvl_status check_ledger(const kvr_config *cfg, char *shown, size_t cap) {
    if (kvr_ledger_is_postgres(cfg->ledger)) {
        kvr_ledger_shown(cfg->ledger, shown, cap);
        return KVL_OK;
    }
    const char *path = !strncmp(cfg->ledger, "sqlite:", 7) ? cfg->ledger + 7 : cfg->ledger;
    shown_path(path, shown, cap);
    if (!access(path, F_OK)) {
        if (access(path, R_OK | W_OK))
            return kvl__errorf(KVL_ERR_IO, "%s:%d: key 'ledger': %s is not readable and writable: %s",
                              cfg->path, cfg->ledger_line, shown, strerror(errno));
        return KVL_OK;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    const char *d = slash ? (dir[0] ? dir : "/") : ".";
    struct stat st;
    if (stat(d, &st) || !S_ISDIR(st.st_mode) || access(d, W_OK | X_OK))
        return kvl__errorf(KVL_ERR_IO, "%s:%d: key 'ledger': %s cannot be created: directory '%s' %s",
                          cfg->path, cfg->ledger_line, shown, d,
                          stat(d, &st) ? "does not exist" : "is not a writable directory");
    return KVL_OK;
}

/* The TLS files of the router (see router.h): loaded and checked, or empty with insecure. */
kvl_status kvr_router_tls(const kvr_config *cfg, kvl__svc_tls *out) {
    memset(out, 0, sizeof *out);
    int hc = cfg->tls_cert != NULL, hk = cfg->tls_key != NULL, ha = cfg->tls_ca != NULL;
    if (cfg->insecure) {
        if (hc || hk || ha)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: insecure is set together with %s: choose TLS "
                              "or plaintext", cfg->path, hc ? "tls_cert" : hk ? "tls_key" : "tls_ca");
        return KVL_OK;
    }
    if (!hc && !hk && !ha)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: %s", cfg->path, KVL_SVC_TLS_REQUIRED_MSG);
    if (!hc || !hk || !ha)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: TLS needs tls_cert, tls_key and tls_ca; %s is "
                          "not set", cfg->path, !hc ? "tls_cert" : !hk ? "tls_key" : "tls_ca");
    kvl_status s = kvl__svc_tls_load(cfg->tls_cert, cfg->tls_key, cfg->tls_ca, out);
    if (s) kvl__error_prefix(s, cfg->path);
    return s;
}

kvl_status kvr_router_check(const kvr_config *cfg, FILE *out) {
    char ledger[PATH_MAX + 64], tokp[PATH_MAX + 64], cfgp[PATH_MAX + 64];
    kvl_tokenizer *tok = NULL;
    kvl_status s = load_tokenizer(cfg, &tok);
    size_t vocab = tok ? kvl_tokenizer_vocab_size(tok) : 0;
    char chat_why[600] = "";
    const int chat_ok = tok && chat_template_renders(tok, chat_why, sizeof chat_why);
    kvl_tokenizer_free(tok);
    if (!s) s = check_ledger(cfg, ledger, sizeof ledger);
    if (!s) s = kvr_policy_check((kvr_config *)cfg);
    kvl__svc_tls tls;
    if (!s) s = kvr_router_tls(cfg, &tls);
    kvr_tenants *tn = NULL;
    if (!s) s = kvr_auth_load(cfg, &tn);
    if (!s && cfg->ticket_key_file) {
        kvl__ticket_key k;
        s = kvl__ticket_key_load(cfg->ticket_key_file, &k);
        memset(&k, 0, sizeof k);
    }
    if (s) return s;
    if (tls.cert_pem)
        fprintf(out, "tls: %s (until %s), CA %s\n", tls.subject, tls.not_after, cfg->tls_ca);
    kvl__svc_tls_free(&tls);
    shown_path(cfg->path, cfgp, sizeof cfgp);
    shown_path(cfg->tokenizer, tokp, sizeof tokp);
    fprintf(out, "config: %s\nlisten: %s\nmetrics: %s\nhttp (OpenAI API): %s (body <= %ld bytes, <= %ld "
            "connections)\nledger: %s (%s)\ntokenizer: %s (vocabulary %zu)\n"
            "policy: %s\nnodes: %d\nreplica: %s (lease %.0f ms, wait %.0f ms)\ninsecure: %s\n", cfgp, cfg->listen,
            cfg->metrics ? cfg->metrics : "off", cfg->http_listen ? cfg->http_listen : "off",
            cfg->http_max_body, cfg->http_max_conn, ledger,
            kvr_ledger_is_postgres(cfg->ledger) ? "postgresql, not contacted by --check"
            : access(!strncmp(cfg->ledger, "sqlite:", 7) ? cfg->ledger + 7 : cfg->ledger, F_OK) ? "will be created"
                                                                                                : "exists",
            tokp, vocab, cfg->policy_name, cfg->n_nodes, cfg->replica_id, cfg->lease_ms, cfg->lease_wait_ms,
            cfg->insecure ? "yes (plaintext gRPC)" : "no");
    fprintf(out, "health_listen: %s\n", cfg->health_listen ? cfg->health_listen : "off");
    if (chat_ok) fprintf(out, "chat template: renders\n");
    else fprintf(out, "chat template: none it can render (/v1/chat/completions answers 500, /v1/completions "
                 "works): %s\n", chat_why);
    fprintf(out, "transfer tickets: %s%s\n", cfg->ticket_key_file ? "key " : "off (no ticket_key_file)",
            cfg->ticket_key_file ? cfg->ticket_key_file : "");
    for (int i = 0; i < cfg->n_nodes; i++)
        fprintf(out, "  %s  %s  model %s\n", cfg->nodes[i].name, cfg->nodes[i].address, cfg->nodes[i].model);
    if (cfg->api_keys) {
        shown_path(cfg->api_keys, cfgp, sizeof cfgp);
        fprintf(out, "api_keys: %s (%d tenants, %d keys)\n", cfgp, kvr_tenants_count(tn), kvr_tenants_key_count(tn));
    } else {
        fprintf(out, "api_keys: none: every client is tenant \"default\"%s\n",
                cfg->insecure ? "" : " (a start refuses this without insecure)");
    }
    kvr_tenants_free(tn);
    return KVL_OK;
}

kvl_status kvr_router_create(kvr_config *cfg, kvr_router **out) {
    *out = NULL;
    kvr_router *r = calloc(1, sizeof *r);
    if (!r) { kvr_config_free(cfg); return kvl__errorf(KVL_ERR_NOMEM, "router"); }
    r->cfg = cfg;
    pthread_rwlock_init(&r->policy_lock, NULL);
    pthread_mutex_init(&r->busy_mu, NULL);
    r->max_busy = (int)cfg->max_busy_sessions;
    r->busy = calloc((size_t)r->max_busy + 1, sizeof *r->busy);   /* + the expiry's place */
    kvl_status s = r->busy ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "router busy table");
    if (!s) s = kvr_router_tls(cfg, &r->tls);
    if (!s && cfg->insecure) {
        r->server_tls = r->client_tls = (kvl__rpc_tls){.insecure = 1};
        kvl__svc_log_text("warn", "insecure: the Router API and the channels to nodes run plaintext, "
                          "without TLS");
    } else if (!s) {
        /* clients verify the router but authenticate with API keys, not certificates; nodes
         * require the router's certificate (mutual TLS) */
        r->server_tls = (kvl__rpc_tls){.cert_pem = r->tls.cert_pem, .key_pem = r->tls.key_pem,
                                       .ca_pem = r->tls.ca_pem};
        r->client_tls = r->server_tls;
        kvl__svc_log_text("info", "tls: %s (until %s), CA %s", r->tls.subject, r->tls.not_after,
                          cfg->tls_ca);
    }
    if (!s) s = kvr_auth_check_start(cfg);
    if (!s) s = kvr_auth_load(cfg, &r->tenants);
    if (!s) kvr_auth_mark(r);
    if (!s) s = kvr_metrics_create(&r->metrics);
    if (!s) {   /* every series at zero from the start, for each model of the fleet */
        const char **models = calloc((size_t)cfg->n_nodes + 1, sizeof *models);
        int nm = 0;
        for (int i = 0; models && i < cfg->n_nodes; i++) {
            int seen = 0;
            for (int j = 0; j < nm && !seen; j++) seen = !strcmp(models[j], cfg->nodes[i].model);
            if (!seen) models[nm++] = cfg->nodes[i].model;
        }
        kvr_metrics_declare(r->metrics, models, nm);
        free(models);
        kvr_auth_declare(r);
    }
    if (!s && cfg->ticket_key_file) {
        s = kvl__ticket_key_load(cfg->ticket_key_file, &r->ticket_key);
        if (!s) kvl__svc_warn_if_world_readable("ticket_key_file", cfg->ticket_key_file);
        if (!s) s = kvl__ticket_warmup(&r->ticket_key);
        r->tickets = s == KVL_OK;
    }
    if (!s) s = kvr_ledger_open(cfg->ledger, &r->ledger);
    if (!s) {
        kvr_ledger_set_observer(r->ledger, ledger_observer, r);
        kvr_metrics_declare_ledger(r->metrics, kvr_ledger_backend(r->ledger));
    }
    if (!s) s = kvr_leases_create(r->ledger, cfg->replica_id, cfg->lease_ms / 1000.0, r->max_busy, &r->leases);
    if (!s) s = load_tokenizer(cfg, &r->tok);
    char chat_why[600];
    if (!s && cfg->http_listen && !chat_template_renders(r->tok, chat_why, sizeof chat_why))
        kvl__svc_log_text("warn", "%s: /v1/chat/completions will answer 500 (use /v1/completions): %s",
                          cfg->path, chat_why);
    if (!s) s = kvr_registry_create(cfg, &r->client_tls, &r->reg);
    if (!s && r->tickets) s = kvl__ticket_key_id(&r->ticket_key, r->reg->ticket_key_id);
    if (!s) s = kvr_policy_create(cfg, &r->policy);
    if (!s) s = kvr_guard_create(cfg, r->reg, r->metrics, &r->guard);
    if (!s) s = kvr_prefix_create((int)cfg->prefix_blocks, &r->prefix);
    if (!s) s = kvr_push_ahead_create(r, &r->push);
    if (s) { kvr_router_free(r); return s; }
    int healthy = kvr_registry_refresh(r->reg, 0, 2000);
    kvr_router_sync_pairs(r);
    char shown[512];
    kvr_ledger_shown(cfg->ledger, shown, sizeof shown);
    kvl__svc_log_text("info", "%d of %d nodes answer; policy %s; ledger %s (%s, schema %d); replica %s; %s",
            healthy, r->reg->n, kvr_policy_name(r->policy), shown, kvr_ledger_backend(r->ledger),
            kvr_ledger_schema(r->ledger), cfg->replica_id,
            cfg->api_keys ? "API keys required" : "no API keys: every client is tenant default");
    kvr_metrics_set_gauges(r->metrics, kvr_router_gauges, r);
    *out = r;
    return KVL_OK;
}

void kvr_router_free(kvr_router *r) {
    if (!r) return;
    kvr_oai_http_stop(r->http);     /* its running turns end before what they use goes */
    if (r->server) kvl__rpc_server_shutdown(r->server, 2000);
    kvl__rpc_server_free(r->health_server);   /* it reads r->server's health: goes first */
    kvl__rpc_server_free(r->server);
    kvr_push_ahead_free(r->push);   /* its workers use the registry, ledger and metrics */
    /* releases what it holds through the ledger, whose observer feeds the metrics */
    kvr_leases_free(r->leases);
    kvr_guard_free(r->guard);
    kvr_metrics_free(r->metrics);   /* stops the HTTP thread before what its gauges read goes */
    kvr_policy_free(r->policy);
    kvr_registry_free(r->reg);
    kvr_ledger_free(r->ledger);
    kvr_prefix_free(r->prefix);
    kvl_tokenizer_free(r->tok);
    kvr_tenants_free(r->tenants);
    kvr_config_free(r->cfg);
    kvl__svc_tls_free(&r->tls);
    free(r->busy);
    pthread_mutex_destroy(&r->busy_mu);
    pthread_rwlock_destroy(&r->policy_lock);
    memset(&r->ticket_key, 0, sizeof r->ticket_key);
    free(r);
}

void kvr_router_sync_pairs(kvr_router *r) {
    /* make every discovered translator pair visible (metrics, ListNodes) before its first use */
    for (int i = 0; i < r->reg->n; i++) {
        kvr_node n;
        kvr_registry_copy(r->reg, i, &n);
        for (int t = 0; t < n.n_tr_from; t++) kvr_guard_pair_ok(r->guard, n.tr_from[t], n.model);
    }
}

/* 1 when the file's node list is not the one the router runs (names, addresses, models, order). */
static int nodes_differ(const kvr_config *a, const kvr_config *b) {
    if (a->n_nodes != b->n_nodes) return 1;
    for (int i = 0; i < a->n_nodes; i++)
        if (strcmp(a->nodes[i].name, b->nodes[i].name) || strcmp(a->nodes[i].address, b->nodes[i].address) ||
            strcmp(a->nodes[i].model, b->nodes[i].model))
            return 1;
    return 0;
}

kvl_status kvr_router_reload(kvr_router *r) {
    kvr_config *nc = NULL;
    kvl_status s = kvr_config_load(r->cfg->path, &nc);
    if (s) return s;
    /* The nodes are read at start only (the registry, its probes and every session's holdings
     * name them), so the new policy is checked against the running fleet: checked against the
     * file's list, a policy naming a model only a newly listed node serves was accepted, and
     * every turn it chose that model for failed NOT_FOUND. */
    int moved = nodes_differ(nc, r->cfg);
    kvr_node_cfg *file_nodes = nc->nodes;
    int file_n = nc->n_nodes;
    nc->nodes = r->cfg->nodes;
    nc->n_nodes = r->cfg->n_nodes;
    kvr_policy *np = NULL;
    s = kvr_policy_create(nc, &np);
    nc->nodes = file_nodes;
    nc->n_nodes = file_n;
    if (s) {
        if (moved) {
            char why[1024];
            snprintf(why, sizeof why, "%s", kvl_last_error());   /* errorf writes that buffer */
            kvl__errorf(s, "%s (checked against the running fleet's nodes: 'nodes:' changed in the "
                        "file, but it is read at start only; restart the router to apply it)", why);
        }
        kvr_config_free(nc);
        return s;
    }
    if (moved)
        kvl__svc_log_text("warn", "%s: 'nodes:' differs from the running fleet's %d nodes and is read at "
                          "start only: the nodes are as they were; restart the router to apply it",
                          r->cfg->path, r->cfg->n_nodes);
    /* only the policy and the guardrail change: nodes, ledger and listen addresses need a
     * restart (sessions survive that too) */
    pthread_rwlock_wrlock(&r->policy_lock);
    kvr_policy *old = r->policy;
    r->policy = np;
    kvl__svc_kvlist tmp = r->cfg->policy;
    r->cfg->policy = nc->policy;
    nc->policy = tmp;
    char *tn = r->cfg->policy_name;
    r->cfg->policy_name = nc->policy_name;
    nc->policy_name = tn;
    r->cfg->shadow_fraction = nc->shadow_fraction;
    r->cfg->kl_budget = nc->kl_budget;
    r->cfg->kl_alpha = nc->kl_alpha;
    r->cfg->kl_min_samples = nc->kl_min_samples;
    pthread_rwlock_unlock(&r->policy_lock);
    kvr_guard_configure(r->guard, r->cfg);
    kvr_policy_free(old);
    kvr_config_free(nc);
    kvl__svc_log_text("info", "reloaded %s: policy %s", r->cfg->path, r->cfg->policy_name);
    return KVL_OK;
}

/* Busy check shared with service.c: 1 when a turn is running on `id`. */
int kvr_router_is_busy(kvr_router *r, const char *id) {
    pthread_mutex_lock(&r->busy_mu);
    int busy = 0;
    for (int i = 0; i < r->n_busy && !busy; i++) busy = !strcmp(r->busy[i], id);
    pthread_mutex_unlock(&r->busy_mu);
    return busy;
}

void kvr_router_expire(kvr_router *r) {
    double now = kvr_wall_now();
    char (*ids)[KVR_ID_MAX] = malloc(sizeof *ids * EXPIRE_BATCH);
    if (!ids) return;
    int n = 0;
    if (kvr_ledger_idle(r->ledger, now - r->cfg->session_ttl_s, ids, EXPIRE_BATCH, &n)) {
        kvl__svc_log_text("warn", "expiry: %s", kvl_last_error());
        n = 0;
    }
    char owner[KVR_NAME_MAX];
    snprintf(owner, sizeof owner, "%.50s/expiry", r->cfg->replica_id);
    for (int i = 0; i < n; i++) {
        /* the session is taken as a turn takes it (this replica's busy slot, the ledger's lease
         * against other replicas) and checked idle again under both: a turn that arrived after
         * the idle listing must not see its session expire under it, nor commit into an ended one */
        if (kvr_router_busy_take_expiry(r, ids[i])) {
            kvl_clear_error();
            continue;
        }
        kvr_lease lease;
        if (kvr_ledger_lease_acquire(r->ledger, ids[i], owner, kvr_wall_now(), r->cfg->lease_ms / 1000.0, &lease)) {
            kvl_clear_error();
            kvr_router_busy_release_expiry(r, ids[i]);
            continue;
        }
        kvr_session s;
        if (kvr_ledger_session_load(r->ledger, ids[i], 0, &s)) {
            kvr_ledger_lease_release(r->ledger, ids[i], owner, lease.gen);
            kvr_router_busy_release_expiry(r, ids[i]);
            continue;
        }
        if (s.state != KVR_SESSION_OPEN || s.last_used > now - r->cfg->session_ttl_s) {   /* used since */
            kvr_session_clear(&s);
            kvr_ledger_lease_release(r->ledger, ids[i], owner, lease.gen);
            kvr_router_busy_release_expiry(r, ids[i]);
            continue;
        }
        for (int h = 0; h < s.n_holdings; h++) {
            int ni = kvr_registry_find(r->reg, s.holdings[h].node);
            kvr_node nc;
            if (ni >= 0) kvr_registry_copy(r->reg, ni, &nc);
            /* a node that is down lost or will lose the session anyway; waiting on it here would
             * stall the loop (signals, probes) for a timeout per session */
            if (ni >= 0 && nc.healthy && kvr_node_drop(&r->reg->nodes[ni], ids[i], 1000, NULL))
                kvl__svc_log_text("warn", "expiry: %s", kvl_last_error());
        }
        /* the drops above may have outlasted the lease: ended only while it is still this
         * expiry's, else another replica may be running a turn on the session */
        if (kvr_ledger_lease_renew(r->ledger, ids[i], owner, lease.gen, kvr_wall_now(), r->cfg->lease_ms / 1000.0))
            kvl__svc_log_text("info", "session %s: not expired: its lease was taken meanwhile", ids[i]);
        else if (!kvr_ledger_session_end(r->ledger, ids[i], KVR_SESSION_EXPIRED, now))
            kvl__svc_log_text("info", "session %s expired after %.0f s idle", ids[i], now - s.last_used);
        kvr_session_clear(&s);
        kvr_ledger_lease_release(r->ledger, ids[i], owner, lease.gen);
        kvr_router_busy_release_expiry(r, ids[i]);
    }
    free(ids);
    kvr_ledger_purge(r->ledger, now - ENDED_KEEP_S);
}

void kvr_router_gauges(void *arg, kvl__svc_text *b) {
    kvr_router *r = arg;
    long open = 0;
    kvr_ledger_count_open(r->ledger, &open);
    kvl__svc_text_printf(b, "# HELP kvlingo_router_sessions_open Sessions open in the ledger.\n"
                          "# TYPE kvlingo_router_sessions_open gauge\nkvlingo_router_sessions_open %ld\n", open);
    kvl__svc_text_printf(b, "# HELP kvlingo_router_pairs_disabled Translator pairs disabled by the guardrail.\n"
                          "# TYPE kvlingo_router_pairs_disabled gauge\nkvlingo_router_pairs_disabled %d\n",
                       kvr_guard_disabled_count(r->guard));
    kvr_pair_status *ps = calloc(KVR_GUARD_MAX_PAIRS, sizeof *ps);
    int np = ps ? kvr_guard_pairs(r->guard, ps, KVR_GUARD_MAX_PAIRS) : 0;
    kvl__svc_text_printf(b, "# HELP kvlingo_router_pair_moving_kl_nats Moving KL(native||translated) per pair.\n"
                          "# TYPE kvlingo_router_pair_moving_kl_nats gauge\n");
    for (int i = 0; i < np; i++)
        kvl__svc_text_printf(b, "kvlingo_router_pair_moving_kl_nats{source=\"%s\",target=\"%s\"} %.6g\n",
                           ps[i].source, ps[i].target, ps[i].moving_kl);
    kvl__svc_text_printf(b, "# HELP kvlingo_router_pair_enabled 1 when the router translates for the pair.\n"
                          "# TYPE kvlingo_router_pair_enabled gauge\n");
    for (int i = 0; i < np; i++)
        kvl__svc_text_printf(b, "kvlingo_router_pair_enabled{source=\"%s\",target=\"%s\"} %d\n",
                           ps[i].source, ps[i].target, ps[i].enabled);
    free(ps);
    int healthy = 0, inflight = 0;
    kvl__svc_text_printf(b, "# HELP kvlingo_router_node_healthy 1 when the node answers.\n"
                          "# TYPE kvlingo_router_node_healthy gauge\n");
    for (int i = 0; i < r->reg->n; i++) {
        kvr_node n;
        kvr_registry_copy(r->reg, i, &n);
        healthy += n.healthy;
        inflight += n.active;
        kvl__svc_text_printf(b, "kvlingo_router_node_healthy{node=\"%s\",model=\"%s\"} %d\n", n.name,
                           n.model, n.healthy);
    }
    kvl__svc_text_printf(b, "# HELP kvlingo_router_nodes_healthy Nodes that answer.\n"
                          "# TYPE kvlingo_router_nodes_healthy gauge\nkvlingo_router_nodes_healthy %d\n", healthy);
    kvl__svc_text_printf(b, "# HELP kvlingo_router_leases_held Session leases this replica holds now.\n"
                          "# TYPE kvlingo_router_leases_held gauge\nkvlingo_router_leases_held %d\n",
                       r->leases ? kvr_leases_held(r->leases) : 0);
    kvl__svc_text_printf(b, "# HELP kvlingo_router_lease_renew_failures_total Lease renewals that failed.\n"
                          "# TYPE kvlingo_router_lease_renew_failures_total counter\n"
                          "kvlingo_router_lease_renew_failures_total %ld\n",
                       r->leases ? kvr_leases_renew_failures(r->leases) : 0);
    char rq[260], bq[64];
    kvl__svc_prom_label_value(rq, sizeof rq, r->cfg->replica_id);
    kvl__svc_prom_label_value(bq, sizeof bq, r->ledger ? kvr_ledger_backend(r->ledger) : "");
    kvl__svc_text_printf(b, "# HELP kvlingo_router_replica_info This replica: its lease name and ledger backend.\n"
                          "# TYPE kvlingo_router_replica_info gauge\n"
                          "kvlingo_router_replica_info{replica=\"%s\",backend=\"%s\"} 1\n", rq, bq);
    kvl__svc_text_printf(b, "# HELP kvlingo_router_turns_in_flight Turns running now.\n"
                          "# TYPE kvlingo_router_turns_in_flight gauge\nkvlingo_router_turns_in_flight %d\n", inflight);
}
