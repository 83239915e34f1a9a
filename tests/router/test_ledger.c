/* tests/router/test_ledger.c: the session ledger, the same tests on each backend: create/load,
 * turn commits with off-by-one protection, holdings, end/expiry/purge, persistence across
 * reopen, schema versions and the migration of a first-version ledger, leases (compare-and-set
 * under a race of two connections, takeover of an expired lease, the commit fence), request
 * ids.  SQLite by default; PostgreSQL when KVR_TEST_LEDGER holds a postgresql:// URI (the
 * router_test_ledger_pg test starts a server for it; tables are dropped before each test). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>
#ifdef KVR_HAVE_LIBPQ
#include <libpq-fe.h>
#endif

#include "lease.h"
#include "ledger.h"

static char g_path[512];
static int g_pg;

/* Run SQL on the test database directly, beside the ledger (0 on success). */
static int raw_exec(const char *sql) {
    if (!g_pg) {
        sqlite3 *db = NULL;
        int rc = sqlite3_open(g_path, &db);
        if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        sqlite3_close(db);
        return rc;
    }
#ifdef KVR_HAVE_LIBPQ
    PGconn *c = PQconnectdb(g_path);
    int rc = PQstatus(c) == CONNECTION_OK ? 0 : -1;
    if (!rc) {
        PGresult *r = PQexec(c, sql);
        rc = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK ? 0 : -1;
        if (rc) fprintf(stderr, "raw_exec: %s", PQresultErrorMessage(r));
        PQclear(r);
    }
    PQfinish(c);
    return rc;
#else
    return -1;
#endif
}

static void wipe(void) {
    if (!g_pg) {
        char p[600];
        unlink(g_path);
        snprintf(p, sizeof p, "%s-wal", g_path);
        unlink(p);
        snprintf(p, sizeof p, "%s-shm", g_path);
        unlink(p);
    } else {
        raw_exec("SET client_min_messages=warning; DROP TABLE IF EXISTS sessions, chunks, turns, holdings, schema_version CASCADE");
    }
}

static int setup(void **state) {
    wipe();
    kvr_ledger *l = NULL;
    if (kvr_ledger_open(g_path, &l)) {
        fprintf(stderr, "setup: %s\n", kvl_last_error());
        return -1;
    }
    *state = l;
    return 0;
}

static int teardown(void **state) {
    kvr_ledger_free(*state);
    wipe();
    return 0;
}

static void commit(kvr_ledger *l, const char *id, const int32_t *t, int t0, int n, const char *node,
                   int held, kvl_status want) {
    kvr_turn_rec tr = {.idx = 0, .node = node, .model = "m", .mode = "none", .t0 = t0, .n_user = n};
    kvr_holding h = {.n_tokens = held};
    snprintf(h.node, sizeof h.node, "%s", node);
    assert_int_equal(kvr_ledger_turn_commit(l, id, t, t0, n, &tr, node, 1, 2, &h, 1, 100.0), want);
}

static void test_create_and_load(void **state) {
    kvr_ledger *l = *state;
    assert_int_equal(kvr_ledger_session_create(l, "s1", "qwen3-a", 10.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create(l, "s1", "", 10.0), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvr_ledger_session_create(l, "bad id!", "", 10.0), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvr_ledger_session_create(l, "", "", 10.0), KVL_ERR_INVALID_ARG);
    kvr_session s;
    assert_int_equal(kvr_ledger_session_load(l, "s1", 1, &s), KVL_OK);
    assert_string_equal(s.model, "qwen3-a");
    assert_int_equal(s.n_tokens, 0);
    assert_int_equal(s.state, KVR_SESSION_OPEN);
    kvr_session_clear(&s);
    assert_int_equal(kvr_ledger_session_load(l, "nope", 1, &s), KVL_ERR_NOT_FOUND);
}

static void test_commit_tokens(void **state) {
    kvr_ledger *l = *state;
    assert_int_equal(kvr_ledger_session_create(l, "s2", "", 10.0), KVL_OK);
    int32_t a[5] = {1, 2, 3, 4, 5}, b[3] = {6, 7, 8};
    commit(l, "s2", a, 0, 5, "n0", 5, KVL_OK);
    commit(l, "s2", b, 4, 3, "n0", 8, KVL_ERR_MISMATCH);   /* off by one: rejected */
    commit(l, "s2", b, 6, 3, "n0", 8, KVL_ERR_MISMATCH);
    commit(l, "s2", b, 5, 3, "n1", 8, KVL_OK);
    /* past the most a session holds (what the loaders read back): refused, not stored */
    commit(l, "s2", b, KVR_LEDGER_MAX_TOKENS - 2, 3, "n1", 8, KVL_ERR_RANGE);
    commit(l, "s2", b, INT32_MAX - 1, 3, "n1", 8, KVL_ERR_RANGE);
    kvr_session s;
    assert_int_equal(kvr_ledger_session_load(l, "s2", 1, &s), KVL_OK);
    assert_int_equal(s.n_tokens, 8);
    for (int i = 0; i < 8; i++) assert_int_equal(s.tokens[i], i + 1);
    assert_int_equal(s.n_turns, 2);
    assert_string_equal(s.current_node, "n1");
    assert_int_equal(s.pol_level, 1);
    assert_int_equal(s.pol_calm, 2);
    /* holdings were replaced by the last commit */
    assert_int_equal(kvr_session_held(&s, "n1"), 8);
    assert_int_equal(kvr_session_held(&s, "n0"), 0);
    kvr_session_clear(&s);
    assert_int_equal(kvr_ledger_holding_set(l, "s2", "n0", 5), KVL_OK);
    assert_int_equal(kvr_ledger_session_load(l, "s2", 0, &s), KVL_OK);
    assert_null(s.tokens);
    assert_int_equal(kvr_session_held(&s, "n0"), 5);
    kvr_session_clear(&s);
    assert_int_equal(kvr_ledger_holding_set(l, "s2", "n0", 0), KVL_OK);
    assert_int_equal(kvr_ledger_session_load(l, "s2", 0, &s), KVL_OK);
    assert_int_equal(kvr_session_held(&s, "n0"), 0);
    kvr_session_clear(&s);
}

static void test_end_expire_purge(void **state) {
    kvr_ledger *l = *state;
    int32_t a[2] = {1, 2};
    assert_int_equal(kvr_ledger_session_create(l, "old", "", 10.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create(l, "new", "", 1000.0), KVL_OK);
    commit(l, "old", a, 0, 2, "n0", 2, KVL_OK);   /* last_used = 100 */
    char ids[4][KVR_ID_MAX];
    int n = 0;
    assert_int_equal(kvr_ledger_idle(l, 500.0, ids, 4, &n), KVL_OK);
    assert_int_equal(n, 1);
    assert_string_equal(ids[0], "old");
    long open = 0;
    assert_int_equal(kvr_ledger_count_open(l, &open), KVL_OK);
    assert_int_equal(open, 2);
    assert_int_equal(kvr_ledger_session_end(l, "old", KVR_SESSION_EXPIRED, 600.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_end(l, "ghost", KVR_SESSION_CLOSED, 600.0), KVL_ERR_NOT_FOUND);
    kvr_session s;
    assert_int_equal(kvr_ledger_session_load(l, "old", 1, &s), KVL_OK);
    assert_int_equal(s.state, KVR_SESSION_EXPIRED);
    assert_null(s.tokens);
    assert_int_equal(s.n_holdings, 0);
    kvr_session_clear(&s);
    commit(l, "old", a, 2, 2, "n0", 4, KVL_ERR_MISMATCH);   /* no turns on an ended session */
    assert_int_equal(kvr_ledger_count_open(l, &open), KVL_OK);
    assert_int_equal(open, 1);
    assert_int_equal(kvr_ledger_purge(l, 700.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_load(l, "old", 0, &s), KVL_ERR_NOT_FOUND);
}

static void test_persistence(void **state) {
    kvr_ledger *l = *state;
    int32_t a[3] = {9, 8, 7};
    assert_int_equal(kvr_ledger_session_create(l, "p", "", 10.0), KVL_OK);
    commit(l, "p", a, 0, 3, "n0", 3, KVL_OK);
    kvr_ledger_free(l);
    assert_int_equal(kvr_ledger_open(g_path, &l), KVL_OK);
    *state = l;
    kvr_session s;
    assert_int_equal(kvr_ledger_session_load(l, "p", 1, &s), KVL_OK);
    assert_int_equal(s.n_tokens, 3);
    assert_int_equal(s.tokens[2], 7);
    assert_int_equal(kvr_session_held(&s, "n0"), 3);
    kvr_session_clear(&s);
}

static void test_bad_path(void **state) {
    (void)state;
    kvr_ledger *l = NULL;
    if (!g_pg) {
        assert_int_equal(kvr_ledger_open("/nonexistent-dir/x/ledger.db", &l), KVL_ERR_IO);
        assert_null(l);
        assert_non_null(strstr(kvl_last_error(), "/nonexistent-dir/x/ledger.db"));
        assert_int_equal(kvr_ledger_open("sqlite:", &l), KVL_ERR_INVALID_ARG);
        return;
    }
    /* nothing listens on port 1: a clear error naming the server, the password hidden */
    assert_int_equal(kvr_ledger_open("postgresql://kvr:s3cret@127.0.0.1:1/postgres", &l), KVL_ERR_IO);
    assert_null(l);
    assert_non_null(strstr(kvl_last_error(), "127.0.0.1:1"));
    assert_null(strstr(kvl_last_error(), "s3cret"));
}

static void test_shown(void **state) {
    (void)state;
    char b[200];
    kvr_ledger_shown("postgresql://u:pw@h:5432/db", b, sizeof b);
    assert_string_equal(b, "postgresql://u:***@h:5432/db");
    kvr_ledger_shown("postgresql://u:p@ss@h/db", b, sizeof b);
    assert_string_equal(b, "postgresql://u:***@h/db");
    kvr_ledger_shown("postgres://h/db?password=pw&x=1", b, sizeof b);
    assert_null(strstr(b, "pw&"));
    kvr_ledger_shown("/var/lib/r.db", b, sizeof b);
    assert_string_equal(b, "/var/lib/r.db");
    assert_true(kvr_ledger_is_postgres("postgresql://h/db"));
    assert_false(kvr_ledger_is_postgres("sqlite:/x"));
}

static void test_schema(void **state) {
    kvr_ledger *l = *state;
    assert_int_equal(kvr_ledger_schema(l), KVR_LEDGER_SCHEMA);
    assert_string_equal(kvr_ledger_backend(l), g_pg ? "postgresql" : "sqlite");
    /* a ledger of a newer router is refused, not used */
    kvr_ledger_free(l);
    *state = NULL;
    assert_int_equal(raw_exec("UPDATE schema_version SET version=99"), 0);
    assert_int_equal(kvr_ledger_open(g_path, &l), KVL_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvl_last_error(), "99"));
}

/* A session belongs to its tenant; max_sessions counts a tenant's open sessions only. */
static void test_tenant_quota(void **state) {
    kvr_ledger *l = *state;
    kvr_session s;
    assert_int_equal(kvr_ledger_session_create_for(l, "ta1", "", "acme", 2, 1.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create_for(l, "ta2", "", "acme", 2, 1.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create_for(l, "ta3", "", "acme", 2, 1.0), KVL_ERR_NOMEM);
    assert_non_null(strstr(kvl_last_error(), "max_sessions"));
    assert_int_equal(kvr_ledger_session_load(l, "ta3", 0, &s), KVL_ERR_NOT_FOUND);
    /* another tenant's count is its own */
    assert_int_equal(kvr_ledger_session_create_for(l, "tb1", "", "beta", 1, 1.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create_for(l, "tb2", "", "beta", 1, 1.0), KVL_ERR_NOMEM);
    assert_int_equal(kvr_ledger_session_create(l, "td1", "", 1.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_load(l, "ta1", 0, &s), KVL_OK);
    assert_string_equal(s.tenant, "acme");
    kvr_session_clear(&s);
    assert_int_equal(kvr_ledger_session_load(l, "td1", 0, &s), KVL_OK);
    assert_string_equal(s.tenant, "default");
    kvr_session_clear(&s);
    /* an ended session frees its place */
    assert_int_equal(kvr_ledger_session_end(l, "ta1", KVR_SESSION_CLOSED, 2.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create_for(l, "ta3", "", "acme", 2, 3.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create_for(l, "ta4", "", "acme", 0, 3.0), KVL_OK);   /* 0: no limit */
    /* a key another tenant holds is taken (the router keys each tenant's ids apart) */
    assert_int_equal(kvr_ledger_session_create_for(l, "ta2", "", "beta", 0, 3.0), KVL_ERR_INVALID_ARG);
    /* per-tenant keys: the same client id under two tenants is two sessions */
    char ka[KVR_ID_MAX], kb[KVR_ID_MAX], kd[KVR_ID_MAX];
    kvr_session_key("acme", "conv-1", ka);
    kvr_session_key("beta", "conv-1", kb);
    kvr_session_key("default", "conv-1", kd);
    assert_string_equal(kd, "conv-1");
    assert_string_not_equal(ka, kb);
    assert_int_equal((int)strlen(ka), 12 + 1 + 6);
    assert_true(kvr_session_key_valid(ka) && kvr_session_key_valid(kd));
    assert_string_equal(kvr_session_client_id(ka), "conv-1");
    assert_string_equal(kvr_session_client_id(kd), "conv-1");
    assert_int_equal(kvr_ledger_session_create_for(l, ka, "", "acme", 0, 3.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create_for(l, kb, "", "beta", 0, 3.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_load(l, kb, 0, &s), KVL_OK);
    assert_string_equal(s.tenant, "beta");
    kvr_session_clear(&s);
    /* the longest client id fits; a client's id may not hold a '/', nor a key a bad tag */
    char longest[65], kl[KVR_ID_MAX];
    memset(longest, 'x', 64);
    longest[64] = 0;
    kvr_session_key("acme", longest, kl);
    assert_int_equal((int)strlen(kl), 77);
    assert_true(kvr_session_key_valid(kl));
    assert_false(kvr_session_id_valid("ab/cd"));
    assert_false(kvr_session_key_valid("0123456789a/cd"));    /* 11-digit tag */
    assert_false(kvr_session_key_valid("0123456789aB/cd"));   /* upper case */
    assert_false(kvr_session_key_valid("0123456789ab/c/d"));
    assert_int_equal(kvr_ledger_session_create_for(l, "ab/cd", "", "acme", 0, 3.0), KVL_ERR_INVALID_ARG);
}

/* A ledger written by the first router (schema 1: no version table, no lease columns) opens,
 * migrates, keeps its sessions and takes leases. */
static void test_migrate_v1(void **state) {
    kvr_ledger_free(*state);
    *state = NULL;
    wipe();
    const char *v1 = g_pg
        ? "CREATE TABLE sessions(id TEXT PRIMARY KEY, state INTEGER NOT NULL, created DOUBLE PRECISION NOT NULL,"
          " last_used DOUBLE PRECISION NOT NULL, n_turns INTEGER NOT NULL, n_tokens INTEGER NOT NULL,"
          " current_node TEXT NOT NULL, model TEXT NOT NULL, pol_level INTEGER NOT NULL, pol_calm INTEGER NOT NULL);"
          "CREATE TABLE chunks(session TEXT NOT NULL, t0 INTEGER NOT NULL, ids BYTEA NOT NULL, PRIMARY KEY(session, t0));"
          "CREATE TABLE turns(session TEXT NOT NULL, idx INTEGER NOT NULL, node TEXT, model TEXT, mode TEXT,"
          " fallback TEXT, t0 INTEGER, n_user INTEGER, n_gen INTEGER, span INTEGER, ttft DOUBLE PRECISION,"
          " tps DOUBLE PRECISION, entropy DOUBLE PRECISION, at DOUBLE PRECISION, PRIMARY KEY(session, idx));"
          "CREATE TABLE holdings(session TEXT NOT NULL, node TEXT NOT NULL, n_tokens INTEGER NOT NULL,"
          " PRIMARY KEY(session, node));"
          "INSERT INTO sessions VALUES('old1',0,1,2,1,2,'n0','m',0,0);"
          "INSERT INTO chunks VALUES('old1',0,'\\x0700000008000000');"
        : "CREATE TABLE sessions(id TEXT PRIMARY KEY, state INTEGER NOT NULL, created REAL NOT NULL,"
          " last_used REAL NOT NULL, n_turns INTEGER NOT NULL, n_tokens INTEGER NOT NULL,"
          " current_node TEXT NOT NULL, model TEXT NOT NULL, pol_level INTEGER NOT NULL, pol_calm INTEGER NOT NULL);"
          "CREATE TABLE chunks(session TEXT NOT NULL, t0 INTEGER NOT NULL, ids BLOB NOT NULL,"
          " PRIMARY KEY(session, t0)) WITHOUT ROWID;"
          "CREATE TABLE turns(session TEXT NOT NULL, idx INTEGER NOT NULL, node TEXT, model TEXT, mode TEXT,"
          " fallback TEXT, t0 INTEGER, n_user INTEGER, n_gen INTEGER, span INTEGER, ttft REAL, tps REAL,"
          " entropy REAL, at REAL, PRIMARY KEY(session, idx)) WITHOUT ROWID;"
          "CREATE TABLE holdings(session TEXT NOT NULL, node TEXT NOT NULL, n_tokens INTEGER NOT NULL,"
          " PRIMARY KEY(session, node)) WITHOUT ROWID;"
          "INSERT INTO sessions VALUES('old1',0,1,2,1,2,'n0','m',0,0);"
          "INSERT INTO chunks VALUES('old1',0,x'0700000008000000');";
    assert_int_equal(raw_exec(v1), 0);
    kvr_ledger *l = NULL;
    assert_int_equal(kvr_ledger_open(g_path, &l), KVL_OK);
    *state = l;
    assert_int_equal(kvr_ledger_schema(l), KVR_LEDGER_SCHEMA);
    kvr_session s;
    assert_int_equal(kvr_ledger_session_load(l, "old1", 1, &s), KVL_OK);
    assert_int_equal(s.n_tokens, 2);
    assert_int_equal(s.tokens[0], 7);
    assert_int_equal(s.tokens[1], 8);
    assert_string_equal(s.tenant, "default");   /* sessions from before tenants: "default"'s */
    kvr_session_clear(&s);
    kvr_lease le;
    assert_int_equal(kvr_ledger_lease_acquire(l, "old1", "r1", 10.0, 5.0, &le), KVL_OK);
    assert_int_equal(le.gen, 1);
    /* opening again is a no-op */
    kvr_ledger *l2 = NULL;
    assert_int_equal(kvr_ledger_open(g_path, &l2), KVL_OK);
    kvr_ledger_free(l2);
}

static void fenced_commit(kvr_ledger *l, const char *id, const int32_t *t, int t0, int n,
                          const char *owner, int64_t gen, const char *rid, kvl_status want) {
    kvr_fence f = {.owner = owner, .gen = gen, .request_id = rid};
    /* turn index = t0: every commit here is a new turn */
    kvr_turn_rec tr = {.idx = t0, .node = "n0", .model = "m", .mode = "none", .t0 = t0, .n_user = n,
                       .n_gen = 0, .finish = "length", .fence = &f};
    kvr_holding h = {.node = "n0", .n_tokens = t0 + n};
    kvl_status s = kvr_ledger_turn_commit(l, id, t, t0, n, &tr, "n0", 0, 0, &h, 1, 100.0);
    if (s != want) fprintf(stderr, "commit: %s\n", kvl_last_error());
    assert_int_equal(s, want);
}

/* The sessions holding a prefix on a node, least recently used first, to free a place on a
 * full node: open sessions only, not the excluded one, not one under a live lease. */
static void test_lru_on_node(void **state) {
    kvr_ledger *l = *state;
    assert_int_equal(kvr_ledger_session_create(l, "lru-new", "", 20.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create(l, "lru-old", "", 10.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create(l, "lru-other", "", 5.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create(l, "lru-leased", "", 1.0), KVL_OK);
    assert_int_equal(kvr_ledger_session_create(l, "lru-ended", "", 2.0), KVL_OK);
    assert_int_equal(kvr_ledger_holding_set(l, "lru-new", "n0", 4), KVL_OK);
    assert_int_equal(kvr_ledger_holding_set(l, "lru-old", "n0", 4), KVL_OK);
    assert_int_equal(kvr_ledger_holding_set(l, "lru-other", "n1", 4), KVL_OK);
    assert_int_equal(kvr_ledger_holding_set(l, "lru-leased", "n0", 4), KVL_OK);
    assert_int_equal(kvr_ledger_holding_set(l, "lru-ended", "n0", 4), KVL_OK);
    assert_int_equal(kvr_ledger_session_end(l, "lru-ended", KVR_SESSION_CLOSED, 30.0), KVL_OK);
    kvr_lease le;   /* a lease far in the (wall-clock) future: another replica drives it */
    assert_int_equal(kvr_ledger_lease_acquire(l, "lru-leased", "rx", 4e9, 60.0, &le), KVL_OK);
    char ids[8][KVR_ID_MAX];
    int n = -1;
    assert_int_equal(kvr_ledger_lru_on_node(l, "n0", "", ids, 8, &n), KVL_OK);
    assert_int_equal(n, 2);
    assert_string_equal(ids[0], "lru-old");
    assert_string_equal(ids[1], "lru-new");
    assert_int_equal(kvr_ledger_lru_on_node(l, "n0", "lru-old", ids, 8, &n), KVL_OK);
    assert_int_equal(n, 1);
    assert_string_equal(ids[0], "lru-new");
    assert_int_equal(kvr_ledger_lru_on_node(l, "n0", "", ids, 1, &n), KVL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(kvr_ledger_lru_on_node(l, "nowhere", "", ids, 8, &n), KVL_OK);
    assert_int_equal(n, 0);
}

static void test_lease(void **state) {
    kvr_ledger *l = *state;
    assert_int_equal(kvr_ledger_session_create(l, "ls", "", 10.0), KVL_OK);
    kvr_lease a, b;
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "ra", 100.0, 5.0, &a), KVL_OK);
    assert_int_equal(a.took_over, 0);
    assert_int_equal(a.gen, 1);
    /* another replica is refused while the lease lives, with who and how long */
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "rb", 103.0, 5.0, &b), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "is busy"));
    assert_non_null(strstr(kvl_last_error(), "'ra'"));
    assert_non_null(strstr(kvl_last_error(), "2.0 s"));
    /* renewed: still refused past the first expiry */
    assert_int_equal(kvr_ledger_lease_renew(l, "ls", "ra", a.gen, 104.0, 5.0), KVL_OK);
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "rb", 106.0, 5.0, &b), KVL_ERR_MISMATCH);
    /* expired: taken over */
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "rb", 109.5, 5.0, &b), KVL_OK);
    assert_int_equal(b.took_over, 1);
    assert_string_equal(b.prev_owner, "ra");
    assert_int_equal(b.gen, 2);
    /* the old holder can neither renew nor commit: the fence */
    assert_int_equal(kvr_ledger_lease_renew(l, "ls", "ra", a.gen, 110.0, 5.0), KVL_ERR_MISMATCH);
    int32_t t[2] = {5, 6};
    fenced_commit(l, "ls", t, 0, 2, "ra", a.gen, NULL, KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "taken over by replica 'rb'"));
    fenced_commit(l, "ls", t, 0, 2, "rb", b.gen, NULL, KVL_OK);
    /* the same replica (a restart under the same name) reclaims its own lease at once */
    kvr_lease b2;
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "rb", 110.0, 5.0, &b2), KVL_OK);
    assert_int_equal(b2.took_over, 0);
    assert_int_equal(b2.gen, 3);
    /* released: free for anyone */
    assert_int_equal(kvr_ledger_lease_release(l, "ls", "rb", b.gen), KVL_OK);   /* stale gen: no-op */
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "ra", 111.0, 5.0, &a), KVL_ERR_MISMATCH);
    assert_int_equal(kvr_ledger_lease_release(l, "ls", "rb", b2.gen), KVL_OK);
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "ra", 111.0, 5.0, &a), KVL_OK);
    assert_int_equal(a.took_over, 0);
    /* unknown and ended sessions, bad arguments */
    assert_int_equal(kvr_ledger_lease_acquire(l, "nope", "ra", 111.0, 5.0, &a), KVL_ERR_NOT_FOUND);
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "", 111.0, 5.0, &a), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "ra", 111.0, 0.0, &a), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvr_ledger_session_end(l, "ls", KVR_SESSION_CLOSED, 112.0), KVL_OK);
    assert_int_equal(kvr_ledger_lease_acquire(l, "ls", "rb", 200.0, 5.0, &b), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "is closed"));
}

/* Two connections race for one expired lease, round after round: exactly one wins each. */
typedef struct racer {
    kvr_ledger *l;
    const char *owner;
    pthread_barrier_t *bar;
    int wins, rounds;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    for (int i = 0; i < r->rounds; i++) {
        pthread_barrier_wait(r->bar);
        kvr_lease le;
        /* every round is later than the last lease's expiry: each lease taken is expired */
        if (kvr_ledger_lease_acquire(r->l, "race", r->owner, 1000.0 + i * 10.0, 5.0, &le) == KVL_OK) r->wins++;
        pthread_barrier_wait(r->bar);
    }
    return NULL;
}

static void test_lease_race(void **state) {
    kvr_ledger *l = *state;
    assert_int_equal(kvr_ledger_session_create(l, "race", "", 10.0), KVL_OK);
    kvr_ledger *l2 = NULL;
    assert_int_equal(kvr_ledger_open(g_path, &l2), KVL_OK);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    const int rounds = 100;
    racer a = {.l = l, .owner = "ra", .bar = &bar, .rounds = rounds};
    racer b = {.l = l2, .owner = "rb", .bar = &bar, .rounds = rounds};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, race, &a);
    pthread_create(&tb, NULL, race, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&bar);
    kvr_ledger_free(l2);
    assert_int_equal(a.wins + b.wins, rounds);
    kvr_lease le;
    /* the generation counted every grant and nothing else */
    assert_int_equal(kvr_ledger_lease_acquire(l, "race", "rc", 1e6, 5.0, &le), KVL_OK);
    assert_int_equal(le.gen, rounds + 1);
}

static void test_request_id(void **state) {
    kvr_ledger *l = *state;
    assert_int_equal(kvr_ledger_session_create(l, "rq", "", 10.0), KVL_OK);
    kvr_lease le;
    assert_int_equal(kvr_ledger_lease_acquire(l, "rq", "ra", 100.0, 5.0, &le), KVL_OK);
    int32_t t[4] = {11, 12, 13, 14};
    fenced_commit(l, "rq", t, 0, 3, "ra", le.gen, "req-1", KVL_OK);
    /* the same request id again: refused by the ledger itself */
    fenced_commit(l, "rq", t + 3, 3, 1, "ra", le.gen, "req-1", KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "applied already"));
    fenced_commit(l, "rq", t + 3, 3, 1, "ra", le.gen, "req-2", KVL_OK);
    kvr_turn_found f;
    assert_int_equal(kvr_ledger_turn_find(l, "rq", "req-1", &f), KVL_OK);
    assert_int_equal(f.t0, 0);
    assert_int_equal(f.n_user, 3);
    assert_string_equal(f.finish, "length");
    assert_string_equal(f.node, "n0");
    assert_non_null(f.tokens);
    assert_int_equal(f.tokens[2], 13);
    kvr_turn_found_clear(&f);
    assert_int_equal(kvr_ledger_turn_find(l, "rq", "req-2", &f), KVL_OK);
    assert_int_equal(f.t0, 3);
    assert_int_equal(f.tokens[0], 14);
    kvr_turn_found_clear(&f);
    assert_int_equal(kvr_ledger_turn_find(l, "rq", "req-3", &f), KVL_ERR_NOT_FOUND);
    assert_int_equal(kvr_ledger_turn_find(l, "rq", "bad id!", &f), KVL_ERR_INVALID_ARG);
    kvr_session s;
    assert_int_equal(kvr_ledger_session_load(l, "rq", 1, &s), KVL_OK);
    assert_int_equal(s.n_tokens, 4);
    assert_int_equal(s.n_turns, 2);
    kvr_session_clear(&s);
    /* an ended session's turn is found, its tokens are gone */
    assert_int_equal(kvr_ledger_session_end(l, "rq", KVR_SESSION_CLOSED, 120.0), KVL_OK);
    assert_int_equal(kvr_ledger_turn_find(l, "rq", "req-1", &f), KVL_OK);
    assert_null(f.tokens);
    kvr_turn_found_clear(&f);
}

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The keeper renews a held lease past its first expiry; dropping it releases it. */
static void test_lease_keeper(void **state) {
    kvr_ledger *l = *state;
    assert_int_equal(kvr_ledger_session_create(l, "kp", "", wall()), KVL_OK);
    kvr_leases *k = NULL;
    assert_int_equal(kvr_leases_create(l, "ra", 0.3, 4, &k), KVL_OK);
    assert_int_equal(kvr_leases_add(k, "kp"), KVL_OK);
    assert_int_equal(kvr_leases_add(k, "kp"), KVL_ERR_MISMATCH);   /* this replica drives it already */
    kvr_lease le, other;
    assert_int_equal(kvr_ledger_lease_acquire(l, "kp", "ra", wall(), 0.3, &le), KVL_OK);
    kvr_leases_bind(k, "kp", le.gen);
    assert_int_equal(kvr_leases_held(k), 1);
    struct timespec d = {.tv_sec = 0, .tv_nsec = 900 * 1000 * 1000};
    nanosleep(&d, NULL);     /* three lease times */
    assert_int_equal(kvr_ledger_lease_acquire(l, "kp", "rb", wall(), 0.3, &other), KVL_ERR_MISMATCH);
    assert_int_equal(kvr_leases_drop(k, "kp"), 0);
    assert_int_equal(kvr_leases_held(k), 0);
    assert_int_equal(kvr_ledger_lease_acquire(l, "kp", "rb", wall(), 0.3, &other), KVL_OK);
    assert_int_equal(other.took_over, 0);   /* released, not expired */
    /* rb holds it now: ra's keeper finds the lease lost at its next renewal */
    assert_int_equal(kvr_leases_add(k, "kp"), KVL_OK);
    kvr_leases_bind(k, "kp", le.gen);
    nanosleep(&d, NULL);
    assert_int_equal(kvr_leases_drop(k, "kp"), 1);
    assert_true(kvr_leases_renew_failures(k) >= 1);
    kvr_leases_free(k);
}

int main(void) {
    const char *env = getenv("KVR_TEST_LEDGER");
    if (env && env[0]) {
        g_pg = kvr_ledger_is_postgres(env);
#ifndef KVR_HAVE_LIBPQ
        if (g_pg) {
            printf("router_test_ledger: skipped: built without libpq\n");
            return 77;
        }
#endif
        snprintf(g_path, sizeof g_path, "%s", env);
    } else {
        snprintf(g_path, sizeof g_path, "/tmp/kvr_ledger_test_%d.db", (int)getpid());
    }
    printf("ledger backend under test: %s\n", g_pg ? "postgresql" : "sqlite");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_and_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_end_expire_purge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lru_on_node, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persistence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenant_quota, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_v1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_race, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_keeper, setup, teardown),
        cmocka_unit_test(test_bad_path),
        cmocka_unit_test(test_shown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
