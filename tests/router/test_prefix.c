/* tests/router/test_prefix.c: the prefix index (stateless requests -> sessions) and the OpenAI
 * request parser: longest match first, newest holder wins, the LRU bound holds, partial blocks
 * are never matched; request validation errors name the parameter and the right status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "openai.h"
#include "prefix.h"

#define B KVR_PREFIX_BLOCK

static void fill(int32_t *t, int n, int seed) {
    for (int i = 0; i < n; i++) t[i] = seed * 1000 + i;
}

static void test_longest_first(void **state) {
    (void)state;
    kvr_prefix *p = NULL;
    assert_int_equal(kvr_prefix_create(1024, &p), KVL_OK);
    int32_t a[8 * B], q[8 * B];
    fill(a, 8 * B, 1);
    kvr_prefix_insert(p, "s-short", a, 2 * B);
    kvr_prefix_insert(p, "s-long", a, 5 * B + 3);   /* the partial block is not indexed */
    assert_int_equal(kvr_prefix_size(p), 5);
    memcpy(q, a, sizeof q);
    char ids[4][KVR_ID_MAX];
    int lens[4];
    int n = kvr_prefix_lookup(p, q, 8 * B, ids, lens, 4);
    assert_int_equal(n, 1);   /* s-long took over the first two blocks: newest holder wins */
    assert_string_equal(ids[0], "s-long");
    assert_int_equal(lens[0], 5 * B);
    /* a prompt that diverges inside block 3 matches blocks 0..2 only */
    q[3 * B + 1] = -7;
    n = kvr_prefix_lookup(p, q, 8 * B, ids, lens, 4);
    assert_int_equal(n, 1);
    assert_int_equal(lens[0], 3 * B);
    /* a different first token: nothing (the hashes chain) */
    q[0] = 424242;
    assert_int_equal(kvr_prefix_lookup(p, q, 8 * B, ids, lens, 4), 0);
    /* shorter than a block: nothing */
    assert_int_equal(kvr_prefix_lookup(p, a, B - 1, ids, lens, 4), 0);
    kvr_prefix_free(p);
}

static void test_candidates(void **state) {
    (void)state;
    kvr_prefix *p = NULL;
    assert_int_equal(kvr_prefix_create(1024, &p), KVL_OK);
    int32_t a[4 * B], b[4 * B];
    fill(a, 4 * B, 2);
    memcpy(b, a, sizeof b);
    b[2 * B] = -1;                                   /* b shares a's first two blocks */
    kvr_prefix_insert(p, "s-a", a, 4 * B);
    kvr_prefix_insert(p, "s-b", b, 2 * B);           /* takes blocks 0..1 over */
    char ids[4][KVR_ID_MAX];
    int lens[4];
    int n = kvr_prefix_lookup(p, a, 4 * B, ids, lens, 4);
    assert_int_equal(n, 2);
    assert_string_equal(ids[0], "s-a");
    assert_int_equal(lens[0], 4 * B);
    assert_string_equal(ids[1], "s-b");
    assert_int_equal(lens[1], 2 * B);
    assert_int_equal(kvr_prefix_lookup(p, a, 4 * B, ids, lens, 1), 1);
    kvr_prefix_free(p);
}

/* Tenants have chains of their own: the same conversation of two tenants gives two entries,
 * and neither tenant's lookup proposes the other's session. */
static void test_tenants(void **state) {
    (void)state;
    kvr_prefix *p = NULL;
    assert_int_equal(kvr_prefix_create(1024, &p), KVL_OK);
    int32_t a[3 * B];
    fill(a, 3 * B, 5);
    char ids[4][KVR_ID_MAX];
    int lens[4];
    kvr_prefix_insert_for(p, "acme", "s-acme", a, 3 * B);
    assert_int_equal(kvr_prefix_lookup_for(p, "beta", a, 3 * B, ids, lens, 4), 0);
    assert_int_equal(kvr_prefix_lookup(p, a, 3 * B, ids, lens, 4), 0);
    kvr_prefix_insert_for(p, "beta", "s-beta", a, 3 * B);    /* takes nothing of acme's over */
    assert_int_equal(kvr_prefix_size(p), 6);
    assert_int_equal(kvr_prefix_lookup_for(p, "acme", a, 3 * B, ids, lens, 4), 1);
    assert_string_equal(ids[0], "s-acme");
    assert_int_equal(kvr_prefix_lookup_for(p, "beta", a, 3 * B, ids, lens, 4), 1);
    assert_string_equal(ids[0], "s-beta");
    kvr_prefix_free(p);
}

static void test_lru_bound(void **state) {
    (void)state;
    kvr_prefix *p = NULL;
    assert_int_equal(kvr_prefix_create(16, &p), KVL_OK);
    int32_t t[40][2 * B];
    char id[32], ids[4][KVR_ID_MAX];
    int lens[4];
    for (int s = 0; s < 40; s++) {
        fill(t[s], 2 * B, 10 + s);
        snprintf(id, sizeof id, "s-%d", s);
        kvr_prefix_insert(p, id, t[s], 2 * B);
        assert_true(kvr_prefix_size(p) <= 16);
        if (s == 8) assert_int_equal(kvr_prefix_lookup(p, t[0], 2 * B, ids, lens, 4), 0);  /* evicted */
        if (s >= 1) {   /* keep session 1 in use: it survives */
            assert_int_equal(kvr_prefix_lookup(p, t[1], 2 * B, ids, lens, 4), 1);
            assert_string_equal(ids[0], "s-1");
        }
    }
    assert_int_equal(kvr_prefix_size(p), 16);
    assert_int_equal(kvr_prefix_lookup(p, t[39], 2 * B, ids, lens, 4), 1);
    kvr_prefix_free(p);
}

static int known(void *arg, const char *m) {
    (void)arg;
    return !strcmp(m, "qwen3-a");
}

static void parse_err(const char *body, int chat, int http, const char *param, const char *word) {
    kvr_oai_req q;
    kvr_oai_error e;
    assert_int_equal(kvr_oai_parse(body, strlen(body), chat, 100, known, NULL, &q, &e), -1);
    kvr_oai_req_clear(&q);
    assert_int_equal(e.http, http);
    assert_string_equal(e.param, param);
    if (!strstr(e.message, word)) fail_msg("'%s' lacks '%s'", e.message, word);
    char *j = kvr_oai_error_json(&e);
    assert_non_null(j);
    assert_non_null(strstr(j, "\"error\":{\"message\":"));
    free(j);
}

/* Strict UTF-8 (no overlong forms, surrogates or values past U+10FFFF). */
static int utf8_ok(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned char b = *p;
        size_t w = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
        if (!w) return 0;
        for (size_t k = 1; k < w; k++)
            if ((p[k] & 0xc0) != 0x80) return 0;
        if ((b == 0xe0 && p[1] < 0xa0) || (b == 0xed && p[1] > 0x9f) || (b == 0xf0 && p[1] < 0x90) ||
            (b == 0xf4 && p[1] > 0x8f))
            return 0;
        p += w;
    }
    return 1;
}

static void utf8_err(const char *body, const char *word) {
    kvr_oai_req q;
    kvr_oai_error e;
    assert_int_equal(kvr_oai_parse(body, strlen(body), strstr(body, "messages") != NULL, 100, known, NULL, &q, &e), -1);
    kvr_oai_req_clear(&q);
    char *j = kvr_oai_error_json(&e);
    assert_non_null(j);
    if (!strstr(j, word)) fail_msg("%s lacks '%s'", j, word);
    if (!utf8_ok(j)) fail_msg("not UTF-8: %s", j);
    free(j);
}

static void test_parse(void **state) {
    (void)state;
    const char *ok = "{\"model\":\"auto\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
                     "\"text\":\"b\"}]}],\"max_completion_tokens\":7,\"stop\":\"x\",\"seed\":3,"
                     "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logit_bias\":{},\"user\":\"u\"}";
    kvr_oai_req q;
    kvr_oai_error e;
    assert_int_equal(kvr_oai_parse(ok, strlen(ok), 1, 100, known, NULL, &q, &e), 0);
    assert_string_equal(q.model, "");
    assert_int_equal(q.n_msgs, 2);
    assert_string_equal(q.msgs[0].role, "system");
    assert_string_equal(q.msgs[1].content, "ab");
    assert_int_equal(q.max_tokens, 7);
    assert_int_equal(q.n_stop, 1);
    assert_true(q.stream && q.include_usage);
    kvr_oai_req_clear(&q);
    parse_err("{\"model\":\"qwen3-a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":101}",
              1, 400, "max_tokens", "at most 100");
    parse_err("{\"model\":\"qwen3-z\",\"messages\":[]}", 1, 404, "model", "does not exist");
    parse_err("{\"model\":\"qwen3-a\",\"messages\":[{\"role\":\"user\"}]}", 1, 400, "messages[0].content", "required");
    parse_err("{\"model\":\"qwen3-a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[1]}]}",
              1, 400, "messages[0].tool_calls", "not supported");
    parse_err("{\"model\":\"qwen3-a\",\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 0, 400, "stop", "at most 4");
    parse_err("{\"model\":\"qwen3-a\",\"prompt\":\"x\",\"temperature\":3}", 0, 400, "temperature", "[0, 2]");
    parse_err("{\"model\":\"qwen3-a\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 0, 400,
              "stream_options", "only allowed");
    parse_err("{\"model\":\"qwen3-a\",\"prompt\":[1,2]}", 0, 400, "prompt", "one string");
    parse_err("[1]", 0, 400, "", "JSON object");
    /* a \u0000 would end cJSON's C string there, dropping the rest of the text unsaid; an
     * escaped backslash before "u0000" is text, not a NUL */
    parse_err("{\"model\":\"qwen3-a\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000 secret\"}]}",
              1, 400, "", "NUL character");
    parse_err("{\"model\":\"qwen3-a\",\"prompt\":\"x\",\"stop\":[\"\\u0000\"]}", 0, 400, "", "NUL character");
    {
        const char *lit = "{\"model\":\"qwen3-a\",\"prompt\":\"a\\\\u0000 b\"}";
        assert_int_equal(kvr_oai_parse(lit, strlen(lit), 0, 100, known, NULL, &q, &e), 0);
        assert_string_equal(q.prompt, "a\\u0000 b");
        kvr_oai_req_clear(&q);
    }
    /* a key given twice is refused: a second 'stop' used to add to the first, past the four
     * the request holds (a stack overflow), and a second 'messages' leaked the first */
    parse_err("{\"model\":\"auto\",\"prompt\":\"hi\",\"stop\":[\"a\",\"b\",\"c\",\"d\"],"
              "\"stop\":[\"e\",\"f\",\"g\",\"h\"]}", 0, 400, "stop", "given twice");
    parse_err("{\"model\":\"auto\",\"prompt\":\"hi\",\"stop\":[\"a\",\"b\",\"c\",\"d\"],\"stop\":\"e\"}",
              0, 400, "stop", "given twice");
    parse_err("{\"model\":\"auto\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
              "\"messages\":[{\"role\":\"user\",\"content\":\"b\"}]}", 1, 400, "messages", "given twice");
    parse_err("{\"model\":\"auto\",\"model\":\"qwen3-a\",\"prompt\":\"x\"}", 0, 400, "model", "given twice");
    /* the parse error's position is this body's (cJSON's global error pointer is another
     * connection's as often as not) */
    parse_err("{\"model\": nope}", 0, 400, "", "near byte 10");
    /* the error quotes the client's strings cut to a byte count, and cJSON does not check them:
     * the JSON out is UTF-8 all the same (a 63-byte name + "é" cut inside the "é"; raw bytes) */
    char name[80];
    memset(name, 'x', 63);
    snprintf(name + 63, sizeof name - 63, "\xc3\xa9");
    char body[200];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"x\"}", name);
    utf8_err(body, "does not exist");
    utf8_err("{\"model\":\"auto\",\"prompt\":\"x\",\"k\xff\xed\xa0\x80\":1}", "Unrecognized");
    utf8_err("{\"model\":\"auto\",\"messages\":[{\"role\":\"\xe4\xb8\",\"content\":\"x\"}]}", "invalid");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_longest_first),
        cmocka_unit_test(test_candidates),
        cmocka_unit_test(test_tenants),
        cmocka_unit_test(test_lru_bound),
        cmocka_unit_test(test_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
