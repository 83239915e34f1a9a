/* router/turn_call.c: the node calls that answer a turn: the Generate stream after prepare
 * and Append (the several-call path, turn.c), or one ContinueTurn call that does all of it on
 * the node. */
#include "log.h"
#include "turn_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "ticket.h"

static void keep_result(one_result *nr, const Kvlingo__V1__ContinueResult *r) {
    nr->got = 1;
    nr->mode = r->mode;
    snprintf(nr->fallback, sizeof nr->fallback, "%s", r->fallback ? r->fallback : "");
    nr->span_t0 = r->span_t0;
    nr->span_t1 = r->span_t1;
    nr->prefill_tokens = r->prefill_tokens;
    nr->token_count = r->token_count;
    snprintf(nr->sha256, sizeof nr->sha256, "%s", r->tokens_sha256 ? r->tokens_sha256 : "");
    nr->pull_s = r->pull_seconds;
    nr->transfer_s = r->transfer_seconds;
    nr->translate_s = r->translate_seconds;
    nr->export_s = r->export_seconds;
    nr->forward_s = r->forward_seconds;
}

/* A turn's deadline on node ti: twice the node timeout, the pull's deadline, and the tokens to
 * prefill and to generate at a quarter of the rates measured on this node's earlier turns (at
 * least 2 ms and 200 ms a token), or at 50 ms and 200 ms a token before any measurement: a
 * large model's first long prefill is not cut short, a node that stopped answering is still
 * given up on. */
static int64_t turn_deadline_ms(const turn *t, int ti, int64_t pull_ms) {
    kvr_node c;
    kvr_registry_copy(t->r->reg, ti, &c);
    double pf_ms = c.n_prefill_samples ? 2.0 : 50.0, dec_ms = 200.0;
    if (c.n_prefill_samples && c.prefill_tps > 0 && 4000.0 / c.prefill_tps > pf_ms) pf_ms = 4000.0 / c.prefill_tps;
    if (c.n_decode_samples && c.decode_tps > 0 && 4000.0 / c.decode_tps > dec_ms) dec_ms = 4000.0 / c.decode_tps;
    /* at most a day: the rates are bounded (registry.c), and the sum stays far from int64's end */
    double ms = (double)t->req->max_tokens * dec_ms + (double)(t->N + t->req->n_user) * pf_ms;
    if (!(ms < 86400e3)) ms = 86400e3;
    return t->node_ms * 2 + pull_ms + (int64_t)ms;
}

void kvr_turn_cancel_init(kvr_turn_cancel *c) {
    pthread_mutex_init(&c->mu, NULL);
    c->fired = 0;
    c->st = NULL;
}

void kvr_turn_cancel_destroy(kvr_turn_cancel *c) { pthread_mutex_destroy(&c->mu); }

void kvr_turn_cancel_fire(kvr_turn_cancel *c) {
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->fired, 1, __ATOMIC_RELEASE);
    if (c->st) kvl__rpc_stream_cancel(c->st);   /* the turn frees it only after taking it back */
    pthread_mutex_unlock(&c->mu);
}

/* Stream the turn from node ti: a Generate opened here after prepare, or the ContinueTurn
 * stream `opened` (its ContinueResult kept in *nr). */
kvl_status kvr__turn_decode(turn *t, int ti, int want_lp, kvr_emit_fn emit, void *arg, double t_start,
                         int32_t *gen, float **first_lp, int *vocab, int *started,
                         grpc_status_code *code, kvl__rpc_stream *opened, one_result *nr) {
    kvr_router *r = t->r;
    kvr_node *T = &r->reg->nodes[ti];
    kvr_turn_out *o = t->out;
    kvr_gen_params gp = {.max_tokens = t->req->max_tokens, .temperature = t->req->temperature,
                         .top_k = t->req->top_k, .top_p = t->req->top_p, .seed = t->req->seed,
                         .stop_at_eos = t->req->stop_at_eos, .stop_ids = t->req->stop_ids,
                         .n_stop = t->req->n_stop, .return_logprobs = want_lp};
    int64_t timeout = turn_deadline_ms(t, ti, 0);
    unsigned gL, gH, gD, node_vocab = 0;
    kvr_registry_geometry(r->reg, ti, &gL, &gH, &gD, &node_vocab);
    kvl__rpc_stream *st = opened;
    kvl_status s = KVL_OK;
    if (!st && (s = kvr_node_generate(T, t->req->sid, &gp, timeout, &st))) {
        *code = GRPC_STATUS_UNAVAILABLE;
        return s;
    }
    kvr_turn_cancel *cx = t->req->cancel;
    if (cx) {   /* the client's cancel reaches this stream from now on (and at once if it came) */
        pthread_mutex_lock(&cx->mu);
        cx->st = st;
        if (cx->fired) kvl__rpc_stream_cancel(st);
        pthread_mutex_unlock(&cx->mu);
    }
    double ent_sum = 0, t_first = 0, t_last = 0, node_tps = 0;
    int n_ent = 0, saw_done = 0;
    for (;;) {
        Kvlingo__V1__GenerateResponse *m = NULL;
        int rr = kvr_node_gen_next(T, st, &m, code);
        if (rr <= 0 && cx && __atomic_load_n(&cx->fired, __ATOMIC_ACQUIRE)) {   /* ended by the client */
            s = kvl__errorf(KVL_ERR_CANCELLED, "client cancelled the turn");
            *code = GRPC_STATUS_CANCELLED;
            t->client_cancelled = 1;
            break;
        }
        if (rr < 0) { s = (kvl_status)rr; break; }
        if (rr == 0) {
            if (*code != GRPC_STATUS_OK) { s = kvl__rpc_status_to_kvl(*code); if (!s) s = KVL_ERR_INTERNAL; }
            break;
        }
        if (m->done) {
            saw_done = 1;
            snprintf(o->finish_reason, sizeof o->finish_reason, "%s", m->finish_reason ? m->finish_reason : "");
            if (m->result && nr) keep_result(nr, m->result);
            o->forward_s = m->ttft_seconds;
            /* the node's own clock: tokens reach the router in bursts, its arrival times would
             * overstate the decode rate */
            if (m->total_seconds > m->ttft_seconds && o->n_generated > 1)
                node_tps = (o->n_generated - 1) / (m->total_seconds - m->ttft_seconds);
            protobuf_c_message_free_unpacked(&m->base, NULL);
            continue;
        }
        if (m->token < 0 || (node_vocab && (unsigned)m->token >= node_vocab)) {
            /* a node bug or a wrong build: such an id must not reach the ledger, where every
             * later re-prefill and replay of the session would refuse it */
            s = kvl__errorf(KVL_ERR_INTERNAL, "node %s generated token id %d, outside its vocabulary of %u",
                           T->name, m->token, node_vocab);
            *code = GRPC_STATUS_INTERNAL;
            protobuf_c_message_free_unpacked(&m->base, NULL);
            kvl__rpc_stream_cancel(st);
            break;
        }
        double now = kvl__now_s();
        if (o->n_generated == 0) { t_first = now; o->ttft_s = now - t_start; }
        t_last = now;
        if (m->n_logprobs) {
            ent_sum += kvr_entropy_logprobs(m->logprobs, (int)m->n_logprobs);
            n_ent++;
            if (o->n_generated == 0 && first_lp && !*first_lp) {
                *first_lp = malloc(m->n_logprobs * sizeof(float));
                if (*first_lp) {
                    memcpy(*first_lp, m->logprobs, m->n_logprobs * sizeof(float));
                    *vocab = (int)m->n_logprobs;
                }
            }
        }
        if (o->n_generated < t->req->max_tokens) gen[o->n_generated] = m->token;
        o->n_generated++;
        *started = 1;
        int stop = emit(arg, m->token, m->text ? m->text : "", m->logprob);
        protobuf_c_message_free_unpacked(&m->base, NULL);
        if (stop == KVR_EMIT_STOP) {
            /* a stop sequence: the turn ends here as finished; the node may have gone a token
             * further before the cancel, which the commit's SessionInfo check catches */
            kvl__rpc_stream_cancel(st);
            snprintf(o->finish_reason, sizeof o->finish_reason, "stop");
            break;
        }
        if (stop) {
            kvl__rpc_stream_cancel(st);
            s = kvl__errorf(KVL_ERR_CANCELLED, "client cancelled the turn");
            *code = GRPC_STATUS_CANCELLED;
            t->client_cancelled = 1;
            break;
        }
    }
    if (cx) {
        pthread_mutex_lock(&cx->mu);
        cx->st = NULL;
        pthread_mutex_unlock(&cx->mu);
    }
    kvl__rpc_stream_free(st);
    if (!s && !saw_done && strcmp(o->finish_reason, "stop")) {
        /* a stream that ends OK without its final message is a broken node, as a ContinueTurn
         * without its result is: its tokens are not committed as a finished turn */
        s = kvl__errorf(KVL_ERR_INTERNAL, "node %s ended the turn's stream without its final message "
                       "(%u tokens)", T->name, o->n_generated);
        *code = GRPC_STATUS_INTERNAL;
    }
    if (o->n_generated > t->req->max_tokens && !s)
        s = kvl__errorf(KVL_ERR_INTERNAL, "node %s generated %u tokens, asked %u", T->name,
                       o->n_generated, t->req->max_tokens);
    if (n_ent) o->mean_entropy = (float)(ent_sum / n_ent);
    if (node_tps > 0) o->tps = node_tps;
    else if (o->n_generated > 1 && t_last > t_first) o->tps = (o->n_generated - 1) / (t_last - t_first);
    return s;
}

/* A one-call switch whose span was translated, counted for the guardrail now; 1 when it is to
 * be shadowed and its first token's logprobs are here (they were asked for when the pair was
 * due: a concurrent switch of the pair may have taken that sample, or left one to this) */
static int count_switch(kvr_router *r, const kvr_node *src, const kvr_node *T, const float *first_lp) {
    return kvr_guard_count_switch(r->guard, src->model, T->model, first_lp != NULL);
}

/* The turn as one ContinueTurn call on node ti: what prepare, Append and decode do in four to
 * six calls, the node does in one.  It checks what it holds against the ledger (count and
 * token hash sent here), pulls the span it lacks from the source when asked (the same checks:
 * the source's tokens by hash, the imported ids against the ledger's, one ticket for the move),
 * re-reads what is still missing from the ledger tokens sent along, and streams the turn.
 * KVL_ERR_UNSUPPORTED when the node refused its session state before any token (it holds other
 * tokens than the ledger says, or translated K/V of a disabled pair): nothing happened there,
 * and the caller takes the several-call path, which resets it. */
kvl_status kvr__turn_one_call(turn *t, int ti, int needs_entropy, kvr_emit_fn emit, void *arg,
                           double t_start, int32_t *gen, float **first_lp, int *vocab, int *started,
                           grpc_status_code *code, one_result *nr, int *shadow) {
    kvr_router *r = t->r;
    kvr_node *T = &r->reg->nodes[ti];
    kvr_turn_out *o = t->out;
    const kvr_turn_req *req = t->req;
    int held = kvr_session_held(&t->s, T->name);
    if (held < 0 || held > t->N) return KVL_ERR_UNSUPPORTED;
    char held_sha[65] = "", src_sha[65] = "";
    if (held > 0) kvl__tokens_sha256_hex(t->s.tokens, (size_t)held, held_sha);
    kvr_continue_req c = {.sid = req->sid, .held = (unsigned)held, .held_sha256 = held_sha,
                          .context = t->N > held ? t->s.tokens + held : NULL, .n_context = t->N - held,
                          .input = req->user,
                          .n_input = req->n_user, .key = r->tickets ? &r->ticket_key : NULL};
    o->mode = KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_NONE;
    if (t->cur >= 0 && t->cur != ti) {
        snprintf(o->from_node, sizeof o->from_node, "%s", r->reg->nodes[t->cur].name);
        snprintf(o->from_model, sizeof o->from_model, "%s", r->reg->nodes[t->cur].model);
    }
    *shadow = 0;
    int shadow_due = 0;
    if (held < t->N) {
        if (t->cur < 0 || t->cur == ti) {
            kvr__turn_fallback(t, "node_state", "%s held %d of %d tokens", T->name, held, t->N);
        } else {
            kvr_node *src = &r->reg->nodes[t->cur];
            int src_held = kvr_session_held(&t->s, src->name);
            if (req->force_reprefill) kvr__turn_fallback(t, "forced", NULL);
            else if (!kvr_registry_can_translate(r->reg, src->model, ti))
                kvr__turn_fallback(t, "no_translator", "%s -> %s", src->model, T->model);
            else if (!kvr_guard_pair_ok(r->guard, src->model, T->model)) {
                kvr__turn_fallback(t, "pair_disabled", "guardrail: %s -> %s", src->model, T->model);
                c.native_only = 1;   /* translated K/V it holds are as suspect as new ones */
            } else if (src_held <= held || src_held > t->N) {
                kvr__turn_fallback(t, "source_state", "%s holds %d tokens, target %d", src->name, src_held, held);
            } else {
                unsigned L, H, D;
                kvr_registry_geometry(r->reg, t->cur, &L, &H, &D, NULL);
                double bytes = 2.0 * L * H * D * 4.0 * (src_held - held) + 4.0 * (src_held - held);
                kvl__tokens_sha256_hex(t->s.tokens, (size_t)src_held, src_sha);
                c.source = src;
                c.source_tokens = (unsigned)src_held;
                c.source_sha256 = src_sha;
                double tms = r->cfg->transfer_base_ms + bytes / r->cfg->transfer_bytes_per_s * 1000.0;
                c.pull_timeout_ms = tms < 3600e3 ? (int64_t)tms : 3600000;   /* an hour at most */
                /* logprobs are asked for when this switch may be shadowed; it is counted (and
                 * shadowed) only once the node's result says the span was translated: a pull
                 * that fell back is a native turn, whose KL against itself says nothing */
                shadow_due = kvr_guard_shadow_due(r->guard, src->model, T->model);
            }
        }
    }
    /* what the first token's readers see (the OpenAI door's headers): the several-call path's
     * figures, corrected from the node's result when the turn ends */
    o->mode = c.source ? KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE
            : held < t->N ? KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_REPREFILL
                          : KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_NONE;
    o->prefill_tokens = (unsigned)(c.source ? t->N - (int)c.source_tokens + 1 + req->n_user
                                            : t->N - held + req->n_user);
    o->span_tokens = c.source ? c.source_tokens - 1 - (unsigned)held : o->prefill_tokens;
    int want_lp = needs_entropy || shadow_due || req->compare_reprefill;
    kvr_gen_params gp = {.max_tokens = req->max_tokens, .temperature = req->temperature,
                         .top_k = req->top_k, .top_p = req->top_p, .seed = req->seed,
                         .stop_at_eos = req->stop_at_eos, .stop_ids = req->stop_ids,
                         .n_stop = req->n_stop, .return_logprobs = want_lp};
    int64_t timeout = turn_deadline_ms(t, ti, c.pull_timeout_ms);
    kvl_status s = KVL_OK;
    for (int attempt = 0; attempt <= KVR_MAKE_ROOM_TRIES; attempt++) {
        kvl__rpc_stream *st = NULL;
        memset(nr, 0, sizeof *nr);
        if ((s = kvr_node_continue(T, &c, &gp, timeout, &st))) {
            *code = GRPC_STATUS_UNAVAILABLE;
            return s;
        }
        s = kvr__turn_decode(t, ti, want_lp, emit, arg, t_start, gen, first_lp, vocab, started, code, st, nr);
        if (!s || *started) break;
        if (*code == GRPC_STATUS_FAILED_PRECONDITION) {
            kvl__svc_log_text("info", "session %s: %s: the several-call path resets it", req->sid,
                              kvl_last_error());
            return KVL_ERR_UNSUPPORTED;
        }
        /* the node's session table is full: drop its least recently used idle session and try
         * again, a few times (a place freed may be taken meanwhile, e.g. by a guardrail shadow
         * re-prefill, whose session the ledger does not know) */
        if (attempt == KVR_MAKE_ROOM_TRIES || !kvr__turn_table_full(*code, kvl_last_error()) ||
            !kvr__turn_make_room(t, ti))
            break;
    }
    if (s) return s;
    o->one_call = 1;
    if (!nr->got) {
        /* the router ended the stream itself (a stop sequence matched): the node's final message
         * never came, the figures set above stand and the commit asks the node what it holds */
        if (strcmp(o->finish_reason, "stop"))
            return kvl__errorf(KVL_ERR_INTERNAL, "node %s: ContinueTurn ended without its result", T->name);
        return KVL_OK;   /* not counted: whether the span was translated is not known */
    }
    o->switch_s = nr->pull_s;
    o->export_s = nr->export_s;
    o->transfer_s = nr->transfer_s;
    o->translate_s = nr->translate_s;
    o->forward_s = nr->forward_s;
    if (nr->mode == KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE) {
        o->mode = KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE;
        o->span_tokens = nr->span_t1 - nr->span_t0;
        o->prefill_tokens = (unsigned)(t->N - (int)nr->span_t1 + req->n_user);
        if (c.source) *shadow = count_switch(r, c.source, T, *first_lp);
        t->fb_code[0] = 0;
        o->fallback[0] = 0;
    } else {
        o->mode = nr->mode == KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_REPREFILL
                      ? KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_REPREFILL
                      : KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_NONE;
        o->prefill_tokens = (unsigned)(t->N - held + req->n_user);
        o->span_tokens = o->prefill_tokens;
        if (c.source && nr->fallback[0]) {
            /* the node's reason, "label: detail"; the label is the metric's */
            const char *colon = strchr(nr->fallback, ':');
            size_t n = colon ? (size_t)(colon - nr->fallback) : strlen(nr->fallback);
            if (n >= sizeof t->fb_code) n = sizeof t->fb_code - 1;
            /* the node's text becomes a label value: only [a-z0-9_] of it, so that a node's
             * quote, backslash or newline cannot break the metrics' exposition format */
            for (size_t i = 0; i < n; i++) {
                char ch = nr->fallback[i];
                t->fb_code[i] = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' ? ch : '_';
            }
            t->fb_code[n] = 0;
            kvr__reason_copy(o->fallback, sizeof o->fallback, nr->fallback);
            kvl__svc_log_text("warn", "session %s: %s could not pull the span from %s: %s", req->sid,
                              T->name, r->reg->nodes[t->cur].name, nr->fallback);
            if (!strcmp(t->fb_code, "source_unavailable"))
                kvr_registry_mark(r->reg, t->cur, 0, nr->fallback);
        }
    }
    return KVL_OK;
}

