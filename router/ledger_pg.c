/* router/ledger_pg.c: the PostgreSQL ledger backend (libpq; see ledger.h, ledger_backend.h).
 * One connection per router behind a mutex, the same tables as SQLite (tokens as one BYTEA of
 * little-endian int32 per turn).  A connection that broke (the server restarted, the network
 * dropped) is reset at the next call: calls fail with KVL_ERR_IO (UNAVAILABLE to clients)
 * while the server is away and work again once it is back.  Leases are compare-and-set
 * UPDATEs on the generation column; no lock outlives one statement or one short transaction. */
#include "ledger_backend.h"

#include <arpa/inet.h>
#include <endian.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "error.h"

#define MAX_PARAMS 32
#define MAX_PREPARED 32

typedef struct pg {
    PGconn *conn;
    char *uri;
    pthread_mutex_t mu;
    int in_tx;                 /* between BEGIN and COMMIT/ROLLBACK                          */
    /* statements prepared on this connection (by the address of their static text): each is
     * planned once per connection, not once per call */
    const char *prepared[MAX_PREPARED];
    int n_prepared;
    char shown[256];
} pg;

static const char *const k_migrations[] = {
    "CREATE TABLE IF NOT EXISTS sessions("
    "  id TEXT PRIMARY KEY, state INTEGER NOT NULL, created DOUBLE PRECISION NOT NULL,"
    "  last_used DOUBLE PRECISION NOT NULL, n_turns INTEGER NOT NULL, n_tokens INTEGER NOT NULL,"
    "  current_node TEXT NOT NULL, model TEXT NOT NULL, pol_level INTEGER NOT NULL,"
    "  pol_calm INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS sessions_idle ON sessions(state, last_used);"
    "CREATE TABLE IF NOT EXISTS chunks(session TEXT NOT NULL, t0 INTEGER NOT NULL,"
    "  ids BYTEA NOT NULL, PRIMARY KEY(session, t0));"
    "CREATE TABLE IF NOT EXISTS turns(session TEXT NOT NULL, idx INTEGER NOT NULL,"
    "  node TEXT, model TEXT, mode TEXT, fallback TEXT, t0 INTEGER, n_user INTEGER,"
    "  n_gen INTEGER, span INTEGER, ttft DOUBLE PRECISION, tps DOUBLE PRECISION,"
    "  entropy DOUBLE PRECISION, at DOUBLE PRECISION, PRIMARY KEY(session, idx));"
    "CREATE TABLE IF NOT EXISTS holdings(session TEXT NOT NULL, node TEXT NOT NULL,"
    "  n_tokens INTEGER NOT NULL, PRIMARY KEY(session, node));",
    /* 2: session leases, the idempotency key and finish reason of a turn */
    "ALTER TABLE sessions ADD COLUMN lease_owner TEXT NOT NULL DEFAULT '',"
    "  ADD COLUMN lease_gen BIGINT NOT NULL DEFAULT 0,"
    "  ADD COLUMN lease_expiry DOUBLE PRECISION NOT NULL DEFAULT 0;"
    "ALTER TABLE turns ADD COLUMN request_id TEXT NOT NULL DEFAULT '',"
    "  ADD COLUMN finish TEXT NOT NULL DEFAULT '';"
    "CREATE UNIQUE INDEX turns_request ON turns(session, request_id) WHERE request_id <> '';",
    /* 3: a session belongs to a tenant (API keys); sessions from before are "default"'s */
    "ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';"
    "CREATE INDEX sessions_tenant ON sessions(tenant, state);",
};
#define N_MIGRATIONS (int)(sizeof k_migrations / sizeof k_migrations[0])

/* libpq's messages end with a newline; messages here are one line. */
static const char *pq_msg(pg *p, const PGresult *r) {
    static __thread char buf[400];
    const char *m = r ? PQresultErrorMessage(r) : NULL;
    if (!m || !m[0]) m = p->conn ? PQerrorMessage(p->conn) : "no connection";
    snprintf(buf, sizeof buf, "%s", m && m[0] ? m : "unknown error");
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = 0;
    for (char *c = buf; *c; c++) if (*c == '\n' || *c == '\t') *c = ' ';
    return buf;
}

static kvl_status conn_err(pg *p, const char *what, const PGresult *r) {
    return kvl__errorf(KVL_ERR_IO, "ledger %s: %s: %s", p->shown, what, pq_msg(p, r));
}

/* A usable connection, or KVL_ERR_IO: the first call after the server went away resets it. */
static kvl_status ensure(pg *p) {
    if (p->conn && PQstatus(p->conn) == CONNECTION_OK) return KVL_OK;
    p->in_tx = 0;
    p->n_prepared = 0;         /* a new server session has none */
    if (p->conn) PQreset(p->conn);
    else {
        /* defaults first: the URI's own settings win */
        const char *keys[] = {"connect_timeout", "application_name", "options", "dbname", NULL};
        const char *vals[] = {"5", "kvlingo-router", "-c client_min_messages=warning", p->uri, NULL};
        p->conn = PQconnectdbParams(keys, vals, 1);
        if (!p->conn) return kvl__errorf(KVL_ERR_NOMEM, "ledger %s: out of memory", p->shown);
    }
    if (PQstatus(p->conn) != CONNECTION_OK) return conn_err(p, "connect", NULL);
    return KVL_OK;
}

/* PQexecParams through a statement prepared once per connection (named by its slot). */
static PGresult *exec(pg *p, const char *sql, int n, const char *const *vals, const int *lens,
                      const int *fmts, int binary_out) {
    int slot = -1;
    for (int i = 0; i < p->n_prepared && slot < 0; i++)
        if (p->prepared[i] == sql) slot = i;
    char name[16];
    if (slot < 0 && p->n_prepared < MAX_PREPARED) {
        snprintf(name, sizeof name, "kvr%d", p->n_prepared);
        PGresult *pr = PQprepare(p->conn, name, sql, n, NULL);
        int ok = pr && PQresultStatus(pr) == PGRES_COMMAND_OK;
        PQclear(pr);
        if (!ok) return PQexecParams(p->conn, sql, n, NULL, vals, lens, fmts, binary_out);
        slot = p->n_prepared;
        p->prepared[p->n_prepared++] = sql;
    }
    if (slot < 0) return PQexecParams(p->conn, sql, n, NULL, vals, lens, fmts, binary_out);
    snprintf(name, sizeof name, "kvr%d", slot);
    return PQexecPrepared(p->conn, name, n, vals, lens, fmts, binary_out);
}

/* Run `sql` with parameters from `fmt`: 't' text, 'i' long long, 'd' double, 'b' bytea
 * (ptr, int len, sent binary).  binary_out: results in binary.  On success *out holds the
 * result (PGRES_COMMAND_OK or PGRES_TUPLES_OK); on failure *sqlstate (when given) names the
 * SQLSTATE, or "" when the connection broke. */
static kvl_status run(pg *p, const char *what, PGresult **out, char *sqlstate, int binary_out,
                      const char *sql, const char *fmt, ...) {
    *out = NULL;
    if (sqlstate) sqlstate[0] = 0;
    kvl_status s = ensure(p);
    if (s) return s;
    const char *vals[MAX_PARAMS];
    int lens[MAX_PARAMS], fmts[MAX_PARAMS];
    char num[MAX_PARAMS][32];
    int n = 0;
    va_list ap;
    va_start(ap, fmt);
    for (; fmt && fmt[n] && n < MAX_PARAMS; n++) {
        lens[n] = 0;
        fmts[n] = 0;
        switch (fmt[n]) {
        case 't': vals[n] = va_arg(ap, const char *); break;
        case 'i': snprintf(num[n], sizeof num[n], "%lld", va_arg(ap, long long)); vals[n] = num[n]; break;
        case 'd': snprintf(num[n], sizeof num[n], "%.17g", va_arg(ap, double)); vals[n] = num[n]; break;
        case 'b':
            vals[n] = va_arg(ap, const char *);
            lens[n] = va_arg(ap, int);
            fmts[n] = 1;
            if (!vals[n]) vals[n] = "";
            break;
        default: vals[n] = ""; break;
        }
    }
    va_end(ap);
    PGresult *r = exec(p, sql, n, vals, lens, fmts, binary_out);
    /* a connection the server closed (it restarted) is only seen broken by the next statement:
     * a read outside a transaction is safe to send again once on a fresh connection */
    if ((!r || PQresultStatus(r) == PGRES_FATAL_ERROR) && PQstatus(p->conn) == CONNECTION_BAD &&
        !p->in_tx && (!strncmp(sql, "SELECT", 6) || !strncmp(sql, "WITH cur", 8)) && !ensure(p)) {
        PQclear(r);
        r = exec(p, sql, n, vals, lens, fmts, binary_out);
    }
    /* libpq answers NULL when it could not even send the statement (the connection is gone),
     * rarely for memory */
    if (!r) return conn_err(p, what, NULL);
    ExecStatusType es = PQresultStatus(r);
    if (es == PGRES_COMMAND_OK || es == PGRES_TUPLES_OK) { *out = r; return KVL_OK; }
    const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (sqlstate && st) snprintf(sqlstate, 6, "%s", st);
    s = conn_err(p, what, r);
    PQclear(r);
    return s;
}

static kvl_status simple(pg *p, const char *what, const char *sql) {
    kvl_status s = ensure(p);
    if (s) return s;
    int begin = !strncmp(sql, "BEGIN", 5);
    PGresult *r = PQexec(p->conn, sql);
    /* as in run(): BEGIN on a connection the server closed is sent again once */
    if (begin && (!r || PQresultStatus(r) == PGRES_FATAL_ERROR) && PQstatus(p->conn) == CONNECTION_BAD &&
        !ensure(p)) {
        PQclear(r);
        r = PQexec(p->conn, sql);
    }
    if (!r) return conn_err(p, what, NULL);
    ExecStatusType es = PQresultStatus(r);
    s = es == PGRES_COMMAND_OK || es == PGRES_TUPLES_OK ? KVL_OK : conn_err(p, what, r);
    PQclear(r);
    if (!s && begin) p->in_tx = 1;
    if (!strncmp(sql, "COMMIT", 6)) p->in_tx = 0;
    return s;
}

/* End a transaction that failed; a broken connection is left for ensure() to reset. */
static void rollback(pg *p) {
    p->in_tx = 0;
    if (p->conn && PQstatus(p->conn) == CONNECTION_OK) {
        PGresult *r = PQexec(p->conn, "ROLLBACK");
        PQclear(r);
    }
}

static long changed_rows(PGresult *r) {
    const char *t = PQcmdTuples(r);
    return t && t[0] ? strtol(t, NULL, 10) : 0;
}

static void text_col(PGresult *r, int row, int col, char *dst, size_t cap) {
    snprintf(dst, cap, "%s", PQgetisnull(r, row, col) ? "" : PQgetvalue(r, row, col));
}

static long long int_col(PGresult *r, int row, int col) {
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static double dbl_col(PGresult *r, int row, int col) {
    return PQgetisnull(r, row, col) ? 0 : strtod(PQgetvalue(r, row, col), NULL);
}

static kvl_status migrate(pg *p, int *schema) {
    kvl_status s = KVL_OK;
    /* two replicas starting at once may race on CREATE TABLE IF NOT EXISTS (a unique
     * violation in the catalog): the loser tries again and finds the table */
    for (int attempt = 0; attempt < 3; attempt++) {
        s = simple(p, "schema", "CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL)");
        if (!s) break;
    }
    if (s) return s;
    if ((s = simple(p, "schema", "BEGIN"))) return s;
    /* migrations run one replica at a time: the lock lasts this short transaction only */
    if ((s = simple(p, "schema lock", "LOCK TABLE schema_version IN ACCESS EXCLUSIVE MODE"))) { rollback(p); return s; }
    PGresult *r = NULL;
    s = run(p, "schema version", &r, NULL, 0, "SELECT coalesce(max(version), 0) FROM schema_version", NULL);
    int v = (!s && PQntuples(r) == 1) ? (int)int_col(r, 0, 0) : 0;
    PQclear(r);
    if (!s && v > N_MIGRATIONS)
        s = kvl__errorf(KVL_ERR_UNSUPPORTED, "ledger %s: schema version %d is newer than this router "
                       "knows (%d): run a newer kvlingo-router", p->shown, v, N_MIGRATIONS);
    for (int i = v; !s && i < N_MIGRATIONS; i++) {
        char what[48];
        snprintf(what, sizeof what, "migration to schema %d", i + 1);
        s = simple(p, what, k_migrations[i]);
    }
    if (!s && v < N_MIGRATIONS) {
        char sql[96];
        snprintf(sql, sizeof sql, "DELETE FROM schema_version; INSERT INTO schema_version VALUES(%d)", N_MIGRATIONS);
        s = simple(p, "schema version", sql);
    }
    if (!s) s = simple(p, "schema commit", "COMMIT");
    if (s) rollback(p);
    else *schema = N_MIGRATIONS;
    return s;
}

static void pg_close(void *impl) {
    pg *p = impl;
    if (!p) return;
    if (p->conn) PQfinish(p->conn);
    free(p->uri);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static kvl_status pg_open(const char *uri, const char *shown, void **impl, int *schema) {
    *impl = NULL;
    pg *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "ledger: out of memory");
    snprintf(p->shown, sizeof p->shown, "%s", shown);
    p->uri = strdup(uri);
    if (!p->uri || pthread_mutex_init(&p->mu, NULL)) {
        free(p->uri);
        free(p);
        return kvl__errorf(KVL_ERR_NOMEM, "ledger: out of memory");
    }
    kvl_status s = ensure(p);
    if (!s) s = migrate(p, schema);
    if (s) { pg_close(p); return s; }
    *impl = p;
    return KVL_OK;
}

static kvl_status pg_session_create(void *impl, const char *id, const char *model, const char *tenant,
                                    long max_open, double now) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    char state[6];
    /* count and insert in one statement; replicas creating sessions of one tenant at the same
     * moment can overshoot max_sessions by the creates in flight (no table lock is taken) */
    kvl_status s = run(p, "create session", &r, state, 0,
                       "INSERT INTO sessions(id,state,created,last_used,n_turns,n_tokens,current_node,"
                       "model,pol_level,pol_calm,tenant) SELECT $1,0,$2,$2,0,0,'',$3,0,0,$4 WHERE $5::bigint=0 "
                       "OR (SELECT count(*) FROM sessions WHERE tenant=$4 AND state=0) < $5::bigint",
                       "tdtti", id, now, model, tenant, (long long)max_open);
    if (!s && changed_rows(r) == 0)
        s = kvl__errorf(KVL_ERR_NOMEM, "quota: tenant '%s' has %ld open sessions, its max_sessions: close "
                       "one first", tenant, max_open);
    PQclear(r);
    if (s && !strcmp(state, "23505")) s = kvl__errorf(KVL_ERR_INVALID_ARG, "session '%s' exists already", id);
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* Binary result columns (network order). */
static int32_t bin_i32(PGresult *r, int col) {
    uint32_t v = 0;
    if (PQgetlength(r, 0, col) == 4) memcpy(&v, PQgetvalue(r, 0, col), 4);
    return (int32_t)ntohl(v);
}

static double bin_f64(PGresult *r, int col) {
    uint64_t v = 0;
    double d = 0;
    if (PQgetlength(r, 0, col) == 8) {
        memcpy(&v, PQgetvalue(r, 0, col), 8);
        v = be64toh(v);
        memcpy(&d, &v, 8);
    }
    return d;
}

static void bin_text(PGresult *r, int col, char *dst, size_t cap) {
    int n = PQgetisnull(r, 0, col) ? 0 : PQgetlength(r, 0, col);
    if ((size_t)n >= cap) n = (int)cap - 1;
    memcpy(dst, PQgetvalue(r, 0, col), (size_t)n);
    dst[n] = 0;
}

/* The session, its holdings ("node<TAB>n" lines) and, with tokens, the chunk layout
 * ("t0:bytes," in order) and the chunks concatenated: one statement, so one snapshot (a commit
 * landing meanwhile cannot tear it) and one round trip. */
static const char *k_load_sql =
    "SELECT s.state, s.created, s.last_used, s.n_turns, s.n_tokens, s.current_node, s.model,"
    " s.pol_level, s.pol_calm,"
    " (SELECT coalesce(string_agg(h.node || chr(9) || h.n_tokens, chr(10) ORDER BY h.node), '')"
    "  FROM holdings h WHERE h.session = s.id),"
    " CASE WHEN $2 AND s.state = 0 THEN (SELECT coalesce(string_agg(c.t0 || ':' || length(c.ids), ','"
    "  ORDER BY c.t0), '') FROM chunks c WHERE c.session = s.id) END,"
    " CASE WHEN $2 AND s.state = 0 THEN (SELECT coalesce(string_agg(c.ids, ''::bytea ORDER BY c.t0),"
    "  ''::bytea) FROM chunks c WHERE c.session = s.id) END, s.tenant"
    " FROM sessions s WHERE s.id = $1";

static kvl_status load_locked(pg *p, const char *id, int with_tokens, kvr_session *out) {
    PGresult *r = NULL;
    kvl_status s = run(p, "load session", &r, NULL, 1, k_load_sql, "tt", id, with_tokens ? "true" : "false");
    if (s) return s;
    if (PQntuples(r) != 1 || PQnfields(r) != 13) {
        PQclear(r);
        return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
    }
    snprintf(out->id, sizeof out->id, "%s", id);
    out->state = (kvr_session_state)bin_i32(r, 0);
    out->created = bin_f64(r, 1);
    out->last_used = bin_f64(r, 2);
    out->n_turns = bin_i32(r, 3);
    out->n_tokens = bin_i32(r, 4);
    bin_text(r, 5, out->current_node, sizeof out->current_node);
    bin_text(r, 6, out->model, sizeof out->model);
    out->pol_level = bin_i32(r, 7);
    out->pol_calm = bin_i32(r, 8);
    bin_text(r, 12, out->tenant, sizeof out->tenant);
    if (out->n_tokens < 0 || out->n_tokens > KVR_LEDGER_MAX_TOKENS || out->state < KVR_SESSION_OPEN ||
        out->state > KVR_SESSION_EXPIRED) {
        PQclear(r);
        return kvl__errorf(KVL_ERR_FORMAT, "ledger %s: session '%s': state %d, %d tokens", p->shown, id,
                          (int)out->state, out->n_tokens);
    }
    /* holdings: "node<TAB>count" lines (the value ends with the NUL libpq adds) */
    for (const char *h = PQgetvalue(r, 0, 9); h && *h && out->n_holdings < KVR_MAX_HOLDINGS;) {
        const char *tab = strchr(h, '\t');
        if (!tab) break;
        kvr_holding *hd = &out->holdings[out->n_holdings++];
        snprintf(hd->node, sizeof hd->node, "%.*s", (int)(tab - h), h);
        hd->n_tokens = (int)strtol(tab + 1, NULL, 10);
        const char *nl = strchr(tab, '\n');
        h = nl ? nl + 1 : NULL;
    }
    if (!with_tokens || out->state != KVR_SESSION_OPEN || PQgetisnull(r, 0, 10)) {
        PQclear(r);
        return KVL_OK;
    }
    out->tokens = malloc(sizeof(int32_t) * (size_t)(out->n_tokens ? out->n_tokens : 1));
    if (!out->tokens) { PQclear(r); return kvl__errorf(KVL_ERR_NOMEM, "ledger: %d tokens", out->n_tokens); }
    /* chunks must tile [0, n_tokens) exactly: anything else is a corrupt ledger */
    int have = 0;
    for (const char *c = PQgetvalue(r, 0, 10); c && *c && !s;) {
        char *end = NULL;
        long t0 = strtol(c, &end, 10), bytes = end && *end == ':' ? strtol(end + 1, &end, 10) : -1;
        if (t0 != have || bytes < 0 || bytes % 4 || have + bytes / 4 > out->n_tokens)
            s = kvl__errorf(KVL_ERR_FORMAT, "ledger: session '%s': chunk at %ld does not follow %d", id, t0, have);
        else
            have += (int)(bytes / 4);
        c = end && *end == ',' ? end + 1 : NULL;
    }
    if (!s && have != out->n_tokens)
        s = kvl__errorf(KVL_ERR_FORMAT, "ledger: session '%s': %d tokens stored, %d expected", id, have,
                       out->n_tokens);
    if (!s && PQgetlength(r, 0, 11) != have * 4)
        s = kvl__errorf(KVL_ERR_FORMAT, "ledger: session '%s': %d token bytes, %d expected", id,
                       PQgetlength(r, 0, 11), have * 4);
    if (!s && have) memcpy(out->tokens, PQgetvalue(r, 0, 11), (size_t)have * 4);
    PQclear(r);
    return s;
}

static kvl_status pg_session_load(void *impl, const char *id, int with_tokens, kvr_session *out) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    kvl_status s = load_locked(p, id, with_tokens, out);
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* A text[] literal of `n` names ({"a","b"}, quotes and backslashes escaped) into buf. */
static int text_array(const kvr_holding *h, int n, char *buf, size_t cap) {
    size_t o = 0;
    buf[o++] = '{';
    for (int i = 0; i < n; i++) {
        if (h[i].n_tokens <= 0) continue;
        if (o > 1) buf[o++] = ',';
        buf[o++] = '"';
        for (const char *c = h[i].node; *c; c++) {
            if (o + 4 >= cap) return -1;
            if (*c == '"' || *c == '\\') buf[o++] = '\\';
            buf[o++] = *c;
        }
        if (o + 4 >= cap) return -1;
        buf[o++] = '"';
    }
    buf[o++] = '}';
    buf[o] = 0;
    return 0;
}

/* The whole commit is one statement (atomic by itself, one round trip): the guarded UPDATE of
 * the session (still open, the ledger length the turn started from, the lease still this
 * turn's) gates every insert, so nothing lands when it matches no row; then the reason is
 * read back for the message. */
static const char *k_commit_sql =
    "WITH s AS (UPDATE sessions SET n_tokens = $3 + $4, n_turns = n_turns + $5, current_node = $6,"
    "  pol_level = $7, pol_calm = $8, last_used = $9"
    "  WHERE id = $1 AND state = 0 AND n_tokens = $3 AND ($10 = '' OR (lease_owner = $10 AND lease_gen = $11))"
    "  RETURNING id),"
    " c AS (INSERT INTO chunks(session, t0, ids) SELECT id, $3::int, $2::bytea FROM s WHERE $4 > 0),"
    " t AS (INSERT INTO turns(session, idx, node, model, mode, fallback, t0, n_user, n_gen, span, ttft,"
    "  tps, entropy, at, request_id, finish)"
    "  SELECT id, $12::int, $13::text, $14::text, $15::text, $16::text, $17::int, $18::int, $19::int,"
    "  $20::int, $21::float8, $22::float8, $23::float8, $9::float8, $24::text, $25::text FROM s WHERE $5 = 1"
    "  ON CONFLICT (session, idx) DO UPDATE SET node = EXCLUDED.node, model = EXCLUDED.model,"
    "  mode = EXCLUDED.mode, fallback = EXCLUDED.fallback, t0 = EXCLUDED.t0, n_user = EXCLUDED.n_user,"
    "  n_gen = EXCLUDED.n_gen, span = EXCLUDED.span, ttft = EXCLUDED.ttft, tps = EXCLUDED.tps,"
    "  entropy = EXCLUDED.entropy, at = EXCLUDED.at, request_id = EXCLUDED.request_id,"
    "  finish = EXCLUDED.finish),"
    " d AS (DELETE FROM holdings WHERE session IN (SELECT id FROM s) AND NOT (node = ANY($26::text[]))),"
    " h AS (INSERT INTO holdings(session, node, n_tokens)"
    "  SELECT s.id, x.node, x.n FROM s, unnest($26::text[], $27::int[]) AS x(node, n)"
    "  ON CONFLICT (session, node) DO UPDATE SET n_tokens = EXCLUDED.n_tokens)"
    " SELECT count(*) FROM s";

static kvl_status pg_turn_commit(void *impl, const kvr_ledger_commit *c) {
    pg *p = impl;
    const kvr_turn_rec *t = c->turn;
    const kvr_fence *f = t ? t->fence : NULL;
    const char *rid = f && f->request_id ? f->request_id : "";
    char nodes[KVR_MAX_HOLDINGS * (KVR_NAME_MAX * 2 + 3) + 4], counts[KVR_MAX_HOLDINGS * 12 + 4];
    if (text_array(c->holdings, c->n_holdings, nodes, sizeof nodes))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "ledger: session '%s': holdings too long", c->id);
    size_t o = 0;
    counts[o++] = '{';
    for (int i = 0; i < c->n_holdings; i++)
        if (c->holdings[i].n_tokens > 0)
            o += (size_t)snprintf(counts + o, sizeof counts - o, "%s%d", o > 1 ? "," : "", c->holdings[i].n_tokens);
    snprintf(counts + o, sizeof counts - o, "}");
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    char state[6];
    kvl_status s = run(p, "commit", &r, state, 0, k_commit_sql, "tbiiitiidti" "ittttiiiiddd" "tttt",
                       c->id, (const char *)c->tokens, c->n * 4, (long long)c->t0, (long long)c->n,
                       (long long)(t ? 1 : 0), c->current_node, (long long)c->pol_level,
                       (long long)c->pol_calm, c->now, f ? f->owner : "", (long long)(f ? f->gen : 0),
                       (long long)(t ? t->idx : 0), t && t->node ? t->node : "", t && t->model ? t->model : "",
                       t && t->mode ? t->mode : "", t && t->fallback ? t->fallback : "",
                       (long long)(t ? t->t0 : 0), (long long)(t ? t->n_user : 0), (long long)(t ? t->n_gen : 0),
                       (long long)(t ? t->span : 0), t ? t->ttft_s : 0.0, t ? t->tps : 0.0, t ? t->entropy : 0.0,
                       rid, t && t->finish ? t->finish : "", nodes, counts);
    long done = !s && PQntuples(r) == 1 ? strtol(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    PQclear(r);
    if (s && !strcmp(state, "23505") && rid[0])
        s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s': request '%s' was applied already", c->id, rid);
    if (!s && done != 1) {
        /* nothing was written: say why */
        s = run(p, "commit", &r, NULL, 0, "SELECT n_tokens, state, lease_owner, lease_gen FROM sessions WHERE id=$1",
                "t", c->id);
        if (!s) {
            if (PQntuples(r) != 1) s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", c->id);
            else {
                int have = (int)int_col(r, 0, 0), st = (int)int_col(r, 0, 1);
                char owner[KVR_NAME_MAX];
                text_col(r, 0, 2, owner, sizeof owner);
                long long gen = int_col(r, 0, 3);
                if (st != KVR_SESSION_OPEN) s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is no longer open", c->id);
                else if (f && (strcmp(owner, f->owner) || gen != f->gen)) s = kvr__ledger_lost(c->id, owner, gen, f->gen);
                else if (have != c->t0)
                    s = kvl__errorf(KVL_ERR_MISMATCH, "ledger: session '%s' has %d tokens, turn starts at %d",
                                   c->id, have, c->t0);
                else s = kvl__errorf(KVL_ERR_MISMATCH, "ledger: session '%s': the commit changed nothing", c->id);
            }
            PQclear(r);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status pg_holding_set(void *impl, const char *id, const char *node, int n) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    kvl_status s = n > 0 ? run(p, "set holding", &r, NULL, 0,
                               "INSERT INTO holdings(session,node,n_tokens) VALUES($1,$2,$3) "
                               "ON CONFLICT(session,node) DO UPDATE SET n_tokens=EXCLUDED.n_tokens",
                               "tti", id, node, (long long)n)
                         : run(p, "set holding", &r, NULL, 0,
                               "DELETE FROM holdings WHERE session=$1 AND node=$2", "tt", id, node);
    PQclear(r);
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status pg_session_end(void *impl, const char *id, kvr_session_state state, double now) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    kvl_status s = simple(p, "begin", "BEGIN");
    if (!s) {
        s = run(p, "end session", &r, NULL, 0, "UPDATE sessions SET state=$1, last_used=$2 WHERE id=$3",
                "idt", (long long)state, now, id);
        if (!s && changed_rows(r) == 0) s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
        PQclear(r);
    }
    if (!s) { s = run(p, "end session", &r, NULL, 0, "DELETE FROM chunks WHERE session=$1", "t", id); PQclear(r); }
    if (!s) { s = run(p, "end session", &r, NULL, 0, "DELETE FROM holdings WHERE session=$1", "t", id); PQclear(r); }
    if (!s) s = simple(p, "commit", "COMMIT");
    if (s) rollback(p);
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status pg_idle(void *impl, double before, char (*ids)[KVR_ID_MAX], int max, int *n) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    /* a session under a live lease is being driven by a replica: not idle */
    kvl_status s = run(p, "idle", &r, NULL, 0,
                       "SELECT id FROM sessions WHERE state=0 AND last_used<$1 AND lease_expiry<$1 LIMIT $2",
                       "di", before, (long long)max);
    for (int i = 0; !s && i < PQntuples(r) && *n < max; i++) text_col(r, i, 0, ids[(*n)++], KVR_ID_MAX);
    PQclear(r);
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status pg_lru_on_node(void *impl, const char *node, const char *exclude, double now,
                                 char (*ids)[KVR_ID_MAX], int max, int *n) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    kvl_status s = run(p, "lru", &r, NULL, 0,
                       "SELECT s.id FROM sessions s JOIN holdings h ON h.session=s.id WHERE h.node=$1 "
                       "AND s.state=0 AND s.id<>$2 AND s.lease_expiry<$3 ORDER BY s.last_used LIMIT $4",
                       "ttdi", node, exclude, now, (long long)max);
    for (int i = 0; !s && i < PQntuples(r) && *n < max; i++) text_col(r, i, 0, ids[(*n)++], KVR_ID_MAX);
    PQclear(r);
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status pg_purge(void *impl, double before) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    kvl_status s = run(p, "purge", &r, NULL, 0,
                       "DELETE FROM turns WHERE session IN (SELECT id FROM sessions WHERE state<>0 AND last_used<$1)",
                       "d", before);
    PQclear(r);
    if (!s) {
        s = run(p, "purge", &r, NULL, 0, "DELETE FROM sessions WHERE state<>0 AND last_used<$1", "d", before);
        PQclear(r);
    }
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status pg_count_open(void *impl, long *n) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    kvl_status s = run(p, "count", &r, NULL, 0, "SELECT count(*) FROM sessions WHERE state=0", NULL);
    if (!s && PQntuples(r) == 1) *n = (long)int_col(r, 0, 0);
    PQclear(r);
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* Read the lease and compare-and-set it in one statement: the UPDATE matches only the
 * generation the read saw (a concurrent take re-checks the row and finds it changed), so of two
 * replicas racing one wins; the read's values say who held it. */
static const char *k_acquire_sql =
    "WITH cur AS (SELECT state, lease_owner, lease_gen, lease_expiry FROM sessions WHERE id = $3),"
    " upd AS (UPDATE sessions s SET lease_owner = $1, lease_gen = s.lease_gen + 1, lease_expiry = $2::float8"
    "  FROM cur WHERE s.id = $3 AND s.lease_gen = cur.lease_gen AND cur.state = 0"
    "  AND (cur.lease_owner = '' OR cur.lease_owner = $1 OR cur.lease_expiry < $4::float8)"
    "  RETURNING s.lease_gen)"
    " SELECT cur.state, cur.lease_owner, cur.lease_gen, cur.lease_expiry, (SELECT lease_gen FROM upd) FROM cur";

static kvl_status pg_lease_acquire(void *impl, const char *id, const char *owner, double now,
                                   double ttl_s, kvr_lease *out) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    kvl_status s = run(p, "lease", &r, NULL, 0, k_acquire_sql, "tdtd", owner, now + ttl_s, id, now);
    char holder[KVR_NAME_MAX] = "";
    long long got = 0;
    if (!s) {
        if (PQntuples(r) != 1) s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
        else {
            int state = (int)int_col(r, 0, 0);
            text_col(r, 0, 1, holder, sizeof holder);
            double expiry = dbl_col(r, 0, 3);
            got = PQgetisnull(r, 0, 4) ? 0 : int_col(r, 0, 4);
            if (state != KVR_SESSION_OPEN) s = kvr__ledger_ended(id, state);
            else if (holder[0] && strcmp(holder, owner) && expiry >= now) s = kvr__ledger_busy(id, holder, expiry, now);
            else if (!got) s = kvr__ledger_busy(id, "(another)", now + ttl_s, now);   /* lost the race */
        }
        PQclear(r);
    }
    pthread_mutex_unlock(&p->mu);
    if (!s) {
        snprintf(out->owner, sizeof out->owner, "%s", owner);
        out->gen = got;
        out->expiry = now + ttl_s;
        out->took_over = holder[0] && strcmp(holder, owner) != 0;
        snprintf(out->prev_owner, sizeof out->prev_owner, "%s", holder);
    }
    return s;
}

static kvl_status pg_lease_renew(void *impl, const char *id, const char *owner, int64_t gen,
                                 double now, double ttl_s) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    kvl_status s = run(p, "lease renew", &r, NULL, 0,
                       "UPDATE sessions SET lease_expiry=$1 WHERE id=$2 AND lease_owner=$3 AND lease_gen=$4",
                       "dtti", now + ttl_s, id, owner, (long long)gen);
    if (!s && changed_rows(r) != 1)
        s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is busy: the lease of '%s' (generation %lld) "
                       "is gone", id, owner, (long long)gen);
    PQclear(r);
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status pg_lease_release(void *impl, const char *id, const char *owner, int64_t gen) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    kvl_status s = run(p, "lease release", &r, NULL, 0,
                       "UPDATE sessions SET lease_owner='', lease_expiry=0 WHERE id=$1 AND lease_owner=$2 "
                       "AND lease_gen=$3", "tti", id, owner, (long long)gen);
    PQclear(r);
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status pg_turn_find(void *impl, const char *id, const char *rid, kvr_turn_found *f) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    /* no transaction: a committed turn's tokens do not change while its session is open (an
     * end in between only deletes them: found, without tokens) */
    PGresult *r = NULL;
    kvl_status s = run(p, "find turn", &r, NULL, 0,
            "SELECT idx,node,model,mode,fallback,t0,n_user,n_gen,span,ttft,tps,entropy,finish "
            "FROM turns WHERE session=$1 AND request_id=$2", "tt", id, rid);
    if (!s && PQntuples(r) != 1)
        s = kvl__errorf(KVL_ERR_NOT_FOUND, "session '%s': no turn with request id '%s'", id, rid);
    if (!s) {
        f->idx = (int)int_col(r, 0, 0);
        text_col(r, 0, 1, f->node, sizeof f->node);
        text_col(r, 0, 2, f->model, sizeof f->model);
        text_col(r, 0, 3, f->mode, sizeof f->mode);
        text_col(r, 0, 4, f->fallback, sizeof f->fallback);
        f->t0 = (int)int_col(r, 0, 5);
        f->n_user = (int)int_col(r, 0, 6);
        f->n_gen = (int)int_col(r, 0, 7);
        f->span = (int)int_col(r, 0, 8);
        f->ttft_s = dbl_col(r, 0, 9);
        f->tps = dbl_col(r, 0, 10);
        f->entropy = dbl_col(r, 0, 11);
        text_col(r, 0, 12, f->finish, sizeof f->finish);
    }
    PQclear(r);
    if (!s) {
        kvr_session ses;
        memset(&ses, 0, sizeof ses);
        s = load_locked(p, id, 1, &ses);
        if (!s) s = kvr__ledger_found_tokens(&ses, f);
        kvr_session_clear(&ses);
    }
    pthread_mutex_unlock(&p->mu);
    return s;
}

const kvr_ledger_ops kvr_ledger_pg_ops = {
    .name = "postgresql",
    .open = pg_open,
    .close = pg_close,
    .session_create = pg_session_create,
    .session_load = pg_session_load,
    .turn_commit = pg_turn_commit,
    .holding_set = pg_holding_set,
    .session_end = pg_session_end,
    .idle = pg_idle,
    .lru_on_node = pg_lru_on_node,
    .purge = pg_purge,
    .count_open = pg_count_open,
    .lease_acquire = pg_lease_acquire,
    .lease_renew = pg_lease_renew,
    .lease_release = pg_lease_release,
    .turn_find = pg_turn_find,
};
