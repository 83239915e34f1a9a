/* daemon/span_service.c: ExportSpan (push a session's span to a peer) and ImportSpan (receive,
 * check, translate, append).  Protocol of one switch, exporter A -> importer B:
 *   A: ExportSpan handler reads pre-norm K/V of [from, to) and builds SpanHeader + payload
 *   A -> B  ImportSpan(header)            B checks the header: target, translator, geometry,
 *                                           range; posts a transport receive; first reply:
 *   B -> A  {transport address, tag}
 *   A -> B  payload over the transport (UCX tag message; rendezvous when large)
 *   B: exact length, xxh3-64, ids, finite values; translate + append atomically; second reply
 *   B -> A  {imported, figures} + OK, or an error status saying why.
 * Either side going away ends the ImportSpan call, which cancels the other side's wait. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "hash.h"
#include "bf16.h"
#include "kvlingo/translator.h"
#include "kvlingo/translator_train.h"
#include "kvlingo/v1/node.pb-c.h"
#include "log.h"
#include "node.h"
#include "span.h"

/* The span codec's reader of pre-norm K/V: the session cache's backend export. */
static kvl_status read_cache_prenorm(const void *cache, int layer, int t0, int t1, float *k,
                                     float *v) {
    return kvl_cache_read_prenorm(cache, layer, t0, t1, k, v);
}

static kvl_status read_cache_prenorm_bf16(const void *cache, int t0, int t1, uint16_t *k, uint16_t *v) {
    return kvl_cache_read_prenorm_bf16(cache, t0, t1, k, v);
}

static void set_flag(void *arg) { *(volatile int *)arg = 1; }

/* ---- import (node B) --------------------------------------------------------------------------- */

/* The import's outcome, answered only after the session is released (an exporter that gets
 * the answer may use the session at once). */
typedef struct import_ctx {
    kvld_req r;
    kvld_node *n;
    kvld_span_err e;
} import_ctx;

static int span_refuse(kvld_span_err *e, kvl__span_reject why, grpc_status_code code,
                       const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int span_refuse(kvld_span_err *e, kvl__span_reject why, grpc_status_code code,
                       const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->why = why;
    e->code = code;
    return 0;
}
#define import_reject(x, ...) span_refuse(&(x)->e, __VA_ARGS__)

static grpc_status_code reject_code(kvl__span_reject why) {
    switch (why) {
    case KVL_SPAN_MALFORMED: return GRPC_STATUS_INVALID_ARGUMENT;
    case KVL_SPAN_WRONG_TARGET:
    case KVL_SPAN_NO_TRANSLATOR:
    case KVL_SPAN_GEOMETRY: return GRPC_STATUS_FAILED_PRECONDITION;
    case KVL_SPAN_RANGE: return GRPC_STATUS_OUT_OF_RANGE;
    case KVL_SPAN_TRUNCATED: return GRPC_STATUS_DATA_LOSS;
    case KVL_SPAN_CHECKSUM: return GRPC_STATUS_DATA_LOSS;
    case KVL_SPAN_BAD_VALUES: return GRPC_STATUS_INVALID_ARGUMENT;
    case KVL_SPAN_TRANSFER: return GRPC_STATUS_UNAVAILABLE;
    case KVL_SPAN_BUSY: return GRPC_STATUS_FAILED_PRECONDITION;
    default: return GRPC_STATUS_INTERNAL;
    }
}

/* Copy tokens [0, t0) of `src` into a fresh cache (for a clean replace), so the old cache
 * survives untouched until the translated span is in. */
static kvl_status copy_prefix(const kvl_model *m, const kvl_cache *src, int t0, int capacity,
                              kvl_cache **out) {
    const kvl_model_config *c = kvl_model_config_get(m);
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = capacity;
    kvl_status st = kvl_model_cache_create(m, &cp, out);
    if (st != KVL_OK || t0 == 0) return st;
    size_t row = (size_t)c->n_kv_heads * c->head_dim, per = (size_t)t0 * row;
    float *kpost = malloc(sizeof(float) * per * c->n_layers);
    float *v = malloc(sizeof(float) * per * c->n_layers);
    float *kpre = malloc(sizeof(float) * per * c->n_layers);
    if (!kpost || !v || !kpre) st = kvl__errorf(KVL_ERR_NOMEM, "copying %d cached tokens", t0);
    for (int l = 0; st == KVL_OK && l < c->n_layers; l++) {
        st = kvl_cache_read_kv(src, l, 0, t0, kpost + l * per, v + l * per);
        if (st == KVL_OK) st = kvl_cache_read_prenorm(src, l, 0, t0, kpre + l * per, NULL);
    }
    if (st == KVL_OK) st = kvl_cache_append(*out, t0, kvl_cache_tokens(src), kpost, v, kpre);
    free(kpost), free(v), free(kpre);
    if (st != KVL_OK) {
        kvl_cache_free(*out);
        *out = NULL;
    }
    return st;
}

/* ---- the checks and the landing every received span passes (ImportSpan, and a pull in push
 * mode: continue.c) -------------------------------------------------------------------------- */

int kvld_span_check_header(kvld_node *n, const Kvlingo__V1__SpanHeader *h, uint64_t max_payload,
                           const kvld_translator_entry **te, kvld_span_err *e) {
    kvl__span_reject why = KVL_SPAN_OK;
    const char *self = kvl_model_name(n->model), *self_hash = kvl_model_hash(n->model);
    if (kvl__span_header_check(h, max_payload, &why) != KVL_OK)
        return span_refuse(e, why, reject_code(why), "%s", kvl_last_error());
    if (!h->target || !h->target->name || strcmp(h->target->name, self) ||
        (h->target->hash && h->target->hash[0] && strcmp(h->target->hash, self_hash)))
        return span_refuse(e, KVL_SPAN_WRONG_TARGET, GRPC_STATUS_FAILED_PRECONDITION,
                           "span is addressed to model '%s' (hash %s) but this node serves '%s' (hash %s)",
                           h->target && h->target->name ? h->target->name : "",
                           h->target && h->target->hash ? h->target->hash : "", self, self_hash);
    *te = kvld_translators_find(&n->translators, h->source->name, h->source->hash);
    if (!*te)
        return span_refuse(e, KVL_SPAN_NO_TRANSLATOR, GRPC_STATUS_FAILED_PRECONDITION,
                           "no translator from source model '%s' (hash %s) to '%s' on this node",
                           h->source->name, h->source->hash ? h->source->hash : "", self);
    if ((int)h->n_layers != (*te)->src_layers || (int)h->n_kv_heads != (*te)->src_kv_heads ||
        (int)h->head_dim != (*te)->src_head_dim)
        return span_refuse(e, KVL_SPAN_GEOMETRY, GRPC_STATUS_FAILED_PRECONDITION,
                           "span geometry (layers %u, kv heads %u, head_dim %u) does not match the "
                           "translator's source (layers %d, kv heads %d, head_dim %d)",
                           h->n_layers, h->n_kv_heads, h->head_dim, (*te)->src_layers,
                           (*te)->src_kv_heads, (*te)->src_head_dim);
    return 1;
}

int kvld_span_check_range(const kvld_session *s, const Kvlingo__V1__SpanHeader *h, int replace,
                          kvld_span_err *e) {
    /* as 64-bit numbers: a header's uint32 t0 / t1 past INT_MAX must not turn negative */
    const int64_t held = kvl_cache_n_tokens(s->cache), t0 = h->t0, t1 = h->t1;
    if (t0 > held)
        return span_refuse(e, KVL_SPAN_RANGE, GRPC_STATUS_OUT_OF_RANGE,
                           "span [%u, %u) leaves a gap: session '%s' holds %lld tokens here", h->t0,
                           h->t1, s->id, (long long)held);
    if (t0 < held && !replace)
        return span_refuse(e, KVL_SPAN_RANGE, GRPC_STATUS_FAILED_PRECONDITION,
                           "span [%u, %u) overlaps the %lld tokens session '%s' holds (set replace to "
                           "overwrite them)", h->t0, h->t1, (long long)held, s->id);
    if (t1 > s->max_context)
        return span_refuse(e, KVL_SPAN_RANGE, GRPC_STATUS_OUT_OF_RANGE,
                           "span ends at token %u, beyond the session's max context %d", h->t1,
                           s->max_context);
    return 1;
}

/* The checks and the translation into s's cache; the ledger is set by kvld_span_commit.  pending:
 * the span must extend the cache (t0 == held: taking it back is a truncation), and *ids_out
 * receives the payload's ids for the commit. */
static int land_span(kvld_node *n, kvld_session *s, const kvld_translator_entry *te,
                     const Kvlingo__V1__SpanHeader *h, const uint8_t *payload, size_t got,
                     double *translate_s, kvld_span_err *e, int pending, const int32_t **ids_out) {
    kvl__span_view v;
    kvl__span_reject why = KVL_SPAN_OK;
    int vocab = kvl_model_config_get(n->model)->vocab_size;
    *translate_s = 0;
    if (kvl__span_payload_check(h, payload, got, vocab, &v, &why) != KVL_OK)
        return span_refuse(e, why, reject_code(why), "%s", kvl_last_error());
    int held = kvl_cache_n_tokens(s->cache);
    if (pending && (int)h->t0 != held)
        return span_refuse(e, KVL_SPAN_RANGE, GRPC_STATUS_FAILED_PRECONDITION,
                           "span [%u, %u) does not extend the %d tokens session '%s' holds", h->t0,
                           h->t1, held, s->id);
    double t_tr = kvl__now_s();
    kvl_cache *fresh = NULL;
    kvl_status st = KVL_OK;
    const float *k = v.k, *vv = v.v;
    float *wide = NULL;
    /* a bf16 span into a translator that multiplies in bf16 (one source layer a target layer:
     * several are gathered in float32) goes in as it came; else its translator reads float32,
     * widened here into a kept buffer (bounded by the checked payload) */
    const int rows16 = v.bf16 && kvl_translator_taps(te->tr) == 1 &&
                       kvl_translator_bf16_products(te->tr, n->model);
    if (v.bf16 && !rows16) {
        const size_t nf = (size_t)v.n_layers * v.n * v.row;
        /* a kept buffer (faulted in already: a fresh 4 MB one costs ~1k page faults) */
        wide = (float *)(void *)kvl__spanbuf_take(n->spanbufs, 2 * nf * sizeof(float));
        if (!wide) {
            st = kvl__errorf(KVL_ERR_NOMEM, "out of memory widening a bf16 span of %zu values", 2 * nf);
        } else {
            kvl__bf16_widen_n(wide, v.k16, nf);
            kvl__bf16_widen_n(wide + nf, v.v16, nf);
            k = wide;
            vv = wide + nf;
        }
    }
    if (st == KVL_OK && (int)h->t0 < held) {
        st = copy_prefix(n->model, s->cache, (int)h->t0, s->max_context, &fresh);
        if (st == KVL_OK)
            st = rows16 ? kvl_translator_apply_bf16(te->tr, v.k16, v.v16, (int)h->t0, (int)v.n, v.ids, fresh)
                        : kvl_translator_apply(te->tr, k, vv, (int)h->t0, (int)v.n, v.ids, fresh);
        if (st == KVL_OK) kvld_session_swap_cache(n->sessions, s, fresh);
        else kvl_cache_free(fresh);
    } else if (st == KVL_OK) {
        st = rows16 ? kvl_translator_apply_bf16(te->tr, v.k16, v.v16, (int)h->t0, (int)v.n, v.ids, s->cache)
                    : kvl_translator_apply(te->tr, k, vv, (int)h->t0, (int)v.n, v.ids, s->cache);
    }
    kvl__spanbuf_give(n->spanbufs, (uint8_t *)wide);
    *translate_s = kvl__now_s() - t_tr;
    if (st != KVL_OK)
        return span_refuse(e, KVL_SPAN_TRANSLATE, kvl__rpc_status_from_kvl(st), "translation failed: %s",
                           kvl_last_error());
    kvld_metrics_observe(n->metrics, KVLD_H_TRANSLATE_SECONDS, *translate_s);
    if (pending) *ids_out = v.ids;
    else kvld_span_commit(n, s, h, v.ids);
    return 1;
}

int kvld_span_land(kvld_node *n, kvld_session *s, const kvld_translator_entry *te,
                   const Kvlingo__V1__SpanHeader *h, const uint8_t *payload, size_t got,
                   double *translate_s, kvld_span_err *e) {
    return land_span(n, s, te, h, payload, got, translate_s, e, 0, NULL);
}

int kvld_span_land_pending(kvld_node *n, kvld_session *s, const kvld_translator_entry *te,
                           const Kvlingo__V1__SpanHeader *h, const uint8_t *payload, size_t got,
                           double *translate_s, const int32_t **ids, kvld_span_err *e) {
    return land_span(n, s, te, h, payload, got, translate_s, e, 1, ids);
}

void kvld_span_commit(kvld_node *n, kvld_session *s, const Kvlingo__V1__SpanHeader *h,
                      const int32_t *ids) {
    const uint32_t cnt = h->t1 - h->t0;
    kvld_metrics_add(n->metrics, KVLD_C_SPANS_RECEIVED, 1);
    /* a span ending inside what the ledger already holds (the cache behind its ledger, the
     * source caching less) keeps the ledger's tail when the ids agree: they are the same
     * tokens, still to be run through the model; ids that differ make the tail another story */
    const int keep_tail = (int)h->t1 < s->n_ledger && !memcmp(s->ledger + h->t0, ids, sizeof(int32_t) * cnt);
    memcpy(s->ledger + h->t0, ids, sizeof(int32_t) * cnt);
    if (!keep_tail) __atomic_store_n(&s->n_ledger, (int)h->t1, __ATOMIC_RELAXED);
    s->logits_valid = 0;
    s->n_imported += (int)cnt;
}

kvl_status kvld_span_unland(kvld_session *s, const Kvlingo__V1__SpanHeader *h) {
    kvl_status st = kvl_cache_truncate(s->cache, (int)h->t0);
    if (st != KVL_OK) {
        char what[160];
        snprintf(what, sizeof what, "taking the span [%u, %u) back out of session '%s'", h->t0, h->t1, s->id);
        return kvl__error_prefix(st, what);
    }
    return KVL_OK;
}

/* A span buffer the transport used past its call (a send to a stalled peer, a receive whose
 * sender died mid-message) comes back here when that ends (kvl__transport_release_fn). */
static void give_span_buffer(void *spanbufs, void *buf) {
    kvl__spanbuf_give(spanbufs, buf);
}

void kvld_span_import_end(kvld_node *n, kvl__transport_recv *rv, uint8_t *payload, kvld_session *s,
                          int drop) {
    if (kvl__transport_recv_free(n->transport, rv, give_span_buffer, n->spanbufs)) {
        kvl__spanbuf_give(n->spanbufs, payload);
    } else if (payload) {
        /* its sender died mid-transfer and the transport still holds the receive: the buffer
         * may yet be written, so the transport keeps it until the receive ends */
        kvl__svc_log("warn", "msg=span_buffer_abandoned reason=\"a receive matched a transfer that "
                     "never finished (its sender stopped mid-message); its buffer comes back when "
                     "the receive ends\"");
    }
    if (!s) return;
    if (!drop) {
        kvld_session_release(n->sessions, s);
        return;
    }
    kvld_session_release_drop(n->sessions, s);   /* a failed import into a session it created leaves no trace */
    kvld_metrics_set(n->metrics, KVLD_G_SESSIONS, kvld_sessions_count(n->sessions));
}

void kvld_rpc_import_span(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvld_node *n = user;
    import_ctx x = {.n = n};
    kvld_req_begin(&x.r, n, call, "ImportSpan");
    Kvlingo__V1__ImportSpanRequest *in = kvlingo__v1__import_span_request__unpack(NULL, len, req);
    if (!in) {
        kvld_metrics_reject(n->metrics, KVL_SPAN_MALFORMED);
        kvld_req_end(&x.r, GRPC_STATUS_INVALID_ARGUMENT,
                     "malformed ImportSpanRequest (protobuf does not parse)", " reason=malformed");
        return;
    }
    snprintf(x.r.session, sizeof x.r.session, "%s", in->session_id);
    if (kvld_req_refuse_if_draining(&x.r)) {
        kvlingo__v1__import_span_request__free_unpacked(in, NULL);
        return;
    }
    const Kvlingo__V1__SpanHeader *h = in->header;
    kvl__span_reject why = KVL_SPAN_OK;
    const kvld_translator_entry *te = NULL;
    kvld_session *s = NULL;
    kvl__transport_recv *rv = NULL;
    uint8_t *payload = NULL;
    int created = 0;
    volatile int cancelled = 0;
    Kvlingo__V1__ImportSpanResponse done = KVLINGO__V1__IMPORT_SPAN_RESPONSE__INIT;
    char done_sha[65] = "";
    char extra[200] = "";
    kvl__rpc_call_on_cancel(call, set_flag, (void *)&cancelled);

    /* 1. the header, before any allocation it asks for; the ticket before what it names */
    if (kvl__span_header_check(h, 0, &why) != KVL_OK) {
        import_reject(&x, why, reject_code(why), "%s", kvl_last_error());
        goto out;
    }
    {
        kvl__ticket_expect e = {.target = n->self, .dst_session = in->session_id, .t0 = h->t0,
                                .t1 = h->t1, .replace = in->replace};
        char why_t[512];
        grpc_status_code tc = kvld_node_check_ticket(n, in->ticket.data, in->ticket.len, &e, why_t,
                                                     sizeof why_t);
        if (tc != GRPC_STATUS_OK) {
            import_reject(&x, KVL_SPAN_OK, tc, "%s", why_t);
            goto out;
        }
    }
    if (!kvld_span_check_header(n, h, 0, &te, &x.e)) goto out;
    if (!n->transport) {
        import_reject(&x, KVL_SPAN_TRANSFER, GRPC_STATUS_UNAVAILABLE,
                      "this node runs without a transport (--transport none)");
        goto out;
    }
    /* 2. the session and the token range */
    kvl_status st = kvld_session_acquire(n->sessions, in->session_id, KVLD_IMPORT, 1, &s, &created);
    if (st != KVL_OK) {
        import_reject(&x, st == KVL_ERR_MISMATCH ? KVL_SPAN_BUSY : KVL_SPAN_RANGE,
                      kvl__rpc_status_from_kvl(st), "%s", kvl_last_error());
        goto out;
    }
    if (created) {
        kvld_metrics_add(n->metrics, KVLD_C_SESSIONS_OPENED, 1);
        kvld_metrics_set(n->metrics, KVLD_G_SESSIONS, kvld_sessions_count(n->sessions));
    }
    if (!kvld_span_check_range(s, h, in->replace, &x.e)) goto out;
    /* 3. receive */
    payload = kvl__spanbuf_take(n->spanbufs, (size_t)h->payload_bytes);
    if (!payload) {
        import_reject(&x, KVL_SPAN_RANGE, GRPC_STATUS_RESOURCE_EXHAUSTED,
                      "cannot allocate %llu bytes for the span", (unsigned long long)h->payload_bytes);
        goto out;
    }
    uint64_t tag = kvl__transport_new_tag(n->transport);
    if (kvl__transport_recv_post(n->transport, tag, payload, (size_t)h->payload_bytes, &rv) != KVL_OK) {
        import_reject(&x, KVL_SPAN_TRANSFER, GRPC_STATUS_UNAVAILABLE, "%s", kvl_last_error());
        goto out;
    }
    Kvlingo__V1__ImportSpanResponse ep = KVLINGO__V1__IMPORT_SPAN_RESPONSE__INIT;
    const uint8_t *addr;
    size_t alen;
    kvl__transport_address(n->transport, &addr, &alen);
    ep.transport = (char *)kvl__transport_kind(n->transport);
    ep.transport_address.data = (uint8_t *)addr;
    ep.transport_address.len = alen;
    ep.tag = tag;
    if (kvl__rpc_call_send_pb(call, &ep.base) != KVL_OK) {
        import_reject(&x, KVL_SPAN_TRANSFER, GRPC_STATUS_CANCELLED,
                      "exporter went away before the transfer");
        goto out;
    }
    double t_recv = kvl__now_s();
    size_t got = 0;
    int64_t left = kvl__rpc_call_deadline_left_ms(call);
    /* an announced span must arrive soon (plus 10 ms per MB it announced): one that never
     * comes must not hold a session place for the whole call deadline */
    int64_t tmo = left < n->cfg.span_timeout_ms ? left : n->cfg.span_timeout_ms;
    int64_t itmo = n->cfg.import_timeout_ms + (int64_t)(h->payload_bytes / 100000);
    if (itmo < tmo) tmo = itmo;
    st = kvl__transport_recv_wait(n->transport, rv, tmo > 0 ? tmo : 1, &cancelled, &got);
    double recv_s = kvl__now_s() - t_recv;
    if (st == KVL_ERR_IO && tmo == itmo && strstr(kvl_last_error(), "timed out")) {
        kvld_metrics_refuse(n->metrics, KVLD_R_IMPORT_TIMEOUT);
        import_reject(&x, KVL_SPAN_TRANSFER, GRPC_STATUS_DEADLINE_EXCEEDED,
                      "the announced span (%llu bytes) did not arrive within %lld ms "
                      "(import_timeout_ms): import ended, session place freed",
                      (unsigned long long)h->payload_bytes, (long long)itmo);
        goto out;
    }
    if (st == KVL_ERR_CANCELLED) {
        import_reject(&x, KVL_SPAN_TRANSFER, GRPC_STATUS_CANCELLED,
                      "peer gone mid-transfer: the exporter cancelled or disconnected after "
                      "%.3f s", recv_s);
        goto out;
    }
    if (st == KVL_ERR_RANGE) {
        import_reject(&x, KVL_SPAN_TRUNCATED, GRPC_STATUS_DATA_LOSS,
                      "payload larger than the %llu bytes the header announced",
                      (unsigned long long)h->payload_bytes);
        goto out;
    }
    if (st != KVL_OK) {
        import_reject(&x, KVL_SPAN_TRANSFER, GRPC_STATUS_UNAVAILABLE, "%s", kvl_last_error());
        goto out;
    }
    kvld_metrics_observe(n->metrics, KVLD_H_TRANSFER_SECONDS, recv_s);
    kvld_metrics_add(n->metrics, KVLD_C_SPAN_BYTES_RECEIVED, got);
    /* 4. check the payload, translate, append */
    double tr_s = 0;
    if (!kvld_span_land(n, s, te, h, payload, got, &tr_s, &x.e)) goto out;
    created = 0;   /* keep the session: it holds the span now */
    done.imported = 1;
    done.token_count = (uint32_t)kvl_cache_n_tokens(s->cache);
    kvl__tokens_sha256_hex(s->ledger, h->t1, done_sha);
    done.tokens_sha256 = done_sha;
    done.translate_seconds = tr_s;
    done.receive_seconds = recv_s;
    snprintf(extra, sizeof extra, " source=%s t0=%u t1=%u bytes=%zu recv_ms=%.3f translate_ms=%.3f",
             h->source->name, h->t0, h->t1, got, recv_s * 1e3, tr_s * 1e3);
out:
    kvl__rpc_call_on_cancel(call, NULL, NULL);
    kvld_span_import_end(n, rv, payload, s, created);
    /* answer last: the session is free again when the exporter hears the verdict */
    if (x.e.code == GRPC_STATUS_OK) {
        kvl__rpc_call_send_pb(call, &done.base);
        kvl__rpc_call_finish(call, GRPC_STATUS_OK, NULL);
        kvld_req_end(&x.r, GRPC_STATUS_OK, NULL, extra);
    } else {
        kvld_metrics_reject(n->metrics, x.e.why);
        snprintf(extra, sizeof extra, " reason=%s",
                 x.e.code == GRPC_STATUS_PERMISSION_DENIED ? "ticket" : kvl__span_reject_name(x.e.why));
        kvld_req_end(&x.r, x.e.code, x.e.msg, extra);
    }
    kvlingo__v1__import_span_request__free_unpacked(in, NULL);
}

/* ---- export (node A) --------------------------------------------------------------------------- */

/* Why the payload send must stop: the client cancelled ExportSpan, or the importer ended the
 * ImportSpan call (it refused, or its process died) while we were still sending. */
typedef struct export_flags {
    volatile int cancelled;
    volatile int stop_send;
} export_flags;

static void export_cancel(void *arg) {
    export_flags *f = arg;
    f->cancelled = 1;
    f->stop_send = 1;
}

/* Reads the importer's verdict concurrently with the send, so that a peer gone mid-transfer
 * stops the send at once instead of at its deadline. */
typedef struct verdict_watch {
    kvl__rpc_stream *stream;
    uint8_t *msg;
    size_t len;
    int got;
    export_flags *fl;
} verdict_watch;

static void *watch_verdict(void *arg) {
    verdict_watch *w = arg;
    w->got = kvl__rpc_stream_read(w->stream, &w->msg, &w->len) == 1;
    if (!w->got) w->fl->stop_send = 1;
    return NULL;
}

void kvld_rpc_export_span(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvld_node *n = user;
    kvld_req r;
    kvld_req_begin(&r, n, call, "ExportSpan");
    Kvlingo__V1__ExportSpanRequest *in = kvlingo__v1__export_span_request__unpack(NULL, len, req);
    if (!in) {
        kvld_req_end(&r, GRPC_STATUS_INVALID_ARGUMENT,
                     "malformed ExportSpanRequest (protobuf does not parse)", NULL);
        return;
    }
    snprintf(r.session, sizeof r.session, "%s", in->session_id);
    if (kvld_req_refuse_if_draining(&r)) {
        kvlingo__v1__export_span_request__free_unpacked(in, NULL);
        return;
    }
    kvld_session *s = NULL;
    uint8_t *payload = NULL;
    int payload_kept = 0;   /* the transport still reads payload (a stalled peer): it gives it back */
    size_t plen = 0;
    kvl__rpc_stream *stream = NULL;
    uint8_t *msg = NULL;
    size_t mlen = 0;
    Kvlingo__V1__ImportSpanResponse *ep = NULL, *verdict = NULL;
    Kvlingo__V1__ExportSpanResponse out = KVLINGO__V1__EXPORT_SPAN_RESPONSE__INIT;
    grpc_status_code code = GRPC_STATUS_OK;
    char err[1024] = "";
    double t_start = kvl__now_s(), xfer_s = 0;
    /* the span's dtype: bf16 when this node's cache holds bf16, or the peer rounds to it anyway */
    const int bf16 = kvl_model_kv_dtype(n->model) == KVL_KV_BF16 || in->wire_bf16;
    /* the caller's deadline, within this node's own bound on a transfer (as a pull's) */
    int64_t tmo = in->timeout_ms && (int64_t)in->timeout_ms < n->cfg.span_timeout_ms ? (int64_t)in->timeout_ms
                                                                                  : n->cfg.span_timeout_ms;
    export_flags fl = {0};
    int peer_held = 0;   /* the peer table's entry is ours until released */
    verdict_watch w = {.fl = &fl};
    pthread_t watcher;
    int watching = 0;
    kvl__rpc_call_on_cancel(call, export_cancel, &fl);

#define FAIL(c, ...) do { code = (c); snprintf(err, sizeof err, __VA_ARGS__); goto out; } while (0)
    if (!in->peer || !in->peer[0]) FAIL(GRPC_STATUS_INVALID_ARGUMENT, "peer address is required");
    if (!kvld_node_peer_allowed(n, in->peer)) {
        kvld_metrics_refuse(n->metrics, KVLD_R_PEER_NOT_MEMBER);
        FAIL(GRPC_STATUS_PERMISSION_DENIED, "peer '%s' is not a member of this node's fleet (--peers%s)",
             in->peer, n->n_fleet ? "" : " is empty and tickets are on");
    }
    if (!n->transport) FAIL(GRPC_STATUS_UNAVAILABLE, "this node runs without a transport");
    kvl_status st = kvld_session_acquire(n->sessions, in->session_id, KVLD_EXPORT, 0, &s, NULL);
    if (st != KVL_OK) FAIL(kvl__rpc_status_from_kvl(st), "%s", kvl_last_error());
    if (in->expect_sha256 && in->expect_sha256[0]) {
        /* what the caller's ledger says this session holds: by content, not by count */
        char have[65];
        kvl__tokens_sha256_hex(s->ledger, (size_t)s->n_ledger, have);
        if ((uint32_t)s->n_ledger != in->expect_tokens || strcmp(have, in->expect_sha256))
            FAIL(GRPC_STATUS_FAILED_PRECONDITION, "session '%s' holds %d tokens%s, the ledger says %u",
                 s->id, s->n_ledger, (uint32_t)s->n_ledger == in->expect_tokens ? " with other ids" : "",
                 in->expect_tokens);
    }
    uint32_t to = in->to_cached ? (uint32_t)kvl_cache_n_tokens(s->cache)
                : in->to ? in->to : (uint32_t)s->n_ledger;
    if (in->to_cached && in->to && to > in->to) to = in->to;
    if (in->to_cached && to == in->from && to > 0) {
        /* the peer caches all this node caches (a span pushed ahead): nothing to ship, and
         * nothing moves, so no ticket is spent */
        out.t0 = out.t1 = to;
        out.total_seconds = kvl__now_s() - t_start;
        goto out;
    }
    if (to > (uint32_t)s->n_ledger || in->from >= to)
        FAIL(GRPC_STATUS_OUT_OF_RANGE, "range [%u, %u) is not within session '%s''s %d %s tokens",
             in->from, to, s->id, in->to_cached ? kvl_cache_n_tokens(s->cache) : s->n_ledger,
             in->to_cached ? "cached" : "ledger");
    {
        /* checked once the range is settled: a window ticket allows any range inside its own */
        kvl__ticket_expect e = {.source = n->self, .target = in->peer, .src_session = in->session_id,
                                .dst_session = in->peer_session_id && in->peer_session_id[0]
                                                   ? in->peer_session_id : in->session_id,
                                .t0 = in->from, .t1 = to, .replace = in->replace};
        char why_t[512];
        grpc_status_code tc = kvld_node_check_ticket(n, in->ticket.data, in->ticket.len, &e, why_t,
                                                     sizeof why_t);
        if (tc != GRPC_STATUS_OK) FAIL(tc, "%s", why_t);
    }
    if ((int)to > kvl_cache_n_tokens(s->cache)) {
        /* tokens known but not yet run through the model (e.g. the last sampled one) */
        st = kvld_sched_prefill(n->sched, s, &fl.cancelled);
        if (st != KVL_OK) FAIL(kvl__rpc_status_from_kvl(st), "prefill before export: %s", kvl_last_error());
    }
    kvl__rpc_client *peer;
    kvld_peer_model pm;
    st = kvld_node_peer(n, in->peer, tmo, &peer, &pm);
    if (st != KVL_OK)
        FAIL(st == KVL_ERR_RANGE ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_UNAVAILABLE, "%s",
             kvl_last_error());
    peer_held = 1;
    Kvlingo__V1__SpanHeader h = KVLINGO__V1__SPAN_HEADER__INIT;
    kvl__span_ids ids;
    const kvl_model_config *mc = kvl_model_config_get(n->model);
    kvl__span_source src = {kvl_model_name(n->model), kvl_model_hash(n->model),
                            (uint32_t)mc->n_layers, (uint32_t)mc->n_kv_heads,
                            (uint32_t)mc->head_dim, (uint32_t)kvl_cache_n_tokens(s->cache),
                            kvl_cache_tokens(s->cache), read_cache_prenorm, s->cache,
                            n->spanbufs, bf16,
                            in->push_tag && in->push_trailer ? KVL_SPAN_TRAILER_MAX : 0,
                            read_cache_prenorm_bf16};
    st = kvl__span_encode(&src, in->from, to, pm.name, pm.hash, &ids, &h, &payload, &plen);
    if (st != KVL_OK) FAIL(kvl__rpc_status_from_kvl(st), "%s", kvl_last_error());
    double encode_s = kvl__now_s() - t_start;
    if (in->push_tag) {
        /* push mode: the peer posted its receive before asking; send there, answer the header */
        size_t tlen = 0;   /* the header behind the payload, when the peer asked for it */
        if (in->push_trailer && kvl__span_trailer_write(&h, payload + plen, KVL_SPAN_TRAILER_MAX, &tlen) != KVL_OK)
            FAIL(GRPC_STATUS_INTERNAL, "%s", kvl_last_error());
        if ((uint64_t)plen + tlen > in->push_max_bytes)
            FAIL(GRPC_STATUS_OUT_OF_RANGE, "span [%u, %u) is %zu bytes, more than the %llu bytes the "
                 "peer's receive holds", in->from, to, plen + tlen, (unsigned long long)in->push_max_bytes);
        uint8_t addr[KVLD_PEER_TRANSPORT_MAX];
        size_t alen = 0;
        if (kvld_node_peer_transport(n, in->peer, addr, sizeof addr, &alen, NULL) != KVL_OK)
            FAIL(GRPC_STATUS_UNAVAILABLE, "%s", kvl_last_error());
        if (in->push_address_hash && kvl__xxh3_64(addr, alen) != in->push_address_hash) {
            /* the peer came back with a new worker (a restart) before the table's refresh saw
             * it: its Info is asked now, and the span goes where that names, or nowhere */
            if (kvld_node_peer_refresh(n, in->peer, tmo < 2000 ? tmo : 2000) != KVL_OK ||
                kvld_node_peer_transport(n, in->peer, addr, sizeof addr, &alen, NULL) != KVL_OK)
                FAIL(GRPC_STATUS_UNAVAILABLE, "peer %s: asking its Info again: %s", in->peer, kvl_last_error());
            if (kvl__xxh3_64(addr, alen) != in->push_address_hash)
                FAIL(GRPC_STATUS_UNAVAILABLE, "peer %s pulls with a transport address its Info does not "
                     "name: the span is not sent", in->peer);
            kvl__svc_log("info", "msg=peer_refreshed peer=%s why=\"it pulls from another transport address "
                         "than the table had (restarted)\"", in->peer);
        }
        double t_x = kvl__now_s();
        st = kvl__transport_send(n->transport, addr, alen, in->push_tag, payload, plen + tlen, tmo, &fl.stop_send,
                                 give_span_buffer, n->spanbufs, &payload_kept);
        xfer_s = kvl__now_s() - t_x;
        if (fl.cancelled) FAIL(GRPC_STATUS_CANCELLED, "export cancelled by the client");
        if (st != KVL_OK) {
            /* the peer may have restarted with a new transport address: its Info is asked
             * again on the next span */
            kvld_node_peer_forget(n, in->peer);
            FAIL(GRPC_STATUS_UNAVAILABLE, "transfer to peer %s failed: %s", in->peer, kvl_last_error());
        }
        kvld_metrics_observe(n->metrics, KVLD_H_TRANSFER_SECONDS, xfer_s);
        kvld_metrics_add(n->metrics, KVLD_C_SPAN_BYTES_SENT, plen);
        kvld_metrics_add(n->metrics, KVLD_C_SPANS_SENT, 1);
        out.t0 = in->from;
        out.t1 = to;
        out.payload_bytes = plen;
        out.transfer_seconds = xfer_s;
        out.export_seconds = encode_s;
        out.header = &h;   /* h and ids live until the reply is sent */
        out.total_seconds = kvl__now_s() - t_start;
        goto out;
    }
    Kvlingo__V1__ImportSpanRequest ir = KVLINGO__V1__IMPORT_SPAN_REQUEST__INIT;
    ir.session_id = in->peer_session_id && in->peer_session_id[0] ? in->peer_session_id : s->id;
    ir.header = &h;
    ir.replace = in->replace;
    ir.ticket = in->ticket;   /* the target checks it again */
    const uint8_t *my_addr;
    size_t my_alen;
    kvl__transport_address(n->transport, &my_addr, &my_alen);
    ir.sender_address.data = (uint8_t *)my_addr;
    ir.sender_address.len = my_alen;
    size_t irl = kvlingo__v1__import_span_request__get_packed_size(&ir);
    uint8_t *irb = malloc(irl + 1);
    if (!irb) FAIL(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    kvlingo__v1__import_span_request__pack(&ir, irb);
    st = kvl__rpc_client_stream_open(peer, "/kvlingo.v1.Node/ImportSpan", irb, irl, tmo, &stream);
    free(irb);
    if (st != KVL_OK) FAIL(GRPC_STATUS_INTERNAL, "%s", kvl_last_error());
    /* first reply: the endpoint, or the end of the stream with the peer's refusal */
    if (kvl__rpc_stream_read(stream, &msg, &mlen) != 1 ||
        !(ep = kvlingo__v1__import_span_response__unpack(NULL, mlen, msg))) {
        kvl__rpc_result res;
        kvl__rpc_stream_finish(stream, &res);
        code = res.code == GRPC_STATUS_OK ? GRPC_STATUS_INTERNAL : res.code;
        snprintf(err, sizeof err, "peer %s refused the span: %s", in->peer,
                 res.message ? res.message : "no endpoint in its reply");
        kvl__rpc_result_clear(&res);
        goto out;
    }
    free(msg);
    msg = NULL;
    if (fl.cancelled) FAIL(GRPC_STATUS_CANCELLED, "export cancelled by the client");
    /* the payload goes to the transport address of the member's own Info, as in push mode,
     * never to one its reply names: a reply is only the importer's word, and its address
     * must be the one the fleet knows it by */
    uint8_t paddr[KVLD_PEER_TRANSPORT_MAX];
    size_t palen = 0;
    if (kvld_node_peer_transport(n, in->peer, paddr, sizeof paddr, &palen, NULL) != KVL_OK)
        FAIL(GRPC_STATUS_UNAVAILABLE, "%s", kvl_last_error());
    if (ep->transport_address.len != palen || memcmp(ep->transport_address.data, paddr, palen)) {
        /* a member that restarted answers its new address before the peer table has it: the
         * table asks its Info again, and the span goes only if the two then agree */
        if (kvld_node_peer_refresh(n, in->peer, tmo < 2000 ? tmo : 2000) != KVL_OK ||
            kvld_node_peer_transport(n, in->peer, paddr, sizeof paddr, &palen, NULL) != KVL_OK ||
            ep->transport_address.len != palen || memcmp(ep->transport_address.data, paddr, palen)) {
            kvl__rpc_stream_cancel(stream);
            FAIL(GRPC_STATUS_PERMISSION_DENIED, "peer %s answered a transport address other than "
                 "its Info's: the span is not sent there", in->peer);
        }
    }
    w.stream = stream;
    watching = pthread_create(&watcher, NULL, watch_verdict, &w) == 0;
    double t_x = kvl__now_s();
    st = kvl__transport_send(n->transport, paddr, palen, ep->tag, payload, plen, tmo, &fl.stop_send,
                             give_span_buffer, n->spanbufs, &payload_kept);
    xfer_s = kvl__now_s() - t_x;
    if (st != KVL_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", kvl_last_error());
        int peer_ended = fl.stop_send && !fl.cancelled;
        kvl__rpc_stream_cancel(stream);
        if (watching) pthread_join(watcher, NULL);
        watching = 0;
        if (fl.cancelled) FAIL(GRPC_STATUS_CANCELLED, "export cancelled by the client");
        kvld_node_peer_forget(n, in->peer);
        if (peer_ended)
            FAIL(GRPC_STATUS_UNAVAILABLE, "peer %s gone mid-transfer: it ended the import after "
                 "%.3f s of sending", in->peer, xfer_s);
        FAIL(GRPC_STATUS_UNAVAILABLE, "transfer to peer %s failed: %s", in->peer, why);
    }
    kvld_metrics_observe(n->metrics, KVLD_H_TRANSFER_SECONDS, xfer_s);
    kvld_metrics_add(n->metrics, KVLD_C_SPAN_BYTES_SENT, plen);
    /* second reply + status: the verdict */
    if (watching) {
        pthread_join(watcher, NULL);
        watching = 0;
        msg = w.msg;
        mlen = w.len;
        w.msg = NULL;
        if (w.got) verdict = kvlingo__v1__import_span_response__unpack(NULL, mlen, msg);
    } else if (kvl__rpc_stream_read(stream, &msg, &mlen) == 1) {
        verdict = kvlingo__v1__import_span_response__unpack(NULL, mlen, msg);
    }
    kvl__rpc_result res;
    kvl__rpc_stream_finish(stream, &res);
    if (res.code != GRPC_STATUS_OK || !verdict) {
        code = res.code != GRPC_STATUS_OK ? res.code : GRPC_STATUS_INTERNAL;
        snprintf(err, sizeof err, "peer %s rejected the span: %s", in->peer,
                 res.code != GRPC_STATUS_OK ? res.message : "no verdict in its reply");
        kvl__rpc_result_clear(&res);
        goto out;
    }
    kvl__rpc_result_clear(&res);
    kvld_metrics_add(n->metrics, KVLD_C_SPANS_SENT, 1);
    out.t0 = in->from;
    out.t1 = to;
    out.payload_bytes = plen;
    out.transfer_seconds = xfer_s;
    out.translate_seconds = verdict->translate_seconds;
    out.total_seconds = kvl__now_s() - t_start;
    out.peer_token_count = verdict->token_count;
    out.peer_tokens_sha256 = verdict->tokens_sha256;   /* verdict outlives the reply */
    out.export_seconds = encode_s;
#undef FAIL
out:
    if (watching) {   /* a FAIL between starting the watcher and joining it */
        kvl__rpc_stream_cancel(stream);
        pthread_join(watcher, NULL);
    }
    free(w.msg);
    kvl__rpc_call_on_cancel(call, NULL, NULL);
    /* release before answering: the caller may use the session as soon as it has the answer */
    kvld_session_release(n->sessions, s);
    if (code == GRPC_STATUS_OK) kvl__rpc_call_reply_pb(call, &out.base);
    {
        char extra[400];
        /* the range shipped when one was (the request's `to` is a bound: 0, or past what is cached) */
        snprintf(extra, sizeof extra, " peer_node=%s from=%u to=%u bytes=%zu transfer_ms=%.3f push=%d trailer=%d "
                 "dtype=%s", in->peer ? in->peer : "", in->from, out.t1 > out.t0 ? out.t1 : in->to, plen,
                 xfer_s * 1e3, in->push_tag != 0,
                 in->push_tag != 0 && in->push_trailer,
                 bf16 ? "bf16" : "f32");
        kvld_req_end(&r, code, err, extra);
    }
    if (ep) kvlingo__v1__import_span_response__free_unpacked(ep, NULL);
    if (verdict) kvlingo__v1__import_span_response__free_unpacked(verdict, NULL);
    free(msg);
    kvl__rpc_stream_free(stream);
    if (peer_held) kvld_node_peer_release(n, in->peer);
    /* a send the peer stalled keeps its payload: the transport gives it back when it ends */
    if (!payload_kept) kvl__spanbuf_give(n->spanbufs, payload);
    kvlingo__v1__export_span_request__free_unpacked(in, NULL);
}
