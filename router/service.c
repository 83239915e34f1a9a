/* router/service.c: the Router gRPC service (kvlingo.v1.Router): request validation, session
 * busy-locking, streaming, one log line per request. */
#include "router.h"
#include "openai.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "error.h"
#include "nodecall.h"

#define SVC "/kvlingo.v1.Router/"
/* Raw text is rejected before tokenizing when it could not fit max_input_tokens even at the
 * longest token this vocabulary has: bounds the work a hostile request can cause. */
#define MAX_BYTES_PER_TOKEN 64


static kvl_status busy_take(kvr_router *r, const char *id, int expiry) {
    pthread_mutex_lock(&r->busy_mu);
    kvl_status s = KVL_OK;
    for (int i = 0; i < r->n_busy; i++)
        if (!strcmp(r->busy[i], id)) { s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is busy: a turn is running", id); break; }
    /* turns count against max_busy without the expiry's place, which is its own */
    if (!s && (expiry ? r->expiry_held : r->n_busy - r->expiry_held >= r->max_busy))
        s = kvl__errorf(KVL_ERR_NOMEM, "router busy: %d turns running (max_busy_sessions)", r->n_busy);
    if (!s) {
        snprintf(r->busy[r->n_busy++], KVR_ID_MAX, "%s", id);
        if (expiry) r->expiry_held = 1;
    }
    pthread_mutex_unlock(&r->busy_mu);
    return s;
}

kvl_status kvr_router_busy_take(kvr_router *r, const char *id) { return busy_take(r, id, 0); }

/* The expiry's own place past max_busy_sessions (it holds one session at a time): a router
 * whose turns fill every place still expires idle sessions, and expiry takes no turn's place.
 * Given back with kvr_router_busy_release_expiry. */
kvl_status kvr_router_busy_take_expiry(kvr_router *r, const char *id) { return busy_take(r, id, 1); }

/* busy_mu held: the place and the expiry's flag go in one step, so that no turn can count the
 * expiry's place as its own in between (busy[] holds max_busy + 1) */
static void busy_release_locked(kvr_router *r, const char *id, int expiry) {
    for (int i = 0; i < r->n_busy; i++)
        if (!strcmp(r->busy[i], id)) {
            memmove(r->busy[i], r->busy[r->n_busy - 1], KVR_ID_MAX);
            r->n_busy--;
            if (expiry) r->expiry_held = 0;
            break;
        }
}

void kvr_router_busy_release_expiry(kvr_router *r, const char *id) {
    pthread_mutex_lock(&r->busy_mu);
    busy_release_locked(r, id, 1);
    pthread_mutex_unlock(&r->busy_mu);
}

void kvr_router_busy_release(kvr_router *r, const char *id) {
    pthread_mutex_lock(&r->busy_mu);
    busy_release_locked(r, id, 0);
    pthread_mutex_unlock(&r->busy_mu);
}

static void fail(kvl__rpc_call *call, const char *method, grpc_status_code code, const char *msg) {
    kvl__svc_log_text("warn", "%s -> %s: %s", method, kvl__rpc_status_name(code), msg);
    kvl__rpc_call_finish(call, code, "%s", msg);
}

static void fail_kvl(kvr_router *r, kvl__rpc_call *call, const char *method, kvl_status s) {
    grpc_status_code code = kvl__rpc_status_from_kvl(s);
    /* a busy session is a retryable conflict, not a broken precondition */
    if (s == KVL_ERR_MISMATCH && strstr(kvl_last_error(), "is busy")) code = GRPC_STATUS_ABORTED;
    char lab[48];
    snprintf(lab, sizeof lab, "code=\"%s\"", kvl__rpc_status_name(code));
    kvr_metrics_inc(r->metrics, "kvlingo_router_errors_total", lab, 1);
    /* the log keeps the whole text; the client reads it without node addresses or tenant tags */
    const char *raw = kvl_last_error()[0] ? kvl_last_error() : kvl_strerror(s);
    char m[1024];
    kvr_registry_redact(r->reg, raw, m, sizeof m);
    kvl__svc_log_text("warn", "%s -> %s: %s", method, kvl__rpc_status_name(code), raw);
    kvl__rpc_call_finish(call, code, "%s", m);
}

kvl_status kvr_session_resolve(kvr_router *r, const char *id, const char *tenant, char key[KVR_ID_MAX]) {
    if (!kvr_session_id_valid(id)) return kvr_id_refuse("session_id", id);
    kvr_session_key(tenant, id, key);
    kvr_session s;
    kvl_status st = kvr_ledger_session_load(r->ledger, key, 0, &s);
    if (st == KVL_ERR_NOT_FOUND && strcmp(key, id)) {   /* made before keys were per tenant */
        snprintf(key, KVR_ID_MAX, "%s", id);
        st = kvr_ledger_session_load(r->ledger, key, 0, &s);
    }
    if (st && st != KVL_ERR_NOT_FOUND) return st;
    int mine = !st && !strcmp(s.tenant, tenant);
    if (!st) kvr_session_clear(&s);
    if (mine) return KVL_OK;
    kvr_session_key(tenant, id, key);   /* where a new session of that name would go */
    return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", id);
}

/* ---- CreateSession ------------------------------------------------------------------------- */

static void h_create(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvr_router *r = user;
    kvr_tenant_info t;
    if (kvr_auth_call(r, call, "CreateSession", 0, &t)) return;
    Kvlingo__V1__CreateSessionRequest *q = kvlingo__v1__create_session_request__unpack(NULL, len, req);
    if (!q) { fail(call, "CreateSession", GRPC_STATUS_INVALID_ARGUMENT, "malformed CreateSessionRequest"); return; }
    char id[KVR_ID_MAX], key[KVR_ID_MAX];
    if (q->session_id && q->session_id[0]) {
        if (!kvr_session_id_valid(q->session_id)) {   /* checked whole, before it is copied */
            kvl_status e = kvr_id_refuse("session_id", q->session_id);
            protobuf_c_message_free_unpacked(&q->base, NULL);
            fail_kvl(r, call, "CreateSession", e);
            return;
        }
        snprintf(id, sizeof id, "%s", q->session_id);
    } else {
        uint8_t rnd[8] = {0};
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            uint64_t x = (uint64_t)(kvl__now_s() * 1e9);
            memcpy(rnd, &x, sizeof rnd);
        }
        snprintf(id, sizeof id, "s-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3],
                 rnd[4], rnd[5], rnd[6], rnd[7]);
    }
    kvl_status s = KVL_OK;
    if (q->model && q->model[0] && !kvr_registry_model_known(r->reg, q->model)) {
        char models[256];
        kvr_registry_models(r->reg, models, sizeof models);
        s = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown model '%.64s' (the fleet serves: %s)", q->model, models);
    }
    if (!s) {
        /* the key (ledger.h kvr_session_key) is the tenant's own: another tenant's alike id is
         * another session.  The tenant's own of that id exists already, also one made before
         * ids were per tenant (its bare id, which a new one under the key would hide) */
        kvl_status e = kvr_session_resolve(r, id, t.name, key);
        if (!e) s = kvl__errorf(KVL_ERR_INVALID_ARG, "session '%s' exists already", id);
        else if (e == KVL_ERR_NOT_FOUND) kvl_clear_error();
        else s = e;
    }
    if (!s) s = kvr_ledger_session_create_for(r->ledger, key, q->model ? q->model : "", t.name, t.max_sessions,
                                              kvr_wall_now());
    protobuf_c_message_free_unpacked(&q->base, NULL);
    if (s == KVL_ERR_NOMEM && strstr(kvl_last_error(), "quota:")) kvr_quota_refused(r, t.name, "max_sessions");
    if (s) {
        if (s == KVL_ERR_INVALID_ARG && strstr(kvl_last_error(), "exists")) {
            char m[160];   /* named as the client names it (the ledger's message has its key) */
            snprintf(m, sizeof m, "session '%s' exists already", id);
            fail(call, "CreateSession", GRPC_STATUS_ALREADY_EXISTS, m);
            return;
        }
        fail_kvl(r, call, "CreateSession", s);
        return;
    }
    Kvlingo__V1__CreateSessionResponse resp = KVLINGO__V1__CREATE_SESSION_RESPONSE__INIT;
    resp.session_id = id;
    kvl__rpc_call_reply_pb(call, &resp.base);
    kvl__svc_log_text("info", "CreateSession %s tenant=%s", key, t.name);
}

/* ---- Send ---------------------------------------------------------------------------------- */

typedef struct emit_ctx {
    kvl__rpc_call *call;
    const kvl_tokenizer *tok;
    int special_text;
} emit_ctx;

static void on_client_cancel(void *arg) { kvr_turn_cancel_fire(arg); }

static int emit_token(void *arg, int32_t token, const char *text, float logprob) {
    emit_ctx *e = arg;
    Kvlingo__V1__SendResponse m = KVLINGO__V1__SEND_RESPONSE__INIT;
    m.token = token;
    /* a special token's piece is its whole text ("<|endoftext|>"): left out unless asked */
    m.text = !e->special_text && kvl_tokenizer_is_special(e->tok, token) ? (char *)"" : (char *)text;
    m.logprob = logprob;
    return kvl__rpc_call_send_pb(e->call, &m.base) != KVL_OK;
}

static kvl_status validate_send(kvr_router *r, Kvlingo__V1__SendRequest *q, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    const kvr_config *c = r->cfg;
    if (!q->session_id || !q->session_id[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "session_id is required");
    if (!kvr_session_id_valid(q->session_id))   /* no session has such an id: say why */
        return kvr_id_refuse("session_id", q->session_id);
    size_t tl = q->text ? strlen(q->text) : 0;
    if (tl && q->n_tokens) return kvl__errorf(KVL_ERR_INVALID_ARG, "give text or tokens, not both");
    if (!tl && !q->n_tokens) return kvl__errorf(KVL_ERR_INVALID_ARG, "empty input: give text or tokens");
    if (q->max_tokens > (uint32_t)c->max_new_tokens)
        return kvl__errorf(KVL_ERR_RANGE, "max_tokens %u exceeds the router's max_new_tokens %ld",
                          q->max_tokens, c->max_new_tokens);
    if (q->model && q->model[0] && !kvr_registry_model_known(r->reg, q->model)) {
        char models[256];
        kvr_registry_models(r->reg, models, sizeof models);
        return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown model '%.64s' (the fleet serves: %s)", q->model, models);
    }
    if (q->prefetch_model && q->prefetch_model[0] && !kvr_registry_model_known(r->reg, q->prefetch_model)) {
        char models[256];
        kvr_registry_models(r->reg, models, sizeof models);
        return kvl__errorf(KVL_ERR_NOT_FOUND, "prefetch_model: unknown model '%.64s' (the fleet serves: %s)",
                          q->prefetch_model, models);
    }
    if (q->request_id && q->request_id[0] && !kvr_session_id_valid(q->request_id))
        return kvr_id_refuse("request_id", q->request_id);
    if (!(q->temperature >= 0 && q->temperature <= 100) || !(q->top_p >= 0 && q->top_p <= 1))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "temperature must be in [0, 100], top_p in [0, 1]");
    if (q->top_k > INT32_MAX)   /* what a node takes: checked here, before a node says so */
        return kvl__errorf(KVL_ERR_INVALID_ARG, "top_k %u is too large (at most %d; 0: off)", q->top_k, INT32_MAX);
    if (tl) {
        if (tl > (size_t)c->max_input_tokens * MAX_BYTES_PER_TOKEN)
            return kvl__errorf(KVL_ERR_RANGE, "input of %zu bytes is too long (max_input_tokens %ld)", tl,
                              c->max_input_tokens);
        size_t cnt = 0;
        kvl_status s = kvl_tokenizer_encode(r->tok, q->text, tl, ids, &cnt);
        if (s) return kvl__error_prefix(s, "text");
        *n = (int)cnt;
        if (!cnt) return kvl__errorf(KVL_ERR_INVALID_ARG, "empty input: the text has no tokens");
    } else {
        size_t vocab = kvl_tokenizer_vocab_size(r->tok);
        for (size_t i = 0; i < q->n_tokens; i++)
            if (q->tokens[i] < 0 || (size_t)q->tokens[i] >= vocab)
                return kvl__errorf(KVL_ERR_INVALID_ARG, "tokens[%zu] = %d is outside the vocabulary [0, %zu)",
                                  i, q->tokens[i], vocab);
        if (q->n_tokens > (size_t)c->max_input_tokens)
            return kvl__errorf(KVL_ERR_RANGE, "input is %zu tokens, at most %ld per turn (max_input_tokens)",
                              q->n_tokens, c->max_input_tokens);
        *ids = malloc(q->n_tokens * sizeof(int32_t));
        if (!*ids) return kvl__errorf(KVL_ERR_NOMEM, "input");
        memcpy(*ids, q->tokens, q->n_tokens * sizeof(int32_t));
        *n = (int)q->n_tokens;
    }
    if (*n > c->max_input_tokens)
        return kvl__errorf(KVL_ERR_RANGE, "input is %d tokens, at most %ld per turn (max_input_tokens)", *n,
                          c->max_input_tokens);
    return KVL_OK;
}

static void h_send(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvr_router *r = user;
    kvr_tenant_info t;
    if (kvr_auth_call(r, call, "Send", 0, &t)) return;
    Kvlingo__V1__SendRequest *q = kvlingo__v1__send_request__unpack(NULL, len, req);
    if (!q) { fail(call, "Send", GRPC_STATUS_INVALID_ARGUMENT, "malformed SendRequest"); return; }
    int32_t *ids = NULL;
    int n = 0;
    char key[KVR_ID_MAX] = "";
    kvl_status s = validate_send(r, q, &ids, &n);
    if (!s) s = kvr_session_resolve(r, q->session_id, t.name, key);   /* before the busy check: no hint either */
    if (!s) s = kvr_router_busy_take(r, key);
    if (s) {
        fail_kvl(r, call, "Send", s);
        free(ids);
        protobuf_c_message_free_unpacked(&q->base, NULL);
        return;
    }
    int32_t stop_ids[1], end_token = -1;
    int n_stop = 0;
    if (q->chat) {   /* the chat template's end-of-turn token also ends the turn */
        kvl_chat_format f = kvl_tokenizer_chat_format(r->tok);
        end_token = kvl_tokenizer_token_id(r->tok, f == KVL_CHAT_LLAMA3 ? "<|eot_id|>" : "<|im_end|>");
        if (end_token >= 0 && !q->ignore_eos) stop_ids[n_stop++] = end_token;
    }
    kvr_turn_req tr = {.sid = key, .user = ids, .n_user = n,
                       .max_tokens = q->max_tokens ? q->max_tokens : (unsigned)r->cfg->default_max_tokens,
                       .temperature = q->temperature, .top_k = q->top_k, .top_p = q->top_p,
                       .seed = q->seed, .stop_at_eos = !q->ignore_eos, .stop_ids = stop_ids,
                       .n_stop = n_stop, .has_end_token = end_token >= 0, .end_token = end_token, .model = q->model ? q->model : "",
                       .escalate = q->escalate, .force_reprefill = q->force_reprefill,
                       .compare_reprefill = q->compare_reprefill,
                       .request_id = q->request_id ? q->request_id : "", .tenant = t.name,
                       .prefetch_model = q->prefetch_model ? q->prefetch_model : ""};
    kvr_turn_out o;
    emit_ctx e = {.call = call, .tok = r->tok, .special_text = q->special_text};
    /* a client that goes away while the node has not answered yet (a long prefill) ends the
     * node's call at once; after the first token, a failed send says it as well */
    kvr_turn_cancel cx;
    kvr_turn_cancel_init(&cx);
    tr.cancel = &cx;
    kvl__rpc_call_on_cancel(call, on_client_cancel, &cx);
    s = kvr_turn_run(r, &tr, emit_token, &e, &o);
    kvl__rpc_call_on_cancel(call, NULL, NULL);   /* returns once no callback runs */
    kvr_turn_cancel_destroy(&cx);
    kvr_router_busy_release(r, key);
    if (s) {
        fail_kvl(r, call, "Send", s);
    } else {
        Kvlingo__V1__TurnSummary sum = KVLINGO__V1__TURN_SUMMARY__INIT;
        sum.model = o.model;
        sum.node = o.node;
        sum.switch_mode = (Kvlingo__V1__SwitchMode)o.mode;
        sum.from_model = o.from_model;
        sum.from_node = o.from_node;
        sum.span_tokens = o.span_tokens;
        sum.ttft_seconds = o.ttft_s;
        sum.tokens_per_second = o.tps;
        sum.n_generated = o.n_generated;
        char fb_r[sizeof o.fallback];   /* a node's reason may name a peer's address */
        kvr_registry_redact(r->reg, o.fallback, fb_r, sizeof fb_r);
        sum.fallback_reason = fb_r;
        sum.turn = o.turn;
        sum.context_tokens = o.context_tokens;
        sum.switch_seconds = o.switch_s;
        sum.finish_reason = o.finish_reason;
        sum.mean_entropy = o.mean_entropy;
        sum.reprefill_ttft_seconds = o.reprefill_ttft_s;
        sum.shadow_kl = o.shadow_kl;
        sum.user_tokens = o.user_tokens;
        sum.policy_reason = o.policy_reason;
        sum.failover_from = o.failover_from;
        sum.ledger_seconds = o.ledger_s;
        sum.export_seconds = o.export_s;
        sum.transfer_seconds = o.transfer_s;
        sum.translate_seconds = o.translate_s;
        sum.forward_seconds = o.forward_s;
        sum.one_call = o.one_call;
        sum.pushed_ahead_tokens = o.pushed_ahead_tokens;
        /* logged before the summary goes out: a client that saw the summary finds the line */
        static const char *modes[] = {"none", "translate", "reprefill"};
        char qfb[330], qpol[330];   /* room for every character escaped */
        kvl__svc_log("info",
                     "msg=turn session=%s turn=%u node=%s model=%s mode=%s from=%s span=%u "
                     "user=%u ttft_ms=%.2f switch_ms=%.2f ledger_ms=%.2f export_ms=%.2f "
                     "transfer_ms=%.2f translate_ms=%.2f forward_ms=%.2f calls=%s tokens=%u "
                     "tok_s=%.1f entropy=%.3f ctx=%u fallback=%s policy=%s",
                     tr.sid, o.turn, o.node, o.model, modes[o.mode % 3],
                     o.from_model[0] ? o.from_model : "-", o.span_tokens, o.user_tokens,
                     o.ttft_s * 1e3, o.switch_s * 1e3, o.ledger_s * 1e3, o.export_s * 1e3,
                     o.transfer_s * 1e3, o.translate_s * 1e3, o.forward_s * 1e3,
                     o.one_call ? "one" : "several", o.n_generated, o.tps, o.mean_entropy,
                     o.context_tokens, kvl__svc_log_q(qfb, sizeof qfb, o.fallback),
                     kvl__svc_log_q(qpol, sizeof qpol, o.policy_reason));
        Kvlingo__V1__SendResponse m = KVLINGO__V1__SEND_RESPONSE__INIT;
        m.summary = &sum;
        kvl__rpc_call_send_pb(call, &m.base);
        kvl__rpc_call_finish(call, GRPC_STATUS_OK, NULL);
    }
    free(ids);
    protobuf_c_message_free_unpacked(&q->base, NULL);
}

/* ---- GetSession / CloseSession ------------------------------------------------------------- */

static void h_get(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvr_router *r = user;
    kvr_tenant_info t;
    if (kvr_auth_call(r, call, "GetSession", 0, &t)) return;
    Kvlingo__V1__GetSessionRequest *q = kvlingo__v1__get_session_request__unpack(NULL, len, req);
    if (!q) { fail(call, "GetSession", GRPC_STATUS_INVALID_ARGUMENT, "malformed GetSessionRequest"); return; }
    kvr_session s;
    char key[KVR_ID_MAX], id[KVR_ID_MAX] = "";
    kvl_status st = kvr_session_resolve(r, q->session_id, t.name, key);
    if (!st) st = kvr_ledger_session_load(r->ledger, key, q->include_tokens, &s);
    if (!st && strcmp(s.tenant, t.name)) {   /* another tenant's: as if it did not exist */
        kvr_session_clear(&s);
        st = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%.80s'", q->session_id);
    }
    if (!st) snprintf(id, sizeof id, "%s", q->session_id);   /* the client's name for it */
    protobuf_c_message_free_unpacked(&q->base, NULL);
    if (st) { fail_kvl(r, call, "GetSession", st); return; }
    Kvlingo__V1__GetSessionResponse resp = KVLINGO__V1__GET_SESSION_RESPONSE__INIT;
    Kvlingo__V1__NodeHolding hold[KVR_MAX_HOLDINGS], *hp[KVR_MAX_HOLDINGS];
    static const char *states[] = {"open", "closed", "expired"};
    int ni = kvr_registry_find(r->reg, s.current_node);
    resp.session_id = id;
    resp.open = s.state == KVR_SESSION_OPEN;
    resp.context_tokens = (uint32_t)s.n_tokens;
    resp.n_turns = (uint32_t)s.n_turns;
    resp.current_node = s.current_node;
    resp.current_model = ni >= 0 ? r->reg->nodes[ni].model : "";
    for (int i = 0; i < s.n_holdings; i++) {
        kvlingo__v1__node_holding__init(&hold[i]);
        hold[i].node = s.holdings[i].node;
        hold[i].n_tokens = (uint32_t)s.holdings[i].n_tokens;
        hp[i] = &hold[i];
    }
    resp.n_holdings = (size_t)s.n_holdings;
    resp.holdings = hp;
    if (s.tokens) { resp.n_tokens = (size_t)s.n_tokens; resp.tokens = s.tokens; }
    resp.idle_seconds = kvr_wall_now() - s.last_used;
    resp.state = (char *)states[s.state % 3];
    kvl__rpc_call_reply_pb(call, &resp.base);
    kvr_session_clear(&s);
}

static void h_close(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvr_router *r = user;
    kvr_tenant_info t;
    if (kvr_auth_call(r, call, "CloseSession", 0, &t)) return;
    Kvlingo__V1__CloseSessionRequest *q = kvlingo__v1__close_session_request__unpack(NULL, len, req);
    if (!q) { fail(call, "CloseSession", GRPC_STATUS_INVALID_ARGUMENT, "malformed CloseSessionRequest"); return; }
    char id[KVR_ID_MAX];   /* the session's key */
    /* checked whole before it is used: a longer id must not close the one it starts with */
    kvl_status st = kvr_session_resolve(r, q->session_id, t.name, id);
    protobuf_c_message_free_unpacked(&q->base, NULL);
    kvr_session s;
    if (!st) st = kvr_router_busy_take(r, id);
    if (st) { fail_kvl(r, call, "CloseSession", st); return; }
    st = kvr_ledger_session_load(r->ledger, id, 0, &s);
    int closed = 0;
    if (!st && s.state == KVR_SESSION_OPEN) {
        kvr_session_clear(&s);
        /* the busy slot keeps this replica's turns out; another replica's turn holds the
         * session's lease: the close waits for it as a turn would (ABORTED when it stays held),
         * else it would drop the nodes' copies under that turn and end the session before its
         * commit, and the client would get the whole answer and then an error */
        const char *owner = kvr_leases_owner(r->leases);
        kvr_lease lease;
        st = kvr_turn_lease_take(r, id, &lease);
        const int leased = !st;
        /* another replica closed (or expired) it meanwhile: closed already, as below */
        if (st == KVL_ERR_MISMATCH && (strstr(kvl_last_error(), "' is closed") || strstr(kvl_last_error(), "' is expired"))) {
            kvl_clear_error();
            st = KVL_OK;
        }
        /* what the nodes hold is read again under the lease: that turn may have moved it */
        if (leased && !(st = kvr_ledger_session_load(r->ledger, id, 0, &s))) {
            for (int i = 0; i < s.n_holdings; i++) {
                int ni = kvr_registry_find(r->reg, s.holdings[i].node);
                if (ni >= 0 && kvr_node_drop(&r->reg->nodes[ni], id, 2000, NULL))
                    kvl__svc_log_text("warn", "CloseSession %s: %s", id, kvl_last_error());
            }
            kvr_session_clear(&s);
            /* the drops may have outlasted the lease: ended only while it is still ours */
            st = kvr_ledger_lease_renew(r->ledger, id, owner, lease.gen, kvr_wall_now(), r->cfg->lease_ms / 1000.0);
            if (st) st = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is busy: another replica took it while it "
                                    "was being closed; retry", id);
            else st = kvr_ledger_session_end(r->ledger, id, KVR_SESSION_CLOSED, kvr_wall_now());
            closed = !st;
        }
        if (leased) kvr_ledger_lease_release(r->ledger, id, owner, lease.gen);
    } else if (!st) {
        kvr_session_clear(&s);
    }
    kvr_router_busy_release(r, id);
    if (st) { fail_kvl(r, call, "CloseSession", st); return; }
    Kvlingo__V1__CloseSessionResponse resp = KVLINGO__V1__CLOSE_SESSION_RESPONSE__INIT;
    resp.closed = closed;
    kvl__rpc_call_reply_pb(call, &resp.base);
    kvl__svc_log_text("info", "CloseSession %s closed=%d", id, closed);
}

/* ---- ListNodes ----------------------------------------------------------------------------- */

static void h_list(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    kvr_router *r = user;
    kvr_tenant_info t;
    /* node addresses, every tenant's session count: fleet internals, for admin tenants */
    if (kvr_auth_call(r, call, "ListNodes", 1, &t)) return;
    (void)req;
    (void)len;
    int nn = r->reg->n;
    kvr_node *nodes = calloc((size_t)nn, sizeof *nodes);
    Kvlingo__V1__NodeStatus *ns = calloc((size_t)nn, sizeof *ns);
    Kvlingo__V1__NodeStatus **nsp = calloc((size_t)nn, sizeof *nsp);
    char **from = calloc((size_t)nn * KVR_MAX_TR, sizeof *from);
    /* the guardrail's pairs and the unusable translators the nodes announced */
    const int max_pairs = KVR_GUARD_MAX_PAIRS + KVR_MAX_NODES * KVR_MAX_TR;
    kvr_pair_status *ps = calloc((size_t)max_pairs, sizeof *ps);
    Kvlingo__V1__PairStatus *pst = calloc((size_t)max_pairs, sizeof *pst);
    Kvlingo__V1__PairStatus **pp = calloc((size_t)max_pairs, sizeof *pp);
    if (!nodes || !ns || !nsp || !from || !ps || !pst || !pp) {
        free(nodes); free(ns); free(nsp); free(from); free(ps); free(pst); free(pp);
        fail(call, "ListNodes", GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (int i = 0; i < nn; i++) {
        kvr_registry_copy(r->reg, i, &nodes[i]);
        kvr_node *n = &nodes[i];
        kvlingo__v1__node_status__init(&ns[i]);
        ns[i].name = n->name;
        ns[i].address = n->address;
        ns[i].model = n->model;
        ns[i].healthy = n->healthy;
        ns[i].error = n->error;
        ns[i].sessions = n->sessions;
        ns[i].active_turns = (uint32_t)n->active;
        ns[i].max_context = n->max_context;
        for (int t = 0; t < n->n_tr_from; t++) from[i * KVR_MAX_TR + t] = n->tr_from[t];
        ns[i].n_translators_from = (size_t)n->n_tr_from;
        ns[i].translators_from = &from[i * KVR_MAX_TR];
        ns[i].prefill_tokens_per_second = n->n_prefill_samples ? n->prefill_tps : 0;
        ns[i].decode_tokens_per_second = n->n_decode_samples ? n->decode_tps : 0;
        ns[i].prefill_rate_samples = n->n_prefill_samples;
        ns[i].decode_rate_samples = n->n_decode_samples;
        ns[i].rate_status = (char *)(n->n_prefill_samples && n->n_decode_samples ? "measured"
                                     : n->n_prefill_samples ? "prefill measured"
                                     : n->n_decode_samples ? "decode measured" : "unmeasured");
        nsp[i] = &ns[i];
    }
    int np = kvr_guard_pairs(r->guard, ps, KVR_GUARD_MAX_PAIRS);
    /* translators a node announced but the router cannot use (wrong target, hash mismatch,
     * source not in the fleet): listed disabled, with the reason */
    for (int i = 0; i < nn && np < max_pairs; i++)
        for (int t = 0; t < nodes[i].n_tr_bad && np < max_pairs; t++) {
            memset(&ps[np], 0, sizeof ps[np]);
            snprintf(ps[np].source, sizeof ps[np].source, "%s", nodes[i].tr_bad[t].src);
            snprintf(ps[np].target, sizeof ps[np].target, "%s", nodes[i].model);
            snprintf(ps[np].reason, sizeof ps[np].reason, "%.63s", nodes[i].tr_bad[t].why);
            np++;
        }
    for (int i = 0; i < np; i++) {
        kvlingo__v1__pair_status__init(&pst[i]);
        pst[i].source_model = ps[i].source;
        pst[i].target_model = ps[i].target;
        pst[i].enabled = ps[i].enabled;
        pst[i].disabled_reason = ps[i].reason;
        pst[i].moving_kl = ps[i].moving_kl;
        pst[i].kl_budget = ps[i].budget;
        pst[i].shadow_samples = ps[i].samples;
        pst[i].switches = ps[i].switches;
        pp[i] = &pst[i];
    }
    Kvlingo__V1__ListNodesResponse resp = KVLINGO__V1__LIST_NODES_RESPONSE__INIT;
    resp.n_nodes = (size_t)nn;
    resp.nodes = nsp;
    resp.n_pairs = (size_t)np;
    resp.pairs = pp;
    pthread_rwlock_rdlock(&r->policy_lock);
    char pol[32];
    snprintf(pol, sizeof pol, "%s", kvr_policy_name(r->policy));
    pthread_rwlock_unlock(&r->policy_lock);
    resp.policy = pol;
    long open = 0;
    kvr_ledger_count_open(r->ledger, &open);
    resp.sessions_open = (uint32_t)open;
    kvl__rpc_call_reply_pb(call, &resp.base);
    free(nodes); free(ns); free(nsp); free(from); free(ps); free(pst); free(pp);
}

kvl_status kvr_router_serve(kvr_router *r) {
    kvl__rpc_server_params p = kvl__rpc_server_default_params();
    p.listen = r->cfg->listen;
    p.tls = &r->server_tls;
    kvl_status s = kvl__rpc_server_create(&p, &r->server);
    if (s) return s;
    if ((s = kvl__rpc_server_add_method(r->server, SVC "CreateSession", KVL_RPC_UNARY, h_create, r)) ||
        (s = kvl__rpc_server_add_method(r->server, SVC "Send", KVL_RPC_SERVER_STREAM, h_send, r)) ||
        (s = kvl__rpc_server_add_method(r->server, SVC "GetSession", KVL_RPC_UNARY, h_get, r)) ||
        (s = kvl__rpc_server_add_method(r->server, SVC "CloseSession", KVL_RPC_UNARY, h_close, r)) ||
        (s = kvl__rpc_server_add_method(r->server, SVC "ListNodes", KVL_RPC_UNARY, h_list, r)))
        return s;
    if ((s = kvl__rpc_server_set_health(r->server, "kvlingo.v1.Router", 1))) return s;
    if ((s = kvl__rpc_server_start(r->server))) return s;
    if (r->cfg->health_listen) {
        /* probes that cannot speak TLS read the Router API's health here, and nothing else */
        static const kvl__rpc_tls plain = {.insecure = 1};
        kvl__rpc_server_params hp = kvl__rpc_server_default_params();
        hp.listen = r->cfg->health_listen;
        hp.tls = &plain;
        hp.max_calls = 4;
        hp.health_of = r->server;
        if ((s = kvl__rpc_server_create(&hp, &r->health_server))) return kvl__error_prefix(s, "health_listen");
        if ((s = kvl__rpc_server_start(r->health_server))) return s;
    }
    if (r->cfg->metrics && (s = kvr_metrics_serve(r->metrics, r->cfg->metrics))) return s;
    if (r->cfg->http_listen &&
        (s = kvr_oai_http_start(r, r->cfg->http_listen, r->cfg->http_max_conn, r->cfg->http_max_body, &r->http)))
        return s;
    return KVL_OK;
}
