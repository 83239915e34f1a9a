/* tests/server/test_transport.c: the UCX transport between two workers of one process, and
 * the span codec (encode from a real cache, header/payload checks, corruptions). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sched.h>
#include <stdatomic.h>

#include <cmocka.h>
#include <xxhash.h>   /* the portable entry points, no dispatch */

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "clock.h"
#include "rpc.h"
#include "kvlingo/safetensors.h"
#include "bf16.h"
#include "span.h"
#include "span_source.h"
#include "transport.h"
#include "spanbuf.h"

static void test_send_recv(void **state) {
    kvl__transport *a, *b;
    assert_int_equal(kvl__transport_create("ucx", &a), KVL_OK);
    assert_int_equal(kvl__transport_create(NULL, &b), KVL_OK);
    assert_string_equal(kvl__transport_kind(a), "ucx");
    const uint8_t *addr;
    size_t alen;
    kvl__transport_address(b, &addr, &alen);
    assert_true(alen > 0);
    /* up to past the old 8 MB eager limit: 24 MB goes eagerly now (transport/ucx.c) */
    size_t sizes[] = {1, 4096, 8u << 20, 24u << 20};
    for (int i = 0; i < 4; i++) {
        size_t n = sizes[i];
        uint8_t *src = malloc(n), *dst = calloc(1, n);
        for (size_t j = 0; j < n; j++) src[j] = (uint8_t)(j * 7 + i);
        uint64_t tag = kvl__transport_new_tag(b);
        kvl__transport_recv *r;
        assert_int_equal(kvl__transport_recv_post(b, tag, dst, n, &r), KVL_OK);
        assert_int_equal(kvl__transport_send(a, addr, alen, tag, src, n, 10000, NULL, NULL, NULL, NULL), KVL_OK);
        size_t got;
        assert_int_equal(kvl__transport_recv_wait(b, r, 10000, NULL, &got), KVL_OK);
        assert_int_equal(got, n);
        assert_memory_equal(src, dst, n);
        kvl__transport_recv_free(b, r, NULL, NULL);
        free(src);
        free(dst);
    }
    /* shorter than announced: completes with fewer bytes */
    uint8_t buf[64], small[16] = {1};
    uint64_t tag = kvl__transport_new_tag(b);
    kvl__transport_recv *r;
    size_t got;
    assert_int_equal(kvl__transport_recv_post(b, tag, buf, sizeof buf, &r), KVL_OK);
    assert_int_equal(kvl__transport_send(a, addr, alen, tag, small, sizeof small, 10000, NULL, NULL, NULL, NULL), KVL_OK);
    assert_int_equal(kvl__transport_recv_wait(b, r, 10000, NULL, &got), KVL_OK);
    assert_int_equal(got, sizeof small);
    kvl__transport_recv_free(b, r, NULL, NULL);
    /* longer than announced: the receive fails with RANGE */
    uint8_t big[256] = {0};
    tag = kvl__transport_new_tag(b);
    assert_int_equal(kvl__transport_recv_post(b, tag, buf, sizeof buf, &r), KVL_OK);
    kvl__transport_send(a, addr, alen, tag, big, sizeof big, 10000, NULL, NULL, NULL, NULL);
    assert_int_equal(kvl__transport_recv_wait(b, r, 10000, NULL, &got), KVL_ERR_RANGE);
    kvl__transport_recv_free(b, r, NULL, NULL);
    /* nothing sent: timeout, then cancellation */
    tag = kvl__transport_new_tag(b);
    assert_int_equal(kvl__transport_recv_post(b, tag, buf, sizeof buf, &r), KVL_OK);
    assert_int_equal(kvl__transport_recv_wait(b, r, 50, NULL, &got), KVL_ERR_IO);
    kvl__transport_recv_free(b, r, NULL, NULL);
    volatile int cancel = 1;
    tag = kvl__transport_new_tag(b);
    assert_int_equal(kvl__transport_recv_post(b, tag, buf, sizeof buf, &r), KVL_OK);
    assert_int_equal(kvl__transport_recv_wait(b, r, 5000, &cancel, &got), KVL_ERR_CANCELLED);
    kvl__transport_recv_free(b, r, NULL, NULL);
    /* tags are random: nobody can guess the next receive's */
    uint64_t t1 = kvl__transport_new_tag(b), t2 = kvl__transport_new_tag(b);
    assert_true(t1 != 0 && t2 != 0 && t1 != t2 && t2 != t1 + 1);
    /* a message for a tag no receive was posted for (a guessed tag, a transfer whose import
     * ended): the receiver takes it into scratch memory and drops it, small or large, so it
     * never piles up; the sender sees it leave */
    size_t big_n = 24u << 20;
    uint8_t *bigbuf = calloc(1, big_n);
    uint64_t dropped0 = kvl__transport_unmatched_dropped(b);
    int64_t t0 = kvl__now_ms();
    for (int i = 0; i < 100; i++)
        assert_int_equal(kvl__transport_send(a, addr, alen, (uint64_t)i + 1, small, sizeof small, 5000,
                                            NULL, NULL, NULL, NULL), KVL_OK);
    assert_int_equal(kvl__transport_send(a, addr, alen, kvl__transport_new_tag(b), bigbuf, big_n,
                                        5000, NULL, NULL, NULL, NULL), KVL_OK);
    while (kvl__transport_unmatched_dropped(b) < dropped0 + 101 && kvl__now_ms() - t0 < 5000) usleep(1000);
    assert_int_equal(kvl__transport_unmatched_dropped(b), dropped0 + 101);
    /* a posted receive is not disturbed by the drain: it still gets its message */
    tag = kvl__transport_new_tag(b);
    assert_int_equal(kvl__transport_recv_post(b, tag, buf, sizeof buf, &r), KVL_OK);
    assert_int_equal(kvl__transport_send(a, addr, alen, tag, small, sizeof small, 10000, NULL, NULL, NULL, NULL), KVL_OK);
    assert_int_equal(kvl__transport_recv_wait(b, r, 10000, NULL, &got), KVL_OK);
    assert_int_equal(got, sizeof small);
    kvl__transport_recv_free(b, r, NULL, NULL);
    /* cancelled before the call: refused, and nothing reaches the peer (an eager send the peer
     * drained at once used to complete inside UCX's send call, and came back KVL_OK) */
    volatile int stop = 1;
    const uint64_t dropped1 = kvl__transport_unmatched_dropped(b);
    assert_int_equal(kvl__transport_send(a, addr, alen, kvl__transport_new_tag(b), bigbuf, big_n,
                                        5000, &stop, NULL, NULL, NULL), KVL_ERR_CANCELLED);
    usleep(20000);
    assert_int_equal(kvl__transport_unmatched_dropped(b), dropped1);
    tag = kvl__transport_new_tag(b);
    uint8_t *dst2 = malloc(big_n);
    assert_int_equal(kvl__transport_recv_post(b, tag, dst2, big_n, &r), KVL_OK);
    assert_int_equal(kvl__transport_send(a, addr, alen, tag, bigbuf, big_n, 10000, NULL, NULL, NULL, NULL), KVL_OK);
    assert_int_equal(kvl__transport_recv_wait(b, r, 10000, NULL, &got), KVL_OK);
    assert_int_equal(got, big_n);
    kvl__transport_recv_free(b, r, NULL, NULL);
    free(dst2);
    free(bigbuf);
    /* unknown kind */
    kvl__transport *x;
    assert_int_equal(kvl__transport_create("carrier-pigeon", &x), KVL_ERR_UNSUPPORTED);
    kvl__transport_free(a);
    kvl__transport_free(b);
}

/* Endpoints stay within the transport's bound (here 3, KVL_UCX_MAX_PEERS): a peer that comes
 * back with a new address leaves its old endpoint behind, and past the bound the least
 * recently used idle one is closed.  Sends to any peer still arrive, an evicted one's too (a
 * new endpoint is made). */
static void test_peer_bound(void **state) {
    (void)state;
    setenv("KVL_UCX_MAX_PEERS", "3", 1);
    kvl__transport *a;
    assert_int_equal(kvl__transport_create("ucx", &a), KVL_OK);
    unsetenv("KVL_UCX_MAX_PEERS");
    enum { NP = 6 };
    kvl__transport *peer[NP];
    for (int i = 0; i < NP; i++) assert_int_equal(kvl__transport_create("ucx", &peer[i]), KVL_OK);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < NP; i++) {
            const uint8_t *addr;
            size_t alen;
            kvl__transport_address(peer[i], &addr, &alen);
            uint8_t src[64], dst[64] = {0};
            for (int j = 0; j < 64; j++) src[j] = (uint8_t)(i * 31 + j + round);
            uint64_t tag = kvl__transport_new_tag(peer[i]);
            kvl__transport_recv *r;
            assert_int_equal(kvl__transport_recv_post(peer[i], tag, dst, sizeof dst, &r), KVL_OK);
            assert_int_equal(kvl__transport_send(a, addr, alen, tag, src, sizeof src, 10000, NULL, NULL,
                                                 NULL, NULL), KVL_OK);
            size_t got = 0;
            assert_int_equal(kvl__transport_recv_wait(peer[i], r, 10000, NULL, &got), KVL_OK);
            assert_int_equal(got, sizeof src);
            assert_memory_equal(src, dst, sizeof src);
            kvl__transport_recv_free(peer[i], r, NULL, NULL);
            assert_true(kvl__transport_peers_open(a) <= 3);
        }
    }
    /* 12 sends to 6 peers through 3 places: every send after the third made room */
    assert_int_equal(kvl__transport_peers_open(a), 3);
    assert_int_equal(kvl__transport_peers_evicted(a), 2 * NP - 3);
    for (int i = 0; i < NP; i++) kvl__transport_free(peer[i]);
    kvl__transport_free(a);
}

static void test_spanbufs(void **state) {
    (void)state;
    kvl__spanbufs *p;
    assert_int_equal(kvl__spanbufs_create(0, 1 << 20, &p), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvl__spanbufs_create(2, 1 << 20, &p), KVL_OK);
    /* a buffer given back is the one the next span of its size gets, faulted in already */
    uint8_t *a = kvl__spanbuf_take(p, 300000);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    memset(a, 7, 300000);
    kvl__spanbuf_give(p, a);
    uint8_t *b = kvl__spanbuf_take(p, 200000);
    assert_ptr_equal(a, b);
    /* two taken at once: two buffers; a third does not fit the pool (its own, freed on give) */
    uint8_t *c = kvl__spanbuf_take(p, 100000);
    assert_non_null(c);
    assert_ptr_not_equal(b, c);
    uint8_t *d = kvl__spanbuf_take(p, 100000);
    assert_non_null(d);
    int kept;
    size_t bytes;
    kvl__spanbufs_stats(p, &kept, &bytes);
    assert_int_equal(kept, 2);
    assert_true(bytes <= (1 << 20));
    kvl__spanbuf_give(p, d);
    kvl__spanbufs_stats(p, &kept, NULL);
    assert_int_equal(kept, 2);
    kvl__spanbuf_give(p, b);
    kvl__spanbuf_give(p, c);
    /* larger than max_bytes: never kept */
    uint8_t *e = kvl__spanbuf_take(p, 2 << 20);
    assert_non_null(e);
    kvl__spanbuf_give(p, e);
    kvl__spanbufs_stats(p, &kept, &bytes);
    assert_true(bytes <= (1 << 20));
    /* a buffer bigger than the idle ones replaces them when the bytes would not fit */
    uint8_t *f = kvl__spanbuf_take(p, 900000);
    assert_non_null(f);
    kvl__spanbufs_stats(p, &kept, &bytes);
    assert_true(bytes <= (1 << 20));
    /* freed while one is taken, in a slot, and one outside them (too big to keep): both stay
     * valid and the table lives until the last is given back (ASan sees a use after free) */
    uint8_t *big = kvl__spanbuf_take(p, 2 << 20);
    assert_non_null(big);
    kvl__spanbufs_free(p);
    memset(f, 1, 900000);
    kvl__spanbuf_give(p, f);
    memset(big, 2, 2 << 20);
    kvl__spanbuf_give(p, big);
    /* no pool: plain allocations */
    uint8_t *g = kvl__spanbuf_take(NULL, 1000);
    assert_non_null(g);
    kvl__spanbuf_give(NULL, g);
    kvl__spanbuf_give(NULL, NULL);
}

/* Threads taking and giving buffers of sizes no idle buffer fits, so that takes reserve a
 * slot and allocate outside the pool's lock while others scan the slots: every buffer must be
 * the caller's alone (nobody else writes it) and hold what was asked (usable size), and the
 * pool's byte count must stay within its limit.  A slot reserved by one take was taken for
 * empty by another: two takes shared it, the slot kept one buffer with the other's size, and a
 * later take got a buffer smaller than it asked for. */
typedef struct spanbuf_worker {
    kvl__spanbufs *p;
    int id, iters, bad;
} spanbuf_worker;

static atomic_uint spanbuf_next;

static void *spanbuf_thread(void *arg) {
    spanbuf_worker *w = arg;
    const double until = kvl__now_s() + 3.0;   /* a sanitizer build is slower: at most 3 s */
    for (int i = 0; i < w->iters && !w->bad && kvl__now_s() < until; i++) {
        /* growing sizes (in cycles): no idle buffer fits, so each take reserves a slot */
        size_t len = 200000 + (size_t)(atomic_fetch_add(&spanbuf_next, 1) % 2000) * 512;
        uint8_t *b = kvl__spanbuf_take(w->p, len);
        if (!b || malloc_usable_size(b) < len) {
            w->bad = 1;
            break;
        }
        b[0] = b[len / 2] = b[len - 1] = (uint8_t)w->id;
        sched_yield();
        if (b[0] != (uint8_t)w->id || b[len / 2] != (uint8_t)w->id || b[len - 1] != (uint8_t)w->id) w->bad = 2;
        kvl__spanbuf_give(w->p, b);
    }
    return NULL;
}

static void test_spanbufs_threads(void **state) {
    (void)state;
    kvl__spanbufs *p;
    assert_int_equal(kvl__spanbufs_create(16, 32u << 20, &p), KVL_OK);
    pthread_t th[8];
    spanbuf_worker w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (spanbuf_worker){.p = p, .id = i + 1, .iters = 30000};
        assert_int_equal(pthread_create(&th[i], NULL, spanbuf_thread, &w[i]), 0);
    }
    for (int i = 0; i < 8; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 8; i++) assert_int_equal(w[i].bad, 0);
    int kept;
    size_t bytes;
    kvl__spanbufs_stats(p, &kept, &bytes);
    assert_true(kept <= 16);
    assert_true(bytes <= (32u << 20));
    kvl__spanbufs_free(p);
}

/* qwen3-a and a cache holding tokens 100..119, the span codec tests' source */
static void codec_source(kvl_model **m, kvl_cache **c) {
    assert_int_equal(kvl_model_load(KVL_SOURCE_DIR "/models/qwen3-a", NULL, m), KVL_OK);
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = 256;
    assert_int_equal(kvl_cache_create(kvl_model_config_get(*m), &cp, c), KVL_OK);
    int32_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = 100 + i;
    assert_int_equal(kvl_model_prefill(*m, *c, toks, 20, KVL_LOGITS_NONE, NULL), KVL_OK);
}

static void test_span_codec(void **state) {
    kvl_model *m;
    kvl_cache *c;
    codec_source(&m, &c);
    const kvl_model_config *cfg = kvl_model_config_get(m);

    Kvlingo__V1__SpanHeader h = KVLINGO__V1__SPAN_HEADER__INIT;
    kvl__span_ids ids;
    uint8_t *p;
    size_t len;
    kvl__span_source src = test_span_source(m, c);
    assert_int_equal(kvl__span_encode(&src, 5, 20, "qwen3-b", "", &ids, &h, &p, &len), KVL_OK);
    assert_int_equal(len, kvl__span_payload_bytes(cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, 15));
    kvl__span_reject why;
    kvl__span_view v;
    assert_int_equal(kvl__span_payload_check(&h, p, len, cfg->vocab_size, &v, &why), KVL_OK);
    assert_int_equal(v.n, 15);
    assert_int_equal(v.ids[0], 105);
    /* the K of layer 1, token 5 equals what the cache reads back */
    size_t row = (size_t)cfg->n_kv_heads * cfg->head_dim;
    float *k = malloc(row * sizeof(float)), *vv = malloc(row * sizeof(float));
    assert_int_equal(kvl_cache_read_prenorm(c, 1, 5, 6, k, vv), KVL_OK);
    assert_memory_equal(k, v.k + 1 * 15 * row, row * sizeof(float));
    assert_memory_equal(vv, v.v + 1 * 15 * row, row * sizeof(float));
    free(k);
    free(vv);
    /* header round trip through protobuf */
    size_t hl = kvlingo__v1__span_header__get_packed_size(&h);
    uint8_t *hb = malloc(hl);
    kvlingo__v1__span_header__pack(&h, hb);
    Kvlingo__V1__SpanHeader *h2 = kvlingo__v1__span_header__unpack(NULL, hl, hb);
    assert_non_null(h2);
    assert_int_equal(kvl__span_payload_check(h2, p, len, cfg->vocab_size, NULL, &why), KVL_OK);
    kvlingo__v1__span_header__free_unpacked(h2, NULL);
    free(hb);
    /* truncated */
    assert_int_not_equal(kvl__span_payload_check(&h, p, len - 4, cfg->vocab_size, NULL, &why), 0);
    assert_int_equal(why, KVL_SPAN_TRUNCATED);
    /* checksum */
    p[17] ^= 1;
    assert_int_not_equal(kvl__span_payload_check(&h, p, len, cfg->vocab_size, NULL, &why), 0);
    assert_int_equal(why, KVL_SPAN_CHECKSUM);
    p[17] ^= 1;
    /* non-finite values, wherever they are: the check names the plane and the element; the
     * largest finite float and a denormal pass */
    {
        size_t nf = (size_t)cfg->n_layers * 15 * row;
        float *kf = (float *)p;
        const float bad_values[] = {NAN, INFINITY, -INFINITY};
        const size_t at[] = {0, 4095, 4096, nf - 1, nf, 2 * nf - 1};
        for (size_t a = 0; a < sizeof at / sizeof at[0]; a++)
            for (size_t b = 0; b < 3; b++) {
                float keep = kf[at[a]];
                kf[at[a]] = bad_values[b];
                h.checksum = kvl__span_checksum(p, len);
                assert_int_equal(kvl__span_payload_check(&h, p, len, cfg->vocab_size, NULL, &why),
                                 KVL_ERR_NUMERIC);
                assert_int_equal(why, KVL_SPAN_BAD_VALUES);
                char want[80];
                snprintf(want, sizeof want, "%s value at element %zu", at[a] < nf ? "K" : "V",
                         at[a] < nf ? at[a] : at[a] - nf);
                assert_non_null(strstr(kvl_last_error(), want));
                kf[at[a]] = keep;
            }
        float keep = kf[7], keep2 = kf[nf + 3];
        kf[7] = FLT_MAX;
        kf[nf + 3] = 1e-40f;
        h.checksum = kvl__span_checksum(p, len);
        assert_int_equal(kvl__span_payload_check(&h, p, len, cfg->vocab_size, NULL, &why), KVL_OK);
        kf[7] = keep;
        kf[nf + 3] = keep2;
        h.checksum = kvl__span_checksum(p, len);
    }
    /* inconsistent geometry */
    h.n_layers += 1;
    assert_int_not_equal(kvl__span_header_check(&h, 0, &why), 0);
    assert_int_equal(why, KVL_SPAN_MALFORMED);
    h.n_layers -= 1;
    h.t1 = h.t0;
    assert_int_not_equal(kvl__span_header_check(&h, 0, &why), 0);
    assert_int_equal(why, KVL_SPAN_RANGE);
    h.t1 = 20;
    assert_int_not_equal(kvl__span_header_check(&h, 1000, &why), 0);
    assert_int_equal(why, KVL_SPAN_RANGE);
    free(p);
    /* out-of-range range */
    assert_int_not_equal(kvl__span_encode(&src, 5, 21, "x", "", &ids, &h, &p, &len), 0);
    assert_null(p);
    kvl_cache_free(c);
    kvl_model_free(m);
}

/* The header behind the payload (a pull's trailer): encode keeps the room, the trailer packs
 * the header byte for byte, find gives back the payload's length and the header's bytes; a
 * payload without one (its last word a token id), a wrong magic, a length that does not fit
 * in front of the trailer or over the limit, and short messages are "no trailer". */
static void test_span_trailer(void **state) {
    (void)state;
    kvl_model *m;
    kvl_cache *c;
    codec_source(&m, &c);
    const kvl_model_config *cfg = kvl_model_config_get(m);
    Kvlingo__V1__SpanHeader h = KVLINGO__V1__SPAN_HEADER__INIT;
    kvl__span_ids ids;
    uint8_t *p;
    size_t len, tl = 0, plen = 0, hl = 0;
    const uint8_t *hb = NULL;
    kvl__span_source src = test_span_source(m, c);
    /* without room: a plain payload, which find does not take for a trailer */
    assert_int_equal(kvl__span_encode(&src, 0, 20, "qwen3-b", "", &ids, &h, &p, &len), KVL_OK);
    assert_int_equal(kvl__span_trailer_find(p, len, &plen, &hb, &hl), 0);
    free(p);
    src.trailer_room = KVL_SPAN_TRAILER_MAX;
    assert_int_equal(kvl__span_encode(&src, 0, 20, "qwen3-b", "", &ids, &h, &p, &len), KVL_OK);
    assert_int_equal(len, kvl__span_payload_bytes(cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, 20));
    assert_int_equal(kvl__span_trailer_write(&h, p + len, KVL_SPAN_TRAILER_MAX, &tl), KVL_OK);
    size_t packed = kvlingo__v1__span_header__get_packed_size(&h);
    assert_int_equal(tl, packed + 8);
    assert_int_equal(kvl__span_trailer_find(p, len + tl, &plen, &hb, &hl), 1);
    assert_int_equal(plen, len);
    assert_ptr_equal(hb, p + len);
    assert_int_equal(hl, packed);
    Kvlingo__V1__SpanHeader *h2 = kvlingo__v1__span_header__unpack(NULL, hl, hb);
    assert_non_null(h2);
    kvl__span_reject why;
    assert_int_equal(kvl__span_payload_check(h2, p, plen, cfg->vocab_size, NULL, &why), KVL_OK);
    kvlingo__v1__span_header__free_unpacked(h2, NULL);
    /* too little room: refused, nothing claimed written */
    assert_int_equal(kvl__span_trailer_write(&h, p + len, packed + 7, &tl), KVL_ERR_RANGE);
    assert_int_equal(tl, 0);
    assert_int_equal(kvl__span_trailer_write(&h, p + len, KVL_SPAN_TRAILER_MAX, &tl), KVL_OK);
    /* damaged trailers */
    uint8_t *end = p + len + tl;
    end[-1] ^= 0x80;   /* magic */
    assert_int_equal(kvl__span_trailer_find(p, len + tl, &plen, &hb, &hl), 0);
    end[-1] ^= 0x80;
    uint8_t keep[4];
    memcpy(keep, end - 8, 4);
    const uint8_t too_long[4] = {0xff, 0xff, 0xff, 0x7f};
    memcpy(end - 8, too_long, 4);   /* longer than the message */
    assert_int_equal(kvl__span_trailer_find(p, len + tl, &plen, &hb, &hl), 0);
    const uint8_t over_max[4] = {(uint8_t)(KVL_SPAN_TRAILER_MAX & 0xff), (uint8_t)(KVL_SPAN_TRAILER_MAX >> 8), 0, 0};
    memcpy(end - 8, over_max, 4);   /* over the limit, though it would fit */
    assert_int_equal(kvl__span_trailer_find(p, len + tl, &plen, &hb, &hl), 0);
    memcpy(end - 8, keep, 4);
    assert_int_equal(kvl__span_trailer_find(p, len + tl, &plen, &hb, &hl), 1);
    for (size_t n = 0; n < 8; n++)   /* too short to hold one */
        assert_int_equal(kvl__span_trailer_find(end - n, n, &plen, &hb, &hl), 0);
    /* only the trailer and an empty header: a payload of 0 bytes, which the checks refuse */
    const uint8_t bare[8] = {0, 0, 0, 0, 'K', 'V', 'S', 'T'};
    assert_int_equal(kvl__span_trailer_find(bare, 8, &plen, &hb, &hl), 1);
    assert_int_equal(plen, 0);
    assert_int_equal(hl, 0);
    free(p);
    kvl_cache_free(c);
    kvl_model_free(m);
}

/* A bf16 span (a node whose KV cache is bf16): half the bytes of K/V, dtype BF16 in the
 * header, the values the float32 read-back rounded to nearest even; a bf16 NaN or infinity
 * is refused naming the element; a header that claims BF16 with float32's payload size is
 * malformed. */
static void test_span_codec_bf16(void **state) {
    (void)state;
    kvl_model *m;
    kvl_cache *c;
    codec_source(&m, &c);
    const kvl_model_config *cfg = kvl_model_config_get(m);
    Kvlingo__V1__SpanHeader h = KVLINGO__V1__SPAN_HEADER__INIT;
    kvl__span_ids ids;
    uint8_t *p;
    size_t len;
    kvl__span_source src = test_span_source(m, c);
    src.bf16 = 1;
    assert_int_equal(kvl__span_encode(&src, 5, 20, "qwen3-b", "", &ids, &h, &p, &len), KVL_OK);
    const size_t row = (size_t)cfg->n_kv_heads * cfg->head_dim, nf = (size_t)cfg->n_layers * 15 * row;
    assert_int_equal(h.dtype, KVLINGO__V1__DTYPE__DTYPE_BF16);
    assert_int_equal(len, 2 * nf * 2 + 15 * 4);
    assert_int_equal(len, kvl__span_payload_bytes_of(cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, 15, 2));
    kvl__span_reject why;
    kvl__span_view v;
    assert_int_equal(kvl__span_payload_check(&h, p, len, cfg->vocab_size, &v, &why), KVL_OK);
    assert_true(v.bf16);
    assert_null(v.k);
    assert_int_equal(v.ids[14], 119);
    /* every element of every layer (test_span_vector_paths has the special values and tails) */
    float *k = malloc(15 * row * sizeof(float)), *vv = malloc(15 * row * sizeof(float));
    for (int l = 0; l < cfg->n_layers; l++) {
        assert_int_equal(kvl_cache_read_prenorm(c, l, 5, 20, k, vv), KVL_OK);
        for (size_t i = 0; i < 15 * row; i++) {
            assert_int_equal(v.k16[(size_t)l * 15 * row + i], kvl_f32_to_bf16(k[i]));
            assert_int_equal(v.v16[(size_t)l * 15 * row + i], kvl_f32_to_bf16(vv[i]));
        }
    }
    free(k);
    free(vv);
    /* the source's all-layers bf16 reader (kvld's) encodes the same bytes */
    {
        kvl__span_source s2 = src;
        s2.read_prenorm_bf16 = test_read_prenorm_bf16;
        Kvlingo__V1__SpanHeader h2 = KVLINGO__V1__SPAN_HEADER__INIT;
        kvl__span_ids ids2;
        uint8_t *p2;
        size_t len2;
        assert_int_equal(kvl__span_encode(&s2, 5, 20, "qwen3-b", "", &ids2, &h2, &p2, &len2), KVL_OK);
        assert_int_equal(len2, len);
        assert_memory_equal(p2, p, len);
        assert_int_equal(h2.checksum, h.checksum);
        free(p2);
    }
    /* NaN and infinity in bf16, first in K then in V */
    uint16_t *e = (uint16_t *)(void *)p;
    const size_t at[] = {3, nf + 9, 2 * nf - 1};   /* the last one past the 4096-element blocks */
    const uint16_t bad[] = {0x7fc0, 0xff80, 0x7f80};
    for (int a = 0; a < 3; a++) {
        uint16_t keep = e[at[a]];
        e[at[a]] = bad[a];
        h.checksum = kvl__span_checksum(p, len);
        assert_int_equal(kvl__span_payload_check(&h, p, len, cfg->vocab_size, NULL, &why), KVL_ERR_NUMERIC);
        assert_int_equal(why, KVL_SPAN_BAD_VALUES);
        char want[80];
        snprintf(want, sizeof want, "%s value at element %zu", a ? "V" : "K", a ? at[a] - nf : at[a]);
        assert_non_null(strstr(kvl_last_error(), want));
        e[at[a]] = keep;
    }
    /* the size a float32 span would have, announced as bf16 */
    h.payload_bytes = kvl__span_payload_bytes(cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, 15);
    assert_int_not_equal(kvl__span_header_check(&h, 0, &why), 0);
    assert_int_equal(why, KVL_SPAN_MALFORMED);
    /* an unknown dtype */
    h.dtype = KVLINGO__V1__DTYPE__DTYPE_F16;
    assert_int_not_equal(kvl__span_header_check(&h, 0, &why), 0);
    assert_int_equal(why, KVL_SPAN_GEOMETRY);
    free(p);
    kvl_cache_free(c);
    kvl_model_free(m);
}

/* finite values of any layout: the float32 form of the source below */
static kvl_status test_read_finite(const void *ctx, int layer, int t0, int t1, float *k, float *v) {
    (void)ctx;
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < 20; i++) {
            k[(size_t)(t - t0) * 20 + i] = 0.25f * (float)((layer * 31 + t * 7 + i) % 97) - 12.0f;
            v[(size_t)(t - t0) * 20 + i] = 0.125f * (float)((layer * 17 + t * 3 + i) % 89) - 5.0f;
        }
    return KVL_OK;
}

/* A synthetic span source for the codec's vector loops: 2 layers of one 20-wide head (rows not
 * a multiple of 16, so every loop runs its scalar tail), element (layer, token, i) of K and V
 * from vpath_value, which mixes in the values rounding must get right. */
#define VP_LAYERS 2
#define VP_ROW 20
static float vpath_value(int plane, int layer, int t, int i) {
    const uint32_t specials[] = {
        0x7fc00000u, /* NaN */                 0x7f800001u, /* signalling NaN */
        0xffc12345u, /* negative NaN */        0x7f800000u, /* +inf */
        0xff800000u, /* -inf */                0x7f7fffffu, /* FLT_MAX: rounds to +inf */
        0x3f808000u, /* a tie, even below */   0x3f818000u, /* a tie, odd below */
        0x3f80ffffu, /* just under a tie... */ 0x00000001u, /* the least denormal */
        0x80000000u, /* -0 */                  0x3f7fffffu, /* rounds up across the exponent */
    };
    const unsigned k = (unsigned)(((plane * VP_LAYERS + layer) * 1000 + t) * VP_ROW + i);
    float f;
    if (k % 7 == 3) {
        memcpy(&f, &specials[(k / 7) % (sizeof specials / sizeof specials[0])], sizeof f);
    } else {
        f = sinf(0.37f * (float)k) * 3.0f;
    }
    return f;
}

static kvl_status vpath_read(const void *ctx, int layer, int t0, int t1, float *k, float *v) {
    (void)ctx;
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < VP_ROW; i++) {
            k[(size_t)(t - t0) * VP_ROW + i] = vpath_value(0, layer, t, i);
            v[(size_t)(t - t0) * VP_ROW + i] = vpath_value(1, layer, t, i);
        }
    return KVL_OK;
}

/* The codec's 16-lane loops against their element-by-element definitions: the bf16 rounding of
 * NaNs, infinities, overflow, ties and denormals (kvl__bf16_round), the widening back
 * (kvl__bf16_widen_n), and the finite-value scan over several whole 4096-element blocks, a
 * non-finite value in each block of either plane named at its element. */
static void test_span_vector_paths(void **state) {
    (void)state;
    enum { N = 300 };   /* 2 x 2 x 300 x 20 = 24000 elements: 5 whole blocks and a tail */
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 7) % 100;
    kvl__span_source src = {"vp", "", VP_LAYERS, 1, VP_ROW, N, ids, vpath_read, NULL, NULL, 1, 0, NULL};
    Kvlingo__V1__SpanHeader h = KVLINGO__V1__SPAN_HEADER__INIT;
    kvl__span_ids sid;
    uint8_t *p;
    size_t len;
    const size_t nf = (size_t)VP_LAYERS * N * VP_ROW;
    assert_int_equal(kvl__span_encode(&src, 0, N, "x", "", &sid, &h, &p, &len), KVL_OK);
    const uint16_t *e = (const uint16_t *)(const void *)p;
    float *wide = malloc(2 * nf * sizeof(float));
    assert_non_null(wide);
    kvl__bf16_widen_n(wide, e, 2 * nf);
    for (int plane = 0; plane < 2; plane++)
        for (int l = 0; l < VP_LAYERS; l++)
            for (int t = 0; t < N; t++)
                for (int i = 0; i < VP_ROW; i++) {
                    const size_t at = (size_t)plane * nf + ((size_t)l * N + t) * VP_ROW + i;
                    const uint16_t want = kvl__bf16_round(vpath_value(plane, l, t, i));
                    if (e[at] != want) fail_msg("bf16 element %zu: %04x, want %04x", at, e[at], want);
                    const uint32_t wbits = (uint32_t)want << 16;
                    uint32_t got;
                    memcpy(&got, &wide[at], sizeof got);
                    if (got != wbits) fail_msg("widened element %zu: %08x, want %08x", at, got, wbits);
                }
    free(wide);
    kvl__spanbuf_give(NULL, p);
    /* float32: finite values only (the scan's subject), then one non-finite value at a time */
    src.bf16 = 0;
    src.read_prenorm = test_read_finite;
    h = (Kvlingo__V1__SpanHeader)KVLINGO__V1__SPAN_HEADER__INIT;
    assert_int_equal(kvl__span_encode(&src, 0, N, "x", "", &sid, &h, &p, &len), KVL_OK);
    kvl__span_reject why;
    assert_int_equal(kvl__span_payload_check(&h, p, len, 100, NULL, &why), KVL_OK);
    float *kf = (float *)(void *)p;
    const size_t at[] = {4095, 4096, 8191, 8192, 12287, 16384, nf - 1, nf, nf + 4096, 2 * nf - 1};
    for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
        const float keep = kf[at[a]], keep2 = kf[at[3] + 5000];
        kf[at[a]] = a % 2 ? -INFINITY : NAN;
        if (a == 3) kf[at[a] + 5000] = NAN;   /* a later one too: the first is named */
        h.checksum = kvl__span_checksum(p, len);
        assert_int_equal(kvl__span_payload_check(&h, p, len, 100, NULL, &why), KVL_ERR_NUMERIC);
        char want[80];
        snprintf(want, sizeof want, "%s value at element %zu", at[a] < nf ? "K" : "V",
                 at[a] < nf ? at[a] : at[a] - nf);
        if (!strstr(kvl_last_error(), want)) fail_msg("poison at %zu: '%s'", at[a], kvl_last_error());
        kf[at[a]] = keep;
        kf[at[3] + 5000] = keep2;
    }
    kvl__spanbuf_give(NULL, p);
}

/* The span checksum goes through xxHash's run-time dispatch (AVX-512 / AVX2 where the CPU has
 * them) where the library has it: the hash must be the portable XXH3-64 of the same bytes, or
 * a node built without the dispatch would refuse every span of one built with it.  Sizes
 * around XXH3's internal boundaries (16, 128, 240 bytes, the 1 KB stripes, the 64 KB blocks)
 * and at unaligned starts. */
static void test_span_checksum_portable(void **state) {
    (void)state;
    const size_t max = (1u << 20) + 333;
    uint8_t *b = malloc(max + 8);
    assert_non_null(b);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < max + 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (uint8_t)x;
    }
    const size_t sizes[] = {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 1025, 65536, 65599, 1u << 20, max};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t off = 0; off < 8; off += 3)
            assert_true(kvl__span_checksum(b + off, sizes[i]) == XXH3_64bits(b + off, sizes[i]));
    free(b);
}

/* The rendezvous path (spans past the eager limit, or where UCX_RNDV_THRESH says so): the same
 * bytes arrive, and a message nobody receives is still dropped. */
static void test_send_rendezvous(void **state) {
    (void)state;
    assert_int_equal(setenv("UCX_RNDV_THRESH", "1mb", 1), 0);
    kvl__transport *a, *b;
    assert_int_equal(kvl__transport_create("ucx", &a), KVL_OK);
    assert_int_equal(kvl__transport_create("ucx", &b), KVL_OK);
    unsetenv("UCX_RNDV_THRESH");
    const uint8_t *addr;
    size_t alen;
    kvl__transport_address(b, &addr, &alen);
    const size_t n = 24u << 20;
    uint8_t *src = malloc(n), *dst = calloc(1, n);
    assert_true(src && dst);
    for (size_t j = 0; j < n; j++) src[j] = (uint8_t)(j * 13 + 5);
    uint64_t tag = kvl__transport_new_tag(b);
    kvl__transport_recv *r;
    size_t got;
    assert_int_equal(kvl__transport_recv_post(b, tag, dst, n, &r), KVL_OK);
    assert_int_equal(kvl__transport_send(a, addr, alen, tag, src, n, 10000, NULL, NULL, NULL, NULL), KVL_OK);
    assert_int_equal(kvl__transport_recv_wait(b, r, 10000, NULL, &got), KVL_OK);
    assert_int_equal(got, n);
    assert_memory_equal(src, dst, n);
    kvl__transport_recv_free(b, r, NULL, NULL);
    uint64_t dropped0 = kvl__transport_unmatched_dropped(b);
    assert_int_equal(kvl__transport_send(a, addr, alen, kvl__transport_new_tag(b), src, n, 5000, NULL, NULL, NULL, NULL),
                     KVL_OK);
    int64_t t0 = kvl__now_ms();
    while (kvl__transport_unmatched_dropped(b) < dropped0 + 1 && kvl__now_ms() - t0 < 5000) usleep(1000);
    assert_int_equal(kvl__transport_unmatched_dropped(b), dropped0 + 1);
    free(src);
    free(dst);
    kvl__transport_free(a);
    kvl__transport_free(b);
}

static atomic_int released, released_wrong;
/* Runs on the transport's progress thread with its lock held: no cmocka asserts here. */
static void on_release(void *arg, void *buf) {
    if (arg != &released) atomic_fetch_add(&released_wrong, 1);
    free(buf);   /* only now: the transport read it until here */
    atomic_fetch_add(&released, 1);
}

/* A send to a peer that stops taking data (a frozen process) times out, but UCX keeps reading
 * the buffer once the peer resumes: the buffer stays the transport's (kept) and comes back
 * through the release callback when the send ends, never earlier.  Freed at the timeout, the
 * sender crashed in ucp_dt_pack when the peer resumed. */
static void test_send_stalled_peer(void **state) {
    (void)state;
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {   /* the receiving peer: its address to the parent, then it idles */
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* a failed test in the parent takes it along */
        close(pfd[0]);
        kvl__transport *b = NULL;
        if (kvl__transport_create("ucx", &b) != KVL_OK) _exit(2);
        const uint8_t *addr;
        size_t alen;
        kvl__transport_address(b, &addr, &alen);
        uint32_t l32 = (uint32_t)alen;
        if (write(pfd[1], &l32, 4) != 4 || write(pfd[1], addr, alen) != (ssize_t)alen) _exit(3);
        for (;;) pause();
    }
    close(pfd[1]);
    uint32_t alen = 0;
    assert_int_equal(read(pfd[0], &alen, 4), 4);
    assert_true(alen > 0 && alen < 65536);
    uint8_t *addr = malloc(alen);
    assert_non_null(addr);
    size_t got = 0;
    while (got < alen) {
        ssize_t r = read(pfd[0], addr + got, alen - got);
        assert_true(r > 0);
        got += (size_t)r;
    }
    close(pfd[0]);
    kvl__transport *a = NULL;
    assert_int_equal(kvl__transport_create("ucx", &a), KVL_OK);
    assert_int_equal(kvl__transport_connect(a, addr, alen, 5000), KVL_OK);
    assert_int_equal(kill(child, SIGSTOP), 0);
    const size_t n = 24u << 20;
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    memset(buf, 0x3c, n);
    atomic_store(&released, 0);
    atomic_store(&released_wrong, 0);
    int kept = -1;
    kvl_status st = kvl__transport_send(a, addr, alen, kvl__transport_new_tag(a), buf, n, 500, NULL,
                                        on_release, &released, &kept);
    assert_int_not_equal(st, KVL_OK);   /* the frozen peer took too little in 500 ms */
    print_message("stalled send: status %d, kept %d\n", (int)st, kept);
    /* over shared memory (the same-host path) the send outlives a force-closed endpoint */
    assert_int_equal(kept, 1);
    assert_int_equal(kvl__transport_sends_kept(a), 1);
    usleep(200 * 1000);
    assert_int_equal(atomic_load(&released), 0);   /* not while the peer is still frozen */
    assert_int_equal(kill(child, SIGCONT), 0);
    int64_t t0 = kvl__now_ms();
    while (atomic_load(&released) == 0 && kvl__now_ms() - t0 < 20000) usleep(2000);
    assert_int_equal(atomic_load(&released), 1);   /* the peer took the rest; then it came back */
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    kvl__transport_free(a);   /* exactly once, not again at free */
    assert_int_equal(atomic_load(&released), 1);
    assert_int_equal(atomic_load(&released_wrong), 0);
    free(addr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_send_stalled_peer),
        cmocka_unit_test(test_peer_bound),
        cmocka_unit_test(test_span_checksum_portable),
        cmocka_unit_test(test_span_vector_paths),
        cmocka_unit_test(test_send_recv),
        cmocka_unit_test(test_send_rendezvous),
        cmocka_unit_test(test_span_codec),
        cmocka_unit_test(test_span_trailer),
        cmocka_unit_test(test_span_codec_bf16),
        cmocka_unit_test(test_spanbufs),
        cmocka_unit_test(test_spanbufs_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
