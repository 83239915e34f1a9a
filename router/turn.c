/* router/turn.c: one turn of a session, end to end.
 *
 *   load the session from the ledger -> the policy picks node T -> make T hold the ledger:
 *   verify what T holds (SessionInfo), ship the span it lacks from the node holding the context
 *   (ExportSpan, deadline sized from the span's bytes, one retry) or, on any failure or when no
 *   translation is possible, re-prefill from the ledger -> append this turn's input -> Generate,
 *   streaming tokens to the client -> commit tokens, turn, holdings and policy state in one
 *   transaction -> metrics, guardrail sample, summary.
 *
 * The client never loses a turn to a failed switch: every failure between "the policy chose T"
 * and "T holds the context" ends in a re-prefill on T, with the reason in the summary, the log
 * and kvlingo_router_fallbacks_total.  A node that fails before the first token is marked down
 * and the policy chooses again. */
#include "router.h"
#include "log.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "nodecall.h"
#include "turn_internal.h"
#include "push_ahead.h"

/* Does a node's SHA-256 of its ledger equal the hash of ledger tokens [0, n)?  What a node
 * holds is checked by content, not by count: a cache someone else filled (a span imported
 * into this session by another caller) must never be decoded as this session's. */
static int same_tokens(const turn *t, const char *node_sha, int n) {
    if (n < 0 || n > t->N || !node_sha) return 0;
    char want[65];
    kvl__tokens_sha256_hex(t->s.tokens, (size_t)n, want);
    return want[0] && !strcmp(node_sha, want);
}

void kvr__reason_copy(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n < cap) {
        memcpy(dst, src, n + 1);
        return;
    }
    if (cap < 8) {
        snprintf(dst, cap, "%s", src);
        return;
    }
    /* too long for the summary and the ledger: cut after the last whole word that leaves room
     * for "...", not mid-word (a reader would take "Connectio" for the message) */
    size_t cut = cap - 4;
    while (cut > cap / 2 && src[cut] != ' ') cut--;
    if (src[cut] != ' ') cut = cap - 4;
    memcpy(dst, src, cut);
    memcpy(dst + cut, "...", 4);
}

void kvr__turn_fallback(turn *t, const char *code, const char *fmt, ...) {
    snprintf(t->fb_code, sizeof t->fb_code, "%s", code);
    char detail[512] = "", all[600];
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
    }
    snprintf(all, sizeof all, "%s%s%s", code, detail[0] ? ": " : "", detail);
    kvr__reason_copy(t->out->fallback, sizeof t->out->fallback, all);
}

/* Short label for a gRPC failure of ExportSpan. */
static void code_label(grpc_status_code c, char *buf, size_t cap) {
    const char *n = kvl__rpc_status_name(c);
    size_t i = 0;
    for (; n[i] && i + 1 < cap; i++) buf[i] = (char)tolower((unsigned char)n[i]);
    buf[i] = 0;
}

static int transient(grpc_status_code c) {
    return c == GRPC_STATUS_UNAVAILABLE || c == GRPC_STATUS_DEADLINE_EXCEEDED ||
           c == GRPC_STATUS_ABORTED || c == GRPC_STATUS_INTERNAL || c == GRPC_STATUS_UNKNOWN ||
           c == GRPC_STATUS_RESOURCE_EXHAUSTED || c == GRPC_STATUS_CANCELLED;
}

/* Node ti's session table is full (it refused a session "at its maximum"): drop the least
 * recently used idle session it holds, so this one fits.  The dropped session keeps its ledger:
 * its next turn rebuilds it there (re-prefill) or elsewhere.  1 when a place was freed. */
int kvr__turn_make_room(turn *t, int ti) {
    kvr_router *r = t->r;
    kvr_node *T = &r->reg->nodes[ti];
    char ids[8][KVR_ID_MAX];
    int n = 0;
    if (kvr_ledger_lru_on_node(r->ledger, T->name, t->req->sid, ids, 8, &n)) return 0;
    for (int i = 0; i < n; i++) {
        if (kvr_router_busy_take(r, ids[i])) continue;   /* its turn runs: not this one */
        int ok = !kvr_node_drop(T, ids[i], t->node_ms, NULL) &&
                 !kvr_ledger_holding_set(r->ledger, ids[i], T->name, 0);
        kvr_router_busy_release(r, ids[i]);
        if (ok) {
            kvl__svc_log_text("info", "node %s is full: dropped idle session %s there (least recently "
                              "used) for session %s", T->name, ids[i], t->req->sid);
            return 1;
        }
    }
    return 0;
}

int kvr__turn_table_full(grpc_status_code code, const char *msg) {
    return code == GRPC_STATUS_OUT_OF_RANGE && strstr(msg, "maximum of");
}

static kvl_status open_session(turn *t, int ti, grpc_status_code *code) {
    kvr_node *T = &t->r->reg->nodes[ti];
    grpc_status_code c = GRPC_STATUS_OK;
    kvl_status st = kvr_node_open(T, t->req->sid, t->node_ms, &c);
    for (int i = 0; i < KVR_MAKE_ROOM_TRIES && st && kvr__turn_table_full(c, kvl_last_error()) &&
                    kvr__turn_make_room(t, ti); i++)
        st = kvr_node_open(T, t->req->sid, t->node_ms, &c);
    if (code) *code = c;
    return st;
}

/* Make node i hold exactly what the ledger says it holds, or nothing: returns the count in *h.
 * A node whose session disagrees with the ledger (it restarted, a turn died mid-way, a router
 * crash lost a commit) is reset: its session is dropped and reopened empty. */
static kvl_status reconcile(turn *t, int i, int *h, int *cached, int *absent, grpc_status_code *code) {
    kvr_node *n = &t->r->reg->nodes[i];
    int expect = kvr_session_held(&t->s, n->name);
    kvr_node_session ns;
    kvl_status st = kvr_node_session_info(n, t->req->sid, t->node_ms, &ns, code);
    if (st) return st;
    int counts_ok = ns.found && (int)ns.tokens == expect && ns.idle && expect <= t->N &&
                    (int)ns.cached <= expect;
    if (counts_ok && same_tokens(t, ns.sha256, expect)) {
        *h = expect;
        *cached = (int)ns.cached;
        return KVL_OK;
    }
    if (counts_ok) {
        t->hash_bad = 1;
        kvl__svc_log_text("warn", "session %s: node %s holds %u tokens as the ledger says, but other "
                          "ids (hash mismatch): reset", t->req->sid, n->name, ns.tokens);
        if ((st = kvr_node_drop(n, t->req->sid, t->node_ms, code))) return st;
    } else if (ns.found) {
        if (expect > 0 || ns.tokens > 0)
            kvl__svc_log_text("warn", "session %s: node %s holds %u tokens (%s), ledger says %d: reset",
                    t->req->sid, n->name, ns.tokens, ns.idle ? "idle" : "busy", expect);
        if ((st = kvr_node_drop(n, t->req->sid, t->node_ms, code))) return st;
    }
    /* not opened here: an import creates the session itself, so a translated switch into a
     * fresh node saves a round trip; prepare() opens it on the other paths */
    *h = 0;
    *cached = 0;
    *absent = 1;
    return KVL_OK;
}

/* Ship [from, to) from the current node into node ti: `from` is what ti has in its KV cache
 * (its ledger may hold one more, uncached token: the last one it sampled; the import overwrites
 * it with the same id), `to` what the source has in its cache (so the source runs no prefill on
 * the critical path: the few uncached tokens go to the target with this turn's input).
 * Returns 1 on success (*to_out set), 0 when the caller must re-prefill (fallback reason set;
 * *reset when ti must be emptied). */
static int try_translate(turn *t, int ti, int from, int tgt_tokens, int *to_out, double *xfer_s,
                         int *reset) {
    kvr_router *r = t->r;
    kvr_node *src = &r->reg->nodes[t->cur], *dst = &r->reg->nodes[ti];
    const kvr_config *c = r->cfg;
    *reset = 0;
    grpc_status_code code = GRPC_STATUS_OK;
    kvr_node_session si;
    if (kvr_node_session_info(src, t->req->sid, t->node_ms, &si, &code)) {
        if (code == GRPC_STATUS_UNAVAILABLE) kvr_registry_mark(r->reg, t->cur, 0, kvl_last_error());
        kvr__turn_fallback(t, "source_unavailable", "%s", kvl_last_error());
        return 0;
    }
    int src_held = kvr_session_held(&t->s, src->name);
    if (!si.found || (int)si.tokens != src_held || !si.idle) {
        kvr__turn_fallback(t, "source_state", "%s holds %u tokens%s, ledger says %d", src->name,
                     si.found ? si.tokens : 0, si.idle ? "" : " (busy)", src_held);
        return 0;
    }
    if (!same_tokens(t, si.sha256, src_held)) {
        t->hash_bad = 1;
        kvr__turn_fallback(t, "hash_mismatch", "%s holds %u tokens but not the ledger's ids", src->name, si.tokens);
        return 0;
    }
    int to = (int)si.cached;
    if (to == from && from > 0) {
        /* push-ahead: the target already caches all the source can ship (both checked against
         * the ledger): a translated switch of 0 tokens */
        *to_out = to;
        return 1;
    }
    if (to <= from) {
        kvr__turn_fallback(t, "source_behind", "%s caches %d tokens, target holds %d", src->name, to, from);
        return 0;
    }
    unsigned L, H, D;
    kvr_registry_geometry(r->reg, t->cur, &L, &H, &D, NULL);
    double bytes = 2.0 * L * H * D * 4.0 * (to - from) + 4.0 * (to - from);
    double tms = c->transfer_base_ms + bytes / c->transfer_bytes_per_s * 1000.0;
    int64_t timeout = tms < 3600e3 ? (int64_t)tms : 3600000;   /* an hour at most */
    kvr_export_result ex;
    int evicted = 0;
    for (int attempt = 0; attempt <= c->transfer_retries; attempt++) {
        double t0 = kvl__now_s();
        kvl_status st = kvr_node_export(src, dst, t->req->sid, (unsigned)from, (unsigned)to, 0,
                                        timeout, 1000, r->tickets ? &r->ticket_key : NULL, &ex, &code);
        *xfer_s += kvl__now_s() - t0;
        if (!st) {
            /* the imported range must be exactly what the ledger expects: an off-by-one span is
             * not decoded, it is thrown away and re-prefilled */
            if ((int)ex.t0 != from || (int)ex.t1 != to || (int)ex.peer_tokens != to) {
                kvr__turn_fallback(t, "range_mismatch", "imported [%u,%u) -> %u tokens, expected [%d,%d)",
                             ex.t0, ex.t1, ex.peer_tokens, from, to);
                *reset = 1;
                return 0;
            }
            if (!same_tokens(t, ex.peer_sha256, to)) {
                t->hash_bad = 1;
                kvr__turn_fallback(t, "hash_mismatch", "%s imported [%u,%u) but holds other ids than the "
                             "ledger", dst->name, ex.t0, ex.t1);
                *reset = 1;
                return 0;
            }
            *to_out = to;
            t->out->export_s = ex.export_s;
            t->out->transfer_s = ex.transfer_s;
            t->out->translate_s = ex.translate_s;
            return 1;
        }
        char label[40];
        code_label(code, label, sizeof label);
        char msg[200];
        snprintf(msg, sizeof msg, "%s", kvl_last_error());
        kvl__svc_log_text("warn", "session %s: export %s->%s [%d,%d) attempt %d failed: %s",
                t->req->sid, src->name, dst->name, from, to, attempt + 1, msg);
        if (kvr__turn_table_full(code, msg) && evicted < KVR_MAKE_ROOM_TRIES && kvr__turn_make_room(t, ti)) {
            evicted++;        /* the target had no room for the import: once more, not a retry */
            attempt--;
            continue;
        }
        if (!transient(code)) {
            char lab[64];
            snprintf(lab, sizeof lab, "rejected_%s", label);
            kvr__turn_fallback(t, lab, "%s", msg);
            break;
        }
        kvr__turn_fallback(t, code == GRPC_STATUS_DEADLINE_EXCEEDED ? "export_deadline" : "export_failed",
                     "%s (deadline %lld ms for %.0f bytes)", msg, (long long)timeout, bytes);
        if (code == GRPC_STATUS_UNAVAILABLE && strstr(msg, src->address))
            kvr_registry_mark(r->reg, t->cur, 0, msg);
        /* retry only from a clean target: a failed import must have left it as it was */
        kvr_node_session di;
        if (kvr_node_session_info(dst, t->req->sid, t->node_ms, &di, NULL)) break;
        /* the source may die after the target imported the whole span (its verdict lost): the
         * target checked the checksum itself; when it holds exactly [0, to), keep it */
        if (di.found && di.idle && (int)di.tokens == to && (int)di.cached == to &&
            same_tokens(t, di.sha256, to) &&
            (int)di.imported >= to - from) {
            kvl__svc_log_text("info", "session %s: %s imported [%d,%d) before the export failed: kept",
                    t->req->sid, dst->name, from, to);
            t->fb_code[0] = 0;
            t->out->fallback[0] = 0;
            *to_out = to;
            return 1;
        }
        int clean = di.found ? (int)di.cached == from && (int)di.tokens == tgt_tokens && di.idle
                             : from == 0 && tgt_tokens == 0;
        if (!clean) break;
    }
    *reset = 1;   /* whatever the target holds now is suspect */
    return 0;
}

/* Make node ti hold ledger [0, *h) (translate or re-prefill decides how much). */
static kvl_status prepare_inner(turn *t, int ti, int *h, int *absent, grpc_status_code *code) {
    kvr_router *r = t->r;
    kvr_turn_out *o = t->out;
    kvr_node *T = &r->reg->nodes[ti];
    int cached = 0;
    kvl_status st = reconcile(t, ti, h, &cached, absent, code);
    if (st) return st;
    o->mode = KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_NONE;
    if (t->cur >= 0 && t->cur != ti) {
        snprintf(o->from_node, sizeof o->from_node, "%s", r->reg->nodes[t->cur].name);
        snprintf(o->from_model, sizeof o->from_model, "%s", r->reg->nodes[t->cur].model);
    }
    if (*h == t->N) return KVL_OK;                       /* nothing missing */
    if (t->cur < 0 || t->cur == ti) {
        /* the node holding the context lost (part of) it: it re-reads the ledger */
        o->mode = KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_REPREFILL;
        if (t->hash_bad) kvr__turn_fallback(t, "hash_mismatch", "%s held other ids than the ledger", T->name);
        else kvr__turn_fallback(t, "node_state", "%s held %d of %d tokens", T->name, *h, t->N);
        return KVL_OK;
    }
    const char *sm = r->reg->nodes[t->cur].model;
    double xfer = 0;
    int ok = 0, reset = 0, to = 0;
    if (t->req->force_reprefill) kvr__turn_fallback(t, "forced", NULL);
    else if (!kvr_registry_can_translate(r->reg, sm, ti)) kvr__turn_fallback(t, "no_translator", "%s -> %s", sm, T->model);
    else if (!kvr_guard_pair_ok(r->guard, sm, T->model)) {
        kvr__turn_fallback(t, "pair_disabled", "guardrail: %s -> %s", sm, T->model);
        /* translated K/V the target already holds are as suspect as new ones: rebuild natively */
        kvr_node_session ns;
        if (!kvr_node_session_info(T, t->req->sid, t->node_ms, &ns, code) && ns.found && ns.imported > 0)
            reset = 2;   /* 2: reset even though the node is consistent */
    }
    else ok = try_translate(t, ti, cached, *h, &to, &xfer, &reset);
    o->switch_s = xfer;
    if (ok) {
        o->mode = KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE;
        o->span_tokens = (unsigned)(to - cached);
        *h = to;
        return KVL_OK;
    }
    o->mode = KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_REPREFILL;
    if (reset) {
        kvr_node_session ns;
        if (reset == 1 && !kvr_node_session_info(T, t->req->sid, t->node_ms, &ns, code) &&
            ns.found && (int)ns.tokens == *h && (int)ns.cached == cached && ns.idle &&
            same_tokens(t, ns.sha256, *h))
            return KVL_OK;                                  /* the import left it as it was */
        if ((st = kvr_node_drop(T, t->req->sid, t->node_ms, code))) return st;
        if ((st = open_session(t, ti, code))) return st;
        *absent = 0;
        *h = 0;
    }
    return KVL_OK;
}

static kvl_status prepare(turn *t, int ti, int *h, grpc_status_code *code) {
    int absent = 0;
    kvl_status st = prepare_inner(t, ti, h, &absent, code);
    if (!st && absent && t->out->mode != KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE)
        st = open_session(t, ti, code);
    return st;
}

static void holdings_after(turn *t, int ti, int n_after, kvr_holding *hs, int *nh) {
    *nh = 0;
    const char *tn = t->r->reg->nodes[ti].name;
    for (int i = 0; i < t->s.n_holdings && *nh < KVR_MAX_HOLDINGS - 1; i++)
        if (strcmp(t->s.holdings[i].node, tn)) hs[(*nh)++] = t->s.holdings[i];
    if (n_after > 0) {
        snprintf(hs[*nh].node, sizeof hs[*nh].node, "%s", tn);
        hs[(*nh)++].n_tokens = n_after;
    }
}

static const char *mode_name(int m) {
    return m == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE ? "translate"
         : m == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_REPREFILL ? "reprefill" : "none";
}

/* The client cancelled the turn: its input stays in the ledger (the next turn continues after
 * it), the output is discarded.  The answering node now holds more than the ledger (the tokens
 * generated before the cancel): its holding goes from the ledger and its copy from the node
 * (the next turn there would reset it anyway; left there, listed nowhere, a close or expiry
 * of the session could not reach it and it would take a place in the node's table until the
 * node's own idle TTL). */
static void keep_cancelled_input(turn *t, int ti, const kvr_policy_decision *d, kvr_turn_out *out) {
    kvr_router *r = t->r;
    const kvr_turn_req *req = t->req;
    kvr_node *T = &r->reg->nodes[ti];
    kvr_holding hs[KVR_MAX_HOLDINGS];
    int nh = 0;
    holdings_after(t, ti, 0, hs, &nh);
    kvr_turn_rec tr = {.idx = t->s.n_turns, .node = T->name, .model = T->model,
                       .mode = mode_name(out->mode), .fallback = "cancelled by the client", .t0 = t->N,
                       .n_user = req->n_user, .n_gen = 0, .span = (int)out->span_tokens,
                       .ttft_s = out->ttft_s, .tps = 0, .entropy = 0, .finish = "cancelled",
                       .fence = req->fence};
    kvl_status cs = kvr_ledger_turn_commit(r->ledger, req->sid, req->user, t->N, req->n_user, &tr,
                                           T->name, d->state.level, d->state.calm, hs, nh, kvr_wall_now());
    if (cs)
        kvl__svc_log_text("warn", "session %s: cancelled turn: keeping its input failed: %s", req->sid,
                          kvl_last_error());
    else
        kvl__svc_log_text("info", "session %s: turn cancelled by the client on %s: its %d input tokens "
                          "stay in the ledger (%d tokens), the output (%u tokens) is discarded", req->sid,
                          T->name, req->n_user, t->N + req->n_user, out->n_generated);
    /* not when the lease went to another replica (MISMATCH): the session may be its turn's now */
    if (cs != KVL_ERR_MISMATCH && kvr_node_drop(T, req->sid, t->node_ms, NULL))
        kvl__svc_log_text("warn", "session %s: dropping the cancelled turn's copy on %s: %s", req->sid, T->name,
                          kvl_last_error());
    out->context_tokens = (unsigned)(t->N + req->n_user);
}

/* Decode on node ti after prepare; fills out, the generated ids and (when asked) the first
 * token's log-distribution.  *started = 1 once a token reached the client. */
kvl_status kvr_turn_run_once(kvr_router *r, const kvr_turn_req *req, kvr_emit_fn emit, void *arg,
                             kvr_turn_out *out) {
    double t_start = kvl__now_s();
    memset(out, 0, sizeof *out);
    turn t = {.r = r, .req = req, .out = out, .cur = -1, .node_ms = (int64_t)r->cfg->node_timeout_ms};
    kvl_status s = kvr_ledger_session_load(r->ledger, req->sid, 1, &t.s);
    if (s) return s;
    if (t.s.state != KVR_SESSION_OPEN) {
        s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is %s", req->sid,
                       t.s.state == KVR_SESSION_CLOSED ? "closed" : "expired");
        kvr_session_clear(&t.s);
        return s;
    }
    out->ledger_s = kvl__now_s() - t_start;
    t.N = t.s.n_tokens;
    t.cur = kvr_registry_find(r->reg, t.s.current_node);
    out->turn = (unsigned)t.s.n_turns;
    out->user_tokens = (unsigned)req->n_user;

    int32_t *gen = malloc(sizeof(int32_t) * (req->max_tokens + 1));
    if (!gen) { kvr_session_clear(&t.s); return kvl__errorf(KVL_ERR_NOMEM, "turn"); }
    float *first_lp = NULL;
    int vocab = 0, ti = -1, tried[KVR_MAX_NODES] = {0};
    char failed[300] = "";        /* the last node that failed before its first token, and why */
    kvr_policy_decision d;
    kvr_policy_input in;
    kvr_node_view views[KVR_MAX_NODES];
    int needs_entropy = 0;
    grpc_status_code code = GRPC_STATUS_OK;

    /* choose -> prepare -> decode; a node failing before the first token is marked down and the
     * policy chooses again (each node at most once) */
    for (int attempt = 0; attempt < r->reg->n; attempt++) {
        kvr_registry_views(r->reg, &t.s, t.cur, kvr_guard_pair_ok, r->guard, views);
        for (int i = 0; i < r->reg->n; i++) if (tried[i]) views[i].healthy = 0;
        in = (kvr_policy_input){.nodes = views, .n_nodes = r->reg->n, .current = t.cur,
                                .n_context = t.N, .n_user = req->n_user, .max_tokens = (int)req->max_tokens,
                                .requested_model = req->model ? req->model : "", .session_model = t.s.model,
                                .escalate = req->escalate,
                                .state = {.level = t.s.pol_level, .calm = t.s.pol_calm}};
        pthread_rwlock_rdlock(&r->policy_lock);
        s = kvr_policy_choose(r->policy, &in, &d);
        needs_entropy = kvr_policy_needs_entropy(r->policy);
        pthread_rwlock_unlock(&r->policy_lock);
        if (s && failed[0]) {
            /* no node left after a failure: the client learns that failure, not only the
             * policy's "no healthy node" */
            char why[320];
            snprintf(why, sizeof why, "%s", kvl_last_error());
            s = kvl__errorf(s, "%s (%s)", why, failed);
        }
        if (s) break;
        ti = d.node;
        tried[ti] = 1;
        kvr_node *T = &r->reg->nodes[ti];
        kvr_node tc;
        kvr_registry_copy(r->reg, ti, &tc);
        long need = (long)t.N + req->n_user + (long)req->max_tokens;
        if (tc.max_context && need > (long)tc.max_context) {
            s = kvl__errorf(KVL_ERR_RANGE, "session '%s': %d context + %d input + %u new tokens = %ld "
                           "exceeds node %s's max context %u", req->sid, t.N, req->n_user,
                           req->max_tokens, need, T->name, tc.max_context);
            break;
        }
        snprintf(out->policy_reason, sizeof out->policy_reason, "%s", d.reason);
        out->failover_from[0] = 0;
        if (d.failover) {
            snprintf(out->failover_from, sizeof out->failover_from, "%s", d.wanted);
            kvl__svc_log_text("warn", "session %s: model failover from %s to %s on %s: %s", req->sid,
                              d.wanted[0] ? d.wanted : "?", T->model, T->name, d.reason);
        }
        snprintf(out->node, sizeof out->node, "%s", T->name);
        snprintf(out->model, sizeof out->model, "%s", T->model);
        out->fallback[0] = 0;
        t.fb_code[0] = 0;
        out->span_tokens = 0;
        out->switch_s = 0;
        /* what an attempt on another node set (a switch that failed before its first token)
         * is not this attempt's: a turn chosen again on the node holding the context is none */
        out->from_node[0] = out->from_model[0] = 0;
        out->export_s = out->transfer_s = out->translate_s = 0;
        kvr_registry_turn_begin(r->reg, ti);
        int h = 0, started = 0, shadow = 0, one = 0;
        one_result nr = {0};
        if (tc.one_call && r->cfg->transfer_one_call) {
            s = kvr__turn_one_call(&t, ti, needs_entropy, emit, arg, t_start, gen, &first_lp, &vocab, &started,
                         &code, &nr, &shadow);
            if (s == KVL_ERR_UNSUPPORTED) {
                kvl_clear_error();
                s = KVL_OK;
                out->fallback[0] = 0;
                t.fb_code[0] = 0;
                out->span_tokens = 0;
                out->switch_s = 0;
            } else {
                one = 1;
            }
        }
        if (!one) {
            s = prepare(&t, ti, &h, &code);
            if (!s) {
                if (out->mode != KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE)
                    out->span_tokens = (unsigned)(t.N - h + req->n_user);
                /* the tail the node lacks (re-prefill) plus this turn's input, in one append */
                int n_tail = t.N - h + req->n_user;
                out->prefill_tokens = (unsigned)n_tail;
                int32_t *tail = malloc(sizeof(int32_t) * (size_t)(n_tail ? n_tail : 1));
                if (!tail) s = kvl__errorf(KVL_ERR_NOMEM, "turn tail");
                else {
                    memcpy(tail, t.s.tokens + h, sizeof(int32_t) * (size_t)(t.N - h));
                    memcpy(tail + (t.N - h), req->user, sizeof(int32_t) * (size_t)req->n_user);
                    unsigned count = 0;
                    s = kvr_node_append(T, req->sid, tail, n_tail, t.node_ms, &count, &code);
                    free(tail);
                    if (!s && (int)count != t.N + req->n_user)
                        s = kvl__errorf(KVL_ERR_INTERNAL, "node %s holds %u tokens after append, ledger expects %d",
                                       T->name, count, t.N + req->n_user);
                }
            }
            if (!s) {
                shadow = out->mode == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE &&
                         kvr_guard_count_switch(r->guard, out->from_model, out->model, 1);
                int want_lp = needs_entropy || shadow || req->compare_reprefill;
                s = kvr__turn_decode(&t, ti, want_lp, emit, arg, t_start, gen, &first_lp, &vocab, &started, &code,
                           NULL, NULL);
            }
        }
        kvr_registry_turn_end(r->reg, ti);
        int tail_replaced = 0;
        if (s == KVL_ERR_CANCELLED && t.client_cancelled) {
            keep_cancelled_input(&t, ti, &d, out);
            break;
        }
        if (s == KVL_ERR_CANCELLED) {
            /* the node cancelled its side (it is shutting down): a node failure like any other,
             * chosen again before the first token, else UNAVAILABLE; never the client's cancel,
             * which would keep the input in the ledger as a cancelled turn */
            char why[400];
            snprintf(why, sizeof why, "%s", kvl_last_error());
            s = kvl__errorf(KVL_ERR_IO, "node %s ended the turn: %s", T->name, why);
        }
        if (!s && req->has_end_token && out->n_generated > 0 && out->n_generated <= req->max_tokens &&
            !strcmp(out->finish_reason, "eos") && gen[out->n_generated - 1] != req->end_token) {
            /* a chat reply the model ended with EOS: the next request's history closes it with
             * the template's end-of-turn token, so the ledger (and the node, where the last
             * sampled token is not in the KV cache yet) say that, and the session continues */
            unsigned last = (unsigned)(t.N + req->n_user) + out->n_generated - 1, cnt = 0;
            tail_replaced = 1;
            if (!kvr_node_replace_tail(T, req->sid, last, &req->end_token, 1, t.node_ms, &cnt, NULL) &&
                cnt == last + 1)
                gen[out->n_generated - 1] = req->end_token;
            else
                kvl__svc_log_text("warn", "session %s: recording end-of-turn after EOS on %s failed: %s",
                                  req->sid, T->name, kvl_last_error());
        }
        if (!s) {
            /* success: commit */
            kvr_node_session ns;
            int after = t.N + req->n_user + (int)out->n_generated;
            if (one && nr.got && !tail_replaced) {
                /* the node said what it holds after the turn: count and ids */
                int32_t *all = malloc(sizeof(int32_t) * (size_t)(after ? after : 1));
                char want[65] = "";
                if (all) {
                    memcpy(all, t.s.tokens, sizeof(int32_t) * (size_t)t.N);
                    memcpy(all + t.N, req->user, sizeof(int32_t) * (size_t)req->n_user);
                    memcpy(all + t.N + req->n_user, gen, sizeof(int32_t) * out->n_generated);
                    kvl__tokens_sha256_hex(all, (size_t)after, want);
                    free(all);
                }
                if ((int)nr.token_count != after || !want[0] || strcmp(want, nr.sha256)) {
                    kvl__svc_log_text("warn", "session %s: node %s holds %u tokens after the turn (%s), "
                                      "expected %d", req->sid, T->name, nr.token_count,
                                      (int)nr.token_count == after ? "other ids" : "count", after);
                    after = 0;
                }
            } else if (kvr_node_session_info(T, req->sid, t.node_ms, &ns, NULL) || !ns.found ||
                       (int)ns.tokens != after) {
                kvl__svc_log_text("warn", "session %s: node %s holds %u tokens after the turn, expected %d",
                        req->sid, T->name, ns.tokens, after);
                after = 0;
            }
            kvr_holding hs[KVR_MAX_HOLDINGS];
            int nh = 0;
            holdings_after(&t, ti, after, hs, &nh);
            kvr_policy_state ps = d.state;
            kvr_turn_outcome oc = {.node = ti, .mean_entropy = out->mean_entropy, .entropy_valid = needs_entropy};
            pthread_rwlock_rdlock(&r->policy_lock);
            kvr_policy_observe(r->policy, &in, &oc, &ps);
            pthread_rwlock_unlock(&r->policy_lock);
            int n_new = req->n_user + (int)out->n_generated;
            int32_t *newtok = malloc(sizeof(int32_t) * (size_t)(n_new ? n_new : 1));
            if (!newtok) { s = kvl__errorf(KVL_ERR_NOMEM, "commit"); break; }
            memcpy(newtok, req->user, sizeof(int32_t) * (size_t)req->n_user);
            memcpy(newtok + req->n_user, gen, sizeof(int32_t) * out->n_generated);
            kvr_turn_rec tr = {.idx = t.s.n_turns, .node = T->name, .model = T->model,
                               .mode = mode_name(out->mode), .fallback = out->fallback, .t0 = t.N,
                               .n_user = req->n_user, .n_gen = (int)out->n_generated,
                               .span = (int)out->span_tokens, .ttft_s = out->ttft_s, .tps = out->tps,
                               .entropy = out->mean_entropy, .finish = out->finish_reason,
                               .fence = req->fence};
            s = kvr_ledger_turn_commit(r->ledger, req->sid, newtok, t.N, n_new, &tr, T->name, ps.level,
                                       ps.calm, hs, nh, kvr_wall_now());
            free(newtok);
            out->context_tokens = (unsigned)(t.N + n_new);
            if (s) break;
            /* the node holds other than the ledger (a stop sequence ended the turn after the
             * node had decoded further, or it answered other figures): its holding is gone from
             * the ledger, and so goes its copy, which the next turn there would reset anyway;
             * left there, listed nowhere, a close or expiry of the session could not reach it,
             * nor could the eviction of a full node's least recently used session */
            if (!after && kvr_node_drop(T, req->sid, t.node_ms, NULL))
                kvl__svc_log_text("warn", "session %s: dropping the unlisted copy on %s: %s", req->sid, T->name,
                                  kvl_last_error());
            /* push-ahead: report a push this turn used, queue one for the next turn */
            kvr_push_ahead_after_turn(r->push, req, ti, !after, &in, &ps, out);
            /* rates for the cost policy */
            double pf_s = out->ttft_s - out->switch_s;
            int prefilled = out->mode == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE ? req->n_user : (int)out->span_tokens;
            kvr_registry_observe(r->reg, ti, prefilled >= 16 && pf_s > 0 ? prefilled / pf_s : 0, out->tps,
                                 out->mode == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE && out->switch_s > 0
                                     ? out->span_tokens / out->switch_s : 0);
            /* guardrail / comparison: native re-prefill of the same tokens on the same node */
            int n_ctx = t.N + req->n_user;
            if (req->compare_reprefill) {
                int32_t *ctx = malloc(sizeof(int32_t) * (size_t)n_ctx);
                float *native = NULL;
                int nv = 0;
                double rt = 0;
                if (ctx) {
                    memcpy(ctx, t.s.tokens, sizeof(int32_t) * (size_t)t.N);
                    memcpy(ctx + t.N, req->user, sizeof(int32_t) * (size_t)req->n_user);
                    if (!kvr_shadow_run(T, req->sid, ctx, n_ctx, t.node_ms * 4, &native, &nv, &rt)) {
                        out->reprefill_ttft_s = rt;
                        /* it prefilled the whole context once more: the tenant's to pay (which
                         * can take its bucket below zero by a context, paid back by waiting) */
                        if (req->tenant) kvr_tenants_charge(r->tenants, req->tenant, n_ctx, kvr_wall_now());
                        /* the client's to see; the guardrail's only when its own sampling had
                         * picked this switch anyway (a tenant choosing when to compare, with
                         * inputs that score badly, must not switch a pair off for everyone) */
                        if (first_lp && nv == vocab && out->mode == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE) {
                            out->shadow_kl = (float)kvr_kl_logprobs(native, first_lp, nv);
                            if (shadow) kvr_guard_record(r->guard, out->from_model, out->model, out->shadow_kl);
                        }
                    } else {
                        kvl__svc_log_text("warn", "compare_reprefill failed: %s", kvl_last_error());
                    }
                }
                free(ctx);
                free(native);
            } else if (shadow && first_lp && out->mode == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE) {
                int32_t *ctx = malloc(sizeof(int32_t) * (size_t)n_ctx);
                if (ctx) {
                    memcpy(ctx, t.s.tokens, sizeof(int32_t) * (size_t)t.N);
                    memcpy(ctx + t.N, req->user, sizeof(int32_t) * (size_t)req->n_user);
                    kvr_guard_enqueue(r->guard, ti, req->sid, out->from_model, out->model, ctx, n_ctx,
                                      first_lp, vocab);
                    first_lp = NULL;   /* owned by the queue now */
                }
            }
            break;
        }
        if (started || t.client_cancelled || !transient(code)) break;
        /* the target failed before any token: mark it down and let the policy choose again */
        kvr_registry_mark(r->reg, ti, 0, kvl_last_error());
        kvl__svc_log_text("warn", "session %s: node %s failed before the first token (%s); choosing again",
                req->sid, T->name, kvl_last_error());
        snprintf(failed, sizeof failed, "node %s failed before the first token: %.240s", T->name, kvl_last_error());
        free(first_lp);
        first_lp = NULL;
    }
    free(first_lp);
    free(gen);
    kvr_session_clear(&t.s);
    if (s) return s;

    /* metrics */
    char labels[200];
    const char *mode = mode_name(out->mode);
    snprintf(labels, sizeof labels, "model=\"%s\",mode=\"%s\"", out->model, mode);
    kvr_metrics_inc(r->metrics, "kvlingo_router_turns_total", labels, 1);
    kvr_metrics_observe(r->metrics, "kvlingo_router_turn_ttft_seconds", "", out->ttft_s);
    if (out->from_model[0]) {
        snprintf(labels, sizeof labels, "source=\"%s\",target=\"%s\",mode=\"%s\"", out->from_model,
                 out->model, mode);
        kvr_metrics_inc(r->metrics, "kvlingo_router_switches_total", labels, 1);
        snprintf(labels, sizeof labels, "mode=\"%s\"", mode);
        kvr_metrics_observe(r->metrics, "kvlingo_router_switch_ttft_seconds", labels, out->ttft_s);
        if (out->mode == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE) {
            const struct { const char *phase; double s; } ph[] = {
                {"ledger", out->ledger_s}, {"export", out->export_s}, {"transfer", out->transfer_s},
                {"translate", out->translate_s}, {"forward", out->forward_s}};
            for (size_t k = 0; k < sizeof ph / sizeof ph[0]; k++) {
                snprintf(labels, sizeof labels, "phase=\"%s\"", ph[k].phase);
                kvr_metrics_observe(r->metrics, "kvlingo_router_switch_phase_seconds", labels, ph[k].s);
            }
        }
    }
    if (out->failover_from[0]) {
        snprintf(labels, sizeof labels, "from=\"%s\",to=\"%s\",mode=\"%s\"", out->failover_from,
                 out->model, mode);
        kvr_metrics_inc(r->metrics, "kvlingo_router_model_failovers_total", labels, 1);
    }
    if (t.fb_code[0]) {
        snprintf(labels, sizeof labels, "reason=\"%s\"", t.fb_code);
        kvr_metrics_inc(r->metrics, "kvlingo_router_fallbacks_total", labels, 1);
    }
    return KVL_OK;
}
