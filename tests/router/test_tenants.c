/* tests/router/test_tenants.c: the API key file parser (router/tenants.c), key lookup, and the
 * token bucket of tokens_per_minute (cmocka). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "tenants.h"

#define KEY_A "sk-acme-0123456789abcdef"
#define KEY_A2 "sk-acme-second-key-000000"
#define KEY_B "sk-beta-fedcba9876543210"

static kvr_tenants *parse_ok(const char *y) {
    kvr_tenants *t = NULL;
    kvl_status s = kvr_tenants_parse(y, strlen(y), "keys.yaml", &t);
    if (s) fprintf(stderr, "unexpected: %s\n", kvl_last_error());
    assert_int_equal(s, KVL_OK);
    return t;
}

/* The file must be refused with every pattern in the message. */
static void refused(const char *y, const char *p1, const char *p2) {
    kvr_tenants *t = NULL;
    assert_int_not_equal(kvr_tenants_parse(y, strlen(y), "keys.yaml", &t), KVL_OK);
    assert_null(t);
    const char *m = kvl_last_error();
    if (!strstr(m, p1) || (p2 && !strstr(m, p2))) fail_msg("message '%s' lacks '%s' / '%s'", m, p1, p2 ? p2 : "");
}

static void test_parse_and_lookup(void **state) {
    (void)state;
    char hexb[65];
    kvr_sha256_hex(KEY_B, strlen(KEY_B), hexb);
    /* sha256("abc"), the FIPS 180-2 example */
    char abc[65];
    kvr_sha256_hex("abc", 3, abc);
    assert_string_equal(abc, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    char y[1024];
    snprintf(y, sizeof y,
             "tenants:\n"
             "  - name: acme\n"
             "    keys: [\"" KEY_A "\", \"" KEY_A2 "\"]\n"
             "    max_sessions: 4\n"
             "    tokens_per_minute: 600\n"
             "  - name: beta\n"
             "    key_sha256: %s\n"
             "    admin: true\n", hexb);
    kvr_tenants *t = parse_ok(y);
    assert_int_equal(kvr_tenants_count(t), 2);
    assert_int_equal(kvr_tenants_key_count(t), 3);
    assert_false(kvr_tenants_open(t));
    kvr_tenant_info i;
    assert_true(kvr_tenants_lookup(t, KEY_A2, strlen(KEY_A2), &i));
    assert_string_equal(i.name, "acme");
    assert_int_equal(i.max_sessions, 4);
    assert_int_equal(i.tokens_per_minute, 600);
    assert_false(i.admin);
    assert_int_equal(kvr_tenants_authorize(t, "Bearer " KEY_B, &i), 1);   /* by its digest */
    assert_string_equal(i.name, "beta");
    assert_true(i.admin);
    assert_int_equal(i.max_sessions, 0);
    assert_int_equal(kvr_tenants_authorize(t, "bearer   " KEY_A "  ", &i), 1);
    assert_string_equal(i.name, "acme");
    /* a prefix, a longer key, another key, raw digest: unknown */
    assert_int_equal(kvr_tenants_authorize(t, "Bearer sk-acme-0123456789abcde", &i), 0);
    assert_int_equal(kvr_tenants_authorize(t, "Bearer " KEY_A "x", &i), 0);
    assert_int_equal(kvr_tenants_authorize(t, "Bearer sk-nobody-000000000000", &i), 0);
    char bearer[80];
    snprintf(bearer, sizeof bearer, "Bearer %s", hexb);
    assert_int_equal(kvr_tenants_authorize(t, bearer, &i), 0);
    /* not a bearer value at all */
    assert_int_equal(kvr_tenants_authorize(t, NULL, &i), -1);
    assert_int_equal(kvr_tenants_authorize(t, "", &i), -1);
    assert_int_equal(kvr_tenants_authorize(t, KEY_A, &i), -1);
    assert_int_equal(kvr_tenants_authorize(t, "Basic " KEY_A, &i), -1);
    assert_int_equal(kvr_tenants_authorize(t, "Bearer   ", &i), -1);
    kvr_tenants_free(t);
}

static void test_refusals(void **state) {
    (void)state;
    refused("", "keys.yaml", "empty");
    refused("- a\n", "keys.yaml:1", "mapping");
    refused("tenant: []\n", "keys.yaml:1", "unknown key 'tenant'");
    refused("tenants: {}\n", "key 'tenants'", "list");
    refused("tenants: []\n", "key 'tenants'", "at least one");
    refused("tenants:\n  - keys: [\"" KEY_A "\"]\n", "keys.yaml:2", "tenants[0].name' is required");
    refused("tenants:\n  - name: \"a b\"\n    keys: [\"" KEY_A "\"]\n", "keys.yaml:2", "tenants[0].name");
    refused("tenants:\n  - name: acme\n", "tenants[0]", "has no keys");
    /* a misspelt `keys:` is named as such, not as a tenant without keys */
    refused("tenants:\n  - name: acme\n    kyes: [\"" KEY_A "\"]\n", "keys.yaml:3", "unknown key 'tenants[0].kyes'");
    refused("tenants:\n  - name: acme\n    keys: [short]\n", "keys.yaml:3", "tenants[0].keys' [0]: 5 characters");
    refused("tenants:\n  - name: acme\n    keys: [\"" KEY_A "\", \"sk has a space 00\"]\n", "tenants[0].keys' [1]",
            "printable");
    refused("tenants:\n  - name: acme\n    key_sha256: abc\n", "tenants[0].key_sha256' [0]", "64 hex");
    refused("tenants:\n  - name: acme\n    key_sha256: "
            "zz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n",
            "tenants[0].key_sha256' [0]", "not hex");
    refused("tenants:\n  - name: acme\n    keys: [\"" KEY_A "\"]\n    max_sessions: -1\n",
            "keys.yaml:4", "tenants[0].max_sessions");
    refused("tenants:\n  - name: acme\n    keys: [\"" KEY_A "\"]\n    tokens_per_minute: lots\n",
            "keys.yaml:4", "tenants[0].tokens_per_minute");
    refused("tenants:\n  - name: acme\n    keys: [\"" KEY_A "\"]\n    admin: maybe\n", "tenants[0].admin", NULL);
    refused("tenants:\n  - name: acme\n    keys: [\"" KEY_A "\"]\n    quota: 3\n", "keys.yaml:4",
            "unknown key 'tenants[0].quota'");
    refused("tenants:\n  - name: acme\n    keys: [\"" KEY_A "\"]\n  - name: acme\n    keys: [\"" KEY_B "\"]\n",
            "tenants[1].name", "named twice");
    /* one key for two tenants would make the owner ambiguous */
    refused("tenants:\n  - name: acme\n    keys: [\"" KEY_A "\"]\n  - name: beta\n    keys: [\"" KEY_A "\"]\n",
            "tenants[1].keys' [0]", "given twice (also for tenant 'acme')");
    /* a raw key and its own digest are the same key */
    char y[512], h[65];
    kvr_sha256_hex(KEY_A, strlen(KEY_A), h);
    snprintf(y, sizeof y, "tenants:\n  - name: acme\n    keys: [\"" KEY_A "\"]\n    key_sha256: [%s]\n", h);
    refused(y, "tenants[0].key_sha256' [0]", "given twice");
    refused("tenants:\n  - name: acme\n    keys: [\"" KEY_A "\"\n", "keys.yaml", "YAML");
    /* the tenant of anonymous clients and of sessions from before tenants */
    refused("tenants:\n  - name: default\n    keys: [\"" KEY_A "\"]\n", "'tenants[0].name'", "reserved");
}

static void test_bounds(void **state) {
    (void)state;
    /* KVR_TENANTS_MAX + 1 tenants: refused, naming the limit */
    size_t cap = 64 * (KVR_TENANTS_MAX + 2);
    char *y = malloc(cap);
    assert_non_null(y);
    size_t o = (size_t)snprintf(y, cap, "tenants:\n");
    for (int i = 0; i <= KVR_TENANTS_MAX; i++)
        o += (size_t)snprintf(y + o, cap - o, "  - {name: t%d, keys: [sk-tenant-key-%06d]}\n", i, i);
    kvr_tenants *t = NULL;
    assert_int_equal(kvr_tenants_parse(y, o, "keys.yaml", &t), KVL_ERR_FORMAT);
    assert_non_null(strstr(kvl_last_error(), "at most 256"));
    free(y);
}

static void test_bucket(void **state) {
    (void)state;
    kvr_bucket b;
    kvr_bucket_init(&b, 60, 100.0);       /* 60 per minute: 1 token a second */
    assert_true(kvr_bucket_admit(&b, 100.0));
    kvr_bucket_charge(&b, 59.5, 100.0);
    assert_false(kvr_bucket_admit(&b, 100.0));    /* 0.5 left: empty */
    assert_true(kvr_bucket_wait(&b, 100.0) > 0.49 && kvr_bucket_wait(&b, 100.0) < 0.51);
    assert_true(kvr_bucket_admit(&b, 100.6));     /* refilled 0.6 */
    /* a turn larger than what is left: debt, paid back by the refill */
    kvr_bucket_charge(&b, 30, 100.6);
    assert_false(kvr_bucket_admit(&b, 110.0));
    assert_true(kvr_bucket_wait(&b, 110.0) > 19.0 && kvr_bucket_wait(&b, 110.0) < 21.0);
    assert_true(kvr_bucket_admit(&b, 131.0));
    /* never above its capacity, however long idle */
    assert_true(kvr_bucket_admit(&b, 1e6));
    assert_true(b.level <= 60.0);
    /* debt is kept: a reservation beyond the bucket keeps the tenant out until it is paid back */
    kvr_bucket_charge(&b, 600, 1e6);
    assert_false(kvr_bucket_admit(&b, 1e6));
    assert_true(kvr_bucket_wait(&b, 1e6) > 540.0 && kvr_bucket_wait(&b, 1e6) < 542.0);
    /* a refund (the unused part of a reservation) comes back, never above the capacity */
    kvr_bucket_charge(&b, -580, 1e6);
    assert_true(kvr_bucket_admit(&b, 1e6));
    kvr_bucket_charge(&b, -1e9, 1e6);
    assert_true(b.level <= 60.0);
    /* a clock going back neither refills nor breaks it */
    kvr_bucket_init(&b, 60, 50.0);
    kvr_bucket_charge(&b, 60, 50.0);
    assert_false(kvr_bucket_admit(&b, 40.0));
    assert_false(kvr_bucket_admit(&b, 50.5));
    assert_true(kvr_bucket_admit(&b, 51.1));
}

/* The table's quotas, and a reload that keeps a staying tenant's bucket. */
static void test_quota_and_replace(void **state) {
    (void)state;
    kvr_tenants *t = parse_ok("tenants:\n"
                              "  - {name: acme, keys: [\"" KEY_A "\"], tokens_per_minute: 120}\n"
                              "  - {name: beta, keys: [\"" KEY_B "\"]}\n");
    double w = 0;
    assert_true(kvr_tenants_admit(t, "acme", 200, 10.0, &w));   /* admitted, 200 reserved */
    assert_false(kvr_tenants_admit(t, "acme", 5, 10.0, &w));
    assert_true(w > 40.0 && w < 42.0);             /* (1 + 80) tokens at 2 a second */
    kvr_tenants_charge(t, "beta", 1000000, 10.0);  /* no limit: nothing */
    assert_true(kvr_tenants_admit(t, "beta", 1000000, 10.0, &w));
    assert_true(kvr_tenants_admit(t, "nobody", 5, 10.0, &w));
    /* reload: acme stays (its debt too), KEY_B is revoked, gamma is new */
    kvr_tenants *fresh = parse_ok("tenants:\n"
                                  "  - {name: acme, keys: [\"" KEY_A "\"], tokens_per_minute: 120}\n"
                                  "  - {name: gamma, keys: [\"" KEY_A2 "\"], max_sessions: 1}\n");
    kvr_tenants_replace(t, fresh);
    kvr_tenant_info i;
    assert_false(kvr_tenants_lookup(t, KEY_B, strlen(KEY_B), &i));
    assert_true(kvr_tenants_lookup(t, KEY_A2, strlen(KEY_A2), &i));
    assert_string_equal(i.name, "gamma");
    assert_int_equal(i.max_sessions, 1);
    assert_false(kvr_tenants_admit(t, "acme", 0, 11.0, &w));
    assert_true(kvr_tenants_admit(t, "acme", 0, 60.0, &w));
    kvr_tenants_free(t);
    /* the anonymous table: everyone is "default", an admin without quotas */
    assert_int_equal(kvr_tenants_anonymous(&t), KVL_OK);
    assert_true(kvr_tenants_open(t));
    char name[KVR_TENANT_NAME_MAX];
    kvr_tenants_name(t, 0, name, sizeof name);
    assert_string_equal(name, KVR_DEFAULT_TENANT);
    assert_false(kvr_tenants_lookup(t, KEY_A, strlen(KEY_A), &i));
    kvr_tenants_free(t);
}

/* max_concurrent_turns: counted per tenant, kept over a reload, freed by the end of a turn. */
static void test_concurrent_turns(void **state) {
    (void)state;
    kvr_tenants *t = parse_ok("tenants:\n"
                              "  - {name: acme, keys: [\"" KEY_A "\"], max_concurrent_turns: 2}\n"
                              "  - {name: beta, keys: [\"" KEY_B "\"]}\n");
    long running = -1;
    assert_true(kvr_tenants_turn_begin(t, "acme", &running));
    assert_int_equal(running, 0);
    assert_true(kvr_tenants_turn_begin(t, "acme", &running));
    assert_false(kvr_tenants_turn_begin(t, "acme", &running));
    assert_int_equal(running, 2);
    for (int i = 0; i < 100; i++) assert_true(kvr_tenants_turn_begin(t, "beta", NULL));   /* no limit */
    /* a reload keeps the two running turns: a lower limit refuses until they end */
    kvr_tenants *fresh = parse_ok("tenants:\n  - {name: acme, keys: [\"" KEY_A "\"], max_concurrent_turns: 1}\n");
    kvr_tenants_replace(t, fresh);
    assert_false(kvr_tenants_turn_begin(t, "acme", &running));
    assert_int_equal(running, 2);
    kvr_tenants_turn_end(t, "acme");
    assert_false(kvr_tenants_turn_begin(t, "acme", NULL));
    kvr_tenants_turn_end(t, "acme");
    assert_true(kvr_tenants_turn_begin(t, "acme", NULL));
    kvr_tenants_turn_end(t, "acme");
    kvr_tenants_turn_end(t, "acme");   /* one end too many: the count stays at 0 */
    kvr_tenants_turn_end(t, "beta");   /* a tenant the reload removed */
    assert_true(kvr_tenants_turn_begin(t, "acme", &running));
    assert_int_equal(running, 0);
    kvr_tenants_free(t);
}

/* A burst of one tenant's turns at once: each admitted turn reserves its most in the same step
 * as the check, so a full bucket of 1,000 admits two turns of 500 (the second runs it to 0),
 * not all of them (before, every turn could pass the check before any had reserved). */
typedef struct burst {
    kvr_tenants *t;
    pthread_barrier_t *go;
    int admitted;
} burst;

static void *burst_turn(void *arg) {
    burst *b = arg;
    pthread_barrier_wait(b->go);
    b->admitted = kvr_tenants_admit(b->t, "acme", 500, 100.0, NULL);
    return NULL;
}

static void test_quota_burst(void **state) {
    (void)state;
    enum { N = 32 };
    for (int round = 0; round < 20; round++) {
        kvr_tenants *t = parse_ok("tenants:\n  - {name: acme, keys: [\"" KEY_A "\"], tokens_per_minute: 1000}\n");
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, N);
        burst b[N];
        pthread_t th[N];
        for (int i = 0; i < N; i++) {
            b[i] = (burst){t, &go, 0};
            assert_int_equal(pthread_create(&th[i], NULL, burst_turn, &b[i]), 0);
        }
        int admitted = 0;
        for (int i = 0; i < N; i++) {
            pthread_join(th[i], NULL);
            admitted += b[i].admitted;
        }
        pthread_barrier_destroy(&go);
        assert_int_equal(admitted, 2);   /* one clock: no refill between them */
        kvr_tenants_free(t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_lookup), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_bounds),           cmocka_unit_test(test_bucket),
        cmocka_unit_test(test_quota_and_replace), cmocka_unit_test(test_quota_burst),
        cmocka_unit_test(test_concurrent_turns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
