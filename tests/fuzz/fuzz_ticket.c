/* tests/fuzz/fuzz_ticket.c: libFuzzer target for the transfer-ticket reader every node runs on
 * ExportSpan and ImportSpan (service/ticket.c): parse, verify under a fixed key (MAC, expiry),
 * match against expected fields, and a re-encode of whatever parsed, which must verify and
 * give back the same fields.  Any input must be accepted or refused with a message.
 * Built only with the server components (KVL_HAVE_TICKET); otherwise a no-op target. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVL_HAVE_TICKET
#include "kvlingo/status.h"
#include "ticket.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvl__ticket_key key;
    memset(&key, 0, sizeof key);
    memset(key.key, 'k', 40);
    key.len = 40;
    kvl__ticket t;
    kvl_status st = kvl__ticket_parse(data, size, &t);
    if (st != KVL_OK) {
        if (!kvl_last_error()[0]) abort();
        return 0;
    }
    /* a parsed ticket's strings are NUL-terminated inside their buffers */
    if (strlen(t.source) >= sizeof t.source || strlen(t.target) >= sizeof t.target) abort();
    kvl__ticket v;
    st = kvl__ticket_verify(&key, data, size, t.expiry_ms > 1000 ? t.expiry_ms - 1000 : 0, &v);
    if (st != KVL_OK && !kvl_last_error()[0]) abort();
    kvl__ticket_expect e = {.target = "127.0.0.1:7200", .t0 = 0, .t1 = 16, .replace = 0};
    if (kvl__ticket_match(&t, &e) != KVL_OK && !kvl_last_error()[0]) abort();
    /* re-encoded under the key, it verifies and reads back the same */
    uint8_t buf[KVL_TICKET_MAX];
    size_t len = 0;
    if (kvl__ticket_encode(&key, &t, buf, sizeof buf, &len) != KVL_OK) return 0;
    uint64_t now = t.expiry_ms > 1000 ? t.expiry_ms - 1000 : 0;
    if (t.expiry_ms > now && kvl__ticket_verify(&key, buf, len, now, &v) != KVL_OK) abort();
    if (t.expiry_ms > now && (strcmp(v.target, t.target) || v.t0 != t.t0 || v.t1 != t.t1 ||
                              v.replace != t.replace || memcmp(v.nonce, t.nonce, sizeof t.nonce)))
        abort();
    return 0;
}
#else
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)data;
    (void)size;
    return 0;
}
#endif
