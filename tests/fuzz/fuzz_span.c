/* tests/fuzz/fuzz_span.c: libFuzzer target for the span header/payload decoder a node runs on
 * every ImportSpan (transport/span.c): protobuf SpanHeader unpack, structural header check,
 * payload check (length, checksum, token ids, finite values).
 * Input: [flags u8][header length u16 LE][SpanHeader bytes][payload bytes].  flags & 1: replace
 * the header's checksum by the payload's real one, so the fuzzer also reaches the checks behind
 * the checksum.  flags & 2: the rest of the input is instead one message as a pull receives it,
 * payload and trailer (span.h): the trailer is found, its header unpacked and both checked.
 * Any input must be accepted or refused with a reason and a message; an
 * accepted payload's views must lie inside the buffer (ASan checks the reads).
 * Built only with the server components (KVL_HAVE_SPAN); otherwise a no-op target. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVL_HAVE_SPAN
#include "kvlingo/status.h"
#include "span.h"

/* A received message with the header behind the payload (kvld's pull): every read inside it. */
static int trailer_message(uint8_t flags, const uint8_t *msg, size_t len) {
    uint8_t *buf = malloc(len ? len : 1);   /* exactly the message, so ASan sees any overread */
    if (!buf) abort();
    memcpy(buf, msg, len);
    size_t plen = 0, hl = 0;
    const uint8_t *hb = NULL;
    if (kvl__span_trailer_find(buf, len, &plen, &hb, &hl)) {
        if (plen + hl + 8 != len || hb != buf + plen) abort();
        Kvlingo__V1__SpanHeader *h = kvlingo__v1__span_header__unpack(NULL, hl, hb);
        kvl__span_reject why = KVL_SPAN_OK;
        if (h && kvl__span_header_check(h, 1u << 20, &why) == KVL_OK) {
            if (flags & 1) h->checksum = kvl__span_checksum(buf, plen);
            kvl__span_view v;
            if (kvl__span_payload_check(h, buf, plen, 4096, &v, &why) == KVL_OK &&
                (const uint8_t *)(v.ids + v.n) != buf + plen)
                abort();
        }
        if (h) kvlingo__v1__span_header__free_unpacked(h, NULL);
    }
    free(buf);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    uint8_t flags = data[0];
    if (flags & 2) return trailer_message(flags, data + 1, size - 1);
    size_t hl = (size_t)data[1] | (size_t)data[2] << 8;
    if (hl > size - 3) return 0;
    const uint8_t *hb = data + 3, *pb = data + 3 + hl;
    size_t pl = size - 3 - hl;
    Kvlingo__V1__SpanHeader *h = kvlingo__v1__span_header__unpack(NULL, hl, hb);
    if (!h) return 0;
    kvl__span_reject why = KVL_SPAN_OK;
    /* the node's limit on what it will allocate for a payload */
    kvl_status st = kvl__span_header_check(h, 1u << 20, &why);
    if (st != KVL_OK) {
        if (why == KVL_SPAN_OK || !kvl_last_error()[0]) abort();
        kvlingo__v1__span_header__free_unpacked(h, NULL);
        return 0;
    }
    /* the receive buffer is exactly what the header announced, as in kvld */
    uint8_t *buf = malloc(h->payload_bytes ? (size_t)h->payload_bytes : 1);
    if (!buf) abort();
    size_t got = pl < h->payload_bytes ? pl : (size_t)h->payload_bytes;
    memcpy(buf, pb, got);
    if (flags & 1) h->checksum = kvl__span_checksum(buf, got);
    kvl__span_view v;
    st = kvl__span_payload_check(h, buf, got, 4096, &v, &why);
    if (st != KVL_OK) {
        if (why == KVL_SPAN_OK || !kvl_last_error()[0]) abort();
    } else {
        size_t nf = (size_t)v.n_layers * v.n * v.row;
        if ((const uint8_t *)(v.ids + v.n) != buf + got) abort();
        volatile float acc = 0;
        for (size_t i = 0; i < nf; i++)   /* float32 or bf16 K/V, as the header says */
            acc += v.bf16 ? (float)v.k16[i] + (float)v.v16[i] : v.k[i] + v.v[i];
        (void)acc;   /* the reads are the point: ASan checks them */
        for (uint32_t i = 0; i < v.n; i++)
            if (v.ids[i] < 0 || v.ids[i] >= 4096) abort();
    }
    free(buf);
    kvlingo__v1__span_header__free_unpacked(h, NULL);
    return 0;
}
#else
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)data;
    (void)size;
    return 0;
}
#endif
