/* router/ledger.c: the ledger interface (see ledger.h): picks the backend from the connection
 * string, checks arguments once for every backend, times every call for the metrics. */
#include "ledger_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "tenants.h"

struct kvr_ledger {
    const kvr_ledger_ops *ops;
    void *impl;
    int schema;
    void (*observer)(void *, const char *, int, double);
    void *observer_arg;
};

int kvr_ledger_is_postgres(const char *conn) {
    return conn && (!strncmp(conn, "postgresql://", 13) || !strncmp(conn, "postgres://", 11));
}

void kvr_ledger_shown(const char *conn, char *buf, size_t cap) {
    if (!cap) return;
    if (!conn) { buf[0] = 0; return; }
    const char *scheme = strstr(conn, "://");
    const char *slash = scheme ? strchr(scheme + 3, '/') : NULL;
    /* the last '@' before the path: a password may contain '@' itself */
    const char *at = NULL;
    for (const char *c = scheme ? scheme + 3 : NULL; c && *c && (!slash || c < slash); c++)
        if (*c == '@') at = c;
    if (at) {
        /* user:password@host -> user:***@host; the query string may carry a password too */
        const char *colon = memchr(scheme + 3, ':', (size_t)(at - (scheme + 3)));
        if (colon)
            snprintf(buf, cap, "%.*s:***%s", (int)(colon - conn), conn, at);
        else
            snprintf(buf, cap, "%s", conn);
    } else {
        snprintf(buf, cap, "%s", conn);
    }
    char *pw = strstr(buf, "password=");
    if (pw) snprintf(pw, cap - (size_t)(pw - buf), "password=***");
}

kvl_status kvr_ledger_open(const char *conn, kvr_ledger **out) {
    *out = NULL;
    if (!conn || !conn[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: empty connection string");
    char shown[512];
    kvr_ledger_shown(conn, shown, sizeof shown);
    const kvr_ledger_ops *ops = &kvr_ledger_sqlite_ops;
    const char *arg = conn;
    if (kvr_ledger_is_postgres(conn)) {
#ifdef KVR_HAVE_LIBPQ
        ops = &kvr_ledger_pg_ops;
#else
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "ledger %s: this build has no PostgreSQL support "
                          "(libpq-dev was missing when it was configured)", shown);
#endif
    } else if (!strncmp(conn, "sqlite:", 7)) {
        arg = conn + 7;
        if (!strncmp(arg, "//", 2)) arg += 2;     /* sqlite:///abs/path reads as /abs/path */
        if (!arg[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger '%s': no path after 'sqlite:'", conn);
    }
    kvr_ledger *l = calloc(1, sizeof *l);
    if (!l) return kvl__errorf(KVL_ERR_NOMEM, "ledger: out of memory");
    l->ops = ops;
    kvl_status s = ops->open(arg, shown, &l->impl, &l->schema);
    if (s) { free(l); return s; }
    *out = l;
    return KVL_OK;
}

void kvr_ledger_free(kvr_ledger *l) {
    if (!l) return;
    if (l->impl) l->ops->close(l->impl);
    free(l);
}

const char *kvr_ledger_backend(const kvr_ledger *l) { return l->ops->name; }
int kvr_ledger_schema(const kvr_ledger *l) { return l->schema; }

void kvr_ledger_set_observer(kvr_ledger *l, void (*fn)(void *, const char *, int, double), void *arg) {
    l->observer = fn;
    l->observer_arg = arg;
}

static void observe(kvr_ledger *l, const char *op, int write, double t0) {
    if (l->observer) l->observer(l->observer_arg, op, write, kvl__now_s() - t0);
}

int kvr_session_id_valid(const char *id) {
    size_t n = id ? strlen(id) : 0;
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

#define KVR_TENANT_TAG 12   /* hex digits of the tenant's tag in a session key */

void kvr_session_key(const char *tenant, const char *id, char out[KVR_ID_MAX]) {
    if (!tenant || !tenant[0] || !strcmp(tenant, "default")) {
        snprintf(out, KVR_ID_MAX, "%s", id);
        return;
    }
    char h[65];
    kvr_sha256_hex(tenant, strlen(tenant), h);
    snprintf(out, KVR_ID_MAX, "%.*s/%s", KVR_TENANT_TAG, h, id);
}

int kvr_session_key_valid(const char *key) {
    if (!key) return 0;
    const char *slash = strchr(key, '/');
    if (!slash) return kvr_session_id_valid(key);
    if (slash - key != KVR_TENANT_TAG) return 0;
    for (const char *c = key; c < slash; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'))) return 0;
    return kvr_session_id_valid(slash + 1);
}

const char *kvr_session_client_id(const char *key) {
    const char *slash = key ? strchr(key, '/') : NULL;
    return slash ? slash + 1 : key;
}

void kvr_session_clear(kvr_session *s) {
    if (!s) return;
    free(s->tokens);
    memset(s, 0, sizeof *s);
}

int kvr_session_held(const kvr_session *s, const char *node) {
    for (int i = 0; i < s->n_holdings; i++)
        if (!strcmp(s->holdings[i].node, node)) return s->holdings[i].n_tokens;
    return 0;
}

void kvr_turn_found_clear(kvr_turn_found *f) {
    if (!f) return;
    free(f->tokens);
    memset(f, 0, sizeof *f);
}

kvl_status kvr_id_refuse(const char *what, const char *id) {
    const size_t n = id ? strlen(id) : 0;
    return kvl__errorf(KVL_ERR_INVALID_ARG, "%s '%.64s%s' (%zu characters) is invalid (1-64 of A-Za-z0-9._:-)",
                      what, id ? id : "", n > 64 ? "..." : "", n);
}

/* Names stored in fixed-size fields must fit them: a longer one is refused, not truncated. */
static kvl_status check_name(const char *what, const char *v) {
    if (v && strlen(v) >= KVR_NAME_MAX)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: %s '%.80s' is longer than %d bytes", what, v,
                          KVR_NAME_MAX - 1);
    return KVL_OK;
}

kvl_status kvr_ledger_session_create_for(kvr_ledger *l, const char *id, const char *model,
                                         const char *tenant, long max_open, double now) {
    if (!kvr_session_key_valid(id)) return kvr_id_refuse("session_id", id);
    kvl_status s = check_name("model", model);
    if (!s) s = check_name("tenant", tenant);
    if (!s && (!tenant || !tenant[0])) s = kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: a session needs a tenant");
    if (s) return s;
    double t0 = kvl__now_s();
    s = l->ops->session_create(l->impl, id, model ? model : "", tenant, max_open > 0 ? max_open : 0, now);
    observe(l, "create", 1, t0);
    return s;
}

kvl_status kvr_ledger_session_create(kvr_ledger *l, const char *id, const char *model, double now) {
    return kvr_ledger_session_create_for(l, id, model, "default", 0, now);
}

kvl_status kvr_ledger_session_load(kvr_ledger *l, const char *id, int with_tokens, kvr_session *out) {
    memset(out, 0, sizeof *out);
    if (!kvr_session_key_valid(id)) return kvr_id_refuse("session_id", id);   /* no session has such an id */
    double t0 = kvl__now_s();
    kvl_status s = l->ops->session_load(l->impl, id, with_tokens, out);
    observe(l, "load", 0, t0);
    if (s) kvr_session_clear(out);
    return s;
}

kvl_status kvr_ledger_turn_commit(kvr_ledger *l, const char *id, const int32_t *tokens, int t0,
                                  int n, const kvr_turn_rec *turn, const char *current_node,
                                  int pol_level, int pol_calm, const kvr_holding *holdings,
                                  int n_holdings, double now) {
    if (!kvr_session_key_valid(id)) return kvr_id_refuse("session_id", id);
    if (t0 < 0 || n < 0 || (n > 0 && !tokens) || n_holdings < 0 || n_holdings > KVR_MAX_HOLDINGS ||
        (n_holdings > 0 && !holdings))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: session '%s': commit of %d tokens at %d "
                          "with %d holdings is malformed", id, n, t0, n_holdings);
    /* the loaders refuse a session longer than this: one committed past it could never be
     * loaded (nor closed, nor expired) again */
    if ((int64_t)t0 + n > KVR_LEDGER_MAX_TOKENS)
        return kvl__errorf(KVL_ERR_RANGE, "ledger: session '%s' would hold %lld tokens, at most %d", id,
                          (long long)t0 + n, KVR_LEDGER_MAX_TOKENS);
    if (turn && turn->fence) {
        const kvr_fence *f = turn->fence;
        if (!f->owner || !f->owner[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: fence without an owner");
        if (f->request_id && f->request_id[0] && !kvr_session_id_valid(f->request_id))
            return kvr_id_refuse("request_id", f->request_id);
    }
    kvl_status s = check_name("node", current_node);
    if (s) return s;
    double m0 = kvl__now_s();
    kvr_ledger_commit c = {.id = id, .tokens = tokens, .t0 = t0, .n = n, .turn = turn,
                           .current_node = current_node ? current_node : "", .pol_level = pol_level,
                           .pol_calm = pol_calm, .holdings = holdings, .n_holdings = n_holdings,
                           .now = now};
    s = l->ops->turn_commit(l->impl, &c);
    observe(l, "commit", 1, m0);
    return s;
}

kvl_status kvr_ledger_holding_set(kvr_ledger *l, const char *id, const char *node, int n) {
    if (!kvr_session_key_valid(id)) return kvr_id_refuse("session_id", id);
    if (!node || !node[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: holding without a node");
    kvl_status s = check_name("node", node);
    if (s) return s;
    double m0 = kvl__now_s();
    s = l->ops->holding_set(l->impl, id, node, n);
    observe(l, "holding", 1, m0);
    return s;
}

kvl_status kvr_ledger_session_end(kvr_ledger *l, const char *id, kvr_session_state state, double now) {
    if (!kvr_session_key_valid(id)) return kvr_id_refuse("session_id", id);   /* no session has such an id */
    double m0 = kvl__now_s();
    kvl_status s = l->ops->session_end(l->impl, id, state, now);
    observe(l, "end", 1, m0);
    return s;
}

kvl_status kvr_ledger_idle(kvr_ledger *l, double before, char (*ids)[KVR_ID_MAX], int max, int *n) {
    *n = 0;
    if (max <= 0) return KVL_OK;
    double m0 = kvl__now_s();
    kvl_status s = l->ops->idle(l->impl, before, ids, max, n);
    observe(l, "idle", 0, m0);
    return s;
}

kvl_status kvr_ledger_lru_on_node(kvr_ledger *l, const char *node, const char *exclude,
                                  char (*ids)[KVR_ID_MAX], int max, int *n) {
    *n = 0;
    if (max <= 0 || !node) return KVL_OK;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);   /* leases are in wall time (shared by replicas) */
    double m0 = kvl__now_s();
    kvl_status s = l->ops->lru_on_node(l->impl, node, exclude ? exclude : "",
                                       (double)ts.tv_sec + ts.tv_nsec * 1e-9, ids, max, n);
    observe(l, "lru", 0, m0);
    return s;
}

kvl_status kvr_ledger_purge(kvr_ledger *l, double before) {
    double m0 = kvl__now_s();
    kvl_status s = l->ops->purge(l->impl, before);
    observe(l, "purge", 1, m0);
    return s;
}

kvl_status kvr_ledger_count_open(kvr_ledger *l, long *n) {
    *n = 0;
    return l->ops->count_open(l->impl, n);
}

kvl_status kvr_ledger_lease_acquire(kvr_ledger *l, const char *id, const char *owner, double now,
                                    double ttl_s, kvr_lease *out) {
    memset(out, 0, sizeof *out);
    if (!kvr_session_key_valid(id)) return kvr_id_refuse("session_id", id);   /* no session has such an id */
    if (!owner || !owner[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: lease without an owner");
    kvl_status s = check_name("lease owner", owner);
    if (s) return s;
    if (!(ttl_s > 0)) return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: lease time %g s", ttl_s);
    double m0 = kvl__now_s();
    s = l->ops->lease_acquire(l->impl, id, owner, now, ttl_s, out);
    observe(l, "lease", 1, m0);
    return s;
}

kvl_status kvr_ledger_lease_renew(kvr_ledger *l, const char *id, const char *owner, int64_t gen,
                                  double now, double ttl_s) {
    if (!kvr_session_key_valid(id) || !owner || !owner[0] || !(ttl_s > 0))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: lease renewal of '%.80s' is malformed", id ? id : "");
    double m0 = kvl__now_s();
    kvl_status s = l->ops->lease_renew(l->impl, id, owner, gen, now, ttl_s);
    observe(l, "renew", 1, m0);
    return s;
}

kvl_status kvr_ledger_lease_release(kvr_ledger *l, const char *id, const char *owner, int64_t gen) {
    if (!kvr_session_key_valid(id) || !owner || !owner[0])
        return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: lease release of '%.80s' is malformed", id ? id : "");
    double m0 = kvl__now_s();
    kvl_status s = l->ops->lease_release(l->impl, id, owner, gen);
    observe(l, "release", 1, m0);
    return s;
}

kvl_status kvr_ledger_turn_find(kvr_ledger *l, const char *id, const char *request_id,
                                kvr_turn_found *out) {
    memset(out, 0, sizeof *out);
    if (!kvr_session_key_valid(id)) return kvr_id_refuse("session_id", id);   /* no session has such an id */
    if (!kvr_session_id_valid(request_id)) return kvr_id_refuse("request_id", request_id);
    double m0 = kvl__now_s();
    kvl_status s = l->ops->turn_find(l->impl, id, request_id, out);
    observe(l, "find", 0, m0);
    if (s) kvr_turn_found_clear(out);
    return s;
}

/* ---- shared by the backends ----------------------------------------------------------------- */

kvl_status kvr__ledger_busy(const char *id, const char *holder, double expiry, double now) {
    return kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is busy: replica '%s' drives it under a lease "
                      "for %.1f s more; retry later or on that replica", id, holder,
                      expiry > now ? expiry - now : 0.0);
}

kvl_status kvr__ledger_lost(const char *id, const char *owner_now, int64_t gen_now, int64_t gen_had) {
    return kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is busy: this replica's lease (generation %lld) "
                      "was taken over by replica '%s' (generation %lld); the turn was not committed",
                      id, (long long)gen_had, owner_now[0] ? owner_now : "(none)", (long long)gen_now);
}

kvl_status kvr__ledger_ended(const char *id, int state) {
    return kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is %s", id,
                      state == KVR_SESSION_CLOSED ? "closed" : "expired");
}

kvl_status kvr__ledger_found_tokens(const kvr_session *s, kvr_turn_found *f) {
    int n = f->n_user + f->n_gen;
    if (!s->tokens || s->state != KVR_SESSION_OPEN) return KVL_OK;   /* ended: gone */
    if (f->t0 < 0 || n < 0 || f->t0 + n > s->n_tokens)
        return kvl__errorf(KVL_ERR_FORMAT, "ledger: session '%s': turn %d spans [%d, %d) of %d tokens",
                          s->id, f->idx, f->t0, f->t0 + n, s->n_tokens);
    f->tokens = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!f->tokens) return kvl__errorf(KVL_ERR_NOMEM, "ledger: %d tokens", n);
    memcpy(f->tokens, s->tokens + f->t0, sizeof(int32_t) * (size_t)n);
    return KVL_OK;
}
