/* tests/router/test_ledger.c: the SQLite session ledger: create/load, turn commits with
 * off-by-one protection, holdings, end/expiry/purge, persistence across reopen. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ledger.h"

static char g_path[256];

static int setup(void **state) {
    snprintf(g_path, sizeof g_path, "/tmp/kvr_ledger_test_%d.db", (int)getpid());
    unlink(g_path);
    kvr_ledger *l = NULL;
    if (kvr_ledger_open(g_path, &l)) return -1;
    *state = l;
    return 0;
}

static int teardown(void **state) {
    kvr_ledger_free(*state);
    char p[300];
    unlink(g_path);
    snprintf(p, sizeof p, "%s-wal", g_path);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", g_path);
    unlink(p);
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
    assert_int_equal(kvr_ledger_open("/nonexistent-dir/x/ledger.db", &l), KVL_ERR_IO);
    assert_null(l);
    assert_non_null(strstr(kvl_last_error(), "/nonexistent-dir/x/ledger.db"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_and_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_end_expire_purge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persistence, setup, teardown),
        cmocka_unit_test(test_bad_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
