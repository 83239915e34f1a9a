/* router/push_ahead.c: span push-ahead (see push_ahead.h): the prediction after a turn, the
 * bounded queue, the workers that ship a session's new span to the predicted node under the
 * session's lease, and the record of recent pushes that the next turn's summary reports. */
#include "push_ahead.h"
#include "router.h"
#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "error.h"
#include "nodecall.h"

#define MAX_WORKERS 4
/* How long a push waits for the turn that queued it to finish (it ends right after its
 * commit): a session busy longer runs its next turn, which switches by itself, and a worker
 * waiting on it would hold up the pushes of other sessions. */
#define WAIT_TURN_S 0.25
#define POLL_S 0.005
#define SWEEP_AFTER_S 0.25  /* a close racing with a push's record has ended by then          */
#define SWEEP_EVERY_S 0.1

typedef struct push_job {
    char sid[KVR_ID_MAX];
    int src, dst;           /* registry indices                                            */
    int n_ctx;              /* ledger length after the turn that queued the push           */
} push_job;

typedef struct pushed {
    char sid[KVR_ID_MAX];   /* "" free                                                     */
    int dst;
    int from, to;           /* the span the push shipped: [from, to)                       */
    double at;              /* when it was recorded (kvl__now_s)                            */
    int checked;            /* the sweep saw the session after the push                    */
} pushed;

struct kvr_push_ahead {
    kvr_router *r;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    push_job *q;            /* ring [cap]                                                  */
    int cap, head, n;
    pushed *done;           /* recent pushes [n_done], replaced oldest first               */
    int n_done, done_next;
    pthread_t th[MAX_WORKERS];
    int n_th, stop;
    /* the sessions whose lease a worker holds now ("" none), and the signal of each release:
     * a turn that finds the lease busy waits for it (kvr_push_ahead_wait) instead of polling */
    char holding[MAX_WORKERS][KVR_ID_MAX];
    pthread_cond_t released;
    struct push_worker { struct kvr_push_ahead *p; int w; } wk[MAX_WORKERS];
    char owner[KVR_NAME_MAX];   /* lease owner of pushes: "REPLICA/push"                    */
};

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void count(kvr_push_ahead *p, const char *result) {
    char lab[48];
    snprintf(lab, sizeof lab, "result=\"%s\"", result);
    kvr_metrics_inc(p->r->metrics, "kvlingo_router_push_ahead_total", lab, 1);
}

static int same_tokens(const kvr_session *s, const char *node_sha, int n) {
    if (n < 0 || n > s->n_tokens || !node_sha || !node_sha[0]) return 0;
    char want[65];
    kvl__tokens_sha256_hex(s->tokens, (size_t)n, want);
    return want[0] && !strcmp(node_sha, want);
}

/* After a failed push the target may hold some of the span.  Nothing is dropped here (a drop
 * that times out may still run on the node later, under the next turn): the target stays
 * listed in the holdings with what it says it holds (`guess` when it does not answer), so the
 * next turn there checks it (count and token hash) and resets it if needed, and CloseSession
 * drops it.  Only under the lease. */
static void list_target(kvr_push_ahead *p, const push_job *j, int64_t node_ms, int guess) {
    kvr_router *r = p->r;
    kvr_node *D = &r->reg->nodes[j->dst];
    kvr_node_session di;
    int n = guess;   /* a target that does not answer: listed with what the push meant to leave */
    if (!kvr_node_session_info(D, j->sid, node_ms, &di, NULL)) n = di.found ? (int)di.tokens : 0;
    if (kvr_ledger_holding_set(r->ledger, j->sid, D->name, n))
        kvl__svc_log_text("warn", "push-ahead %s: listing %s's holding after a failed push: %s", j->sid,
                          D->name, kvl_last_error());
}

/* A target that refused the push because it does not know the session although the ledger
 * lists it (the node restarted) holds nothing: its holding is removed, so the next push there
 * starts it afresh in one call instead of every push being refused (and warned about) until a
 * turn lands there and resets it.  A target that holds the session keeps its listing: the next
 * turn there checks it by count and hash.  Only under the lease. */
static void forget_lost(kvr_push_ahead *p, const push_job *j, int64_t node_ms) {
    kvr_router *r = p->r;
    kvr_node *D = &r->reg->nodes[j->dst];
    kvr_node_session di;
    if (kvr_node_session_info(D, j->sid, node_ms, &di, NULL) || di.found) return;
    if (kvr_ledger_holding_set(r->ledger, j->sid, D->name, 0))
        kvl__svc_log_text("warn", "push-ahead %s: removing %s's holding (it lost the session): %s", j->sid,
                          D->name, kvl_last_error());
    else
        kvl__svc_log_text("info", "push-ahead %s: %s does not hold the session the ledger listed (restarted?): "
                          "holding removed", j->sid, D->name);
}

/* An ended session runs no turn: its copy on the target can go without a lease. */
static void drop_ended(kvr_push_ahead *p, const char *sid, int dst) {
    kvr_router *r = p->r;
    kvr_node *D = &r->reg->nodes[dst];
    if (kvr_node_drop(D, sid, (int64_t)r->cfg->node_timeout_ms, NULL))
        kvl__svc_log_text("warn", "push-ahead %s: dropping the ended session's copy on %s: %s", sid,
                          D->name, kvl_last_error());
    else
        kvl__svc_log_text("info", "push-ahead %s: the session ended during the push: its copy on %s "
                          "was dropped", sid, D->name);
}

/* 1 when the ledger still has the session open at the length the push was queued for. */
static int current(kvr_push_ahead *p, const push_job *j) {
    kvr_session s;
    if (kvr_ledger_session_load(p->r->ledger, j->sid, 0, &s)) return 0;
    int ok = s.state == KVR_SESSION_OPEN && s.n_tokens == j->n_ctx;
    kvr_session_clear(&s);
    return ok;
}

/* Wait until no turn of this replica runs on the session and take its lease with the push's
 * owner name.  1: taken (*lease set); 0: busy past WAIT_TURN_S, or stopping; -1: the session
 * is gone (closed, expired), has moved on (a later turn committed), or the ledger failed. */
static int take_lease(kvr_push_ahead *p, const push_job *j, kvr_lease *lease) {
    kvr_router *r = p->r;
    double deadline = kvl__now_s() + WAIT_TURN_S;
    while (kvl__now_s() < deadline) {
        pthread_mutex_lock(&p->mu);
        int stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        if (stop) return 0;
        if (!current(p, j)) {
            kvl__svc_log_text("info", "push-ahead %s: the session ended or moved on: skipped", j->sid);
            return -1;
        }
        if (!kvr_router_is_busy(r, j->sid)) {
            kvl_status s = kvr_ledger_lease_acquire(r->ledger, j->sid, p->owner, kvr_wall_now(),
                                                    r->cfg->lease_ms / 1000.0, lease);
            if (!s) {
                if (!kvr_router_is_busy(r, j->sid)) return 1;
                /* a Send took the session just now: it waits for this lease; let it switch */
                kvr_ledger_lease_release(r->ledger, j->sid, p->owner, lease->gen);
                return 0;
            }
            if (s != KVL_ERR_MISMATCH || !strstr(kvl_last_error(), "is busy")) {
                kvl__svc_log_text("info", "push-ahead %s: %s: skipped", j->sid, kvl_last_error());
                return -1;
            }
        }
        sleep_s(POLL_S);
    }
    return 0;
}

static void remember(kvr_push_ahead *p, const push_job *j, int from, int to) {
    pthread_mutex_lock(&p->mu);
    int slot = -1;
    for (int i = 0; i < p->n_done && slot < 0; i++)
        if (!strcmp(p->done[i].sid, j->sid)) slot = i;
    if (slot < 0) { slot = p->done_next; p->done_next = (p->done_next + 1) % p->n_done; }
    snprintf(p->done[slot].sid, sizeof p->done[slot].sid, "%s", j->sid);
    p->done[slot].dst = j->dst;
    p->done[slot].from = from;
    p->done[slot].to = to;
    p->done[slot].at = kvl__now_s();
    p->done[slot].checked = 0;
    pthread_mutex_unlock(&p->mu);
}

/* The deadline of a push's span move of n_tokens (ms): transfer_base_ms plus its float32 bytes at
 * transfer_bytes_per_s, at most cap_ms (what the push's budget leaves it, see push_locked). */
static double move_timeout_ms(const kvr_push_ahead *p, const push_job *j, int n_tokens, double cap_ms) {
    const kvr_config *c = p->r->cfg;
    unsigned L = 0, H = 0, Dh = 0;
    kvr_registry_geometry(p->r->reg, j->src, &L, &H, &Dh, NULL);
    double bytes = 2.0 * L * H * Dh * 4.0 * n_tokens + 4.0 * n_tokens;
    double timeout = c->transfer_base_ms + bytes / c->transfer_bytes_per_s * 1000.0;
    if (timeout > cap_ms) timeout = cap_ms;
    return timeout < 1 ? 1 : timeout;
}

/* Milliseconds until `end` (kvl__now_s clock), less `reserve`: what a call may still take. */
static int64_t ms_left(double end, int64_t reserve) {
    return (int64_t)((end - kvl__now_s()) * 1000.0) - reserve;
}

/* The span move of a push by the several calls (a target without ContinueRequest.pull_only, or
 * transfer.one_call off): SessionInfo on the source and the target, then ExportSpan from the
 * source, which pushes the span to the target.  NULL with [*from, *to_out) shipped and what the
 * target holds checked against the ledger, else the result label (the reason logged). */
static const char *move_export(kvr_push_ahead *p, const push_job *j, const kvr_session *s, int64_t node_ms,
                               double end, int *from_out, int *to_out, double *took) {
    kvr_router *r = p->r;
    const kvr_config *c = r->cfg;
    kvr_node *S = &r->reg->nodes[j->src], *D = &r->reg->nodes[j->dst];
    /* the source must hold exactly the ledger: count, idle, ids */
    kvr_node_session si;
    if (kvr_node_session_info(S, j->sid, node_ms, &si, NULL) || !si.found || (int)si.tokens != j->n_ctx ||
        !si.idle || !same_tokens(s, si.sha256, j->n_ctx)) {
        kvl__svc_log_text("warn", "push-ahead %s: source %s does not hold the ledger's %d tokens: skipped",
                          j->sid, S->name, j->n_ctx);
        return "skipped";
    }
    int to = (int)si.cached;
    /* what the target holds: kept only when it is exactly what the ledger says */
    int held = kvr_session_held(s, D->name), from = 0;
    kvr_node_session di;
    if (kvr_node_session_info(D, j->sid, node_ms, &di, NULL)) {
        kvl__svc_log_text("warn", "push-ahead %s: target %s: %s: skipped", j->sid, D->name, kvl_last_error());
        return "skipped";
    }
    if (di.found && (int)di.tokens == held && di.idle && (int)di.cached <= held && same_tokens(s, di.sha256, held)) {
        from = (int)di.cached;
    } else if (di.found || held > 0) {
        kvl__svc_log_text("info", "push-ahead %s: target %s disagrees with the ledger (the next turn there "
                          "resets it): skipped", j->sid, D->name);
        return "skipped";
    }
    if (to <= from) return "skipped";            /* the target holds all the source can ship */
    if (to - from > c->push_ahead_max_tokens) {
        kvl__svc_log_text("info", "push-ahead %s: span [%d,%d) exceeds push_ahead_max_tokens %ld: skipped",
                          j->sid, from, to, c->push_ahead_max_tokens);
        return "skipped";
    }
    /* what the budget leaves after the two SessionInfo calls above, less the listing after a
     * failure; a quarter of it (a second at most) waits for the node's own report of its timeout */
    const int64_t export_ms = ms_left(end, node_ms);
    if (export_ms < 8) {
        kvl__svc_log_text("info", "push-ahead %s: %lld ms of the push's budget left for the export (lease_wait_ms "
                          "%.0f): skipped", j->sid, (long long)export_ms, c->lease_wait_ms);
        return "skipped";
    }
    const int64_t grace = export_ms / 4 < 1000 ? export_ms / 4 : 1000;
    const double timeout = move_timeout_ms(p, j, to - from, (double)(export_ms - grace));
    kvr_export_result ex;
    grpc_status_code code = GRPC_STATUS_OK;
    double t0 = kvl__now_s();
    kvl_status st = kvr_node_export(S, D, j->sid, (unsigned)from, (unsigned)to, 0, (int64_t)timeout,
                                    grace, r->tickets ? &r->ticket_key : NULL, &ex, &code);
    *took = kvl__now_s() - t0;
    if (st) {
        kvl__svc_log_text("warn", "push-ahead %s: export %s->%s [%d,%d) failed: %s", j->sid, S->name,
                          D->name, from, to, kvl_last_error());
        list_target(p, j, node_ms, to);
        return "failed";
    }
    if ((int)ex.t0 != from || (int)ex.t1 != to || (int)ex.peer_tokens != to || !same_tokens(s, ex.peer_sha256, to)) {
        kvl__svc_log_text("warn", "push-ahead %s: %s imported [%u,%u) -> %u tokens, expected [%d,%d) of the "
                          "ledger's ids: discarded", j->sid, D->name, ex.t0, ex.t1, ex.peer_tokens, from, to);
        list_target(p, j, node_ms, (int)ex.peer_tokens > 0 ? (int)ex.peer_tokens : to);
        return "failed";
    }
    *from_out = from;
    *to_out = to;
    return NULL;
}

/* The span move of a push in one call: the target checks what it holds against the ledger
 * (count and token hash) and pulls the span from the source, which checks its own tokens
 * against the ledger's by hash and that no turn runs there; only the span moves
 * (ContinueRequest.pull_only), translated the moment it lands.  The span runs from what the
 * target caches to what the source does (the last sampled token is in neither yet).  Returns as
 * move_export. */
static const char *move_pull_only(kvr_push_ahead *p, const push_job *j, const kvr_session *s, int64_t node_ms,
                                  double end, int *from_out, int *to_out, double *took) {
    kvr_router *r = p->r;
    const kvr_config *c = r->cfg;
    kvr_node *S = &r->reg->nodes[j->src], *D = &r->reg->nodes[j->dst];
    const int held = kvr_session_held(s, D->name);
    if (held < 0 || held >= j->n_ctx - 1) return "skipped";   /* nothing the source can ship */
    if (j->n_ctx - held > c->push_ahead_max_tokens) {
        kvl__svc_log_text("info", "push-ahead %s: span [%d,%d) exceeds push_ahead_max_tokens %ld: skipped",
                          j->sid, held, j->n_ctx, c->push_ahead_max_tokens);
        return "skipped";
    }
    /* the call: the budget less the listing after a failure.  The node's pull gets half of it,
     * so that it reports a slow source itself; the call's deadline cancels the pull in any case
     * (the node gives the source's ExportSpan a second more, continue.c) */
    const int64_t call_ms = ms_left(end, node_ms);
    if (call_ms < 8) {
        kvl__svc_log_text("info", "push-ahead %s: %lld ms of the push's budget left for its call (lease_wait_ms "
                          "%.0f): skipped", j->sid, (long long)call_ms, c->lease_wait_ms);
        return "skipped";
    }
    const double timeout = move_timeout_ms(p, j, j->n_ctx - held, (double)(call_ms / 2));
    char held_sha[65] = "", src_sha[65];
    if (held > 0) kvl__tokens_sha256_hex(s->tokens, (size_t)held, held_sha);
    kvl__tokens_sha256_hex(s->tokens, (size_t)j->n_ctx, src_sha);
    kvr_continue_req cr = {.sid = j->sid, .held = (unsigned)held, .held_sha256 = held_sha, .source = S,
                           .source_tokens = (unsigned)j->n_ctx, .source_sha256 = src_sha,
                           .pull_timeout_ms = (int64_t)timeout, .pull_only = 1,
                           .key = r->tickets ? &r->ticket_key : NULL};
    kvr_gen_params gp;
    memset(&gp, 0, sizeof gp);
    double t0 = kvl__now_s();
    kvl__rpc_stream *st = NULL;
    grpc_status_code code = GRPC_STATUS_OK;
    int got = 0, to = 0, t0_span = 0, refused = 0;
    unsigned node_count = 0;
    char node_sha[65] = "", why[300] = "";
    kvl_status ks = kvr_node_continue(D, &cr, &gp, call_ms, &st);
    while (!ks) {
        Kvlingo__V1__GenerateResponse *m = NULL;
        int rr = kvr_node_gen_next(D, st, &m, &code);
        if (rr < 0) ks = (kvl_status)rr;
        else if (rr == 0 && code != GRPC_STATUS_OK) ks = kvl__rpc_status_to_kvl(code) ? kvl__rpc_status_to_kvl(code)
                                                                                      : KVL_ERR_INTERNAL;
        if (rr <= 0) break;
        if (m->done && m->result) {
            const Kvlingo__V1__ContinueResult *res = m->result;
            got = 1;
            node_count = res->token_count;
            snprintf(node_sha, sizeof node_sha, "%s", res->tokens_sha256 ? res->tokens_sha256 : "");
            if (res->mode == KVLINGO__V1__CONTINUE_RESULT__MODE__MODE_TRANSLATE && res->span_t1 > res->span_t0)
                to = (int)res->span_t1, t0_span = (int)res->span_t0;
            snprintf(why, sizeof why, "%s", res->fallback && res->fallback[0] ? res->fallback
                                                                               : "the source had no more to ship");
            /* the source not holding what the ledger says, or nothing new: nothing to push, as
             * the several calls' SessionInfo would have found */
            refused = !res->fallback || !res->fallback[0] || !strncmp(res->fallback, "source_state", 12) ||
                      !strncmp(res->fallback, "source_behind", 13);
        }
        protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    kvl__rpc_stream_free(st);
    *took = kvl__now_s() - t0;
    if (ks || !got) {
        /* refused before any pull (the target disagrees with the ledger: the next turn there
         * resets it), or the call failed: what the target holds now is listed if it changed */
        kvl__svc_log_text("warn", "push-ahead %s: ContinueTurn on %s: %s", j->sid, D->name,
                          ks ? kvl_last_error() : "it ended without its result");
        if (ks && code != GRPC_STATUS_FAILED_PRECONDITION && code != GRPC_STATUS_INVALID_ARGUMENT)
            list_target(p, j, node_ms, held);
        else if (ks && code == GRPC_STATUS_FAILED_PRECONDITION && held > 0)
            forget_lost(p, j, node_ms);
        return ks && code == GRPC_STATUS_FAILED_PRECONDITION ? "skipped" : "failed";
    }
    if (!to) {
        /* no span: an import is atomic, so the target holds what it did, unless it says
         * otherwise (a session it could not keep, dropped) */
        kvl__svc_log_text(refused ? "info" : "warn", "push-ahead %s: %s -> %s: %s", j->sid, S->name,
                          D->name, why);
        if ((int)node_count != held) list_target(p, j, node_ms, (int)node_count);
        return refused ? "skipped" : "failed";
    }
    if ((int)node_count != to || to > j->n_ctx || !same_tokens(s, node_sha, to)) {
        kvl__svc_log_text("warn", "push-ahead %s: %s holds %u tokens after the pull, expected %d of the "
                          "ledger's ids: discarded", j->sid, D->name, node_count, to);
        list_target(p, j, node_ms, (int)node_count);
        return "failed";
    }
    *from_out = t0_span;
    *to_out = to;
    return NULL;
}

/* One push, under the session's lease.  Returns the result label. */
static const char *push_locked(kvr_push_ahead *p, const push_job *j, const kvr_lease *lease,
                               kvr_session *s) {
    kvr_router *r = p->r;
    const kvr_config *c = r->cfg;
    /* a turn arriving now waits for this lease at most lease_wait_ms: every call of the push
     * together (ContinueTurn, or SessionInfo x2 and the export, and a listing of the target
     * after a failure) ends within half of that, the budget each call's deadline comes from */
    const double end = kvl__now_s() + c->lease_wait_ms / 2 / 1000.0;
    int64_t node_ms = (int64_t)(c->lease_wait_ms / 8 < c->node_timeout_ms ? c->lease_wait_ms / 8 : c->node_timeout_ms);
    if (node_ms < 1) node_ms = 1;
    kvr_node *S = &r->reg->nodes[j->src], *D = &r->reg->nodes[j->dst];
    if (kvr_ledger_session_load(r->ledger, j->sid, 1, s)) {
        kvl__svc_log_text("info", "push-ahead %s: %s", j->sid, kvl_last_error());
        return "skipped";
    }
    if (s->state != KVR_SESSION_OPEN || s->n_tokens != j->n_ctx || strcmp(s->current_node, S->name) ||
        kvr_session_held(s, S->name) != j->n_ctx) {
        kvl__svc_log_text("info", "push-ahead %s: the session moved on (%d tokens on %s, the push was "
                          "for %d on %s): skipped", j->sid, s->n_tokens, s->current_node, j->n_ctx, S->name);
        return "skipped";
    }
    if (!kvr_registry_can_translate(r->reg, S->model, j->dst) || !kvr_guard_pair_ok(r->guard, S->model, D->model)) {
        kvl__svc_log_text("info", "push-ahead %s: no usable translator %s -> %s: skipped", j->sid,
                          S->model, D->model);
        return "skipped";
    }
    int from = 0, to = 0;
    double took = 0;
    kvr_node dc;   /* what the target serves, as its last Info said (a copy, under the registry's lock) */
    kvr_registry_copy(r->reg, j->dst, &dc);
    const char *res = dc.pull_only && c->transfer_one_call
                          ? move_pull_only(p, j, s, node_ms, end, &from, &to, &took)
                          : move_export(p, j, s, node_ms, end, &from, &to, &took);
    if (res) return res;
    /* A close or expiry takes the session's lease as a turn does, so neither ends the session
     * during this push; one that did anyway (a replica of an older build, which took no lease
     * to close) is seen here and its copy goes now, or is caught by the sweep. */
    kvr_session now;
    memset(&now, 0, sizeof now);
    int loaded = !kvr_ledger_session_load(r->ledger, j->sid, 0, &now);
    int ended = loaded && now.state != KVR_SESSION_OPEN;
    int open = loaded && !ended && now.n_tokens == j->n_ctx;
    if (loaded) kvr_session_clear(&now);
    /* only while the lease is still this push's: else another replica drives the session and
     * its reconcile resets the target's unrecorded copy */
    kvl_status rs = !open ? KVL_ERR_MISMATCH
                  : kvr_ledger_lease_renew(r->ledger, j->sid, p->owner, lease->gen, kvr_wall_now(),
                                           c->lease_ms / 1000.0);
    const int renewed = !rs;
    if (!rs) rs = kvr_ledger_holding_set(r->ledger, j->sid, D->name, to);
    if (rs) {
        kvl__svc_log_text("info", "push-ahead %s: not recording %s's %d tokens: %s", j->sid, D->name, to,
                          open ? kvl_last_error() : ended ? "the session ended during the push"
                                                          : "the session moved on during the push");
        /* an ended session's copy goes; a session that moved on is another turn's now */
        if (ended) drop_ended(p, j->sid, j->dst);
        else if (open && renewed) list_target(p, j, node_ms, to);   /* a lease lost: the new holder's */
    }
    if (rs) return open ? "failed" : "skipped";
    kvr_metrics_observe(r->metrics, "kvlingo_router_push_ahead_seconds", "", took);
    remember(p, j, from, to);
    kvl__svc_log_text("info", "push-ahead %s: shipped [%d,%d) %s -> %s in %.1f ms", j->sid, from, to,
                      S->model, D->model, took * 1e3);
    return "shipped";
}

static void set_holding(kvr_push_ahead *p, int w, const char *sid) {
    pthread_mutex_lock(&p->mu);
    snprintf(p->holding[w], sizeof p->holding[w], "%s", sid);
    if (!sid[0]) pthread_cond_broadcast(&p->released);
    pthread_mutex_unlock(&p->mu);
}

/* One job on worker w. */
static void run_job(kvr_push_ahead *p, int w, const push_job *j) {
    kvr_lease lease;
    int taken = take_lease(p, j, &lease);
    if (taken <= 0) { count(p, taken ? "skipped" : "skipped_busy"); return; }
    set_holding(p, w, j->sid);
    kvr_session s;
    memset(&s, 0, sizeof s);
    const char *res = push_locked(p, j, &lease, &s);
    kvr_session_clear(&s);
    if (kvr_ledger_lease_release(p->r->ledger, j->sid, p->owner, lease.gen))
        kvl__svc_log_text("warn", "push-ahead %s: releasing the lease: %s", j->sid, kvl_last_error());
    set_holding(p, w, "");
    count(p, res);
}

static int holds(const kvr_push_ahead *p, const char *sid) {
    for (int w = 0; w < MAX_WORKERS; w++)
        if (!strcmp(p->holding[w], sid)) return 1;
    return 0;
}

int kvr_push_ahead_wait(kvr_push_ahead *p, const char *sid, double timeout_s) {
    if (!p || !sid || !sid[0] || !(timeout_s > 0)) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);   /* `released` waits on the monotonic clock */
    double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&p->mu);
    /* stopping: the caller polls (and backs off) as for any other holder */
    int waited = !p->stop && holds(p, sid);
    while (waited && holds(p, sid) && !p->stop)
        if (pthread_cond_timedwait(&p->released, &p->mu, &ts)) break;   /* ETIMEDOUT */
    pthread_mutex_unlock(&p->mu);
    return waited;
}

/* Pushes recorded SWEEP_AFTER_S ago or more, not yet looked at: a session that ended since
 * (a close that raced with the record) gets its target copy dropped.  One look per push. */
static void sweep(kvr_push_ahead *p) {
    double now = kvl__now_s();
    for (int i = 0; i < p->n_done; i++) {
        char sid[KVR_ID_MAX];
        int dst;
        pthread_mutex_lock(&p->mu);
        pushed *d = &p->done[i];
        int due = d->sid[0] && !d->checked && now - d->at >= SWEEP_AFTER_S;
        if (due) {
            d->checked = 1;
            snprintf(sid, sizeof sid, "%s", d->sid);
            dst = d->dst;
        }
        pthread_mutex_unlock(&p->mu);
        if (!due) continue;
        kvr_session s;
        kvl_status st = kvr_ledger_session_load(p->r->ledger, sid, 0, &s);
        int ended = st == KVL_ERR_NOT_FOUND || (!st && s.state != KVR_SESSION_OPEN);
        if (!st) kvr_session_clear(&s);
        if (ended) drop_ended(p, sid, dst);
    }
}

static void *worker(void *arg) {
    const struct push_worker *wk = arg;
    kvr_push_ahead *p = wk->p;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (!p->stop && p->n == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);   /* p->cv waits on it: a wall clock step holds no sweep */
            ts.tv_nsec += (long)(SWEEP_EVERY_S * 1e9);
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        }
        if (p->stop) { pthread_mutex_unlock(&p->mu); break; }
        int have = p->n > 0;
        push_job j;
        if (have) {
            j = p->q[p->head];
            p->head = (p->head + 1) % p->cap;
            p->n--;
        }
        pthread_mutex_unlock(&p->mu);
        if (have) run_job(p, wk->w, &j);
        sweep(p);
    }
    return NULL;
}

kvl_status kvr_push_ahead_create(kvr_router *r, kvr_push_ahead **out) {
    *out = NULL;
    const kvr_config *c = r->cfg;
    static const char *const results[] = {"shipped", "used", "unused", "skipped_busy", "skipped",
                                          "dropped_full", "failed"};
    for (size_t i = 0; i < sizeof results / sizeof results[0]; i++) {
        char lab[48];
        snprintf(lab, sizeof lab, "result=\"%s\"", results[i]);
        kvr_metrics_inc(r->metrics, "kvlingo_router_push_ahead_total", lab, 0);
    }
    kvr_metrics_observe_zero(r->metrics, "kvlingo_router_push_ahead_seconds", "");
    if (c->push_ahead_queue <= 0) return KVL_OK;
    if (c->lease_wait_ms <= 0) {
        kvl__svc_log_text("warn", "%s: push-ahead is off: lease_wait_ms is 0, so a turn could not wait "
                          "for a push", c->path);
        return KVL_OK;
    }
    kvr_push_ahead *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "push-ahead");
    p->r = r;
    p->cap = (int)c->push_ahead_queue;
    p->n_done = p->cap * 2 < 16 ? 16 : p->cap * 2;
    p->q = calloc((size_t)p->cap, sizeof *p->q);
    p->done = calloc((size_t)p->n_done, sizeof *p->done);
    if (!p->q || !p->done) {
        free(p->q);
        free(p->done);
        free(p);
        return kvl__errorf(KVL_ERR_NOMEM, "push-ahead queue of %d", (int)c->push_ahead_queue);
    }
    snprintf(p->owner, sizeof p->owner, "%.58s/push", c->replica_id);
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_cond_init(&p->released, &ca);
    pthread_condattr_destroy(&ca);
    int nw = (int)c->push_ahead_workers;
    if (nw > MAX_WORKERS) nw = MAX_WORKERS;
    for (int i = 0; i < nw; i++) {
        p->wk[i] = (struct push_worker){.p = p, .w = i};
        if (pthread_create(&p->th[i], NULL, worker, &p->wk[i])) {
            kvr_push_ahead_free(p);
            return kvl__errorf(KVL_ERR_INTERNAL, "push-ahead: starting worker %d of %d failed", i + 1, nw);
        }
        p->n_th++;
    }
    *out = p;
    return KVL_OK;
}

void kvr_push_ahead_free(kvr_push_ahead *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_cond_broadcast(&p->released);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_th; i++) pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->released);
    pthread_mutex_destroy(&p->mu);
    free(p->q);
    free(p->done);
    free(p);
}

/* Did this turn use the push made after the previous one?  It did when it answered on the
 * pushed node by translation and the node's cache at the start of the turn reached the
 * pushed end (a reset node re-ships everything: the push was lost). */
static void claim(kvr_push_ahead *p, const kvr_turn_req *req, int node, kvr_turn_out *out) {
    pthread_mutex_lock(&p->mu);
    pushed hit = {.sid = ""};
    for (int i = 0; i < p->n_done; i++)
        if (p->done[i].sid[0] && !strcmp(p->done[i].sid, req->sid)) {
            hit = p->done[i];
            p->done[i].sid[0] = 0;
            break;
        }
    pthread_mutex_unlock(&p->mu);
    if (!hit.sid[0]) return;
    long n_before = (long)out->context_tokens - out->user_tokens - out->n_generated;
    long held = n_before - ((long)out->prefill_tokens - out->user_tokens);   /* after the span */
    /* what the node held before the turn: before its span, when one was translated; a turn that
     * fell back (its source gone) still ran on the pushed tokens, which saved their prefill */
    long cached = out->mode == KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE ? held - (long)out->span_tokens
                                                                             : held;
    if (hit.dst == node && cached >= hit.to) {
        out->pushed_ahead_tokens = (unsigned)(hit.to - hit.from);
        count(p, "used");
    } else {
        count(p, "unused");
    }
}

void kvr_push_ahead_after_turn(kvr_push_ahead *p, const kvr_turn_req *req, int node, int node_dropped,
                               const kvr_policy_input *in, const kvr_policy_state *st,
                               kvr_turn_out *out) {
    if (!p) return;
    kvr_router *r = p->r;
    claim(p, req, node, out);
    if (node_dropped) return;   /* the source of any push holds nothing now: it could only fail */
    char model[KVR_CFG_NAME_MAX] = "";
    pthread_rwlock_rdlock(&r->policy_lock);
    int on = kvr_policy_push_ahead(r->policy);
    if (on && req->prefetch_model && req->prefetch_model[0])
        snprintf(model, sizeof model, "%s", req->prefetch_model);
    else if (on && !kvr_policy_predict(r->policy, in, st, model, sizeof model))
        model[0] = 0;
    pthread_rwlock_unlock(&r->policy_lock);
    if (!model[0] || !strcmp(model, out->model)) return;   /* no switch expected */
    int dst = kvr_policy_pick_of_model(in, model);
    if (dst < 0 || dst == node) {
        kvl__svc_log_text("info", "push-ahead %s: no healthy node of %s to push to", req->sid, model);
        count(p, "skipped");
        return;
    }
    push_job j = {.src = node, .dst = dst, .n_ctx = (int)out->context_tokens};
    snprintf(j.sid, sizeof j.sid, "%s", req->sid);
    pthread_mutex_lock(&p->mu);
    int full = p->n >= p->cap;
    if (!full) {
        p->q[(p->head + p->n) % p->cap] = j;
        p->n++;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (full) count(p, "dropped_full");
}
