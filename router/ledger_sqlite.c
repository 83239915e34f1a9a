/* router/ledger_sqlite.c: the SQLite ledger backend (see ledger.h, ledger_backend.h).  Tokens
 * are stored as one BLOB per turn (a chunk) rather than a row per token: a 2048-token context
 * is a handful of rows, so a turn's load and commit stay well under a millisecond. */
#include "ledger_backend.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "error.h"

/* Prepared statements kept for the connection's life, keyed by their SQL's address (each is a
 * string literal of this file): a turn runs a dozen statements, and compiling each one anew
 * (parse, plan, code generation) cost about as much as running it. */
#define SQ_STMT_CACHE 48
typedef struct sq_stmt {
    const char *sql;
    sqlite3_stmt *st;
} sq_stmt;

typedef struct sq {
    sqlite3 *db;
    pthread_mutex_t mu;           /* held around every use of db and of the cache */
    char shown[256];
    sq_stmt cache[SQ_STMT_CACHE];
    int n_cache;
} sq;

static const char *k_pragmas =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "PRAGMA foreign_keys=OFF;";

/* Schema 1 is the ledger as first shipped (its files have no version table: IF NOT EXISTS
 * makes this a no-op on them); each later entry migrates from the one before. */
static const char *const k_migrations[] = {
    "CREATE TABLE IF NOT EXISTS sessions("
    "  id TEXT PRIMARY KEY, state INTEGER NOT NULL, created REAL NOT NULL,"
    "  last_used REAL NOT NULL, n_turns INTEGER NOT NULL, n_tokens INTEGER NOT NULL,"
    "  current_node TEXT NOT NULL, model TEXT NOT NULL, pol_level INTEGER NOT NULL,"
    "  pol_calm INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS sessions_idle ON sessions(state, last_used);"
    "CREATE TABLE IF NOT EXISTS chunks(session TEXT NOT NULL, t0 INTEGER NOT NULL,"
    "  ids BLOB NOT NULL, PRIMARY KEY(session, t0)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS turns(session TEXT NOT NULL, idx INTEGER NOT NULL,"
    "  node TEXT, model TEXT, mode TEXT, fallback TEXT, t0 INTEGER, n_user INTEGER,"
    "  n_gen INTEGER, span INTEGER, ttft REAL, tps REAL, entropy REAL, at REAL,"
    "  PRIMARY KEY(session, idx)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS holdings(session TEXT NOT NULL, node TEXT NOT NULL,"
    "  n_tokens INTEGER NOT NULL, PRIMARY KEY(session, node)) WITHOUT ROWID;",
    /* 2: session leases, the idempotency key and finish reason of a turn */
    "ALTER TABLE sessions ADD COLUMN lease_owner TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE sessions ADD COLUMN lease_gen INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE sessions ADD COLUMN lease_expiry REAL NOT NULL DEFAULT 0;"
    "ALTER TABLE turns ADD COLUMN request_id TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE turns ADD COLUMN finish TEXT NOT NULL DEFAULT '';"
    "CREATE UNIQUE INDEX turns_request ON turns(session, request_id) WHERE request_id <> '';",
    /* 3: a session belongs to a tenant (API keys); sessions from before are "default"'s */
    "ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';"
    "CREATE INDEX sessions_tenant ON sessions(tenant, state);",
};
#define N_MIGRATIONS (int)(sizeof k_migrations / sizeof k_migrations[0])

static kvl_status db_err(sq *q, const char *what) {
    return kvl__errorf(KVL_ERR_IO, "ledger %s: %s: %s", q->shown, what, sqlite3_errmsg(q->db));
}

/* The statement for `sql` (a literal of this file), ready to bind and step: from the cache, or
 * compiled now (and kept while the cache has room).  Hand it back with done(). */
static int prep(sq *q, const char *sql, sqlite3_stmt **out) {
    *out = NULL;
    for (int i = 0; i < q->n_cache; i++)
        if (q->cache[i].sql == sql) {
            *out = q->cache[i].st;
            return SQLITE_OK;
        }
    int rc = sqlite3_prepare_v3(q->db, sql, -1, SQLITE_PREPARE_PERSISTENT, out, NULL);
    if (rc == SQLITE_OK && q->n_cache < SQ_STMT_CACHE) q->cache[q->n_cache++] = (sq_stmt){sql, *out};
    return rc;
}

/* After a statement from prep(): reset (which also ends the read it may hold open) and unbind
 * a cached one, finalize one the cache had no room for. */
static void done(sq *q, sqlite3_stmt *st) {
    if (!st) return;
    for (int i = 0; i < q->n_cache; i++)
        if (q->cache[i].st == st) {
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
            return;
        }
    sqlite3_finalize(st);
}

/* Run one statement with binds given as a format: 't' text, 'i' int64, 'd' double, 'b' blob
 * (ptr, len).  Returns the sqlite rc of the last step (SQLITE_OK when done). */
static int exec_bind(sq *q, const char *sql, const char *fmt, ...) {
    sqlite3_stmt *st = NULL;
    int rc = prep(q, sql, &st);
    if (rc != SQLITE_OK) return rc;
    va_list ap;
    va_start(ap, fmt);
    for (int i = 0; fmt && fmt[i] && rc == SQLITE_OK; i++) {
        switch (fmt[i]) {
        case 't': rc = sqlite3_bind_text(st, i + 1, va_arg(ap, const char *), -1, SQLITE_TRANSIENT); break;
        case 'i': rc = sqlite3_bind_int64(st, i + 1, va_arg(ap, long long)); break;
        case 'd': rc = sqlite3_bind_double(st, i + 1, va_arg(ap, double)); break;
        case 'b': {
            const void *p = va_arg(ap, const void *);
            int len = va_arg(ap, int);
            rc = sqlite3_bind_blob(st, i + 1, p ? p : "", len, SQLITE_TRANSIENT);
            break;
        }
        }
    }
    va_end(ap);
    if (rc == SQLITE_OK) {
        do rc = sqlite3_step(st); while (rc == SQLITE_ROW);
    }
    done(q, st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static kvl_status migrate(sq *q, int *schema) {
    char *msg = NULL;
    if (sqlite3_exec(q->db, "BEGIN IMMEDIATE;CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL);",
                     NULL, NULL, &msg) != SQLITE_OK) {
        kvl_status s = kvl__errorf(KVL_ERR_IO, "ledger %s: schema: %s", q->shown, msg ? msg : "?");
        sqlite3_free(msg);
        sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
        return s;
    }
    int v = 0;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(q->db, "SELECT max(version) FROM schema_version", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    kvl_status s = KVL_OK;
    if (v > N_MIGRATIONS)
        s = kvl__errorf(KVL_ERR_UNSUPPORTED, "ledger %s: schema version %d is newer than this router "
                       "knows (%d): run a newer kvlingo-router", q->shown, v, N_MIGRATIONS);
    for (int i = v; !s && i < N_MIGRATIONS; i++) {
        if (sqlite3_exec(q->db, k_migrations[i], NULL, NULL, &msg) != SQLITE_OK) {
            s = kvl__errorf(KVL_ERR_IO, "ledger %s: migration to schema %d: %s", q->shown, i + 1,
                           msg ? msg : "?");
            sqlite3_free(msg);
            msg = NULL;
        }
    }
    if (!s && v < N_MIGRATIONS &&
        (exec_bind(q, "DELETE FROM schema_version", NULL) != SQLITE_OK ||
         exec_bind(q, "INSERT INTO schema_version(version) VALUES(?)", "i", (long long)N_MIGRATIONS) != SQLITE_OK))
        s = db_err(q, "schema version");
    if (!s && sqlite3_exec(q->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) s = db_err(q, "schema commit");
    if (s) sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
    else *schema = N_MIGRATIONS;
    return s;
}

static void sq_close(void *impl) {
    sq *q = impl;
    if (!q) return;
    for (int i = 0; i < q->n_cache; i++) sqlite3_finalize(q->cache[i].st);
    if (q->db) sqlite3_close_v2(q->db);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

static kvl_status sq_open(const char *path, const char *shown, void **impl, int *schema) {
    *impl = NULL;
    sq *q = calloc(1, sizeof *q);
    if (!q) return kvl__errorf(KVL_ERR_NOMEM, "ledger: out of memory");
    snprintf(q->shown, sizeof q->shown, "%s", shown);
    if (pthread_mutex_init(&q->mu, NULL)) { free(q); return kvl__errorf(KVL_ERR_INTERNAL, "ledger: mutex"); }
    int rc = sqlite3_open_v2(path, &q->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL);
    if (rc != SQLITE_OK) {
        kvl_status s = kvl__errorf(KVL_ERR_IO, "ledger %s: %s", shown,
                                  q->db ? sqlite3_errmsg(q->db) : sqlite3_errstr(rc));
        sq_close(q);
        return s;
    }
    sqlite3_busy_timeout(q->db, 5000);
    char *msg = NULL;
    if (sqlite3_exec(q->db, k_pragmas, NULL, NULL, &msg) != SQLITE_OK) {
        kvl_status s = kvl__errorf(KVL_ERR_IO, "ledger %s: schema: %s", shown, msg ? msg : "?");
        sqlite3_free(msg);
        sq_close(q);
        return s;
    }
    kvl_status s = migrate(q, schema);
    if (s) { sq_close(q); return s; }
    *impl = q;
    return KVL_OK;
}

static kvl_status sq_session_create(void *impl, const char *id, const char *model, const char *tenant,
                                    long max_open, double now) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    /* the count and the insert in one statement under the connection's mutex: concurrent
     * creates of one tenant cannot both take its last place (on this ledger file) */
    int rc = exec_bind(q,
                       "INSERT INTO sessions(id,state,created,last_used,n_turns,n_tokens,"
                       "current_node,model,pol_level,pol_calm,tenant) SELECT ?,0,?,?,0,0,'',?,0,0,? "
                       "WHERE ?=0 OR (SELECT count(*) FROM sessions WHERE tenant=? AND state=0) < ?",
                       "tddttiti", id, now, now, model, tenant, (long long)max_open, tenant,
                       (long long)max_open);
    kvl_status s = KVL_OK;
    if (rc == SQLITE_CONSTRAINT) s = kvl__errorf(KVL_ERR_INVALID_ARG, "session '%s' exists already", id);
    else if (rc != SQLITE_OK) s = db_err(q, "create session");
    else if (sqlite3_changes(q->db) == 0)
        s = kvl__errorf(KVL_ERR_NOMEM, "quota: tenant '%s' has %ld open sessions, its max_sessions: close "
                       "one first", tenant, max_open);
    pthread_mutex_unlock(&q->mu);
    return s;
}

static void copy_col(char *dst, size_t cap, sqlite3_stmt *st, int col) {
    const unsigned char *t = sqlite3_column_text(st, col);
    snprintf(dst, cap, "%s", t ? (const char *)t : "");
}

static kvl_status load_locked(sq *q, const char *id, int with_tokens, kvr_session *out) {
    sqlite3_stmt *st = NULL;
    if (prep(q,
                           "SELECT state,created,last_used,n_turns,n_tokens,current_node,model,"
                           "pol_level,pol_calm,tenant FROM sessions WHERE id=?", &st) != SQLITE_OK)
        return db_err(q, "load session");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        done(q, st);
        if (rc == SQLITE_DONE) return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
        return db_err(q, "load session");
    }
    snprintf(out->id, sizeof out->id, "%s", id);
    out->state = (kvr_session_state)sqlite3_column_int(st, 0);
    out->created = sqlite3_column_double(st, 1);
    out->last_used = sqlite3_column_double(st, 2);
    out->n_turns = sqlite3_column_int(st, 3);
    out->n_tokens = sqlite3_column_int(st, 4);
    copy_col(out->current_node, sizeof out->current_node, st, 5);
    copy_col(out->model, sizeof out->model, st, 6);
    out->pol_level = sqlite3_column_int(st, 7);
    out->pol_calm = sqlite3_column_int(st, 8);
    copy_col(out->tenant, sizeof out->tenant, st, 9);
    done(q, st);
    if (out->n_tokens < 0 || out->n_tokens > KVR_LEDGER_MAX_TOKENS || out->state < KVR_SESSION_OPEN ||
        out->state > KVR_SESSION_EXPIRED)
        return kvl__errorf(KVL_ERR_FORMAT, "ledger %s: session '%s': state %d, %d tokens", q->shown, id,
                          (int)out->state, out->n_tokens);

    if (prep(q, "SELECT node,n_tokens FROM holdings WHERE session=? ORDER BY node", &st) != SQLITE_OK)
        return db_err(q, "load holdings");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && out->n_holdings < KVR_MAX_HOLDINGS) {
        kvr_holding *h = &out->holdings[out->n_holdings++];
        copy_col(h->node, sizeof h->node, st, 0);
        h->n_tokens = sqlite3_column_int(st, 1);
    }
    done(q, st);

    /* an ended session's tokens are deleted: nothing to load */
    if (!with_tokens || out->state != KVR_SESSION_OPEN) return KVL_OK;
    out->tokens = malloc(sizeof(int32_t) * (size_t)(out->n_tokens ? out->n_tokens : 1));
    if (!out->tokens) return kvl__errorf(KVL_ERR_NOMEM, "ledger: %d tokens", out->n_tokens);
    if (prep(q, "SELECT t0,ids FROM chunks WHERE session=? ORDER BY t0", &st) != SQLITE_OK)
        return db_err(q, "load tokens");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    int have = 0;
    kvl_status s = KVL_OK;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int t0 = sqlite3_column_int(st, 0);
        int bytes = sqlite3_column_bytes(st, 1);
        const void *blob = sqlite3_column_blob(st, 1);
        int n = bytes / 4;
        /* chunks must tile [0, n_tokens) exactly: anything else is a corrupt ledger */
        if (t0 != have || bytes % 4 || have + n > out->n_tokens) {
            s = kvl__errorf(KVL_ERR_FORMAT, "ledger: session '%s': chunk at %d does not follow %d",
                           id, t0, have);
            break;
        }
        if (n) memcpy(out->tokens + have, blob, (size_t)bytes);
        have += n;
    }
    done(q, st);
    if (!s && rc != SQLITE_DONE && rc != SQLITE_ROW) s = db_err(q, "load tokens");
    if (!s && have != out->n_tokens)
        s = kvl__errorf(KVL_ERR_FORMAT, "ledger: session '%s': %d tokens stored, %d expected", id,
                       have, out->n_tokens);
    return s;
}

static kvl_status sq_session_load(void *impl, const char *id, int with_tokens, kvr_session *out) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    /* one read transaction: another process sharing the file commits atomically */
    int began = exec_bind(q, "BEGIN", NULL) == SQLITE_OK;
    kvl_status s = load_locked(q, id, with_tokens, out);
    if (began) exec_bind(q, "COMMIT", NULL);
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_turn_commit(void *impl, const kvr_ledger_commit *c) {
    sq *q = impl;
    const kvr_turn_rec *t = c->turn;
    const kvr_fence *f = t ? t->fence : NULL;
    const char *rid = f && f->request_id ? f->request_id : "";
    pthread_mutex_lock(&q->mu);
    kvl_status s = KVL_OK;
    if (exec_bind(q, "BEGIN IMMEDIATE", NULL) != SQLITE_OK) {
        s = db_err(q, "begin");
        pthread_mutex_unlock(&q->mu);
        return s;
    }
    sqlite3_stmt *st = NULL;
    int have = -1, state = -1;
    long long gen = 0;
    char owner[KVR_NAME_MAX] = "";
    if (prep(q, "SELECT n_tokens,state,lease_owner,lease_gen FROM sessions WHERE id=?", &st) != SQLITE_OK) {
        s = db_err(q, "commit");
    } else {
        sqlite3_bind_text(st, 1, c->id, -1, SQLITE_TRANSIENT);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            have = sqlite3_column_int(st, 0);
            state = sqlite3_column_int(st, 1);
            copy_col(owner, sizeof owner, st, 2);
            gen = sqlite3_column_int64(st, 3);
        } else if (rc != SQLITE_DONE) {
            s = db_err(q, "commit");
        }
        done(q, st);
    }
    if (s) {}
    else if (have < 0) s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", c->id);
    else if (state != KVR_SESSION_OPEN) s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is no longer open", c->id);
    else if (f && (strcmp(owner, f->owner) || gen != f->gen)) s = kvr__ledger_lost(c->id, owner, gen, f->gen);
    else if (have != c->t0)
        s = kvl__errorf(KVL_ERR_MISMATCH, "ledger: session '%s' has %d tokens, turn starts at %d",
                       c->id, have, c->t0);
    if (!s && c->n > 0 &&
        exec_bind(q, "INSERT INTO chunks(session,t0,ids) VALUES(?,?,?)", "tib", c->id, (long long)c->t0,
                  (const void *)c->tokens, c->n * 4) != SQLITE_OK)
        s = db_err(q, "append tokens");
    if (!s && t) {
        int rc = exec_bind(q,
                           /* an upsert on the key, not OR REPLACE: a second turn with the
                            * same request id must fail on the unique index, not replace it */
                           "INSERT INTO turns(session,idx,node,model,mode,fallback,t0,n_user,"
                           "n_gen,span,ttft,tps,entropy,at,request_id,finish) "
                           "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(session,idx) DO UPDATE SET "
                           "node=excluded.node, model=excluded.model, mode=excluded.mode,"
                           " fallback=excluded.fallback, t0=excluded.t0, n_user=excluded.n_user,"
                           " n_gen=excluded.n_gen, span=excluded.span, ttft=excluded.ttft, tps=excluded.tps,"
                           " entropy=excluded.entropy, at=excluded.at, request_id=excluded.request_id,"
                           " finish=excluded.finish",
                           "tittttiiiiddddtt", c->id, (long long)t->idx, t->node ? t->node : "",
                           t->model ? t->model : "", t->mode ? t->mode : "",
                           t->fallback ? t->fallback : "", (long long)t->t0, (long long)t->n_user,
                           (long long)t->n_gen, (long long)t->span, t->ttft_s, t->tps, t->entropy,
                           c->now, rid, t->finish ? t->finish : "");
        if (rc == SQLITE_CONSTRAINT)
            s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s': request '%s' was applied already", c->id, rid);
        else if (rc != SQLITE_OK)
            s = db_err(q, "insert turn");
    }
    if (!s &&
        exec_bind(q,
                  "UPDATE sessions SET n_tokens=?, n_turns=n_turns+?, current_node=?, pol_level=?,"
                  " pol_calm=?, last_used=? WHERE id=?",
                  "iitiidt", (long long)(c->t0 + c->n), (long long)(t ? 1 : 0), c->current_node,
                  (long long)c->pol_level, (long long)c->pol_calm, c->now, c->id) != SQLITE_OK)
        s = db_err(q, "update session");
    if (!s && exec_bind(q, "DELETE FROM holdings WHERE session=?", "t", c->id) != SQLITE_OK)
        s = db_err(q, "holdings");
    for (int i = 0; !s && i < c->n_holdings; i++) {
        if (c->holdings[i].n_tokens <= 0) continue;
        if (exec_bind(q, "INSERT OR REPLACE INTO holdings(session,node,n_tokens) VALUES(?,?,?)",
                      "tti", c->id, c->holdings[i].node, (long long)c->holdings[i].n_tokens) != SQLITE_OK)
            s = db_err(q, "holdings");
    }
    if (!s && exec_bind(q, "COMMIT", NULL) != SQLITE_OK) s = db_err(q, "commit");
    if (s) exec_bind(q, "ROLLBACK", NULL);
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_holding_set(void *impl, const char *id, const char *node, int n) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    int rc = n > 0 ? exec_bind(q, "INSERT OR REPLACE INTO holdings(session,node,n_tokens) VALUES(?,?,?)",
                               "tti", id, node, (long long)n)
                   : exec_bind(q, "DELETE FROM holdings WHERE session=? AND node=?", "tt", id, node);
    kvl_status s = rc == SQLITE_OK ? KVL_OK : db_err(q, "set holding");
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_session_end(void *impl, const char *id, kvr_session_state state, double now) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    kvl_status s = KVL_OK;
    if (exec_bind(q, "BEGIN IMMEDIATE", NULL) != SQLITE_OK) s = db_err(q, "begin");
    if (!s && exec_bind(q, "UPDATE sessions SET state=?, last_used=? WHERE id=?", "idt",
                        (long long)state, now, id) != SQLITE_OK)
        s = db_err(q, "end session");
    if (!s && sqlite3_changes(q->db) == 0) s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
    if (!s && exec_bind(q, "DELETE FROM chunks WHERE session=?", "t", id) != SQLITE_OK) s = db_err(q, "end session");
    if (!s && exec_bind(q, "DELETE FROM holdings WHERE session=?", "t", id) != SQLITE_OK) s = db_err(q, "end session");
    if (!s && exec_bind(q, "COMMIT", NULL) != SQLITE_OK) s = db_err(q, "commit");
    if (s) exec_bind(q, "ROLLBACK", NULL);
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_idle(void *impl, double before, char (*ids)[KVR_ID_MAX], int max, int *n) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    sqlite3_stmt *st = NULL;
    kvl_status s = KVL_OK;
    /* a session under a live lease is being driven by a replica: not idle */
    if (prep(q, "SELECT id FROM sessions WHERE state=0 AND last_used<? "
                           "AND lease_expiry<? LIMIT ?", &st) != SQLITE_OK) {
        s = db_err(q, "idle");
    } else {
        sqlite3_bind_double(st, 1, before);
        sqlite3_bind_double(st, 2, before);
        sqlite3_bind_int(st, 3, max);
        while (sqlite3_step(st) == SQLITE_ROW && *n < max) copy_col(ids[(*n)++], KVR_ID_MAX, st, 0);
        done(q, st);
    }
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_lru_on_node(void *impl, const char *node, const char *exclude, double now,
                                 char (*ids)[KVR_ID_MAX], int max, int *n) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    sqlite3_stmt *st = NULL;
    kvl_status s = KVL_OK;
    if (prep(q, "SELECT s.id FROM sessions s JOIN holdings h ON h.session=s.id "
                           "WHERE h.node=? AND s.state=0 AND s.id<>? AND s.lease_expiry<? "
                           "ORDER BY s.last_used LIMIT ?", &st) != SQLITE_OK) {
        s = db_err(q, "lru");
    } else {
        sqlite3_bind_text(st, 1, node, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, exclude, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(st, 3, now);
        sqlite3_bind_int(st, 4, max);
        while (sqlite3_step(st) == SQLITE_ROW && *n < max) copy_col(ids[(*n)++], KVR_ID_MAX, st, 0);
        done(q, st);
    }
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_purge(void *impl, double before) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    kvl_status s = KVL_OK;
    if (exec_bind(q, "DELETE FROM turns WHERE session IN (SELECT id FROM sessions WHERE state<>0 AND last_used<?)",
                  "d", before) != SQLITE_OK ||
        exec_bind(q, "DELETE FROM sessions WHERE state<>0 AND last_used<?", "d", before) != SQLITE_OK)
        s = db_err(q, "purge");
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_count_open(void *impl, long *n) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    sqlite3_stmt *st = NULL;
    kvl_status s = KVL_OK;
    if (prep(q, "SELECT count(*) FROM sessions WHERE state=0", &st) != SQLITE_OK) {
        s = db_err(q, "count");
    } else {
        if (sqlite3_step(st) == SQLITE_ROW) *n = (long)sqlite3_column_int64(st, 0);
        done(q, st);
    }
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_lease_acquire(void *impl, const char *id, const char *owner, double now,
                                   double ttl_s, kvr_lease *out) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    kvl_status s = KVL_OK;
    /* the read and the compare-and-set in one write transaction: another process on the same
     * file cannot slip between them (BEGIN IMMEDIATE takes the write lock) */
    if (exec_bind(q, "BEGIN IMMEDIATE", NULL) != SQLITE_OK) {
        s = db_err(q, "lease begin");
        pthread_mutex_unlock(&q->mu);
        return s;
    }
    sqlite3_stmt *st = NULL;
    int found = 0, state = 0;
    long long gen = 0;
    double expiry = 0;
    char holder[KVR_NAME_MAX] = "";
    if (prep(q, "SELECT state,lease_owner,lease_gen,lease_expiry FROM sessions WHERE id=?", &st) != SQLITE_OK) {
        s = db_err(q, "lease");
    } else {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            found = 1;
            state = sqlite3_column_int(st, 0);
            copy_col(holder, sizeof holder, st, 1);
            gen = sqlite3_column_int64(st, 2);
            expiry = sqlite3_column_double(st, 3);
        } else if (rc != SQLITE_DONE) {
            s = db_err(q, "lease");
        }
        done(q, st);
    }
    if (s) {}
    else if (!found) s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
    else if (state != KVR_SESSION_OPEN) s = kvr__ledger_ended(id, state);
    else if (holder[0] && strcmp(holder, owner) && expiry >= now) s = kvr__ledger_busy(id, holder, expiry, now);
    if (!s) {
        if (exec_bind(q, "UPDATE sessions SET lease_owner=?, lease_gen=lease_gen+1, lease_expiry=? "
                      "WHERE id=? AND lease_gen=?", "tdti", owner, now + ttl_s, id, gen) != SQLITE_OK)
            s = db_err(q, "lease");
        else if (sqlite3_changes(q->db) != 1)
            s = kvr__ledger_busy(id, "(another)", now + ttl_s, now);
    }
    if (!s && exec_bind(q, "COMMIT", NULL) != SQLITE_OK) s = db_err(q, "lease commit");
    if (s) exec_bind(q, "ROLLBACK", NULL);
    pthread_mutex_unlock(&q->mu);
    if (!s) {
        snprintf(out->owner, sizeof out->owner, "%s", owner);
        out->gen = gen + 1;
        out->expiry = now + ttl_s;
        out->took_over = holder[0] && strcmp(holder, owner) != 0;
        snprintf(out->prev_owner, sizeof out->prev_owner, "%s", holder);
    }
    return s;
}

static kvl_status sq_lease_renew(void *impl, const char *id, const char *owner, int64_t gen,
                                 double now, double ttl_s) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    kvl_status s = KVL_OK;
    if (exec_bind(q, "UPDATE sessions SET lease_expiry=? WHERE id=? AND lease_owner=? AND lease_gen=?",
                  "dtti", now + ttl_s, id, owner, (long long)gen) != SQLITE_OK)
        s = db_err(q, "lease renew");
    else if (sqlite3_changes(q->db) != 1)
        s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is busy: the lease of '%s' (generation %lld) "
                       "is gone", id, owner, (long long)gen);
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_lease_release(void *impl, const char *id, const char *owner, int64_t gen) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    kvl_status s = KVL_OK;
    if (exec_bind(q, "UPDATE sessions SET lease_owner='', lease_expiry=0 WHERE id=? AND lease_owner=? "
                  "AND lease_gen=?", "tti", id, owner, (long long)gen) != SQLITE_OK)
        s = db_err(q, "lease release");
    pthread_mutex_unlock(&q->mu);
    return s;
}

static kvl_status sq_turn_find(void *impl, const char *id, const char *rid, kvr_turn_found *f) {
    sq *q = impl;
    pthread_mutex_lock(&q->mu);
    sqlite3_stmt *st = NULL;
    kvl_status s = KVL_OK;
    int began = exec_bind(q, "BEGIN", NULL) == SQLITE_OK;
    if (prep(q, "SELECT idx,node,model,mode,fallback,t0,n_user,n_gen,span,ttft,tps,"
                           "entropy,finish FROM turns WHERE session=? AND request_id=?", &st) != SQLITE_OK) {
        s = db_err(q, "find turn");
    } else {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, rid, -1, SQLITE_TRANSIENT);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            f->idx = sqlite3_column_int(st, 0);
            copy_col(f->node, sizeof f->node, st, 1);
            copy_col(f->model, sizeof f->model, st, 2);
            copy_col(f->mode, sizeof f->mode, st, 3);
            copy_col(f->fallback, sizeof f->fallback, st, 4);
            f->t0 = sqlite3_column_int(st, 5);
            f->n_user = sqlite3_column_int(st, 6);
            f->n_gen = sqlite3_column_int(st, 7);
            f->span = sqlite3_column_int(st, 8);
            f->ttft_s = sqlite3_column_double(st, 9);
            f->tps = sqlite3_column_double(st, 10);
            f->entropy = sqlite3_column_double(st, 11);
            copy_col(f->finish, sizeof f->finish, st, 12);
        } else if (rc == SQLITE_DONE) {
            s = kvl__errorf(KVL_ERR_NOT_FOUND, "session '%s': no turn with request id '%s'", id, rid);
        } else {
            s = db_err(q, "find turn");
        }
        done(q, st);
    }
    if (!s) {
        kvr_session ses;
        memset(&ses, 0, sizeof ses);
        s = load_locked(q, id, 1, &ses);
        if (!s) s = kvr__ledger_found_tokens(&ses, f);
        kvr_session_clear(&ses);
    }
    if (began) exec_bind(q, "COMMIT", NULL);
    pthread_mutex_unlock(&q->mu);
    return s;
}

const kvr_ledger_ops kvr_ledger_sqlite_ops = {
    .name = "sqlite",
    .open = sq_open,
    .close = sq_close,
    .session_create = sq_session_create,
    .session_load = sq_session_load,
    .turn_commit = sq_turn_commit,
    .holding_set = sq_holding_set,
    .session_end = sq_session_end,
    .idle = sq_idle,
    .lru_on_node = sq_lru_on_node,
    .purge = sq_purge,
    .count_open = sq_count_open,
    .lease_acquire = sq_lease_acquire,
    .lease_renew = sq_lease_renew,
    .lease_release = sq_lease_release,
    .turn_find = sq_turn_find,
};
