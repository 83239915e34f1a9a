/* daemon/service.c: the Node service's session handlers: Info, OpenSession, Append, Generate,
 * DropSession, SessionInfo.  (ExportSpan / ImportSpan: span_service.c.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "kvlingo/v1/node.pb-c.h"
#include "log.h"
#include "node.h"

/* Bytes of the longest token text allowed for (the shipped vocabularies stay well below). */
#define KVLD_MAX_TOKEN_BYTES 256

/* Unpack the request or answer INVALID_ARGUMENT "malformed <Name>Request". */
#define UNPACK_OR_FAIL(var, type, fn, r, req, len)                                              \
    type *var = fn(NULL, len, req);                                                             \
    if (!var) {                                                                                 \
        kvld_req_end(r, GRPC_STATUS_INVALID_ARGUMENT, malformed_msg((r)->method), NULL);        \
        return;                                                                                 \
    }

static const char *malformed_msg(const char *method) {
    static _Thread_local char buf[128];
    snprintf(buf, sizeof buf, "malformed %sRequest (protobuf does not parse)", method);
    return buf;
}

static Kvlingo__V1__DType dtype_pb(kvl_dtype d) {
    switch (d) {
    case KVL_DTYPE_F32: return KVLINGO__V1__DTYPE__DTYPE_F32;
    case KVL_DTYPE_BF16: return KVLINGO__V1__DTYPE__DTYPE_BF16;
    case KVL_DTYPE_F16: return KVLINGO__V1__DTYPE__DTYPE_F16;
    default: return KVLINGO__V1__DTYPE__DTYPE_UNSPECIFIED;
    }
}

void kvld_rpc_info(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvld_node *n = user;
    kvld_req r;
    kvld_req_begin(&r, n, call, "Info");
    UNPACK_OR_FAIL(in, Kvlingo__V1__InfoRequest, kvlingo__v1__info_request__unpack, &r, req, len);
    kvld_peers_kick(n);   /* a peer connecting: the one that started first need not back off */
    kvlingo__v1__info_request__free_unpacked(in, NULL);
    const kvl_model_config *c = kvl_model_config_get(n->model);
    Kvlingo__V1__InfoResponse out = KVLINGO__V1__INFO_RESPONSE__INIT;
    Kvlingo__V1__ModelId mid = KVLINGO__V1__MODEL_ID__INIT;
    mid.name = (char *)kvl_model_name(n->model);
    mid.hash = (char *)kvl_model_hash(n->model);
    out.model = &mid;
    out.architecture = (char *)c->architecture;
    out.n_layers = (uint32_t)c->n_layers;
    out.n_kv_heads = (uint32_t)c->n_kv_heads;
    out.head_dim = (uint32_t)c->head_dim;
    out.hidden_size = (uint32_t)c->hidden_size;
    out.vocab_size = (uint32_t)c->vocab_size;
    out.continue_rpc = 1;
    out.continue_pull_only = 1;
    out.span_push = 1;
    out.ticket_key_id = n->tickets ? n->ticket_key_id : (char *)"";
    out.dtype = dtype_pb(c->weight_dtype);
    int nt = n->translators.n;
    Kvlingo__V1__TranslatorInfo *ti = calloc((size_t)nt + 1, sizeof *ti);
    Kvlingo__V1__TranslatorInfo **tp = calloc((size_t)nt + 1, sizeof *tp);
    Kvlingo__V1__ModelId *ids = calloc(2 * (size_t)nt + 1, sizeof *ids);
    if (!ti || !tp || !ids) {
        free(ti), free(tp), free(ids);
        kvld_req_end(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL);
        return;
    }
    for (int i = 0; i < nt; i++) {
        const kvld_translator_entry *e = &n->translators.items[i];
        kvlingo__v1__translator_info__init(&ti[i]);
        kvlingo__v1__model_id__init(&ids[2 * i]);
        kvlingo__v1__model_id__init(&ids[2 * i + 1]);
        ids[2 * i].name = (char *)e->source_name;
        ids[2 * i].hash = (char *)(e->source_hash ? e->source_hash : "");
        ids[2 * i + 1].name = (char *)e->target_name;
        ids[2 * i + 1].hash = (char *)(e->target_hash ? e->target_hash : "");
        ti[i].source = &ids[2 * i];
        ti[i].target = &ids[2 * i + 1];
        ti[i].path = (char *)e->path;
        tp[i] = &ti[i];
    }
    out.n_translators = (size_t)nt;
    out.translators = tp;
    out.transport = (char *)(n->transport ? kvl__transport_kind(n->transport) : "none");
    if (n->transport) {
        const uint8_t *a;
        size_t al;
        kvl__transport_address(n->transport, &a, &al);
        out.transport_address.data = (uint8_t *)a;
        out.transport_address.len = al;
    }
    out.max_context = (uint32_t)n->max_context;
    out.max_sessions = (uint32_t)n->cfg.max_sessions;
    out.sessions = (uint32_t)kvld_sessions_count(n->sessions);
    kvl__rpc_call_reply_pb(call, &out.base);
    free(ti), free(tp), free(ids);
    kvld_req_end(&r, GRPC_STATUS_OK, NULL, NULL);
}

void kvld_rpc_open_session(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvld_node *n = user;
    kvld_req r;
    kvld_req_begin(&r, n, call, "OpenSession");
    UNPACK_OR_FAIL(in, Kvlingo__V1__OpenSessionRequest, kvlingo__v1__open_session_request__unpack,
                   &r, req, len);
    if (kvld_req_refuse_if_draining(&r)) {
        kvlingo__v1__open_session_request__free_unpacked(in, NULL);
        return;
    }
    char id[KVLD_ID_MAX];
    kvl_status st = kvld_sessions_open(n->sessions, in->session_id, (int)in->max_context, id);
    kvlingo__v1__open_session_request__free_unpacked(in, NULL);
    if (st != KVL_OK) {
        kvld_req_fail(&r, st, NULL);
        return;
    }
    snprintf(r.session, sizeof r.session, "%s", id);
    kvld_metrics_add(n->metrics, KVLD_C_SESSIONS_OPENED, 1);
    kvld_metrics_set(n->metrics, KVLD_G_SESSIONS, kvld_sessions_count(n->sessions));
    Kvlingo__V1__OpenSessionResponse out = KVLINGO__V1__OPEN_SESSION_RESPONSE__INIT;
    out.session_id = id;
    kvl__rpc_call_reply_pb(call, &out.base);
    kvld_req_end(&r, GRPC_STATUS_OK, NULL, NULL);
}

static void set_flag(void *arg) { *(volatile int *)arg = 1; }

void kvld_rpc_append(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvld_node *n = user;
    kvld_req r;
    kvld_req_begin(&r, n, call, "Append");
    UNPACK_OR_FAIL(in, Kvlingo__V1__AppendRequest, kvlingo__v1__append_request__unpack, &r, req,
                   len);
    snprintf(r.session, sizeof r.session, "%s", in->session_id);
    if (kvld_req_refuse_if_draining(&r)) {
        kvlingo__v1__append_request__free_unpacked(in, NULL);
        return;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    kvl_status st = KVL_OK;
    int has_text = in->text && in->text[0];
    if (has_text && in->n_tokens > 0) {
        st = kvl__errorf(KVL_ERR_INVALID_ARG, "give either tokens or text, not both");
    } else if (has_text) {
        size_t bytes = strlen(in->text);
        if (!n->tok)
            st = kvl__errorf(KVL_ERR_UNSUPPORTED, "this node has no tokenizer: send tokens");
        /* bounded before tokenizing: no token of a byte-level BPE vocabulary is longer than
         * KVLD_MAX_TOKEN_BYTES, so a longer text is over the context whatever its tokens */
        else if (bytes > (size_t)n->max_context * KVLD_MAX_TOKEN_BYTES)
            st = kvl__errorf(KVL_ERR_RANGE, "input too long: a text of %zu bytes is more than the max "
                            "context of %d tokens can hold (--max-context; checked before tokenizing)",
                            bytes, n->max_context);
        else
            st = kvl_tokenizer_encode(n->tok, in->text, bytes, &ids, &n_ids);
    } else if (in->n_tokens > 0) {
        ids = malloc(sizeof(int32_t) * in->n_tokens);
        if (!ids) st = kvl__errorf(KVL_ERR_NOMEM, "tokens");
        else memcpy(ids, in->tokens, sizeof(int32_t) * in->n_tokens);
        n_ids = in->n_tokens;
    }
    int vocab = kvl_model_config_get(n->model)->vocab_size;
    for (size_t i = 0; st == KVL_OK && i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            st = kvl__errorf(KVL_ERR_INVALID_ARG, "token %zu has id %d outside the vocabulary [0, %d)",
                            i, ids[i], vocab);
    kvld_session *s = NULL;
    if (st == KVL_OK) st = kvld_session_acquire(n->sessions, in->session_id, KVLD_PREFILL, 0, &s, NULL);
    /* the ledger's length after a cut: checked with the new tokens before anything changes, so
     * a refused Append leaves the session as it was */
    int keep = st == KVL_OK ? s->n_ledger : 0;
    if (st == KVL_OK && in->truncate) {
        /* only the uncached tail may go: the KV cache (and the logits after it) stay valid */
        int cached = kvl_cache_n_tokens(s->cache);
        if ((int64_t)in->truncate_to > s->n_ledger)
            st = kvl__errorf(KVL_ERR_RANGE, "truncate_to %u is past the ledger's %d tokens", in->truncate_to,
                            s->n_ledger);
        else if ((int)in->truncate_to < cached)
            st = kvl__errorf(KVL_ERR_MISMATCH, "truncate_to %u would cut into the KV cache (%d tokens)",
                            in->truncate_to, cached);
        else
            keep = (int)in->truncate_to;
    }
    if (st == KVL_OK && (size_t)keep + n_ids > (size_t)s->max_context)
        st = kvl__errorf(KVL_ERR_RANGE,
                        "input too long: %zu new tokens + %d held exceed the max context of %d "
                        "tokens (--max-context)", n_ids, keep, s->max_context);
    double prefill_s = 0;
    if (st == KVL_OK) {
        if (keep != s->n_ledger) __atomic_store_n(&s->n_ledger, keep, __ATOMIC_RELAXED);
        memcpy(s->ledger + s->n_ledger, ids, sizeof(int32_t) * n_ids);
        __atomic_store_n(&s->n_ledger, s->n_ledger + (int)n_ids, __ATOMIC_RELAXED);
        if (in->prefill && n_ids > 0) {
            volatile int cancelled = 0;
            kvl__rpc_call_on_cancel(call, set_flag, (void *)&cancelled);
            double t0 = kvl__now_s();
            st = kvld_sched_prefill(n->sched, s, &cancelled);
            prefill_s = kvl__now_s() - t0;
            kvl__rpc_call_on_cancel(call, NULL, NULL);
            /* a failed prefill leaves the tokens in the ledger: Generate will prefill them */
        }
    }
    Kvlingo__V1__AppendResponse out = KVLINGO__V1__APPEND_RESPONSE__INIT;
    if (s) {
        out.token_count = (uint32_t)s->n_ledger;
        out.cached_count = (uint32_t)kvl_cache_n_tokens(s->cache);
    }
    char extra[128];
    snprintf(extra, sizeof extra, " tokens=%zu prefill_ms=%.3f", n_ids, prefill_s * 1e3);
    kvld_session_release(n->sessions, s);
    if (st != KVL_OK) {
        kvld_req_fail(&r, st, extra);
    } else {
        out.n_tokens = n_ids;
        out.tokens = ids;
        out.prefill_seconds = prefill_s;
        kvl__rpc_call_reply_pb(call, &out.base);
        kvld_req_end(&r, GRPC_STATUS_OK, NULL, extra);
    }
    free(ids);
    kvlingo__v1__append_request__free_unpacked(in, NULL);
}

static void cancel_job(void *arg) { kvld_job_cancel(arg); }

kvl_status kvld_gen_params_from_pb(const kvld_node *n, const Kvlingo__V1__GenerateRequest *in,
                                   kvld_gen_params *gp) {
    memset(gp, 0, sizeof *gp);
    /* every field checked here, before a caller changes a session for the turn (ContinueTurn
     * appends its tokens first): what the scheduler or the sampler would refuse later must not
     * leave a session holding a turn that never ran */
    if (in->max_tokens < 1 || in->max_tokens > INT32_MAX)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "max_tokens must be >= 1 (got %u)", in->max_tokens);
    if (!(in->temperature >= 0.0f) || !isfinite(in->temperature))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "temperature must be a finite number >= 0 (got %g)",
                          (double)in->temperature);
    if (in->top_k > INT32_MAX)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "top_k %u is too large", in->top_k);
    gp->max_tokens = (int)in->max_tokens;
    gp->stop_at_eos = in->stop_at_eos;
    gp->want_logprobs = in->return_logprobs;
    gp->sampler = kvl_sampler_default_params();
    gp->sampler.temperature = in->temperature;
    gp->sampler.top_k = (int)in->top_k;
    gp->sampler.top_p = in->top_p > 0 && in->top_p < 1 ? in->top_p : 1.0f;
    gp->sampler.seed = in->seed;
    /* stop ids: bounded, and each a real id */
    int vocab = kvl_model_config_get(n->model)->vocab_size;
    if (in->n_stop_tokens > KVLD_MAX_STOP_IDS)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "stop_tokens: at most %d ids, got %zu", KVLD_MAX_STOP_IDS,
                          in->n_stop_tokens);
    for (size_t i = 0; i < in->n_stop_tokens; i++) {
        if (in->stop_tokens[i] < 0 || in->stop_tokens[i] >= vocab)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "stop_tokens[%zu] = %d is outside the vocabulary [0, %d)",
                              i, in->stop_tokens[i], vocab);
        gp->stop_ids[gp->n_stop++] = in->stop_tokens[i];
    }
    if (gp->max_tokens > n->max_context) gp->max_tokens = n->max_context;
    return KVL_OK;
}

void kvld_stream_turn(kvld_req *r, kvld_session *s, const kvld_gen_params *gp,
                      Kvlingo__V1__ContinueResult *result) {
    kvld_node *n = r->node;
    kvl__rpc_call *call = r->call;
    kvld_job *job = NULL;
    kvl_detok *dt = NULL;
    char *piece = NULL;
    size_t piece_cap = n->tok ? kvl_detok_push_capacity(n->tok) : 0;
    kvl_status st = KVL_OK;
    if (n->tok) {
        st = kvl_detok_create(n->tok, &dt);
        if (st == KVL_OK && !(piece = malloc(piece_cap + 1)))
            st = kvl__errorf(KVL_ERR_NOMEM, "detokenizer buffer");
    }
    /* a cancel while kvld_sched_generate runs the job's first step (an idle node) is seen
     * through the flag, after it through kvld_job_cancel, which also wakes a paused job */
    volatile int cancelled = 0;
    kvld_gen_params g = *gp;
    g.cancel = &cancelled;
    kvl__rpc_call_on_cancel(call, set_flag, (void *)&cancelled);
    if (st == KVL_OK) st = kvld_sched_generate(n->sched, s, &g, &job);
    if (st != KVL_OK) {
        kvl__rpc_call_on_cancel(call, NULL, NULL);
        kvl_detok_free(dt);
        free(piece);
        kvld_session_release(n->sessions, s);
        kvld_req_fail(r, st, NULL);
        return;
    }
    kvl__rpc_call_on_cancel(call, cancel_job, job);
    int vocab = kvl_model_config_get(n->model)->vocab_size;
    int sent = 0, send_failed = 0;
    double first_s = 0;   /* the call's arrival to its first token's message, this node's TTFT */
    kvld_token t;
    while (kvld_job_next(job, &t)) {
        if (send_failed) {   /* drain until the scheduler sees the cancel */
            free(t.logprobs);
            continue;
        }
        Kvlingo__V1__GenerateResponse m = KVLINGO__V1__GENERATE_RESPONSE__INIT;
        m.token = t.id;
        m.logprob = t.logprob;
        size_t pl = 0;
        if (dt && kvl_detok_push(dt, t.id, piece, piece_cap, &pl) != KVL_OK) pl = 0;
        if (piece) piece[pl] = '\0';
        m.text = piece ? piece : (char *)"";
        if (t.logprobs) {
            m.n_logprobs = (size_t)vocab;
            m.logprobs = t.logprobs;
        }
        if (!sent) first_s = kvl__now_s() - r->t0;
        if (kvl__rpc_call_send_pb(call, &m.base) != KVL_OK) {
            send_failed = 1;
            kvld_job_cancel(job);
        } else {
            sent++;
        }
        free(t.logprobs);
    }
    kvl__rpc_call_on_cancel(call, NULL, NULL);
    const char *err, *reason;
    double ttft;
    st = kvld_job_result(job, &err, &reason, &ttft);
    char errcopy[512];
    snprintf(errcopy, sizeof errcopy, "%s", err);
    char extra[400];
    int el = snprintf(extra, sizeof extra, " generated=%d finish=%s ttft_ms=%.3f first_ms=%.3f", sent, reason,
                      ttft * 1e3, first_s * 1e3);
    char sha[65] = "";
    if (result) {
        /* the session is still ours: what it holds after the turn, for the caller's commit */
        result->token_count = (uint32_t)s->n_ledger;
        result->cached_count = (uint32_t)kvl_cache_n_tokens(s->cache);
        kvl__tokens_sha256_hex(s->ledger, (size_t)s->n_ledger, sha);
        result->tokens_sha256 = sha;
        result->forward_seconds = ttft;
        if (el > 0 && (size_t)el < sizeof extra)
            snprintf(extra + el, sizeof extra - (size_t)el,
                     " mode=%s span=%u prefill=%u pull_ms=%.3f transfer_ms=%.3f translate_ms=%.3f%s%s",
                     result->mode == 1 ? "translate" : result->mode == 2 ? "reprefill" : "none",
                     result->span_t1 - result->span_t0, result->prefill_tokens, result->pull_seconds * 1e3,
                     result->transfer_seconds * 1e3, result->translate_seconds * 1e3,
                     result->fallback && result->fallback[0] ? " fallback=" : "",
                     result->fallback ? result->fallback : "");
    }
    /* the session goes back before the final message: a client that acts on done=1 (before
     * the status) finds it idle, and a slow reader of that message holds nothing */
    kvld_job_free(job);
    kvld_session_release(n->sessions, s);
    if (st == KVL_OK && !send_failed) {
        Kvlingo__V1__GenerateResponse fin = KVLINGO__V1__GENERATE_RESPONSE__INIT;
        size_t pl = 0;
        if (dt && kvl_detok_flush(dt, piece, piece_cap, &pl) != KVL_OK) pl = 0;
        if (piece) piece[pl] = '\0';
        fin.text = piece ? piece : (char *)"";
        fin.done = 1;
        fin.generated_count = (uint32_t)sent;
        fin.ttft_seconds = ttft;
        fin.total_seconds = kvl__now_s() - r->t0;
        fin.finish_reason = (char *)reason;
        fin.result = result;
        kvl__rpc_call_send_pb(call, &fin.base);
    }
    kvl_detok_free(dt);
    free(piece);
    if (send_failed || st == KVL_ERR_CANCELLED)
        kvld_req_end(r, GRPC_STATUS_CANCELLED, "generation cancelled by the client", extra);
    else if (st != KVL_OK)
        kvld_req_end(r, kvl__rpc_status_from_kvl(st), errcopy, extra);
    else {
        kvl__rpc_call_finish(call, GRPC_STATUS_OK, NULL);
        kvld_req_end(r, GRPC_STATUS_OK, NULL, extra);
    }
}

void kvld_rpc_generate(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvld_node *n = user;
    kvld_req r;
    kvld_req_begin(&r, n, call, "Generate");
    UNPACK_OR_FAIL(in, Kvlingo__V1__GenerateRequest, kvlingo__v1__generate_request__unpack, &r,
                   req, len);
    snprintf(r.session, sizeof r.session, "%s", in->session_id);
    if (kvld_req_refuse_if_draining(&r)) {
        kvlingo__v1__generate_request__free_unpacked(in, NULL);
        return;
    }
    kvld_gen_params gp;
    /* r.session is the id cut to its buffer: a longer one must not name the session it starts with */
    kvl_status st = strlen(in->session_id) < sizeof r.session
                        ? kvld_gen_params_from_pb(n, in, &gp)
                        : kvl__errorf(KVL_ERR_INVALID_ARG, "session id of %zu characters (at most %zu)",
                                      strlen(in->session_id), sizeof r.session - 1);
    kvlingo__v1__generate_request__free_unpacked(in, NULL);
    if (st != KVL_OK) {
        kvld_req_fail(&r, st, NULL);
        return;
    }
    kvld_session *s = NULL;
    st = kvld_session_acquire(n->sessions, r.session, KVLD_DECODE, 0, &s, NULL);
    if (st != KVL_OK) {
        kvld_req_fail(&r, st, NULL);
        return;
    }
    kvld_stream_turn(&r, s, &gp, NULL);
}

void kvld_rpc_drop_session(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvld_node *n = user;
    kvld_req r;
    kvld_req_begin(&r, n, call, "DropSession");
    UNPACK_OR_FAIL(in, Kvlingo__V1__DropSessionRequest, kvlingo__v1__drop_session_request__unpack,
                   &r, req, len);
    snprintf(r.session, sizeof r.session, "%s", in->session_id);
    kvl_status st = kvld_sessions_drop(n->sessions, in->session_id);
    kvlingo__v1__drop_session_request__free_unpacked(in, NULL);
    if (st != KVL_OK) {
        kvld_req_fail(&r, st, NULL);
        return;
    }
    kvld_metrics_set(n->metrics, KVLD_G_SESSIONS, kvld_sessions_count(n->sessions));
    Kvlingo__V1__DropSessionResponse out = KVLINGO__V1__DROP_SESSION_RESPONSE__INIT;
    out.dropped = 1;
    kvl__rpc_call_reply_pb(call, &out.base);
    kvld_req_end(&r, GRPC_STATUS_OK, NULL, NULL);
}

void kvld_rpc_session_info(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvld_node *n = user;
    kvld_req r;
    kvld_req_begin(&r, n, call, "SessionInfo");
    UNPACK_OR_FAIL(in, Kvlingo__V1__SessionInfoRequest, kvlingo__v1__session_info_request__unpack,
                   &r, req, len);
    snprintf(r.session, sizeof r.session, "%s", in->session_id);
    const size_t idl = strlen(in->session_id);
    kvlingo__v1__session_info_request__free_unpacked(in, NULL);
    kvld_session_info si;
    /* r.session is the id cut to its buffer: a longer one must not name the session it starts with */
    kvl_status st = idl < sizeof r.session ? kvld_sessions_info(n->sessions, r.session, &si)
                                           : kvl__errorf(KVL_ERR_INVALID_ARG, "session id of %zu characters "
                                                         "(at most %zu)", idl, sizeof r.session - 1);
    if (st != KVL_OK) {
        kvld_req_fail(&r, st, NULL);
        return;
    }
    Kvlingo__V1__SessionInfoResponse out = KVLINGO__V1__SESSION_INFO_RESPONSE__INIT;
    out.session_id = r.session;
    out.token_count = (uint32_t)si.n_ledger;
    out.cached_count = (uint32_t)si.n_cached;
    out.max_context = (uint32_t)si.max_context;
    out.cache_bytes = si.cache_bytes;
    out.state = (char *)kvld_state_name(si.state);
    out.imported_count = (uint32_t)si.n_imported;
    out.tokens_sha256 = si.tokens_sha256;
    out.idle_ttl_seconds = (uint32_t)(n->cfg.session_idle_ttl_s > 0 ? n->cfg.session_idle_ttl_s : 0);
    kvl__rpc_call_reply_pb(call, &out.base);
    kvld_req_end(&r, GRPC_STATUS_OK, NULL, NULL);
}
