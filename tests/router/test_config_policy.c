/* tests/router/test_config_policy.c: fleet.yaml parsing (errors name file:line and key) and the
 * four routing policies on synthetic node views. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "policy.h"
#include "registry.h"
#include "rpc.h"

static const char *k_base =
    "listen: 127.0.0.1:7000\n"
    "tokenizer: tok.json\n"
    "nodes:\n"
    "  - {name: a0, address: 127.0.0.1:7100, model: small}\n"
    "  - {name: a1, address: 127.0.0.1:7101, model: small}\n"
    "  - {name: b0, address: 127.0.0.1:7200, model: large}\n";

static kvl_status parse(const char *extra, kvr_config **c) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s%s", k_base, extra);
    return kvr_config_parse(buf, strlen(buf), "/etc/fleet.yaml", c);
}

/* What the router does with a file: parse it, then let the policy check its section. */
static kvl_status load(const char *extra, kvr_config **c) {
    kvl_status s = parse(extra, c);
    if (!s && (s = kvr_policy_check(*c))) {
        kvr_config_free(*c);
        *c = NULL;
    }
    return s;
}

static void expect_err(const char *extra, const char *w1, const char *w2) {
    kvr_config *c = NULL;
    assert_int_not_equal(load(extra, &c), KVL_OK);
    assert_null(c);
    const char *e = kvl_last_error();
    if (!strstr(e, w1) || (w2 && !strstr(e, w2))) fail_msg("error '%s' lacks '%s' / '%s'", e, w1, w2 ? w2 : "");
}

static void test_config_ok(void **state) {
    (void)state;
    kvr_config *c = NULL;
    assert_int_equal(parse("policy:\n  name: cascade\n  models: [small, large]\n  calm_turns: 3\n"
                           "guardrail: {shadow_fraction: 0.25, kl_budget: 0.5}\n"
                           "transfer: {retries: 2}\nsession_ttl_seconds: 60\n", &c), KVL_OK);
    assert_string_equal(c->listen, "127.0.0.1:7000");
    assert_string_equal(c->tokenizer, "/etc/tok.json");      /* relative to the file */
    assert_string_equal(c->ledger, "/etc/router.db");
    assert_int_equal(c->n_nodes, 3);
    assert_string_equal(c->nodes[2].model, "large");
    assert_string_equal(c->policy_name, "cascade");
    assert_true(c->shadow_fraction == 0.25);
    assert_int_equal(c->transfer_retries, 2);
    assert_true(c->session_ttl_s == 60);
    kvr_config_free(c);
}

static void test_config_errors(void **state) {
    (void)state;
    expect_err("policy:\n  name: fastest\n", "fleet.yaml:8", "unknown policy 'fastest'");
    expect_err("policy:\n  name: cascade\n  models: [small, large]\n  entropy_treshold: 2\n",
               "fleet.yaml:10", "policy.entropy_treshold");
    expect_err("policy:\n  name: cascade\n  models: [small, huge]\n", "fleet.yaml:9", "'huge'");
    expect_err("policy:\n  name: cascade\n", "policy.models", "required");
    /* a request that names no max_tokens must not get more than any request may ask for */
    expect_err("policy:\n  name: pinned\n  default_model: small\nmax_new_tokens: 10\ndefault_max_tokens: 1000\n",
               "fleet.yaml:11: key 'default_max_tokens'", "1000 exceeds max_new_tokens (10)");
    /* without default_max_tokens, a smaller max_new_tokens is the default (a file that set only
     * max_new_tokens: 10 loaded before, and still does) */
    kvr_config *c10 = NULL;
    assert_int_equal(load("policy:\n  name: pinned\n  default_model: small\nmax_new_tokens: 10\n", &c10), KVL_OK);
    assert_int_equal(c10->default_max_tokens, 10);
    kvr_config_free(c10);
    expect_err("policy:\n  name: pinned\nguardrail: {shadow_fraction: 2}\n", "fleet.yaml:9",
               "guardrail.shadow_fraction");
    expect_err("policy:\n  name: pinned\nlisten_typo: 1\n", "fleet.yaml:9", "listen_typo");
    expect_err("policy:\n  name: pinned\ntransfer: {retries: many}\n", "transfer.retries",
               "integer");
    expect_err("nodes2: 1\n", "nodes2", NULL);
    expect_err("policy: [1, 2\n", "YAML error", NULL);
    /* parsing alone does not know policies: the name is the policy's to check */
    kvr_config *c = NULL;
    assert_int_equal(parse("policy:\n  name: fastest\n", &c), KVL_OK);
    assert_string_equal(c->policy_name, "fastest");
    kvr_config_free(c);
    c = NULL;
    const char *no_nodes = "listen: 127.0.0.1:1\ntokenizer: t\npolicy: {name: pinned}\n";
    assert_int_not_equal(kvr_config_parse(no_nodes, strlen(no_nodes), "f.yaml", &c), KVL_OK);
    assert_non_null(strstr(kvl_last_error(), "'nodes' is required"));
    const char *dup = "listen: 127.0.0.1:1\ntokenizer: t\nnodes:\n  - {name: a, address: h:1, model: m}\n"
                      "  - {name: a, address: h:2, model: m}\npolicy: {name: pinned}\n";
    assert_int_not_equal(kvr_config_parse(dup, strlen(dup), "f.yaml", &c), KVL_OK);
    assert_non_null(strstr(kvl_last_error(), "f.yaml:5"));
    const char *addr = "listen: nowhere\ntokenizer: t\nnodes: []\npolicy: {name: pinned}\n";
    assert_int_not_equal(kvr_config_parse(addr, strlen(addr), "f.yaml", &c), KVL_OK);
    assert_non_null(strstr(kvl_last_error(), "f.yaml:1"));
}

/* ---- policies ------------------------------------------------------------------------------ */

static kvr_node_view g_views[3];

static kvr_policy *make_policy(const char *yaml) {
    kvr_config *c = NULL;
    if (parse(yaml, &c)) fail_msg("config: %s", kvl_last_error());
    kvr_policy *p = NULL;
    assert_int_equal(kvr_policy_create(c, &p), KVL_OK);
    kvr_config_free(c);
    return p;
}

static kvr_policy_input input(int current, int ctx) {
    static const char *names[] = {"a0", "a1", "b0"}, *models[] = {"small", "small", "large"};
    for (int i = 0; i < 3; i++) {
        g_views[i] = (kvr_node_view){.name = names[i], .model = models[i], .healthy = 1,
                                     .prefill_tps = 5000, .decode_tps = 400, .translate_tps = 1e5};
    }
    return (kvr_policy_input){.nodes = g_views, .n_nodes = 3, .current = current, .n_context = ctx,
                              .n_user = 8, .max_tokens = 16, .requested_model = "",
                              .session_model = ""};
}

static void test_pinned(void **state) {
    (void)state;
    kvr_policy *p = make_policy("policy: {name: pinned, default_model: large}\n");
    kvr_policy_input in = input(-1, 0);
    kvr_policy_decision d;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 2);
    in.requested_model = "small";
    g_views[1].held = 100;   /* the node holding the session wins among equals */
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 1);
    in.requested_model = "medium";
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_ERR_NOT_FOUND);
    in.requested_model = "large";
    g_views[2].healthy = 0;   /* no healthy node of the model: another model takes the session */
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.failover, 1);
    assert_string_equal(d.wanted, "large");
    assert_string_equal(g_views[d.node].model, "small");
    assert_non_null(strstr(d.reason, "failover"));
    assert_non_null(strstr(d.reason, "large"));
    for (int i = 0; i < 3; i++) g_views[i].healthy = 0;   /* nobody left: fail */
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_ERR_IO);
    assert_non_null(strstr(kvl_last_error(), "no other node is healthy"));
    kvr_policy_free(p);
}

/* Model failover in every policy: the chosen model ("large") has no healthy node. */
static void test_failover(void **state) {
    (void)state;
    static const char *const yaml[] = {
        "policy: {name: pinned, default_model: large}\n",
        "policy: {name: least_loaded, default_model: large}\n",
        "policy: {name: cascade, models: [large, small]}\n",
        "policy: {name: cost, models: [large]}\n"};
    for (int k = 0; k < 4; k++) {
        kvr_policy *p = make_policy(yaml[k]);
        kvr_policy_decision d;
        /* a new session: any healthy node of another model, the least loaded */
        kvr_policy_input in = input(-1, 0);
        g_views[2].healthy = 0;
        g_views[0].load = 2;
        assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
        assert_int_equal(d.failover, 1);
        assert_int_equal(d.node, 1);
        /* the session was on large (down) and a0 holds part of it: a0 re-prefills the least */
        in = input(2, 100);
        g_views[2].healthy = 0;
        g_views[0].held = 60;
        g_views[0].load = 2;
        g_views[0].can_translate = g_views[1].can_translate = 1;   /* but the source is down */
        assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
        assert_int_equal(d.node, 0);
        assert_non_null(strstr(d.reason, "by re-prefill"));
        kvr_policy_free(p);
    }
    /* translation beats re-prefill; holding the whole context beats both */
    kvr_policy *p = make_policy("policy: {name: pinned, default_model: large}\n");
    kvr_policy_decision d;
    kvr_policy_input in = input(0, 100);
    g_views[2].healthy = 0;
    g_views[0].held = 40;   /* current, partial */
    g_views[1].can_translate = 1;
    in.requested_model = "large";
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 1);
    assert_non_null(strstr(d.reason, "by translation"));
    g_views[0].held = 100;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 0);
    assert_non_null(strstr(d.reason, "holds the context"));
    kvr_policy_free(p);
}

static void test_least_loaded(void **state) {
    (void)state;
    kvr_policy *p = make_policy("policy: {name: least_loaded, default_model: small, rebalance_margin: 2}\n");
    kvr_policy_input in = input(-1, 0);
    kvr_policy_decision d;
    g_views[0].load = 3;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 1);                /* new session: least loaded */
    in = input(0, 50);
    g_views[0].held = 50;
    g_views[0].load = 2;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 0);                /* stays: within the margin */
    g_views[0].load = 5;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 1);                /* moves: much busier */
    kvr_policy_free(p);
}

static void test_cascade(void **state) {
    (void)state;
    kvr_policy *p = make_policy("policy: {name: cascade, models: [small, large], entropy_threshold: 3, calm_turns: 2}\n");
    assert_int_equal(kvr_policy_needs_entropy(p), 1);
    kvr_policy_input in = input(-1, 0);
    kvr_policy_decision d;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_string_equal(g_views[d.node].model, "small");
    /* an unsure turn on the small model: the next goes up */
    kvr_turn_outcome o = {.node = d.node, .mean_entropy = 4.0, .entropy_valid = 1};
    kvr_policy_state st = d.state;
    kvr_policy_observe(p, &in, &o, &st);
    assert_int_equal(st.level, 1);
    in = input(d.node, 20);
    in.state = st;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_string_equal(g_views[d.node].model, "large");
    /* two calm turns on the large model: step down */
    st = d.state;
    o = (kvr_turn_outcome){.node = 2, .mean_entropy = 1.0, .entropy_valid = 1};
    kvr_policy_observe(p, &in, &o, &st);
    assert_int_equal(st.level, 1);
    assert_int_equal(st.calm, 1);
    kvr_policy_observe(p, &in, &o, &st);
    assert_int_equal(st.level, 0);
    /* the escalate flag answers this turn one rung up */
    in = input(0, 40);
    in.state = st;
    in.escalate = 1;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_string_equal(g_views[d.node].model, "large");
    assert_int_equal(d.state.level, 1);
    /* at the top rung, escalate stays there */
    in.state = d.state;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.state.level, 1);
    kvr_policy_free(p);
}

/* push-ahead: the policy key (every policy, default on), the router-wide keys, the cascade's
 * prediction (the rung observe() left, whatever the model that answered) */
static void test_push_ahead(void **state) {
    (void)state;
    kvr_config *c = NULL;
    assert_int_equal(load("policy: {name: pinned}\n", &c), KVL_OK);
    assert_int_equal(c->push_ahead_queue, 64);
    assert_int_equal(c->push_ahead_workers, 1);
    assert_int_equal(c->push_ahead_max_tokens, 32768);
    kvr_config_free(c);
    assert_int_equal(load("push_ahead_queue: 0\npush_ahead_workers: 2\npolicy: {name: pinned, push_ahead: false}\n",
                          &c), KVL_OK);
    assert_int_equal(c->push_ahead_queue, 0);
    assert_int_equal(c->push_ahead_workers, 2);
    kvr_config_free(c);
    expect_err("push_ahead_queue: 5000\npolicy: {name: pinned}\n", "fleet.yaml:", "push_ahead_queue");
    expect_err("push_ahead_workers: 0\npolicy: {name: pinned}\n", "fleet.yaml:", "push_ahead_workers");
    expect_err("policy: {name: cascade, models: [small, large], push_ahead: maybe}\n", "fleet.yaml:",
               "push_ahead");
    kvr_policy *p = make_policy("policy: {name: pinned}\n");
    kvr_policy_input in = input(0, 20);
    kvr_policy_state st = {0, 0};
    char m[64] = "x";
    assert_int_equal(kvr_policy_push_ahead(p), 1);
    assert_int_equal(kvr_policy_predict(p, &in, &st, m, sizeof m), 0);   /* pinned: no opinion */
    kvr_policy_free(p);
    p = make_policy("policy: {name: cascade, models: [small, large], entropy_threshold: 3}\n");
    kvr_turn_outcome o = {.node = 0, .mean_entropy = 4.0, .entropy_valid = 1};
    kvr_policy_observe(p, &in, &o, &st);
    assert_int_equal(kvr_policy_predict(p, &in, &st, m, sizeof m), 1);
    assert_string_equal(m, "large");
    kvr_policy_free(p);
    p = make_policy("policy: {name: cascade, models: [small, large], push_ahead: false}\n");
    assert_int_equal(kvr_policy_push_ahead(p), 0);
    assert_int_equal(kvr_policy_predict(p, &in, &st, m, sizeof m), 0);
    kvr_policy_free(p);
}

/* What a node's answers yield as rates is bounded: NaN, infinities, 0, negatives and values
 * far outside a model's rates leave the averages as they were. */
static void test_rates_bounded(void **state) {
    (void)state;
    kvr_config *c = NULL;
    assert_int_equal(parse("policy:\n  name: pinned\n", &c), KVL_OK);
    const kvl__rpc_tls tls = {.insecure = 1};
    kvr_registry *reg = NULL;
    if (kvr_registry_create(c, &tls, &reg) != KVL_OK) fail_msg("registry: %s", kvl_last_error());
    kvr_registry_observe(reg, 0, 2000, 100, 50000);
    const double bad[] = {NAN, INFINITY, -INFINITY, 0, -5, 1e-300, 1e-3, 1e12, 1e300};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) kvr_registry_observe(reg, 0, bad[i], bad[i], bad[i]);
    kvr_node n;
    kvr_registry_copy(reg, 0, &n);
    assert_true(n.prefill_tps == 2000 && n.decode_tps == 100 && n.translate_tps == 50000);
    assert_int_equal(n.n_prefill_samples, 1);
    assert_int_equal(n.n_decode_samples, 1);
    kvr_registry_observe(reg, 0, 0.02, 0.02, 0.02);   /* slow, but a rate */
    kvr_registry_copy(reg, 0, &n);
    assert_int_equal(n.n_decode_samples, 2);
    kvr_registry_free(reg);
    kvr_config_free(c);
}

void kvr__reason_copy(char *dst, size_t cap, const char *src);   /* router/turn.c */

/* A fallback reason too long for the summary is cut after a whole word, marked with "...". */
static void test_reason_copy(void **state) {
    (void)state;
    char b[32];
    kvr__reason_copy(b, sizeof b, "export_failed: short");
    assert_string_equal(b, "export_failed: short");
    kvr__reason_copy(b, sizeof b, "export_failed: failed to connect: Connection refused");
    assert_string_equal(b, "export_failed: failed to...");
    assert_true(strlen(b) < sizeof b);
    kvr__reason_copy(b, sizeof b, "x_0123456789012345678901234567890123456789");   /* no space: cut */
    assert_int_equal(strlen(b), sizeof b - 1);
    assert_string_equal(b + sizeof b - 4, "...");
}

static void test_cost(void **state) {
    (void)state;
    kvr_policy *p = make_policy("policy: {name: cost}\n");
    kvr_policy_input in = input(0, 2000);
    kvr_policy_decision d;
    g_views[0].held = 2000;
    /* the holder has everything: cheapest */
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 0);
    /* the client asks for large: translation is cheaper than a 2000-token prefill, and both
     * beat nothing; with the translator the expected TTFT is small */
    in.requested_model = "large";
    g_views[2].can_translate = 1;
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 2);
    assert_non_null(strstr(d.reason, "expected TTFT"));
    /* among two small nodes the one holding the context wins even when busier */
    in = input(1, 2000);
    g_views[1].held = 2000;
    g_views[1].load = 5;
    in.requested_model = "small";
    assert_int_equal(kvr_policy_choose(p, &in, &d), KVL_OK);
    assert_int_equal(d.node, 1);
    kvr_policy_free(p);
}

/* What a client reads of a node error: members' addresses by name, other addresses masked,
 * digits that are not an address left alone, the output bounded. */
static void test_redact(void **state) {
    (void)state;
    kvr_registry reg;
    memset(&reg, 0, sizeof reg);
    reg.n = 2;
    snprintf(reg.nodes[0].name, sizeof reg.nodes[0].name, "a0");
    snprintf(reg.nodes[0].address, sizeof reg.nodes[0].address, "127.0.0.1:7100");
    snprintf(reg.nodes[1].name, sizeof reg.nodes[1].name, "b0");
    snprintf(reg.nodes[1].address, sizeof reg.nodes[1].address, "kvld-b.fleet.svc:7101");
    char out[256];
    kvr_registry_redact(&reg, "node b0: source_unavailable: 127.0.0.1:7100: connect to ipv4:10.2.3.4:7100 "
                        "and [fe80::1%eth0]:7101 failed; pull source 'kvld-b.fleet.svc:7101'", out, sizeof out);
    assert_string_equal(out, "node b0: source_unavailable: a0: connect to ipv4:<address> and <address> failed; "
                             "pull source 'b0'");
    kvr_registry_redact(&reg, "span [0, 2048) of 1.5 MB, v10.1.2.3, 3.14 s, 1.2.3, top_k 3000000000", out, sizeof out);
    assert_string_equal(out, "span [0, 2048) of 1.5 MB, v10.1.2.3, 3.14 s, 1.2.3, top_k 3000000000");
    kvr_registry_redact(&reg, "ipv6:%5Bfd00::5%5D:7100 closed; span [2048] and [ab] kept", out, sizeof out);
    assert_string_equal(out, "ipv6:<address> closed; span [2048] and [ab] kept");
    kvr_registry_redact(&reg, "session '0123456789ab/conv-1' is busy; 0123456789abc/x", out, sizeof out);
    assert_string_equal(out, "session 'conv-1' is busy; 0123456789abc/x");
    kvr_registry_redact(&reg, "at 192.168.0.1", out, 8);
    assert_string_equal(out, "at <add");
    kvr_registry_redact(NULL, "10.0.0.1:80", out, sizeof out);
    assert_string_equal(out, "<address>");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_ok),       cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_pinned),          cmocka_unit_test(test_least_loaded),
        cmocka_unit_test(test_cascade),         cmocka_unit_test(test_cost),
        cmocka_unit_test(test_failover),        cmocka_unit_test(test_push_ahead),
        cmocka_unit_test(test_rates_bounded),   cmocka_unit_test(test_reason_copy),
        cmocka_unit_test(test_redact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
