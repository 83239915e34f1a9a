/* router/openai_session.c: one stateless OpenAI request as one turn of a ledger session.
 *
 * The request carries the whole conversation.  It is rendered (chat template) and tokenized to
 * P; the session to continue is the one the x-kvlingo-session header names, else the one the
 * prefix index finds whose ledger P extends.  Only P's tail past the ledger is this turn's
 * input, so the node holding the context (or, at a model switch, a translation of it) serves
 * the old part from its cache.  A session whose ledger P does not extend (the client edited
 * the history, a stop sequence cut the reply) is not continued: a new session re-reads P.
 *
 * The text the client sees is detokenized here from the token ids, special tokens left out
 * unless skip_special_tokens is false; stop sequences end the turn and never reach the client
 * (text that could begin one is held back until it cannot). */
#include "openai.h"
#include "prefix.h"
#include "router.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "clock.h"
#include "error.h"
#include "nodecall.h"

typedef struct emit_ctx {
    kvr_router *r;
    const kvr_oai_req *q;
    kvr_oai_sink *sink;
    kvr_oai_run *run;
    const kvr_turn_out *out;      /* filled by the turn as it goes: final at the first token */
    kvl_detok *dt;
    char *piece;
    size_t piece_cap;
    int32_t *gen;
    int n_gen, cap_gen;
    size_t sent;                  /* bytes of run->text handed to the sink                   */
    size_t hold;                  /* longest stop sequence - 1: bytes held back               */
    int started, stopped, sink_gone;
} emit_ctx;

static const char *mode_str(int m) {
    return m == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE ? "translate"
         : m == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_REPREFILL ? "reprefill" : "none";
}

static void fill_result(emit_ctx *e) {
    kvr_oai_run *u = e->run;
    const kvr_turn_out *o = e->out;
    snprintf(u->model, sizeof u->model, "%s", o->model);
    snprintf(u->node, sizeof u->node, "%s", o->node);
    snprintf(u->from_model, sizeof u->from_model, "%s", o->from_model);
    snprintf(u->mode, sizeof u->mode, "%s", mode_str(o->mode));
    u->res.model = u->model;
    u->res.node = u->node;
    u->res.from_model = u->from_model;
    u->res.switch_mode = u->mode;
    u->res.session = kvr_session_client_id(u->sid);   /* the client's name, without its tenant's tag */
    u->res.span_tokens = o->span_tokens;
    u->res.ttft_ms = o->ttft_s * 1e3;
    int cached = u->res.prompt_tokens - (int)o->prefill_tokens;
    u->res.cached_tokens = cached > 0 ? cached : 0;
    u->res.completion_tokens = e->n_gen;
    snprintf(u->res.id, sizeof u->res.id, "%s-%s-%u", e->q->chat ? "chatcmpl" : "cmpl",
             kvr_session_client_id(u->sid), o->turn);
}

static int text_append(kvr_oai_run *u, const char *s, size_t n) {
    if (u->len + n + 1 > u->cap) {
        size_t cap = u->cap ? u->cap : 256;
        while (cap < u->len + n + 1) cap *= 2;
        char *t = realloc(u->text, cap);
        if (!t) return -1;
        u->text = t;
        u->cap = cap;
    }
    /* a NUL byte (token <0x00>) would end the JSON string early: dropped */
    for (size_t i = 0; i < n; i++)
        if (s[i]) u->text[u->len++] = s[i];
    u->text[u->len] = 0;
    return 0;
}

/* Hand text [sent, upto) to the sink. */
static void sink_text(emit_ctx *e, size_t upto) {
    if (upto <= e->sent) return;
    if (e->sink && e->sink->on_text && !e->sink_gone &&
        e->sink->on_text(e->sink->arg, e->run->text + e->sent, upto - e->sent))
        e->sink_gone = 1;
    e->sent = upto;
}

/* After new text: cut at the earliest stop sequence (1), or release what cannot start one. */
static int check_stop(emit_ctx *e) {
    kvr_oai_run *u = e->run;
    const kvr_oai_req *q = e->q;
    size_t best = (size_t)-1;
    for (int i = 0; i < q->n_stop; i++) {
        const char *hit = strstr(u->text + e->sent, q->stop[i]);
        if (hit && (size_t)(hit - u->text) < best) best = (size_t)(hit - u->text);
    }
    if (best != (size_t)-1) {
        u->len = best;
        u->text[best] = 0;
        sink_text(e, best);
        return 1;
    }
    size_t safe = u->len > e->hold ? u->len - e->hold : 0;
    while (safe > e->sent && safe < u->len && ((unsigned char)u->text[safe] & 0xC0) == 0x80) safe--;
    sink_text(e, safe);
    return 0;
}

static int on_token(void *arg, int32_t token, const char *node_text, float logprob) {
    (void)node_text;
    (void)logprob;
    emit_ctx *e = arg;
    if (e->n_gen < e->cap_gen) e->gen[e->n_gen++] = token;
    if (!e->started) {
        e->started = 1;
        fill_result(e);
        if (e->sink && e->sink->on_start && e->sink->on_start(e->sink->arg, e->run)) e->sink_gone = 1;
    }
    e->run->res.completion_tokens = e->n_gen;
    if (e->sink_gone) return 1;
    if (!e->q->skip_special || !kvl_tokenizer_is_special(e->r->tok, token)) {
        size_t n = 0;
        if (kvl_detok_push(e->dt, token, e->piece, e->piece_cap, &n) == KVL_OK && n &&
            text_append(e->run, e->piece, n))
            return 1;   /* out of memory: give the turn up */
    }
    if (check_stop(e)) {
        e->stopped = 1;
        return KVR_EMIT_STOP;
    }
    return e->sink_gone ? 1 : 0;
}

/* The HTTP status and OpenAI error of a failed turn (the thread message says why). */
static void turn_error(kvr_router *r, kvl_status s, kvr_oai_error *err) {
    char mr[512];   /* as the client may read it: no node addresses */
    kvr_registry_redact(r->reg, kvl_last_error()[0] ? kvl_last_error() : kvl_strerror(s), mr, sizeof mr);
    const char *m = mr;
    grpc_status_code c = kvl__rpc_status_from_kvl(s);
    if (s == KVL_ERR_MISMATCH && strstr(m, "is busy")) c = GRPC_STATUS_ABORTED;
    if (s == KVL_ERR_NOMEM && strstr(m, "router busy")) c = GRPC_STATUS_RESOURCE_EXHAUSTED;
    if (c == GRPC_STATUS_RESOURCE_EXHAUSTED && strstr(m, "quota:")) {   /* a tenant's quota */
        kvr_oai_set_error(err, 429, strstr(m, "max_sessions") ? "sessions"
                                    : strstr(m, "max_concurrent_turns") ? "requests" : "tokens", NULL,
                          "rate_limit_exceeded", "%s", m);
        return;
    }
    switch (c) {
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_FAILED_PRECONDITION:
        kvr_oai_set_error(err, 400, "invalid_request_error", NULL, NULL, "%s", m); break;
    case GRPC_STATUS_OUT_OF_RANGE:
        kvr_oai_set_error(err, 400, "invalid_request_error", "messages", "context_length_exceeded", "%s", m); break;
    case GRPC_STATUS_NOT_FOUND:
        kvr_oai_set_error(err, 404, "invalid_request_error", "model", "model_not_found", "%s", m); break;
    case GRPC_STATUS_ABORTED:
        kvr_oai_set_error(err, 409, "invalid_request_error", NULL, "session_busy", "%s", m); break;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
    case GRPC_STATUS_UNAVAILABLE:
        kvr_oai_set_error(err, 503, "server_error", NULL, "unavailable", "%s", m); break;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        kvr_oai_set_error(err, 504, "server_error", NULL, "timeout", "%s", m); break;
    default:
        kvr_oai_set_error(err, 500, "server_error", NULL, NULL, "%s", m); break;
    }
}

/* P: the request rendered and tokenized.  A chat request's messages are encoded as text, so
 * that no message can write a special token (end its turn, open a system turn); a prompt of
 * /v1/completions is the client's whole input, its special tokens parsed (as gRPC Send's text). */
static int render(kvr_router *r, const kvr_oai_req *q, int32_t **ids, size_t *n, kvr_oai_error *err) {
    kvl_status s;
    if (q->chat) {
        s = kvl_tokenizer_encode_chat(r->tok, q->msgs, (size_t)q->n_msgs, 1, ids, n);
        if (s == KVL_ERR_NOT_FOUND || s == KVL_ERR_UNSUPPORTED) {
            /* a template this router cannot render (none, or one it does not know) is the
             * server's to fix, not the request's */
            kvr_oai_set_error(err, 500, "server_error", NULL, NULL,
                              "cannot render the chat template: %s (use /v1/completions for plain text)",
                              kvl_last_error());
            return -1;
        }
    } else {
        s = kvl_tokenizer_encode(r->tok, q->prompt, strlen(q->prompt), ids, n);
    }
    if (s == KVL_ERR_NOMEM) {
        kvr_oai_set_error(err, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    if (s) {
        kvr_oai_set_error(err, 400, "invalid_request_error", q->chat ? "messages" : "prompt", NULL,
                          "cannot tokenize the input: %s", kvl_last_error());
        return -1;
    }
    if (*n == 0) {
        kvr_oai_set_error(err, 400, "invalid_request_error", "prompt", NULL, "the input has no tokens");
        return -1;
    }
    return 0;
}

static void new_id(char *id, size_t cap) {
    uint8_t b[8] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t x = (uint64_t)(kvl__now_s() * 1e9);
        memcpy(b, &x, sizeof b);
    }
    snprintf(id, cap, "oa-%02x%02x%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
}

/* Take session `sid` (busy lock) if its ledger is a strict prefix of P: *n_ledger set, 1.
 * 0: not usable (*why says why, lock released); -1: an error for the client (err set). */
static int take_if_prefix(kvr_router *r, const char *tenant, const char *sid, const int32_t *P, int nP,
                          int *n_ledger, char *why, size_t why_cap) {
    kvr_session s;
    /* the owner first, so that another tenant's session is never reported busy */
    if (kvr_ledger_session_load(r->ledger, sid, 0, &s)) {
        snprintf(why, why_cap, "%s", kvl_last_error());
        return 0;
    }
    int mine = !strcmp(s.tenant, tenant);
    kvr_session_clear(&s);
    if (!mine) {
        snprintf(why, why_cap, "unknown session");
        return 0;
    }
    if (kvr_router_busy_take(r, sid)) {
        snprintf(why, why_cap, "a turn is running on it");
        return 0;
    }
    if (kvr_ledger_session_load(r->ledger, sid, 1, &s)) {
        kvr_router_busy_release(r, sid);
        snprintf(why, why_cap, "%s", kvl_last_error());
        return 0;
    }
    int ok = s.state == KVR_SESSION_OPEN && s.n_tokens < nP &&
             (!s.n_tokens || !memcmp(s.tokens, P, sizeof(int32_t) * (size_t)s.n_tokens));
    if (!ok) {
        int at = 0;
        while (at < s.n_tokens && at < nP && s.tokens[at] == P[at]) at++;
        if (s.state != KVR_SESSION_OPEN) snprintf(why, why_cap, "it is %s", s.state == KVR_SESSION_CLOSED ? "closed" : "expired");
        else snprintf(why, why_cap, "its ledger (%d tokens) is not a prefix of the %d-token prompt (they "
                      "differ from token %d)", s.n_tokens, nP, at);
        kvr_router_busy_release(r, sid);
    }
    *n_ledger = s.n_tokens;
    kvr_session_clear(&s);
    return ok;
}

/* A session this request made for itself (no x-kvlingo-session, no prefix hit) whose first
 * turn failed before any of it reached the client: it is indexed only after a turn succeeds
 * and its id is in no answer, so no later request can reach it; it is closed, instead of
 * counting against the tenant's max_sessions until its TTL (an SDK retrying a refused request
 * would open one per retry).  A stream that started named the session in its headers, and
 * its session is kept. */
static void end_unreachable(kvr_router *r, const char *sid, int created) {
    if (!created) return;
    kvr_session s;
    if (!kvr_ledger_session_load(r->ledger, sid, 0, &s)) {   /* a cancelled turn may have left copies */
        for (int i = 0; i < s.n_holdings; i++) {
            int ni = kvr_registry_find(r->reg, s.holdings[i].node);
            if (ni >= 0 && kvr_node_drop(&r->reg->nodes[ni], sid, 2000, NULL))
                kvl__svc_log("warn", "msg=openai_session_drop session=%s node=%s error=\"%s\"", sid,
                             s.holdings[i].node, kvl_last_error());
        }
        kvr_session_clear(&s);
    }
    if (kvr_ledger_session_end(r->ledger, sid, KVR_SESSION_CLOSED, kvr_wall_now()))
        kvl__svc_log("warn", "msg=openai_session_not_closed session=%s error=\"%s\"", sid, kvl_last_error());
}

int kvr_oai_run_turn(kvr_router *r, const kvr_oai_req *q, const char *session_hdr,
                     const kvr_tenant_info *tenant, kvr_oai_sink *sink, kvr_oai_run *u) {
    const char *tn = tenant->name;
    kvr_oai_error *err = &u->err;
    int32_t *P = NULL;
    size_t nP = 0;
    u->res.created = (long)time(NULL);
    if (render(r, q, &P, &nP, err)) return -1;
    u->res.prompt_tokens = (int)nP;
    int n_ledger = 0, have = 0, created = 0;
    char why[200] = "";
    if (session_hdr && session_hdr[0]) {
        if (!kvr_session_id_valid(session_hdr)) {
            kvr_oai_set_error(err, 400, "invalid_request_error", "x-kvlingo-session", NULL,
                              "x-kvlingo-session: '%.64s' is not a session id (1-64 of [A-Za-z0-9._:-])",
                              session_hdr);
            free(P);
            return -1;
        }
        /* the tenant's own session of that name (ledger.h kvr_session_key), else a new one
         * under its key: another tenant's alike name is another session, reaching nothing of
         * theirs (a ledger error: take_if_prefix below says it) */
        kvl_status ls = kvr_session_resolve(r, session_hdr, tn, u->sid);
        if (ls == KVL_ERR_NOT_FOUND) {
            kvl_status cs = kvr_ledger_session_create_for(r->ledger, u->sid, "", tn, tenant->max_sessions,
                                                          kvr_wall_now());
            if (cs == KVL_ERR_NOMEM && strstr(kvl_last_error(), "quota:")) kvr_quota_refused(r, tn, "max_sessions");
            if (cs && !strstr(kvl_last_error(), "exists")) {
                turn_error(r, cs == KVL_ERR_NOMEM ? cs : KVL_ERR_INTERNAL, err);
                free(P);
                return -1;
            }
        }
        int t = take_if_prefix(r, tn, u->sid, P, (int)nP, &n_ledger, why, sizeof why);
        if (t <= 0 && !strcmp(why, "unknown session")) {   /* another tenant's: as if absent */
            kvr_oai_set_error(err, 404, "invalid_request_error", "x-kvlingo-session", "session_not_found",
                              "unknown session '%s'", session_hdr);
            free(P);
            return -1;
        }
        if (t <= 0) {
            char wr[sizeof why];   /* a ledger error may name the session's key */
            kvr_registry_redact(r->reg, why, wr, sizeof wr);
            snprintf(why, sizeof why, "%s", wr);
            kvr_oai_set_error(err, strstr(why, "running") ? 409 : 400, "invalid_request_error",
                              "x-kvlingo-session", strstr(why, "running") ? "session_busy" : NULL,
                              "session '%s' cannot continue with this conversation: %s", session_hdr, why);
            free(P);
            return -1;
        }
        have = 1;
    } else {
        char ids[KVR_PREFIX_MAX_CANDIDATES][KVR_ID_MAX];
        int lens[KVR_PREFIX_MAX_CANDIDATES];
        int nc = kvr_prefix_lookup_for(r->prefix, tn, P, (int)nP, ids, lens, KVR_PREFIX_MAX_CANDIDATES);
        for (int i = 0; i < nc && !have; i++) {
            have = take_if_prefix(r, tn, ids[i], P, (int)nP, &n_ledger, why, sizeof why) > 0;
            if (have) snprintf(u->sid, sizeof u->sid, "%s", ids[i]);
        }
        if (!have) {
            n_ledger = 0;
            if ((long)nP > r->cfg->max_input_tokens) {   /* refused before a session is made for it */
                kvr_oai_set_error(err, 400, "invalid_request_error", q->chat ? "messages" : "prompt",
                                  "context_length_exceeded", "this request adds %zu tokens to the session, "
                                  "at most %ld per turn (max_input_tokens)", nP, r->cfg->max_input_tokens);
                free(P);
                return -1;
            }
            char fresh[KVR_ID_MAX];
            new_id(fresh, sizeof fresh);
            kvr_session_key(tn, fresh, u->sid);
            kvl_status cs = kvr_ledger_session_create_for(r->ledger, u->sid, "", tn, tenant->max_sessions,
                                                          kvr_wall_now());
            if (cs == KVL_ERR_NOMEM && strstr(kvl_last_error(), "quota:")) kvr_quota_refused(r, tn, "max_sessions");
            if (!cs) {
                created = 1;
                cs = kvr_router_busy_take(r, u->sid);   /* max_busy_sessions: 503 */
            }
            if (cs) {
                turn_error(r, cs, err);
                end_unreachable(r, u->sid, created);
                free(P);
                return -1;
            }
            have = 1;
        }
    }
    int n_user = (int)nP - n_ledger;
    int rc = 0;
    if (n_user > r->cfg->max_input_tokens) {
        kvr_oai_set_error(err, 400, "invalid_request_error", q->chat ? "messages" : "prompt",
                          "context_length_exceeded", "this request adds %d tokens to the session, at most "
                          "%ld per turn (max_input_tokens)", n_user, r->cfg->max_input_tokens);
        kvr_router_busy_release(r, u->sid);
        end_unreachable(r, u->sid, created);
        free(P);
        return -1;
    }
    /* end-of-turn ids: EOS, and the chat template's end-of-message token */
    int32_t stop_ids[1], eot = -1;
    int n_stop = 0;
    if (q->chat) {   /* the same rule as a gRPC Send with chat set */
        kvl_chat_format f = kvl_tokenizer_chat_format(r->tok);
        eot = kvl_tokenizer_token_id(r->tok, f == KVL_CHAT_LLAMA3 ? "<|eot_id|>" : "<|im_end|>");
        if (eot >= 0 && !q->ignore_eos) stop_ids[n_stop++] = eot;
    }
    unsigned max_tokens = q->max_tokens ? (unsigned)q->max_tokens : (unsigned)r->cfg->default_max_tokens;
    kvr_turn_req tr = {.sid = u->sid, .user = P + n_ledger, .n_user = n_user, .max_tokens = max_tokens,
                       .temperature = q->temperature, .top_k = q->top_k,
                       .top_p = q->top_p < 1 ? q->top_p : 0, .seed = q->seed,
                       .stop_at_eos = !q->ignore_eos, .stop_ids = stop_ids, .n_stop = n_stop,
                       .has_end_token = eot >= 0, .end_token = eot,
                       .model = q->model, .tenant = tn, .cancel = sink ? sink->cancel : NULL};
    kvr_turn_out o;
    emit_ctx e = {.r = r, .q = q, .sink = sink, .run = u, .out = &o, .cap_gen = (int)max_tokens};
    for (int i = 0; i < q->n_stop; i++) {
        size_t l = strlen(q->stop[i]);
        if (l - 1 > e.hold) e.hold = l - 1;
    }
    e.piece_cap = kvl_detok_push_capacity(r->tok);
    e.piece = malloc(e.piece_cap + 1);
    e.gen = malloc(sizeof(int32_t) * (max_tokens + 1));
    kvl_status s = e.piece && e.gen ? kvl_detok_create(r->tok, &e.dt) : kvl__errorf(KVL_ERR_NOMEM, "request");
    if (!s) s = text_append(u, "", 0) ? kvl__errorf(KVL_ERR_NOMEM, "request") : KVL_OK;
    if (!s) s = kvr_turn_run(r, &tr, on_token, &e, &o);
    if (!s) {
        if (!e.stopped) {   /* what the detokenizer and the stop check held back */
            size_t n = 0;
            if (kvl_detok_flush(e.dt, e.piece, e.piece_cap, &n) == KVL_OK && n) text_append(u, e.piece, n);
            if (q->n_stop && check_stop(&e)) e.stopped = 1;
            sink_text(&e, u->len);
        }
        fill_result(&e);   /* again when started: the turn's final figures */
        u->res.completion_tokens = e.n_gen;
        const char *fr = o.finish_reason;
        snprintf(u->finish, sizeof u->finish, "%s",
                 e.stopped || !strcmp(fr, "eos") || !strcmp(fr, "stop") ? "stop" : "length");
        /* the ledger now holds P and the generated ids: index it for the next request */
        int nl = (int)nP + e.n_gen;
        int32_t *led = malloc(sizeof(int32_t) * (size_t)nl);
        if (led) {
            memcpy(led, P, sizeof(int32_t) * nP);
            memcpy(led + nP, e.gen, sizeof(int32_t) * (size_t)e.n_gen);
            kvr_prefix_insert_for(r->prefix, tn, u->sid, led, nl);
            free(led);
        }
        kvl__svc_log("info", "msg=openai_turn session=%s turn=%u model=%s node=%s mode=%s prompt=%d "
                     "cached=%d input=%d tokens=%d ttft_ms=%.2f finish=%s", u->sid, o.turn, o.model,
                     o.node, mode_str(o.mode), u->res.prompt_tokens, u->res.cached_tokens, n_user, e.n_gen,
                     o.ttft_s * 1e3, u->finish);
    } else {
        turn_error(r, s, err);
        rc = -1;
    }
    kvr_router_busy_release(r, u->sid);
    /* a stream that started has told its client the id: that session stays */
    if (rc) end_unreachable(r, u->sid, created && !(e.started && sink && sink->names_session));
    kvl_detok_free(e.dt);
    free(e.piece);
    free(e.gen);
    free(P);
    return rc;
}

void kvr_oai_run_clear(kvr_oai_run *u) {
    free(u->text);
    memset(u, 0, sizeof *u);
}
