/* tests/server/test_ticket.c: transfer tickets (service/ticket.c): encode + verify round trip,
 * and each way a ticket must be refused: expired, too far ahead, wrong target, wrong range,
 * wrong session, wrong replace flag, tampered MAC, tampered body, another key, replay, a full
 * replay cache; a window ticket (any range inside its own, nothing outside, the flag under the
 * MAC); key files (missing, short, fine); the token hash against a known vector. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvlingo/status.h"
#include "ticket.h"

static kvl__ticket_key test_key(char fill) {
    kvl__ticket_key k;
    memset(&k, 0, sizeof k);
    memset(k.key, fill, 40);
    k.len = 40;
    return k;
}

static kvl__ticket sample(uint64_t now) {
    kvl__ticket t;
    memset(&t, 0, sizeof t);
    snprintf(t.src_session, sizeof t.src_session, "victim");
    snprintf(t.dst_session, sizeof t.dst_session, "victim");
    snprintf(t.source, sizeof t.source, "127.0.0.1:7100");
    snprintf(t.target, sizeof t.target, "127.0.0.1:7200");
    t.t0 = 0;
    t.t1 = 48;
    t.expiry_ms = now + 30000;
    assert_int_equal(kvl__ticket_new_nonce(&t), KVL_OK);
    return t;
}

static kvl__ticket_expect expect_of(const kvl__ticket *t) {
    kvl__ticket_expect e = {.src_session = t->src_session, .dst_session = t->dst_session,
                            .source = t->source, .target = t->target, .t0 = t->t0, .t1 = t->t1,
                            .replace = t->replace};
    return e;
}

static void test_round_trip(void **st) {
    (void)st;
    kvl__ticket_key k = test_key('k');
    uint64_t now = kvl__ticket_now_ms();
    kvl__ticket t = sample(now), got;
    uint8_t buf[KVL_TICKET_MAX];
    size_t len;
    assert_int_equal(kvl__ticket_encode(&k, &t, buf, sizeof buf, &len), KVL_OK);
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &got), KVL_OK);
    assert_string_equal(got.target, "127.0.0.1:7200");
    assert_string_equal(got.src_session, "victim");
    assert_int_equal(got.t1, 48);
    assert_memory_equal(got.nonce, t.nonce, KVL_TICKET_NONCE);
    kvl__ticket_expect e = expect_of(&t);
    assert_int_equal(kvl__ticket_match(&got, &e), KVL_OK);
    /* two nonces differ */
    kvl__ticket t2 = sample(now);
    assert_memory_not_equal(t.nonce, t2.nonce, KVL_TICKET_NONCE);
}

static void test_expired(void **st) {
    (void)st;
    kvl__ticket_key k = test_key('k');
    uint64_t now = kvl__ticket_now_ms();
    kvl__ticket t = sample(now), got;
    t.expiry_ms = now - 1;
    uint8_t buf[KVL_TICKET_MAX];
    size_t len;
    assert_int_equal(kvl__ticket_encode(&k, &t, buf, sizeof buf, &len), KVL_OK);
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &got), KVL_ERR_RANGE);
    assert_non_null(strstr(kvl_last_error(), "expired"));
    /* a ticket that would live for hours is refused too (the replay cache forgets nothing
     * before expiry, so lifetimes are bounded) */
    t.expiry_ms = now + 3600 * 1000;
    assert_int_equal(kvl__ticket_encode(&k, &t, buf, sizeof buf, &len), KVL_OK);
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &got), KVL_ERR_RANGE);
}

static void test_wrong_fields(void **st) {
    (void)st;
    kvl__ticket_key k = test_key('k');
    uint64_t now = kvl__ticket_now_ms();
    kvl__ticket orig = sample(now), t;
    uint8_t buf[KVL_TICKET_MAX];
    size_t len;
    /* the fields are checked on what verify read back */
    assert_int_equal(kvl__ticket_encode(&k, &orig, buf, sizeof buf, &len), KVL_OK);
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &t), KVL_OK);
    kvl__ticket_expect e = expect_of(&t);
    e.target = "127.0.0.1:9999";
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "target node"));
    e = expect_of(&t);
    e.t1 = 47;
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "range"));
    e = expect_of(&t);
    e.t0 = 1;
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_ERR_MISMATCH);
    e = expect_of(&t);
    e.dst_session = "evil";
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "target session"));
    e = expect_of(&t);
    e.replace = 1;
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "replace"));
    e = expect_of(&t);
    e.source = "127.0.0.1:7300";
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_ERR_MISMATCH);
    /* unchecked fields (NULL / -1) pass */
    kvl__ticket_expect loose = {.t0 = -1, .t1 = -1, .replace = -1};
    assert_int_equal(kvl__ticket_match(&t, &loose), KVL_OK);
}

static void test_window(void **st) {
    (void)st;
    kvl__ticket_key k = test_key('k');
    uint64_t now = kvl__ticket_now_ms();
    kvl__ticket orig = sample(now), t;
    orig.window = 1;
    orig.t1 = 65;
    uint8_t buf[KVL_TICKET_MAX];
    size_t len;
    assert_int_equal(kvl__ticket_encode(&k, &orig, buf, sizeof buf, &len), KVL_OK);
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &t), KVL_OK);
    assert_int_equal(t.window, 1);
    assert_int_equal(t.replace, 0);
    kvl__ticket_expect e = expect_of(&t);
    /* the nodes settle the range inside the window: the target's cache to the source's */
    e.t0 = 12;
    e.t1 = 64;
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_OK);
    e.t0 = 0;
    e.t1 = 65;
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_OK);
    e.t1 = 66;   /* past the window */
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "allows range [0, 65)"));
    /* a window does not widen the other fields */
    e = expect_of(&t);
    e.target = "127.0.0.1:9999";
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_ERR_MISMATCH);
    /* the flag is under the MAC: clearing it breaks the ticket (flags byte follows "KVT1") */
    buf[4] &= (uint8_t)~2u;
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &t), KVL_ERR_MISMATCH);
    /* an exact ticket still wants the exact range */
    kvl__ticket exact = sample(now);
    assert_int_equal(kvl__ticket_encode(&k, &exact, buf, sizeof buf, &len), KVL_OK);
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &t), KVL_OK);
    e = expect_of(&t);
    e.t0 = 1;
    assert_int_equal(kvl__ticket_match(&t, &e), KVL_ERR_MISMATCH);
    /* unknown flag bits are malformed */
    buf[4] = 4;
    assert_int_equal(kvl__ticket_parse(buf, len, &t), KVL_ERR_FORMAT);
}

static void test_tampered(void **st) {
    (void)st;
    kvl__ticket_key k = test_key('k'), other = test_key('o');
    uint64_t now = kvl__ticket_now_ms();
    kvl__ticket t = sample(now), got;
    uint8_t buf[KVL_TICKET_MAX];
    size_t len;
    assert_int_equal(kvl__ticket_encode(&k, &t, buf, sizeof buf, &len), KVL_OK);
    buf[len - 1] ^= 1;   /* the MAC */
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &got), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "MAC"));
    buf[len - 1] ^= 1;
    /* the body: the range's last byte (t1 = 48 -> 49) */
    size_t t1_at = 4 + 1 + 8 + KVL_TICKET_NONCE + 4;
    buf[t1_at] ^= 1;
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &got), KVL_ERR_MISMATCH);
    buf[t1_at] ^= 1;
    assert_int_equal(kvl__ticket_verify(&k, buf, len, now, &got), KVL_OK);
    /* another fleet's key */
    assert_int_equal(kvl__ticket_verify(&other, buf, len, now, &got), KVL_ERR_MISMATCH);
    /* truncated, empty, garbage */
    assert_int_equal(kvl__ticket_verify(&k, buf, len - 1, now, &got), KVL_ERR_FORMAT);
    assert_int_equal(kvl__ticket_verify(&k, buf, 10, now, &got), KVL_ERR_FORMAT);
    assert_int_equal(kvl__ticket_verify(&k, NULL, 0, now, &got), KVL_ERR_FORMAT);
    uint8_t junk[64];
    memset(junk, 'x', sizeof junk);
    assert_int_equal(kvl__ticket_verify(&k, junk, sizeof junk, now, &got), KVL_ERR_FORMAT);
}

static void test_replay(void **st) {
    (void)st;
    uint64_t now = kvl__ticket_now_ms();
    kvl__ticket_replay r;
    assert_int_equal(kvl__ticket_replay_init(&r, 2), KVL_OK);
    kvl__ticket a = sample(now), b = sample(now), c = sample(now);
    const int64_t mono = 1000000;   /* the monotonic clock, as the tests advance it */
    assert_int_equal(kvl__ticket_replay_check(&r, &a, now, mono), KVL_OK);
    assert_int_equal(kvl__ticket_replay_check(&r, &a, now, mono), KVL_ERR_MISMATCH);
    assert_non_null(strstr(kvl_last_error(), "replayed"));
    assert_int_equal(kvl__ticket_replay_check(&r, &b, now, mono), KVL_OK);
    /* full of live nonces: refused, not forgotten */
    assert_int_equal(kvl__ticket_replay_check(&r, &c, now, mono), KVL_ERR_RANGE);
    assert_int_equal(kvl__ticket_replay_check(&r, &a, now, mono), KVL_ERR_MISMATCH);
    /* the wall clock steps a minute forward (no time passed): nothing is forgotten, so once it
     * steps back a's ticket, which verify would take again, is still a replay */
    assert_int_equal(kvl__ticket_replay_check(&r, &c, now + 60000, mono), KVL_ERR_RANGE);
    assert_int_equal(kvl__ticket_replay_check(&r, &a, now, mono), KVL_ERR_MISMATCH);
    /* a minute passes on both clocks: they expired, their places free up */
    assert_int_equal(kvl__ticket_replay_check(&r, &c, now + 60000, mono + 60000), KVL_OK);
    kvl__ticket_replay_free(&r);
}

static void test_key_file(void **st) {
    (void)st;
    kvl__ticket_key k;
    assert_int_equal(kvl__ticket_key_load("/nonexistent/ticket.key", &k), KVL_ERR_IO);
    assert_non_null(strstr(kvl_last_error(), "/nonexistent/ticket.key"));
    assert_non_null(strstr(kvl_last_error(), "missing"));
    char path[] = "/tmp/kvl_ticket_keyXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "short\n", 6), 6);
    assert_int_equal(kvl__ticket_key_load(path, &k), KVL_ERR_RANGE);
    assert_non_null(strstr(kvl_last_error(), "too short"));
    assert_int_equal(write(fd, "0123456789012345678901234567890123456789\n", 41), 41);
    close(fd);
    assert_int_equal(kvl__ticket_key_load(path, &k), KVL_OK);
    assert_int_equal(k.len, 46);   /* "short\n" + 40 digits, the final newline stripped */
    unlink(path);
    assert_int_equal(kvl__ticket_key_load("/", &k), KVL_ERR_IO);   /* a directory: unreadable */
}

/* the start-up warm-up: a usable key passes; one that cannot make a ticket fails there, at
 * start, with the encoder's error */
/* the key's public name: HMAC-SHA256(key, label) cut to 8 bytes, as Python's hmac computes it */
static void test_key_id(void **st) {
    (void)st;
    kvl__ticket_key a = test_key('A'), b = test_key('B');
    char ia[17], ib[17];
    assert_int_equal(kvl__ticket_key_id(&a, ia), KVL_OK);
    assert_int_equal(kvl__ticket_key_id(&b, ib), KVL_OK);
    assert_string_equal(ia, "e7e860cce485e7cc");
    assert_string_equal(ib, "a0160a9c49daa055");
}

static void test_warmup(void **st) {
    (void)st;
    kvl__ticket_key k;
    memset(&k, 0, sizeof k);
    memset(k.key, 0x5a, KVL_TICKET_KEY_MIN);
    k.len = KVL_TICKET_KEY_MIN;
    assert_int_equal(kvl__ticket_warmup(&k), KVL_OK);
    k.len = 0;
    assert_int_equal(kvl__ticket_warmup(&k), KVL_ERR_INVALID_ARG);
    assert_non_null(strstr(kvl_last_error(), "no key"));
}

static void test_token_hash(void **st) {
    (void)st;
    char hex[65];
    /* SHA-256 of the empty string */
    kvl__tokens_sha256_hex(NULL, 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    /* ids 1, 2 little-endian: bytes 01 00 00 00 02 00 00 00 (python: hashlib.sha256(
     * struct.pack('<2i', 1, 2)).hexdigest()) */
    int32_t ids[2] = {1, 2};
    kvl__tokens_sha256_hex(ids, 2, hex);
    assert_string_equal(hex, "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip), cmocka_unit_test(test_expired),
        cmocka_unit_test(test_wrong_fields), cmocka_unit_test(test_window),
        cmocka_unit_test(test_tampered),
        cmocka_unit_test(test_replay), cmocka_unit_test(test_key_file),
        cmocka_unit_test(test_token_hash), cmocka_unit_test(test_warmup), cmocka_unit_test(test_key_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
