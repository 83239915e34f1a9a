/* tests/server/span_inject.c: a misbehaving exporter for the bad-input tests.  It announces a
 * real span of MODEL's K/V to a node (ImportSpan), then breaks the transfer on purpose:
 *   ok        send the payload as announced (control case)
 *   truncate  send 100 bytes fewer than announced
 *   oversize  send 64 bytes more than announced
 *   corrupt   flip one payload byte (the header keeps the original checksum)
 *   vanish    exit right after the node answered with its endpoint (peer gone mid-transfer)
 *   hang      never send; cancel the call after 300 ms
 *   stall     never send, keep the call open: print how the node ends it
 * Environment KVL_TICKET_HEX: a transfer ticket (hex) to put in the ImportSpan request.
 * usage: span_inject NODE_ADDR MODEL_DIR SESSION MODE [N_TOKENS]
 *        span_inject --flood NODE_ADDR COUNT BYTES   COUNT tagged UCX messages of BYTES each,
 *                             on tags 1..COUNT, to the node's transport address (from its
 *                             Info): what anybody who can call Info can aim at its transport
 *        span_inject --sink   a fake importer: prints "port=N", answers ImportSpan with a UCX
 *                             endpoint that never receives, then exits (importer gone
 *                             mid-transfer, seen from the exporter)
 *        span_inject --sink-redirect   a fake importer whose ImportSpan names the UCX address
 *                             of another worker than its Info's (a member aiming the span
 *                             elsewhere); prints "redirect_received=N" (bytes that reached
 *                             the other worker) when the call ends, then exits
 * Prints "code=<grpc status name> msg=<message>" of the ImportSpan call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/v1/node.pb-c.h"
#include "rpc.h"
#include "span.h"
#include "span_source.h"
#include "transport.h"

/* the kvld processes of the integration tests run plaintext (--insecure) */
static const kvl__rpc_tls plaintext = {.insecure = 1};

static int die(const char *what) {
    fprintf(stderr, "span_inject: %s: %s\n", what, kvl_last_error());
    return 1;
}

/* ---- sink mode: an importer that dies mid-transfer -------------------------------------- */

typedef struct sink {
    kvl__transport *t;
    kvl__transport *other;   /* redirect mode: the worker its ImportSpan names instead */
} sink;

/* Info as a node answers it: its model and its own transport address */
static void sink_info(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    sink *sk = user;
    Kvlingo__V1__InfoResponse out = KVLINGO__V1__INFO_RESPONSE__INIT;
    Kvlingo__V1__ModelId mid = KVLINGO__V1__MODEL_ID__INIT;
    mid.name = "qwen3-b";
    mid.hash = "";
    out.model = &mid;
    const uint8_t *a;
    size_t al;
    kvl__transport_address(sk->t, &a, &al);
    out.transport = "ucx";
    out.transport_address.data = (uint8_t *)a;
    out.transport_address.len = al;
    kvl__rpc_call_reply_pb(call, &out.base);
}

/* ImportSpan's first reply: the endpoint of worker t, tag 42 */
static void announce(kvl__rpc_call *call, kvl__transport *t) {
    Kvlingo__V1__ImportSpanResponse ep = KVLINGO__V1__IMPORT_SPAN_RESPONSE__INIT;
    const uint8_t *a;
    size_t al;
    kvl__transport_address(t, &a, &al);
    ep.transport = "ucx";
    ep.transport_address.data = (uint8_t *)a;
    ep.transport_address.len = al;
    ep.tag = 42;
    kvl__rpc_call_send_pb(call, &ep.base);
}

/* announce the other worker's endpoint, and report what reached it once the exporter ends
 * the call */
static void sink_redirect(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    sink *sk = user;
    static uint8_t buf[4 << 20];
    kvl__transport_recv *rv = NULL;
    if (kvl__transport_recv_post(sk->other, 42, buf, sizeof buf, &rv) != KVL_OK) _exit(die("recv_post"));
    announce(call, sk->other);
    size_t got = 0;
    kvl_status st = kvl__transport_recv_wait(sk->other, rv, 3000, NULL, &got);
    printf("redirect_received=%zu\n", st == KVL_OK ? got : (size_t)0);
    fflush(stdout);
    _exit(0);
}

/* announce an endpoint (a live UCX worker that never posts the receive), then die */
static void sink_import(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    sink *sk = user;
    announce(call, sk->t);
    usleep(200 * 1000);   /* the exporter is sending by now */
    fprintf(stderr, "span_inject sink: dying mid-transfer\n");
    _exit(0);
}

static int run_sink(int redirect) {
    sink sk = {0};
    if (kvl__transport_create("ucx", &sk.t)) return die("transport");
    if (redirect && kvl__transport_create("ucx", &sk.other)) return die("transport");
    kvl__rpc_server_params p = kvl__rpc_server_default_params();
    p.tls = &plaintext;
    kvl__rpc_server *srv;
    if (kvl__rpc_server_create(&p, &srv) ||
        kvl__rpc_server_add_method(srv, "/kvlingo.v1.Node/Info", KVL_RPC_UNARY, sink_info, &sk) ||
        kvl__rpc_server_add_method(srv, "/kvlingo.v1.Node/ImportSpan", KVL_RPC_SERVER_STREAM,
                                  redirect ? sink_redirect : sink_import, &sk) ||
        kvl__rpc_server_start(srv))
        return die("server");
    printf("port=%d\n", kvl__rpc_server_port(srv));
    fflush(stdout);
    sleep(120);   /* killed by the test or dies in sink_import */
    return 0;
}

/* ---- flood mode: unsolicited UCX messages ------------------------------------------------ */

/* A plaintext client of the node at addr and its Info (model identity, transport address);
 * NULL after saying why. */
static Kvlingo__V1__InfoResponse *node_info(const char *addr, kvl__rpc_client **cli) {
    if (kvl__rpc_client_create(addr, 0, &plaintext, cli)) {
        die("client");
        return NULL;
    }
    Kvlingo__V1__InfoRequest iq = KVLINGO__V1__INFO_REQUEST__INIT;
    ProtobufCMessage *ir;
    kvl__rpc_result res;
    if (kvl__rpc_client_unary_pb(*cli, "/kvlingo.v1.Node/Info", &iq.base,
                                &kvlingo__v1__info_response__descriptor, 10000, &ir, &res) ||
        res.code != GRPC_STATUS_OK) {
        die("Info");
        kvl__rpc_result_clear(&res);
        return NULL;
    }
    kvl__rpc_result_clear(&res);   /* ir is unpacked: it owns its memory */
    return (Kvlingo__V1__InfoResponse *)ir;
}

static int run_flood(const char *addr, long count, long bytes) {
    kvl__rpc_client *cli;
    Kvlingo__V1__InfoResponse *info = node_info(addr, &cli);
    if (!info) return 1;
    kvl__transport *t;
    if (kvl__transport_create("ucx", &t)) return die("transport");
    uint8_t *buf = calloc(1, (size_t)bytes + 1);
    long sent = 0;
    for (long i = 1; i <= count; i++) {
        buf[0] = (uint8_t)i;
        if (kvl__transport_send(t, info->transport_address.data, info->transport_address.len,
                                (uint64_t)i, buf, (size_t)bytes, 5000, NULL, NULL, NULL, NULL) == KVL_OK)
            sent++;
    }
    printf("sent=%ld\n", sent);
    fflush(stdout);
    usleep(200 * 1000);   /* let the last ones leave before the worker goes */
    kvl__transport_free(t);
    free(buf);
    protobuf_c_message_free_unpacked(&info->base, NULL);
    kvl__rpc_client_free(cli);
    return sent == count ? 0 : 1;
}

static size_t unhex(const char *hx, uint8_t *out, size_t cap) {
    size_t n = 0;
    for (; hx[0] && hx[1] && n < cap; hx += 2) {
        unsigned v;
        if (sscanf(hx, "%2x", &v) != 1) break;
        out[n++] = (uint8_t)v;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--sink")) return run_sink(0);
    if (argc == 2 && !strcmp(argv[1], "--sink-redirect")) return run_sink(1);
    if (argc == 5 && !strcmp(argv[1], "--flood")) return run_flood(argv[2], atol(argv[3]), atol(argv[4]));
    if (argc < 5) {
        fprintf(stderr, "usage: span_inject NODE_ADDR MODEL_DIR SESSION MODE [N_TOKENS]\n");
        return 2;
    }
    const char *addr = argv[1], *mode = argv[4];
    int n = argc > 5 ? atoi(argv[5]) : 12;
    kvl_model *m;
    if (kvl_model_load(argv[2], NULL, &m)) return die("model");
    kvl_cache *c;
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = n + 1;
    if (kvl_cache_create(kvl_model_config_get(m), &cp, &c)) return die("cache");
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) ids[i] = 200 + i;
    if (kvl_model_prefill(m, c, ids, n, KVL_LOGITS_NONE, NULL)) return die("prefill");
    kvl__rpc_client *cli;
    /* target identity from the node itself */
    Kvlingo__V1__InfoResponse *info = node_info(addr, &cli);
    if (!info) return 1;
    Kvlingo__V1__SpanHeader h = KVLINGO__V1__SPAN_HEADER__INIT;
    kvl__span_ids sid;
    uint8_t *payload;
    size_t plen;
    kvl__span_source src = test_span_source(m, c);
    if (kvl__span_encode(&src, 0, (uint32_t)n, info->model->name, info->model->hash, &sid, &h,
                        &payload, &plen))
        return die("encode");
    Kvlingo__V1__ImportSpanRequest rq = KVLINGO__V1__IMPORT_SPAN_REQUEST__INIT;
    rq.session_id = argv[3];
    rq.header = &h;
    static uint8_t ticket[2048];
    const char *thex = getenv("KVL_TICKET_HEX");
    if (thex && thex[0]) {
        rq.ticket.data = ticket;
        rq.ticket.len = unhex(thex, ticket, sizeof ticket);
    }
    size_t rl = kvlingo__v1__import_span_request__get_packed_size(&rq);
    uint8_t *rb = malloc(rl);
    kvlingo__v1__import_span_request__pack(&rq, rb);
    kvl__rpc_stream *st;
    if (kvl__rpc_client_stream_open(cli, "/kvlingo.v1.Node/ImportSpan", rb, rl, 20000, &st))
        return die("ImportSpan");
    uint8_t *msg;
    size_t ml;
    if (kvl__rpc_stream_read(st, &msg, &ml) == 1) {
        Kvlingo__V1__ImportSpanResponse *ep = kvlingo__v1__import_span_response__unpack(NULL, ml, msg);
        if (!ep) return die("endpoint");
        if (!strcmp(mode, "vanish")) _exit(0);   /* no cleanup: like a crashed process */
        kvl__transport *t;
        if (kvl__transport_create("ucx", &t)) return die("transport");
        size_t send_len = plen;
        uint8_t *buf = malloc(plen + 64);
        memcpy(buf, payload, plen);
        memset(buf + plen, 0, 64);
        if (!strcmp(mode, "truncate")) send_len = plen - 100;
        if (!strcmp(mode, "oversize")) send_len = plen + 64;
        if (!strcmp(mode, "corrupt")) buf[plen / 2] ^= 0x40;
        if (!strcmp(mode, "hang")) {
            usleep(300 * 1000);
            kvl__rpc_stream_cancel(st);
        } else if (!strcmp(mode, "stall")) {
            /* the announced span never comes: the node must end the import by itself */
        } else if (kvl__transport_send(t, ep->transport_address.data, ep->transport_address.len,
                                      ep->tag, buf, send_len, 10000, NULL, NULL, NULL, NULL)) {
            fprintf(stderr, "span_inject: send: %s\n", kvl_last_error());
        }
        kvl__rpc_result fin;
        kvl__rpc_stream_finish(st, &fin);
        printf("code=%s msg=%s\n", kvl__rpc_status_name(fin.code), fin.message);
        kvl__rpc_result_clear(&fin);
        kvl__transport_free(t);
        free(buf);
        kvlingo__v1__import_span_response__free_unpacked(ep, NULL);
        free(msg);
    } else {
        kvl__rpc_result fin;
        kvl__rpc_stream_finish(st, &fin);
        printf("code=%s msg=%s\n", kvl__rpc_status_name(fin.code), fin.message);
        kvl__rpc_result_clear(&fin);
    }
    kvl__rpc_stream_free(st);
    free(rb);
    free(payload);
    protobuf_c_message_free_unpacked(&info->base, NULL);
    kvl__rpc_client_free(cli);
    kvl_cache_free(c);
    free(ids);
    kvl_model_free(m);
    return 0;
}
