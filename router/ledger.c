/* router/ledger.c: SQLite session ledger (see ledger.h).  Tokens are stored as one BLOB per
 * turn (a chunk) rather than a row per token: a 2048-token context is a handful of rows, so a
 * turn's load and commit stay well under a millisecond. */
#include "ledger.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "clock.h"
#include "error.h"

struct kvr_ledger {
    sqlite3 *db;
    pthread_mutex_t mu;
    void (*observer)(void *, double);
    void *observer_arg;
};

static const char *k_schema =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "PRAGMA foreign_keys=OFF;"
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
    "  n_tokens INTEGER NOT NULL, PRIMARY KEY(session, node)) WITHOUT ROWID;";

static kvl_status db_err(kvr_ledger *l, const char *what) {
    return kvl__errorf(KVL_ERR_IO, "ledger: %s: %s", what, sqlite3_errmsg(l->db));
}

kvl_status kvr_ledger_open(const char *path, kvr_ledger **out) {
    *out = NULL;
    kvr_ledger *l = calloc(1, sizeof *l);
    if (!l) return kvl__errorf(KVL_ERR_NOMEM, "ledger: out of memory");
    if (pthread_mutex_init(&l->mu, NULL)) { free(l); return kvl__errorf(KVL_ERR_INTERNAL, "ledger: mutex"); }
    int rc = sqlite3_open_v2(path, &l->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        kvl_status s = kvl__errorf(KVL_ERR_IO, "ledger %s: %s", path,
                                  l->db ? sqlite3_errmsg(l->db) : sqlite3_errstr(rc));
        kvr_ledger_free(l);
        return s;
    }
    sqlite3_busy_timeout(l->db, 5000);
    char *msg = NULL;
    rc = sqlite3_exec(l->db, k_schema, NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
        kvl_status s = kvl__errorf(KVL_ERR_IO, "ledger %s: schema: %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        kvr_ledger_free(l);
        return s;
    }
    *out = l;
    return KVL_OK;
}

void kvr_ledger_free(kvr_ledger *l) {
    if (!l) return;
    if (l->db) sqlite3_close_v2(l->db);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

void kvr_ledger_set_observer(kvr_ledger *l, void (*fn)(void *, double), void *arg) {
    l->observer = fn;
    l->observer_arg = arg;
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

/* Run one statement with text/int/double binds given as a format: 't' text, 'i' int,
 * 'd' double, 'b' blob (ptr,len).  Returns the sqlite rc of the last step. */
static int exec_bind(kvr_ledger *l, const char *sql, const char *fmt, ...) {
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(l->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    va_list ap;
    va_start(ap, fmt);
    for (int i = 0; fmt && fmt[i]; i++) {
        switch (fmt[i]) {
        case 't': sqlite3_bind_text(st, i + 1, va_arg(ap, const char *), -1, SQLITE_TRANSIENT); break;
        case 'i': sqlite3_bind_int64(st, i + 1, va_arg(ap, long long)); break;
        case 'd': sqlite3_bind_double(st, i + 1, va_arg(ap, double)); break;
        case 'b': {
            const void *p = va_arg(ap, const void *);
            int len = va_arg(ap, int);
            sqlite3_bind_blob(st, i + 1, p ? p : "", len, SQLITE_TRANSIENT);
            break;
        }
        }
    }
    va_end(ap);
    do rc = sqlite3_step(st); while (rc == SQLITE_ROW);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static void observe(kvr_ledger *l, double t0) {
    if (l->observer) l->observer(l->observer_arg, kvl__now_s() - t0);
}

kvl_status kvr_ledger_session_create(kvr_ledger *l, const char *id, const char *model, double now) {
    if (!kvr_session_id_valid(id))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "session id '%.80s' is invalid (1-64 of A-Za-z0-9._:-)", id ? id : "");
    double t0 = kvl__now_s();
    pthread_mutex_lock(&l->mu);
    int rc = exec_bind(l,
                       "INSERT INTO sessions(id,state,created,last_used,n_turns,n_tokens,"
                       "current_node,model,pol_level,pol_calm) VALUES(?,0,?,?,0,0,'',?,0,0)",
                       "tddt", id, now, now, model ? model : "");
    kvl_status s = KVL_OK;
    if (rc == SQLITE_CONSTRAINT) s = kvl__errorf(KVL_ERR_INVALID_ARG, "session '%s' exists already", id);
    else if (rc != SQLITE_OK) s = db_err(l, "create session");
    pthread_mutex_unlock(&l->mu);
    observe(l, t0);
    return s;
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

static void copy_col(char *dst, size_t cap, sqlite3_stmt *st, int col) {
    const unsigned char *t = sqlite3_column_text(st, col);
    snprintf(dst, cap, "%s", t ? (const char *)t : "");
}

static kvl_status load_locked(kvr_ledger *l, const char *id, int with_tokens, kvr_session *out) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(l->db,
                           "SELECT state,created,last_used,n_turns,n_tokens,current_node,model,"
                           "pol_level,pol_calm FROM sessions WHERE id=?", -1, &st, NULL) != SQLITE_OK)
        return db_err(l, "load session");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(st);
        if (rc == SQLITE_DONE) return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
        return db_err(l, "load session");
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
    sqlite3_finalize(st);

    if (sqlite3_prepare_v2(l->db, "SELECT node,n_tokens FROM holdings WHERE session=? ORDER BY node",
                           -1, &st, NULL) != SQLITE_OK)
        return db_err(l, "load holdings");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && out->n_holdings < KVR_MAX_HOLDINGS) {
        kvr_holding *h = &out->holdings[out->n_holdings++];
        copy_col(h->node, sizeof h->node, st, 0);
        h->n_tokens = sqlite3_column_int(st, 1);
    }
    sqlite3_finalize(st);

    /* an ended session's tokens are deleted: nothing to load */
    if (!with_tokens || out->state != KVR_SESSION_OPEN) return KVL_OK;
    out->tokens = malloc(sizeof(int32_t) * (size_t)(out->n_tokens ? out->n_tokens : 1));
    if (!out->tokens) return kvl__errorf(KVL_ERR_NOMEM, "ledger: %d tokens", out->n_tokens);
    if (sqlite3_prepare_v2(l->db, "SELECT t0,ids FROM chunks WHERE session=? ORDER BY t0", -1, &st,
                           NULL) != SQLITE_OK)
        return db_err(l, "load tokens");
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
    sqlite3_finalize(st);
    if (!s && have != out->n_tokens)
        s = kvl__errorf(KVL_ERR_FORMAT, "ledger: session '%s': %d tokens stored, %d expected", id,
                       have, out->n_tokens);
    return s;
}

kvl_status kvr_ledger_session_load(kvr_ledger *l, const char *id, int with_tokens,
                                   kvr_session *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&l->mu);
    kvl_status s = load_locked(l, id, with_tokens, out);
    pthread_mutex_unlock(&l->mu);
    if (s) kvr_session_clear(out);
    return s;
}

kvl_status kvr_ledger_turn_commit(kvr_ledger *l, const char *id, const int32_t *tokens, int t0,
                                  int n, const kvr_turn_rec *t, const char *current_node,
                                  int pol_level, int pol_calm, const kvr_holding *holdings,
                                  int n_holdings, double now) {
    double m0 = kvl__now_s();
    pthread_mutex_lock(&l->mu);
    kvl_status s = KVL_OK;
    if (sqlite3_exec(l->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        s = db_err(l, "begin");
        pthread_mutex_unlock(&l->mu);
        return s;
    }
    sqlite3_stmt *st = NULL;
    int have = -1, state = -1;
    if (sqlite3_prepare_v2(l->db, "SELECT n_tokens,state FROM sessions WHERE id=?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            have = sqlite3_column_int(st, 0);
            state = sqlite3_column_int(st, 1);
        }
        sqlite3_finalize(st);
    }
    if (have < 0) s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
    else if (state != KVR_SESSION_OPEN) s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is no longer open", id);
    else if (have != t0)
        s = kvl__errorf(KVL_ERR_MISMATCH, "ledger: session '%s' has %d tokens, turn starts at %d",
                       id, have, t0);
    if (!s && n > 0 &&
        exec_bind(l, "INSERT INTO chunks(session,t0,ids) VALUES(?,?,?)", "tib", id, (long long)t0,
                  (const void *)tokens, n * 4) != SQLITE_OK)
        s = db_err(l, "append tokens");
    if (!s && t &&
        exec_bind(l,
                  "INSERT OR REPLACE INTO turns(session,idx,node,model,mode,fallback,t0,n_user,"
                  "n_gen,span,ttft,tps,entropy,at) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                  "tittttiiiidddd", id, (long long)t->idx, t->node ? t->node : "",
                  t->model ? t->model : "", t->mode ? t->mode : "", t->fallback ? t->fallback : "",
                  (long long)t->t0, (long long)t->n_user, (long long)t->n_gen, (long long)t->span,
                  t->ttft_s, t->tps, t->entropy, now) != SQLITE_OK)
        s = db_err(l, "insert turn");
    if (!s &&
        exec_bind(l,
                  "UPDATE sessions SET n_tokens=?, n_turns=n_turns+?, current_node=?, pol_level=?,"
                  " pol_calm=?, last_used=? WHERE id=?",
                  "iitiidt", (long long)(t0 + n), (long long)(t ? 1 : 0), current_node ? current_node : "",
                  (long long)pol_level, (long long)pol_calm, now, id) != SQLITE_OK)
        s = db_err(l, "update session");
    if (!s && exec_bind(l, "DELETE FROM holdings WHERE session=?", "t", id) != SQLITE_OK)
        s = db_err(l, "holdings");
    for (int i = 0; !s && i < n_holdings; i++) {
        if (holdings[i].n_tokens <= 0) continue;
        if (exec_bind(l, "INSERT OR REPLACE INTO holdings(session,node,n_tokens) VALUES(?,?,?)",
                      "tti", id, holdings[i].node, (long long)holdings[i].n_tokens) != SQLITE_OK)
            s = db_err(l, "holdings");
    }
    if (!s && sqlite3_exec(l->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) s = db_err(l, "commit");
    if (s) sqlite3_exec(l->db, "ROLLBACK", NULL, NULL, NULL);
    pthread_mutex_unlock(&l->mu);
    observe(l, m0);
    return s;
}

kvl_status kvr_ledger_holding_set(kvr_ledger *l, const char *id, const char *node, int n) {
    double m0 = kvl__now_s();
    pthread_mutex_lock(&l->mu);
    int rc = n > 0 ? exec_bind(l, "INSERT OR REPLACE INTO holdings(session,node,n_tokens) VALUES(?,?,?)",
                               "tti", id, node, (long long)n)
                   : exec_bind(l, "DELETE FROM holdings WHERE session=? AND node=?", "tt", id, node);
    kvl_status s = rc == SQLITE_OK ? KVL_OK : db_err(l, "set holding");
    pthread_mutex_unlock(&l->mu);
    observe(l, m0);
    return s;
}

kvl_status kvr_ledger_session_end(kvr_ledger *l, const char *id, kvr_session_state state, double now) {
    double m0 = kvl__now_s();
    pthread_mutex_lock(&l->mu);
    kvl_status s = KVL_OK;
    if (sqlite3_exec(l->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) s = db_err(l, "begin");
    if (!s && exec_bind(l, "UPDATE sessions SET state=?, last_used=? WHERE id=?", "idt",
                        (long long)state, now, id) != SQLITE_OK)
        s = db_err(l, "end session");
    if (!s && sqlite3_changes(l->db) == 0) s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
    if (!s && exec_bind(l, "DELETE FROM chunks WHERE session=?", "t", id) != SQLITE_OK) s = db_err(l, "end session");
    if (!s && exec_bind(l, "DELETE FROM holdings WHERE session=?", "t", id) != SQLITE_OK) s = db_err(l, "end session");
    if (!s && sqlite3_exec(l->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) s = db_err(l, "commit");
    if (s) sqlite3_exec(l->db, "ROLLBACK", NULL, NULL, NULL);
    pthread_mutex_unlock(&l->mu);
    observe(l, m0);
    return s;
}

kvl_status kvr_ledger_idle(kvr_ledger *l, double before, char (*ids)[KVR_ID_MAX], int max, int *n) {
    *n = 0;
    pthread_mutex_lock(&l->mu);
    sqlite3_stmt *st = NULL;
    kvl_status s = KVL_OK;
    if (sqlite3_prepare_v2(l->db, "SELECT id FROM sessions WHERE state=0 AND last_used<? LIMIT ?",
                           -1, &st, NULL) != SQLITE_OK) {
        s = db_err(l, "idle");
    } else {
        sqlite3_bind_double(st, 1, before);
        sqlite3_bind_int(st, 2, max);
        while (sqlite3_step(st) == SQLITE_ROW && *n < max) copy_col(ids[(*n)++], KVR_ID_MAX, st, 0);
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&l->mu);
    return s;
}

kvl_status kvr_ledger_lru_on_node(kvr_ledger *l, const char *node, const char *exclude,
                                  char (*ids)[KVR_ID_MAX], int max, int *n) {
    *n = 0;
    pthread_mutex_lock(&l->mu);
    sqlite3_stmt *st = NULL;
    kvl_status s = KVL_OK;
    if (sqlite3_prepare_v2(l->db, "SELECT s.id FROM sessions s JOIN holdings h ON h.session=s.id "
                           "WHERE h.node=? AND s.state=0 AND s.id<>? ORDER BY s.last_used LIMIT ?",
                           -1, &st, NULL) != SQLITE_OK) {
        s = db_err(l, "lru");
    } else {
        sqlite3_bind_text(st, 1, node, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, exclude ? exclude : "", -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(st, 3, max);
        while (sqlite3_step(st) == SQLITE_ROW && *n < max) copy_col(ids[(*n)++], KVR_ID_MAX, st, 0);
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&l->mu);
    return s;
}

kvl_status kvr_ledger_purge(kvr_ledger *l, double before) {
    double m0 = kvl__now_s();
    pthread_mutex_lock(&l->mu);
    kvl_status s = KVL_OK;
    if (exec_bind(l, "DELETE FROM turns WHERE session IN (SELECT id FROM sessions WHERE state<>0 AND last_used<?)",
                  "d", before) != SQLITE_OK ||
        exec_bind(l, "DELETE FROM sessions WHERE state<>0 AND last_used<?", "d", before) != SQLITE_OK)
        s = db_err(l, "purge");
    pthread_mutex_unlock(&l->mu);
    observe(l, m0);
    return s;
}

kvl_status kvr_ledger_count_open(kvr_ledger *l, long *n) {
    *n = 0;
    pthread_mutex_lock(&l->mu);
    sqlite3_stmt *st = NULL;
    kvl_status s = KVL_OK;
    if (sqlite3_prepare_v2(l->db, "SELECT count(*) FROM sessions WHERE state=0", -1, &st, NULL) != SQLITE_OK) {
        s = db_err(l, "count");
    } else {
        if (sqlite3_step(st) == SQLITE_ROW) *n = (long)sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&l->mu);
    return s;
}
