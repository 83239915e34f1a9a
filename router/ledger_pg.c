/* router/ledger_pg.c: the PostgreSQL ledger backend (libpq; see ledger.h, ledger_backend.h).
 * One connection per router behind a mutex, the same tables as SQLite (tokens as one BYTEA of
 * little-endian int32 per turn).  A connection that broke (the server restarted, the network
 * dropped) is reset at the next call: calls fail with KVL_ERR_IO (UNAVAILABLE to clients)
 * while the server is away and work again once it is back.  Leases are compare-and-set
 * UPDATEs on the generation column; no lock outlives one statement or one short transaction. */
#include "ledger_backend.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "error.h"

#define MAX_PARAMS 16

typedef struct pg {
    PGconn *conn;
    char *uri;
    pthread_mutex_t mu;
    int in_tx;                 /* between BEGIN and COMMIT/ROLLBACK                          */
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
    PGresult *r = PQexecParams(p->conn, sql, n, NULL, vals, lens, fmts, binary_out);
    /* a connection the server closed (it restarted) is only seen broken by the next statement:
     * a read outside a transaction is safe to send again once on a fresh connection */
    if (r && PQresultStatus(r) == PGRES_FATAL_ERROR && PQstatus(p->conn) == CONNECTION_BAD &&
        !p->in_tx && !strncmp(sql, "SELECT", 6) && !ensure(p)) {
        PQclear(r);
        r = PQexecParams(p->conn, sql, n, NULL, vals, lens, fmts, binary_out);
    }
    if (!r) return kvl__errorf(KVL_ERR_NOMEM, "ledger %s: %s: out of memory", p->shown, what);
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
    if (r && begin && PQresultStatus(r) == PGRES_FATAL_ERROR && PQstatus(p->conn) == CONNECTION_BAD &&
        !ensure(p)) {
        PQclear(r);
        r = PQexec(p->conn, sql);
    }
    if (!r) return kvl__errorf(KVL_ERR_NOMEM, "ledger %s: %s: out of memory", p->shown, what);
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

static kvl_status pg_session_create(void *impl, const char *id, const char *model, double now) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    char state[6];
    kvl_status s = run(p, "create session", &r, state, 0,
                       "INSERT INTO sessions(id,state,created,last_used,n_turns,n_tokens,current_node,"
                       "model,pol_level,pol_calm) VALUES($1,0,$2,$2,0,0,'',$3,0,0)", "tdt", id, now, model);
    PQclear(r);
    if (s && !strcmp(state, "23505")) s = kvl__errorf(KVL_ERR_INVALID_ARG, "session '%s' exists already", id);
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status load_locked(pg *p, const char *id, int with_tokens, kvr_session *out) {
    PGresult *r = NULL;
    kvl_status s = run(p, "load session", &r, NULL, 0,
                       "SELECT state,created,last_used,n_turns,n_tokens,current_node,model,pol_level,"
                       "pol_calm FROM sessions WHERE id=$1", "t", id);
    if (s) return s;
    if (PQntuples(r) != 1) { PQclear(r); return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id); }
    snprintf(out->id, sizeof out->id, "%s", id);
    out->state = (kvr_session_state)int_col(r, 0, 0);
    out->created = dbl_col(r, 0, 1);
    out->last_used = dbl_col(r, 0, 2);
    out->n_turns = (int)int_col(r, 0, 3);
    out->n_tokens = (int)int_col(r, 0, 4);
    text_col(r, 0, 5, out->current_node, sizeof out->current_node);
    text_col(r, 0, 6, out->model, sizeof out->model);
    out->pol_level = (int)int_col(r, 0, 7);
    out->pol_calm = (int)int_col(r, 0, 8);
    PQclear(r);
    if (out->n_tokens < 0 || out->n_tokens > (1 << 28) || out->state < KVR_SESSION_OPEN ||
        out->state > KVR_SESSION_EXPIRED)
        return kvl__errorf(KVL_ERR_FORMAT, "ledger %s: session '%s': state %d, %d tokens", p->shown, id,
                          (int)out->state, out->n_tokens);
    if ((s = run(p, "load holdings", &r, NULL, 0,
                 "SELECT node,n_tokens FROM holdings WHERE session=$1 ORDER BY node", "t", id)))
        return s;
    for (int i = 0; i < PQntuples(r) && out->n_holdings < KVR_MAX_HOLDINGS; i++) {
        kvr_holding *h = &out->holdings[out->n_holdings++];
        text_col(r, i, 0, h->node, sizeof h->node);
        h->n_tokens = (int)int_col(r, i, 1);
    }
    PQclear(r);
    if (!with_tokens || out->state != KVR_SESSION_OPEN) return KVL_OK;
    out->tokens = malloc(sizeof(int32_t) * (size_t)(out->n_tokens ? out->n_tokens : 1));
    if (!out->tokens) return kvl__errorf(KVL_ERR_NOMEM, "ledger: %d tokens", out->n_tokens);
    if ((s = run(p, "load tokens", &r, NULL, 1,
                 "SELECT t0::int4, ids FROM chunks WHERE session=$1 ORDER BY t0", "t", id)))
        return s;
    int have = 0;
    for (int i = 0; !s && i < PQntuples(r); i++) {
        uint32_t be = 0;
        if (PQgetlength(r, i, 0) == 4) memcpy(&be, PQgetvalue(r, i, 0), 4);
        int t0 = (int)ntohl(be);
        int bytes = PQgetlength(r, i, 1);
        int n = bytes / 4;
        /* chunks must tile [0, n_tokens) exactly: anything else is a corrupt ledger */
        if (t0 != have || bytes % 4 || have + n > out->n_tokens) {
            s = kvl__errorf(KVL_ERR_FORMAT, "ledger: session '%s': chunk at %d does not follow %d", id,
                           t0, have);
            break;
        }
        if (n) memcpy(out->tokens + have, PQgetvalue(r, i, 1), (size_t)bytes);
        have += n;
    }
    PQclear(r);
    if (!s && have != out->n_tokens)
        s = kvl__errorf(KVL_ERR_FORMAT, "ledger: session '%s': %d tokens stored, %d expected", id,
                       have, out->n_tokens);
    return s;
}

static kvl_status pg_session_load(void *impl, const char *id, int with_tokens, kvr_session *out) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    /* one snapshot: a commit landing between the reads must not tear the session */
    kvl_status s = simple(p, "load begin", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    if (!s) {
        s = load_locked(p, id, with_tokens, out);
        if (s) rollback(p);
        else s = simple(p, "load commit", "COMMIT");
    }
    pthread_mutex_unlock(&p->mu);
    return s;
}

static kvl_status pg_turn_commit(void *impl, const kvr_ledger_commit *c) {
    pg *p = impl;
    const kvr_turn_rec *t = c->turn;
    const kvr_fence *f = t ? t->fence : NULL;
    const char *rid = f && f->request_id ? f->request_id : "";
    pthread_mutex_lock(&p->mu);
    kvl_status s = simple(p, "begin", "BEGIN");
    if (s) { pthread_mutex_unlock(&p->mu); return s; }
    PGresult *r = NULL;
    char state[6];
    /* the row lock orders this commit against a takeover's UPDATE of the lease */
    s = run(p, "commit", &r, NULL, 0,
            "SELECT n_tokens,state,lease_owner,lease_gen FROM sessions WHERE id=$1 FOR UPDATE", "t", c->id);
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
        }
        PQclear(r);
    }
    if (!s && c->n > 0) {
        s = run(p, "append tokens", &r, NULL, 0, "INSERT INTO chunks(session,t0,ids) VALUES($1,$2,$3)",
                "tib", c->id, (long long)c->t0, (const char *)c->tokens, c->n * 4);
        PQclear(r);
    }
    if (!s && t) {
        s = run(p, "insert turn", &r, state, 0,
                "INSERT INTO turns(session,idx,node,model,mode,fallback,t0,n_user,n_gen,span,ttft,tps,"
                "entropy,at,request_id,finish) VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16) "
                "ON CONFLICT(session,idx) DO UPDATE SET node=EXCLUDED.node, model=EXCLUDED.model,"
                " mode=EXCLUDED.mode, fallback=EXCLUDED.fallback, t0=EXCLUDED.t0, n_user=EXCLUDED.n_user,"
                " n_gen=EXCLUDED.n_gen, span=EXCLUDED.span, ttft=EXCLUDED.ttft, tps=EXCLUDED.tps,"
                " entropy=EXCLUDED.entropy, at=EXCLUDED.at, request_id=EXCLUDED.request_id,"
                " finish=EXCLUDED.finish",
                "tittttiiiiddddtt", c->id, (long long)t->idx, t->node ? t->node : "",
                t->model ? t->model : "", t->mode ? t->mode : "", t->fallback ? t->fallback : "",
                (long long)t->t0, (long long)t->n_user, (long long)t->n_gen, (long long)t->span,
                t->ttft_s, t->tps, t->entropy, c->now, rid, t->finish ? t->finish : "");
        PQclear(r);
        if (s && !strcmp(state, "23505"))
            s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s': request '%s' was applied already", c->id, rid);
    }
    if (!s) {
        s = run(p, "update session", &r, NULL, 0,
                "UPDATE sessions SET n_tokens=$1, n_turns=n_turns+$2, current_node=$3, pol_level=$4,"
                " pol_calm=$5, last_used=$6 WHERE id=$7",
                "iitiidt", (long long)(c->t0 + c->n), (long long)(t ? 1 : 0), c->current_node,
                (long long)c->pol_level, (long long)c->pol_calm, c->now, c->id);
        PQclear(r);
    }
    if (!s) {
        s = run(p, "holdings", &r, NULL, 0, "DELETE FROM holdings WHERE session=$1", "t", c->id);
        PQclear(r);
    }
    for (int i = 0; !s && i < c->n_holdings; i++) {
        if (c->holdings[i].n_tokens <= 0) continue;
        s = run(p, "holdings", &r, NULL, 0,
                "INSERT INTO holdings(session,node,n_tokens) VALUES($1,$2,$3) "
                "ON CONFLICT(session,node) DO UPDATE SET n_tokens=EXCLUDED.n_tokens",
                "tti", c->id, c->holdings[i].node, (long long)c->holdings[i].n_tokens);
        PQclear(r);
    }
    if (!s) s = simple(p, "commit", "COMMIT");
    if (s) rollback(p);
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

static kvl_status pg_lease_acquire(void *impl, const char *id, const char *owner, double now,
                                   double ttl_s, kvr_lease *out) {
    pg *p = impl;
    pthread_mutex_lock(&p->mu);
    PGresult *r = NULL;
    kvl_status s = run(p, "lease", &r, NULL, 0,
                       "SELECT state,lease_owner,lease_gen,lease_expiry FROM sessions WHERE id=$1", "t", id);
    char holder[KVR_NAME_MAX] = "";
    long long gen = 0;
    if (!s) {
        if (PQntuples(r) != 1) s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
        else {
            int state = (int)int_col(r, 0, 0);
            text_col(r, 0, 1, holder, sizeof holder);
            gen = int_col(r, 0, 2);
            double expiry = dbl_col(r, 0, 3);
            if (state != KVR_SESSION_OPEN) s = kvr__ledger_ended(id, state);
            else if (holder[0] && strcmp(holder, owner) && expiry >= now) s = kvr__ledger_busy(id, holder, expiry, now);
        }
        PQclear(r);
    }
    if (!s) {
        /* compare-and-set: of two replicas that read the same generation, one changes the row */
        s = run(p, "lease", &r, NULL, 0,
                "UPDATE sessions SET lease_owner=$1, lease_gen=lease_gen+1, lease_expiry=$2 "
                "WHERE id=$3 AND lease_gen=$4", "tdti", owner, now + ttl_s, id, gen);
        if (!s && changed_rows(r) != 1) s = kvr__ledger_busy(id, "(another)", now + ttl_s, now);
        PQclear(r);
    }
    pthread_mutex_unlock(&p->mu);
    if (!s) {
        snprintf(out->owner, sizeof out->owner, "%s", owner);
        out->gen = gen + 1;
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
    kvl_status s = simple(p, "find begin", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    PGresult *r = NULL;
    if (!s) {
        s = run(p, "find turn", &r, NULL, 0,
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
        if (s) rollback(p);
        else s = simple(p, "find commit", "COMMIT");
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
    .purge = pg_purge,
    .count_open = pg_count_open,
    .lease_acquire = pg_lease_acquire,
    .lease_renew = pg_lease_renew,
    .lease_release = pg_lease_release,
    .turn_find = pg_turn_find,
};
