/* daemon/continue.c: ContinueTurn, the one Node call of a turn on the router's critical path.
 *
 *   check the session against the router's ledger (count and SHA-256 of the ids it holds)
 *   -> pull the span it lacks from the peer holding the context: post a transport receive,
 *      then ExportSpan on the peer in push mode, which sends the payload straight to it and
 *      answers the header; check, translate and keep it here (an older peer instead pushes it
 *      through ImportSpan, span_service.c)
 *   -> append the ledger tokens still missing and the turn's input
 *   -> stream the turn (kvld_stream_turn, service.c), the final message saying how the
 *      context was made whole and where the time to first token went (ContinueResult).
 *
 * Compared with the router driving SessionInfo x2, ExportSpan, Append and Generate itself,
 * three round trips leave the critical path, and this node starts its forward the moment the
 * import lands.  A pull that fails leaves the session as it was (an import is atomic) and the
 * missing tokens are prefilled from the ledger tokens that came with the request: the turn is
 * never lost to a failed switch, and the result names the reason.  Only a session that holds
 * other tokens than the ledger says is refused (FAILED_PRECONDITION, before any token): the
 * caller resets it. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "hash.h"
#include "kvlingo/v1/node.pb-c.h"
#include "log.h"
#include "node.h"
#include "span.h"

typedef struct cont {
    kvld_req r;
    kvld_node *n;
    const Kvlingo__V1__ContinueRequest *in;
    Kvlingo__V1__ContinueResult res;
    char fallback[400];
    int absent;                  /* the session is not on this node (yet) */
    int cached;                  /* tokens in its KV cache before the turn */
    int imported;                /* of them, translated from spans */
} cont;

static void set_fallback(cont *c, grpc_status_code code, const char *msg) {
    char label[48];
    const char *name = kvl__rpc_status_name(code);
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof label; i++) label[i] = (char)tolower((unsigned char)name[i]);
    label[i] = 0;
    /* the router's fallback labels: the source not holding what its ledger says is its state */
    const char *code_name = code == GRPC_STATUS_FAILED_PRECONDITION && strstr(msg, "the ledger says")
                                ? "source_state"
                          : code == GRPC_STATUS_OUT_OF_RANGE && strstr(msg, "cached tokens")
                                ? "source_behind"
                          : code == GRPC_STATUS_DEADLINE_EXCEEDED ? "export_deadline"
                          : code == GRPC_STATUS_UNAVAILABLE ? "export_failed"
                                                            : NULL;
    if (code_name) snprintf(c->fallback, sizeof c->fallback, "%s: %s", code_name, msg);
    else snprintf(c->fallback, sizeof c->fallback, "rejected_%s: %s", label, msg);
    c->res.fallback = c->fallback;
}

/* The session as the ledger says: 1 when it matches (or is absent with held = 0), 0 with the
 * call answered FAILED_PRECONDITION / the error otherwise. */
static int check_state(cont *c) {
    const Kvlingo__V1__ContinueRequest *in = c->in;
    kvld_session_info si;
    kvl_status st = kvld_sessions_info(c->n->sessions, in->session_id, &si);
    if (st == KVL_ERR_NOT_FOUND) {
        kvl_clear_error();
        if (in->held == 0) {
            c->absent = 1;
            return 1;
        }
        kvld_req_end(&c->r, GRPC_STATUS_FAILED_PRECONDITION, "session unknown here; the ledger says "
                     "this node holds some of it", NULL);
        return 0;
    }
    if (st != KVL_OK) {
        kvld_req_fail(&c->r, st, NULL);
        return 0;
    }
    const char *why = NULL;
    char msg[256];
    if (si.state != KVLD_IDLE) why = "busy";
    else if ((uint32_t)si.n_ledger != in->held) why = "count";
    else if (in->held > 0 && (!in->held_sha256 || strcmp(si.tokens_sha256, in->held_sha256))) why = "ids";
    else if (in->native_only && si.n_imported > 0) why = "translated";
    if (!why) {
        c->cached = si.n_cached;
        c->imported = si.n_imported;
        return 1;
    }
    if (in->held == 0 && si.state == KVLD_IDLE) {
        /* the whole context came with the request: start this node's copy afresh, unless a
         * request (a push's import) took the session since it was looked at */
        kvl_status ds = kvld_sessions_drop_idle(c->n->sessions, in->session_id);
        if (ds == KVL_OK || ds == KVL_ERR_NOT_FOUND) {
            c->absent = 1;
            return 1;
        }
        why = "busy";
    }
    snprintf(msg, sizeof msg, "session '%s' holds %d tokens (%s, %d translated), the ledger says %u: %s",
             in->session_id, si.n_ledger, kvld_state_name(si.state), si.n_imported, in->held,
             !strcmp(why, "ids") ? "other ids" : !strcmp(why, "translated")
                                                     ? "translated K/V are not trusted for this pair"
                                                     : why);
    kvld_req_end(&c->r, GRPC_STATUS_FAILED_PRECONDITION, msg, NULL);
    return 0;
}

/* After the source's answer: the fallback reason of a failed call, or 0 when it shipped
 * [cached, t1) (t1 == cached: this node already caches all the source does, a span pushed
 * ahead, and nothing moved). */
static int pull_answered(cont *c, const char *source, kvl_status st, const kvl__rpc_result *rr,
                         const Kvlingo__V1__ExportSpanResponse *resp) {
    const char *rmsg = st != KVL_OK ? kvl_last_error() : rr->message ? rr->message : "";
    if ((st != KVL_OK || rr->code == GRPC_STATUS_UNAVAILABLE) && !strstr(rmsg, c->n->self)) {
        /* the call to the source failed, not its transfer to this node (whose messages name
         * this node): the router takes the source for down */
        snprintf(c->fallback, sizeof c->fallback, "source_unavailable: %s: %s", source, rmsg);
        c->res.fallback = c->fallback;
        return 1;
    }
    if (rr->code != GRPC_STATUS_OK) {
        set_fallback(c, rr->code, rmsg);
        return 1;
    }
    if (resp->t0 != (uint32_t)c->cached) {
        char m[160];
        snprintf(m, sizeof m, "the peer shipped [%u, %u), this node caches %d", resp->t0, resp->t1, c->cached);
        set_fallback(c, GRPC_STATUS_OUT_OF_RANGE, m);
        return 1;
    }
    return 0;
}

static void pull_shipped(cont *c, const Kvlingo__V1__ExportSpanResponse *resp, double translate_s) {
    c->res.mode = KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE;
    c->res.span_t0 = resp->t0;
    c->res.span_t1 = resp->t1;
    c->res.transfer_seconds = resp->transfer_seconds;
    c->res.translate_seconds = translate_s;
    c->res.export_seconds = resp->export_seconds;
}

/* Push mode: post the receive first, then ask the source to send straight to it; the span is
 * checked and translated here, on this call's thread.  One node-to-node call, no ImportSpan
 * back and no verdict: the source's answer carries the header the payload is checked against
 * (its xxh3-64 came over the authenticated channel), and the receive's tag is random and
 * known only to the two nodes.
 *
 * The source sends the header behind the payload as well (push_trailer), so the span is
 * checked and translated the moment its bytes land, while the answer is on its way (one
 * node-to-node trip less before the forward pass); it is kept only when the answer carries
 * the same header, byte for byte, and taken back out of the cache otherwise.  When the answer
 * comes first (a refusal, an empty span, a source that sends no trailer), the span waits for
 * it as before. */
typedef struct pull_rx {
    kvl__transport_recv *rv;
    uint8_t *buf;              /* [cap]: the payload, then the trailer                        */
    size_t cap, got;
    kvl_status st;             /* the receive's outcome, once done                           */
    double wait_s;             /* bytes before the answer: from the request to the last byte; */
                               /*   after it: from the answer to the last byte               */
    size_t plen;               /* the payload's bytes: got less the trailer                  */
    const uint8_t *raw;        /* the trailer's packed header inside buf (NULL: none)        */
    size_t raw_len;
} pull_rx;

/* After the receive: where the payload ends and the trailer's header is, if there is one. */
static void find_trailer(pull_rx *rx) {
    rx->plen = rx->got;
    rx->raw = NULL;
    rx->raw_len = 0;
    kvl__span_trailer_find(rx->buf, rx->got, &rx->plen, &rx->raw, &rx->raw_len);   /* sets all or none */
}

/* 1 when the answer's header packs to exactly the trailer's bytes. */
static int same_header(const Kvlingo__V1__SpanHeader *h, const uint8_t *raw, size_t raw_len) {
    if (!h || !raw) return 0;
    size_t n = kvlingo__v1__span_header__get_packed_size(h);
    if (n != raw_len) return 0;
    uint8_t *b = malloc(n ? n : 1);
    if (!b) return 0;
    kvlingo__v1__span_header__pack(h, b);
    int same = memcmp(b, raw, n) == 0;
    free(b);
    return same;
}

/* How long the pull drives the receive between looks at the source's answer.  A look polls
 * gRPC's sockets, which on a small host takes the CPU from the two threads moving the span
 * (the source's send and this receive): measured on 2 cores (bench_switch.py, qwen3-a ->
 * qwen3-b, 512 tokens, 1 MB), the source's send took 0.35-0.74 ms with a look every 200 us and
 * 0.17-0.21 ms with one every 1.5 ms; in an A/B of both kinds of turn interleaved in one fleet,
 * looks every 1 ms and every 1.5 ms made the switch alike, 0.25-0.5 ms faster than every
 * 200 us.  In push mode the bytes come before the answer, so only an answer that comes without
 * bytes (a refusal, a failure, nothing to ship) is seen up to this much later. */
#define PULL_LOOK_US 1000

static void pull_push(cont *c, kvl__rpc_client *cli, const char *src_name, const char *src_hash,
                      int64_t tmo, Kvlingo__V1__ExportSpanRequest *er) {
    kvld_node *n = c->n;
    const Kvlingo__V1__SpanPull *p = c->in->pull;
    const kvld_translator_entry *te = kvld_translators_find(&n->translators, src_name, src_hash);
    char m[400];
    if (!te) {
        snprintf(m, sizeof m, "no translator from source model '%s' (hash %s) to '%s' on this node", src_name,
                 src_hash, kvl_model_name(n->model));
        set_fallback(c, GRPC_STATUS_FAILED_PRECONDITION, m);
        return;
    }
    /* the receive holds what the ledger says the source holds past this node's cache */
    uint64_t max = kvl__span_payload_bytes((uint32_t)te->src_layers, (uint32_t)te->src_kv_heads,
                                           (uint32_t)te->src_head_dim, p->source_tokens - (uint32_t)c->cached);
    kvld_session *s = NULL;
    int created = 0, landed = 0, pending = 0, drop = 0;
    pull_rx rx = {0};
    kvl__rpc_unary *call = NULL;
    Kvlingo__V1__ExportSpanResponse *resp = NULL;
    Kvlingo__V1__SpanHeader *th = NULL;   /* the trailer's header */
    const int32_t *ids = NULL;
    kvl__rpc_result rr = {0};
    kvld_span_err e = {0};
    if (!max || max > SIZE_MAX - KVL_SPAN_TRAILER_MAX) {
        snprintf(m, sizeof m, "a span of %u tokens of '%s' is beyond the span limits",
                 p->source_tokens - (uint32_t)c->cached, src_name);
        set_fallback(c, GRPC_STATUS_OUT_OF_RANGE, m);
        return;
    }
    kvl_status st = kvld_session_acquire(n->sessions, c->in->session_id, KVLD_IMPORT, 1, &s, &created);
    if (st != KVL_OK) {
        set_fallback(c, kvl__rpc_status_from_kvl(st), kvl_last_error());
        return;
    }
    if (created) {
        kvld_metrics_add(n->metrics, KVLD_C_SESSIONS_OPENED, 1);
        kvld_metrics_set(n->metrics, KVLD_G_SESSIONS, kvld_sessions_count(n->sessions));
    }
    rx.cap = (size_t)max + KVL_SPAN_TRAILER_MAX;
    if (!(rx.buf = kvl__spanbuf_take(n->spanbufs, rx.cap))) {
        snprintf(m, sizeof m, "cannot allocate %zu bytes for the span", rx.cap);
        set_fallback(c, GRPC_STATUS_RESOURCE_EXHAUSTED, m);
        goto out;
    }
    er->push_tag = kvl__transport_new_tag(n->transport);
    er->push_max_bytes = rx.cap;
    er->push_trailer = 1;
    {
        const uint8_t *my_addr;
        size_t my_len;
        kvl__transport_address(n->transport, &my_addr, &my_len);
        er->push_address_hash = kvl__xxh3_64(my_addr, my_len);
    }
    if (kvl__transport_recv_post(n->transport, er->push_tag, rx.buf, rx.cap, &rx.rv) != KVL_OK) {
        set_fallback(c, GRPC_STATUS_UNAVAILABLE, kvl_last_error());
        goto out;
    }
    double t_w = kvl__now_s();
    st = kvl__rpc_unary_start_pb(cli, "/kvlingo.v1.Node/ExportSpan", &er->base, tmo + 1000, &call);
    if (st != KVL_OK) {
        snprintf(c->fallback, sizeof c->fallback, "source_unavailable: %s: %s", p->source, kvl_last_error());
        c->res.fallback = c->fallback;
        goto out;
    }
    /* the bytes or the answer, whichever comes first; the call's deadline bounds the loop.
     * While the span is due (its export and transfer: 2 ms plus 1 ms per 2 MB) this thread
     * drives the receive itself, which sees the last byte at once, and looks at the call every
     * PULL_LOOK_US; after that it sleeps in the call's queue a millisecond at a time (a slow or
     * hung source costs no core) and looks at the receive between naps */
    int have_bytes = 0;
    const double spin_until = t_w + 0.002 + (double)rx.cap / 2e9;
    for (;;) {
        if (kvl__now_s() < spin_until) {
            if ((have_bytes = kvl__transport_recv_poll(n->transport, rx.rv, PULL_LOOK_US))) break;
            if (kvl__rpc_unary_wait(call, 0)) break;
        } else {
            if (kvl__rpc_unary_wait(call, 1)) break;
            if ((have_bytes = kvl__transport_recv_poll(n->transport, rx.rv, 0))) break;
            if (kvl__rpc_call_cancelled(c->r.call)) {
                /* the client went away while the source is slow: stop waiting for it.  The
                 * span is not imported; the turn goes on as for any failed pull (its input is
                 * appended, as the router commits it for a cancelled turn) and its cancel ends
                 * the generation at once */
                kvl__rpc_unary_cancel(call);
                set_fallback(c, GRPC_STATUS_CANCELLED, "the client cancelled the turn during the pull");
                goto out;
            }
        }
    }
    double early_tr_s = 0;
    if (have_bytes) {
        rx.wait_s = kvl__now_s() - t_w;
        rx.st = kvl__transport_recv_wait(n->transport, rx.rv, 0, NULL, &rx.got);
        if (rx.st == KVL_OK) find_trailer(&rx);
        const kvld_translator_entry *te_h = NULL;
        kvld_span_err pe = {0};
        /* translated now, kept once the answer agrees; a trailer this node refuses is left to
         * the answer's header, which gets the same checks below */
        if (rx.raw && (th = kvlingo__v1__span_header__unpack(NULL, rx.raw_len, rx.raw)) &&
            th->t0 == (uint32_t)c->cached && kvld_span_check_header(n, th, max, &te_h, &pe) &&
            kvld_span_check_range(s, th, 0, &pe) &&
            kvld_span_land_pending(n, s, te_h, th, rx.buf, rx.plen, &early_tr_s, &ids, &pe))
            pending = 1;
        else if (rx.raw)
            kvl__svc_log("debug", "msg=span_trailer_refused session=%s why=%s detail=\"%s\"", s->id,
                         kvl__span_reject_name(pe.why), pe.why != KVL_SPAN_OK ? pe.msg : "no header or range");
    }
    st = kvl__rpc_unary_finish_pb(call, &kvlingo__v1__export_span_response__descriptor,
                                  (ProtobufCMessage **)&resp, &rr);
    call = NULL;
    if (pull_answered(c, p->source, st, &rr, resp)) goto out;
    if (resp->t1 == resp->t0) {
        pull_shipped(c, resp, 0);
        goto out;
    }
    const Kvlingo__V1__SpanHeader *h = resp->header;
    if (!h || h->t0 != resp->t0 || h->t1 != resp->t1) {
        set_fallback(c, GRPC_STATUS_INTERNAL, "the source answered no header for the span it sent");
        goto out;
    }
    if (pending && same_header(h, rx.raw, rx.raw_len)) {
        kvld_span_commit(n, s, th, ids);
        pending = 0;
        landed = 1;
        kvld_metrics_observe(n->metrics, KVLD_H_TRANSFER_SECONDS, resp->transfer_seconds);
        kvld_metrics_add(n->metrics, KVLD_C_SPAN_BYTES_RECEIVED, rx.plen);
        pull_shipped(c, resp, early_tr_s);   /* the wire: the source's send, as it timed it */
        kvl__svc_log("debug", "msg=span_landed session=%s source=%s t0=%u t1=%u bytes=%zu wait_ms=%.3f "
                     "translate_ms=%.3f early=1", s->id, src_name, h->t0, h->t1, rx.plen, rx.wait_s * 1e3,
                     early_tr_s * 1e3);
        goto out;
    }
    if (pending) {
        /* the answer's header is another (or packs otherwise): the translation made on the
         * trailer's goes, and the bytes are checked against the answer's below */
        pending = 0;
        kvl__svc_log("warn", "msg=span_trailer_differs session=%s source=%s: the header behind the span "
                     "differs from the source's answer; checked against the answer instead", s->id, src_name);
        if (kvld_span_unland(s, th) != KVL_OK) {
            drop = 1;
            set_fallback(c, GRPC_STATUS_INTERNAL, kvl_last_error());
            goto out;
        }
    }
    if (!have_bytes) {
        /* sent before it answered: the payload is here or about to be */
        double t_a = kvl__now_s();
        int64_t wait_ms = n->cfg.import_timeout_ms + (int64_t)(max / 100000);
        rx.st = kvl__transport_recv_wait(n->transport, rx.rv, wait_ms, NULL, &rx.got);
        if (rx.st == KVL_OK) find_trailer(&rx);
        rx.wait_s = kvl__now_s() - t_a;
    } else {
        rx.wait_s = 0;   /* here before the answer: the source's send is the wire */
    }
    if (rx.st != KVL_OK) {
        e.why = rx.st == KVL_ERR_RANGE ? KVL_SPAN_TRUNCATED : KVL_SPAN_TRANSFER;
        snprintf(m, sizeof m, "the span [%u, %u) the source sent did not arrive here: %s", h->t0, h->t1,
                 kvl_last_error());
        set_fallback(c, rx.st == KVL_ERR_RANGE ? GRPC_STATUS_DATA_LOSS : GRPC_STATUS_UNAVAILABLE, m);
        goto out;
    }
    kvld_metrics_observe(n->metrics, KVLD_H_TRANSFER_SECONDS, resp->transfer_seconds + rx.wait_s);
    kvld_metrics_add(n->metrics, KVLD_C_SPAN_BYTES_RECEIVED, rx.plen);
    double tr_s = 0;
    const kvld_translator_entry *te_h = NULL;
    if (!kvld_span_check_header(n, h, max, &te_h, &e) || !kvld_span_check_range(s, h, 0, &e) ||
        !kvld_span_land(n, s, te_h, h, rx.buf, rx.plen, &tr_s, &e)) {
        set_fallback(c, e.code, e.msg);
        goto out;
    }
    landed = 1;
    pull_shipped(c, resp, tr_s);
    c->res.transfer_seconds += rx.wait_s;
    kvl__svc_log("debug", "msg=span_landed session=%s source=%s t0=%u t1=%u bytes=%zu wait_ms=%.3f "
                 "translate_ms=%.3f early=0", s->id, src_name, h->t0, h->t1, rx.plen, rx.wait_s * 1e3,
                 tr_s * 1e3);
out:
    if (call) {   /* a failure before its answer was taken: the answer is not needed */
        kvl__rpc_result dropped;
        kvl__rpc_unary_finish(call, &dropped);
        kvl__rpc_result_clear(&dropped);
    }
    if (pending && kvld_span_unland(s, th) != KVL_OK) drop = 1;   /* not as it was: it goes */
    if (e.why != KVL_SPAN_OK) kvld_metrics_reject(n->metrics, e.why);
    if (th) kvlingo__v1__span_header__free_unpacked(th, NULL);
    kvld_span_import_end(n, rx.rv, rx.buf, s, drop || (created && !landed));
    kvl__rpc_result_clear(&rr);
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
}

/* Ask the peer to send the span [cached, what it caches) here: in push mode when it can, else
 * it pushes it through ImportSpan (an older node). */
static void pull(cont *c) {
    kvld_node *n = c->n;
    const Kvlingo__V1__SpanPull *p = c->in->pull;
    double t0 = kvl__now_s();
    /* the caller's deadline, within this node's own bound on a transfer */
    int64_t tmo = p->timeout_ms && (int64_t)p->timeout_ms < n->cfg.span_timeout_ms ? (int64_t)p->timeout_ms
                                                                                : n->cfg.span_timeout_ms;
    kvl__rpc_client *cli = NULL;
    kvl_status st = KVL_OK;
    if (!p->source || !p->source[0] || !kvld_node_peer_allowed(n, p->source)) {
        char m[300];
        snprintf(m, sizeof m, "pull source '%s' is not a member of this node's fleet (--peers)",
                 p->source ? p->source : "");
        set_fallback(c, GRPC_STATUS_PERMISSION_DENIED, m);
        return;
    }
    kvld_peer_model pm;
    st = kvld_node_peer(n, p->source, tmo, &cli, &pm);
    if (st != KVL_OK) {
        set_fallback(c, GRPC_STATUS_UNAVAILABLE, kvl_last_error());
        return;
    }
    Kvlingo__V1__ExportSpanRequest er = KVLINGO__V1__EXPORT_SPAN_REQUEST__INIT;
    er.session_id = c->in->session_id;
    er.from = (uint32_t)c->cached;
    er.to = p->source_tokens;
    er.to_cached = 1;
    er.peer = n->self;
    er.timeout_ms = (uint32_t)tmo;
    er.ticket = p->ticket;
    er.expect_tokens = p->source_tokens;
    er.expect_sha256 = p->source_sha256;
    /* this node rounds the span to bf16 before its maps multiply it: half the bytes on the wire,
     * pushed here or sent through ImportSpan alike */
    const kvld_translator_entry *te = kvld_translators_find(&n->translators, pm.name, pm.hash);
    er.wire_bf16 = te && kvl_translator_bf16_products(te->tr, n->model);
    uint8_t addr[KVLD_PEER_TRANSPORT_MAX];
    size_t alen = 0;
    int push = 0;
    if (n->transport && n->cfg.span_push &&
        kvld_node_peer_transport(n, p->source, addr, sizeof addr, &alen, &push) == KVL_OK && push) {
        pull_push(c, cli, pm.name, pm.hash, tmo, &er);
        c->res.pull_seconds = kvl__now_s() - t0;
        kvld_node_peer_release(n, p->source);
        return;
    }
    kvl_clear_error();
    Kvlingo__V1__ExportSpanResponse *resp = NULL;
    kvl__rpc_result rr = {0};
    st = kvl__rpc_client_unary_pb(cli, "/kvlingo.v1.Node/ExportSpan", &er.base,
                                  &kvlingo__v1__export_span_response__descriptor, tmo + 1000,
                                  (ProtobufCMessage **)&resp, &rr);
    c->res.pull_seconds = kvl__now_s() - t0;
    if (!pull_answered(c, p->source, st, &rr, resp)) pull_shipped(c, resp, resp->translate_seconds);
    kvl__rpc_result_clear(&rr);
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    kvld_node_peer_release(n, p->source);
}

/* After the pull: does the session hold ledger ids, and how many?  Returns the tokens it
 * holds that agree with the ledger (>= held), or -1 when it holds something else. */
static int agreed(const cont *c, const kvld_session *s) {
    const Kvlingo__V1__ContinueRequest *in = c->in;
    int nl = s->n_ledger, held = (int)in->held;
    if (nl < held || (size_t)(nl - held) > in->n_context) return -1;
    if (held > 0) {
        char have[65];
        kvl__tokens_sha256_hex(s->ledger, (size_t)held, have);
        if (!in->held_sha256 || strcmp(have, in->held_sha256)) return -1;
    }
    if (nl > held && memcmp(s->ledger + held, in->context, sizeof(int32_t) * (size_t)(nl - held))) return -1;
    return nl;
}

/* pull_only: the final message only, its result saying what the node holds now (the pull's
 * span translated, or the session as it was with the reason in `fallback`); nothing is
 * prefilled or generated. */
static void answer_pull_only(cont *c) {
    kvld_node *n = c->n;
    Kvlingo__V1__ContinueResult *res = &c->res;
    if (res->mode != KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE)
        res->mode = KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_NONE;
    char sha[65] = "";
    kvld_session_info si;
    kvl_status st = kvld_sessions_info(n->sessions, c->in->session_id, &si);
    if (st == KVL_OK) {
        res->token_count = (uint32_t)si.n_ledger;
        res->cached_count = (uint32_t)si.n_cached;
        snprintf(sha, sizeof sha, "%s", si.tokens_sha256);
        if (res->mode != KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE && si.n_ledger > (int)c->in->held &&
            si.n_imported > 0) {
            /* the peer's verdict was lost but its span landed whole (an import is atomic): said
             * as translated, and the caller checks the ids by the hash */
            res->mode = KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE;
            res->span_t0 = (uint32_t)c->cached;
            res->span_t1 = (uint32_t)si.n_ledger;
        }
    } else {
        kvl_clear_error();   /* the pull made none: the node holds nothing of the session */
        kvl__tokens_sha256_hex(NULL, 0, sha);
    }
    res->tokens_sha256 = sha;
    Kvlingo__V1__GenerateResponse fin = KVLINGO__V1__GENERATE_RESPONSE__INIT;
    fin.text = (char *)"";
    fin.done = 1;
    fin.finish_reason = (char *)"pull_only";
    fin.total_seconds = kvl__now_s() - c->r.t0;
    fin.result = res;
    char extra[300];
    snprintf(extra, sizeof extra, " pull_only=1 mode=%s span=%u pull_ms=%.3f translate_ms=%.3f%s%s",
             res->mode == KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE ? "translate" : "none",
             res->span_t1 - res->span_t0, res->pull_seconds * 1e3, res->translate_seconds * 1e3,
             res->fallback && res->fallback[0] ? " fallback=" : "", res->fallback ? res->fallback : "");
    if (kvl__rpc_call_send_pb(c->r.call, &fin.base) != KVL_OK) {
        kvld_req_end(&c->r, GRPC_STATUS_CANCELLED, "the caller went before the answer", extra);
        return;
    }
    kvl__rpc_call_finish(c->r.call, GRPC_STATUS_OK, NULL);
    kvld_req_end(&c->r, GRPC_STATUS_OK, NULL, extra);
}

void kvld_rpc_continue(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvld_node *n = user;
    cont c;
    memset(&c, 0, sizeof c);
    c.n = n;
    kvlingo__v1__continue_result__init(&c.res);
    kvld_req_begin(&c.r, n, call, "ContinueTurn");
    Kvlingo__V1__ContinueRequest *in = kvlingo__v1__continue_request__unpack(NULL, len, req);
    if (!in) {
        kvld_req_end(&c.r, GRPC_STATUS_INVALID_ARGUMENT, "malformed ContinueRequest (protobuf does not parse)",
                     NULL);
        return;
    }
    c.in = in;
    snprintf(c.r.session, sizeof c.r.session, "%s", in->session_id ? in->session_id : "");
    if (kvld_req_refuse_if_draining(&c.r)) goto done;
    kvld_gen_params gp;
    kvl_status st = KVL_OK;
    if (in->pull_only) {
        if (!in->pull || !in->pull->source_tokens)
            st = kvl__errorf(KVL_ERR_INVALID_ARG, "ContinueRequest.pull_only needs a pull");
        else if (in->native_only)
            st = kvl__errorf(KVL_ERR_INVALID_ARG, "ContinueRequest.pull_only imports translated K/V: "
                            "native_only cannot go with it");
        else if (in->n_context || in->n_input)
            st = kvl__errorf(KVL_ERR_INVALID_ARG, "ContinueRequest.pull_only takes no context and no input "
                            "(%zu and %zu tokens given)", in->n_context, in->n_input);
        else if (in->pull->source_tokens <= in->held)
            st = kvl__errorf(KVL_ERR_INVALID_ARG, "ContinueRequest.pull_only: the source holds %u tokens, "
                            "this node %u already: nothing to pull", in->pull->source_tokens, in->held);
    } else if (!in->generate) {
        st = kvl__errorf(KVL_ERR_INVALID_ARG, "ContinueRequest.generate is required");
    } else {
        st = kvld_gen_params_from_pb(n, in->generate, &gp);
    }
    const int vocab = kvl_model_config_get(n->model)->vocab_size;
    for (size_t i = 0; st == KVL_OK && i < in->n_context; i++)
        if (in->context[i] < 0 || in->context[i] >= vocab)
            st = kvl__errorf(KVL_ERR_INVALID_ARG, "context[%zu] has id %d outside the vocabulary [0, %d)", i,
                            in->context[i], vocab);
    for (size_t i = 0; st == KVL_OK && i < in->n_input; i++)
        if (in->input[i] < 0 || in->input[i] >= vocab)
            st = kvl__errorf(KVL_ERR_INVALID_ARG, "input[%zu] has id %d outside the vocabulary [0, %d)", i,
                            in->input[i], vocab);
    /* a turn needs room for one generated token past its input (the scheduler's rule) */
    if (st == KVL_OK && (uint64_t)in->held + in->n_context + in->n_input + (in->pull_only ? 0 : 1) >
                            (uint64_t)n->max_context)
        st = kvl__errorf(KVL_ERR_RANGE, "input too long: %u held + %zu context + %zu input tokens %s the "
                        "max context of %d tokens (--max-context)%s", in->held, in->n_context, in->n_input,
                        in->pull_only ? "exceed" : "reach", n->max_context,
                        in->pull_only ? "" : ", with no room to generate");
    if (st == KVL_OK && in->n_context + in->n_input == 0 && in->held == 0 && !in->pull_only)
        st = kvl__errorf(KVL_ERR_INVALID_ARG, "nothing to continue: no context and no input");
    if (st != KVL_OK) {
        kvld_req_fail(&c.r, st, NULL);
        goto done;
    }
    if (!check_state(&c)) goto done;
    if (in->pull && in->pull->source_tokens > in->held) {
        if (c.imported > 0 && in->pull->source_tokens == (uint32_t)c.cached + 1) {
            /* A span pushed ahead: this node caches all the source did but the last sampled
             * token, which the source normally has not run through its model either, so asking
             * would cost a round trip for an empty answer.  The token comes with the request and
             * is prefilled with the turn's input (natively, where a source that had cached it
             * would have shipped it translated).  The source is not asked, so a source that is
             * down is not noticed by this turn. */
            c.res.mode = KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE;
            c.res.span_t0 = c.res.span_t1 = (uint32_t)c.cached;
        } else {
            pull(&c);
        }
    }
    if (in->pull_only) {
        answer_pull_only(&c);
        goto done;
    }
    /* the session, created here when neither it nor an import existed */
    kvld_session *s = NULL;
    int created = 0;
    st = kvld_session_acquire(n->sessions, in->session_id, KVLD_DECODE, 1, &s, &created);
    if (st != KVL_OK) {
        kvld_req_fail(&c.r, st, NULL);
        goto done;
    }
    if (created) {
        kvld_metrics_add(n->metrics, KVLD_C_SESSIONS_OPENED, 1);
        kvld_metrics_set(n->metrics, KVLD_G_SESSIONS, kvld_sessions_count(n->sessions));
    }
    int have = agreed(&c, s);
    if (have < 0) {
        /* an import brought other ids than the ledger's (the token hash the source checked
         * should make this impossible): nothing of it may be decoded */
        char id[KVLD_ID_MAX];
        snprintf(id, sizeof id, "%s", s->id);
        int nl = s->n_ledger;
        kvld_session_release_drop(n->sessions, s);
        char m[200];
        snprintf(m, sizeof m, "session '%s' holds %d tokens after the pull, not the ledger's ids: dropped",
                 id, nl);
        kvld_req_end(&c.r, GRPC_STATUS_FAILED_PRECONDITION, m, NULL);
        goto done;
    }
    if (c.res.mode != KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE && have > (int)in->held &&
        s->n_imported > 0) {
        /* the peer's verdict was lost but its span landed whole (checked above): keep it */
        c.res.mode = KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE;
        c.res.span_t0 = (uint32_t)c.cached;
        c.res.span_t1 = (uint32_t)have;
    }
    const size_t from_ctx = (size_t)(have - (int)in->held);
    const size_t n_new = in->n_context - from_ctx + in->n_input;
    if ((size_t)s->n_ledger + n_new + 1 > (size_t)s->max_context) {
        /* the session may have been opened with a smaller max context than the node's */
        st = kvl__errorf(KVL_ERR_RANGE, "input too long: %zu new tokens + %d held reach the session's "
                        "max context of %d tokens, with no room to generate", n_new, have, s->max_context);
        kvld_session_release(n->sessions, s);
        kvld_req_fail(&c.r, st, NULL);
        goto done;
    }
    const size_t n_ctx_new = in->n_context - from_ctx;
    if (n_ctx_new > 0) memcpy(s->ledger + s->n_ledger, in->context + from_ctx, sizeof(int32_t) * n_ctx_new);
    if (in->n_input > 0) memcpy(s->ledger + s->n_ledger + n_ctx_new, in->input, sizeof(int32_t) * in->n_input);
    if (n_new > 0) __atomic_store_n(&s->n_ledger, s->n_ledger + (int)n_new, __ATOMIC_RELAXED);
    if (c.res.mode != KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE)
        c.res.mode = in->n_context > from_ctx ? KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_REPREFILL
                                              : KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_NONE;
    c.res.prefill_tokens = (uint32_t)(s->n_ledger - kvl_cache_n_tokens(s->cache));
    kvld_stream_turn(&c.r, s, &gp, &c.res);
done:
    kvlingo__v1__continue_request__free_unpacked(in, NULL);
}
