/* router/turn_once.c: what makes a turn safe with several router replicas on one ledger:
 *
 *   reserve the session on this replica -> take its lease in the ledger (waiting up to
 *   lease_wait_ms while another replica holds it; an expired lease is taken over) -> a request
 *   id already committed answers with the stored result (a client's retry is never applied
 *   twice) -> else run the turn (turn.c), its commit fenced by the lease -> release.
 *
 * The keeper (lease.c) renews the lease while the turn runs; the fence makes the commit fail
 * when the lease was lost anyway (this replica stalled past the expiry), so two replicas never
 * both commit a turn of one session. */
#include "router.h"
#include "log.h"
#include "push_ahead.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "error.h"

/* Polls of a busy lease back off from WAIT_FIRST_S to WAIT_STEP_S: a lease held by a push of
 * this replica is waited on instead (kvr_push_ahead_wait); for another holder (a turn on
 * another replica, a push not yet marked) a first look after 1 ms costs one ledger
 * transaction, and a long holder is then polled no more often than before. */
#define WAIT_FIRST_S 0.001
#define WAIT_STEP_S 0.05

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

kvl_status kvr_turn_lease_take(kvr_router *r, const char *sid, kvr_lease *lease) {
    const kvr_config *c = r->cfg;
    double deadline = kvl__now_s() + c->lease_wait_ms / 1000.0, step = WAIT_FIRST_S;
    for (;;) {
        kvl_status s = kvr_ledger_lease_acquire(r->ledger, sid, kvr_leases_owner(r->leases), kvr_wall_now(),
                                                c->lease_ms / 1000.0, lease);
        if (s != KVL_ERR_MISMATCH || !strstr(kvl_last_error(), "is busy") || kvl__now_s() >= deadline) {
            if (s == KVL_ERR_MISMATCH && strstr(kvl_last_error(), "is busy"))
                kvr_metrics_inc(r->metrics, "kvlingo_router_lease_conflicts_total", "", 1);
            return s;
        }
        double left = deadline - kvl__now_s();
        if (left > 0 && !kvr_push_ahead_wait(r->push, sid, left)) {
            sleep_s(step < left ? step : left);
            step = step * 2 < WAIT_STEP_S ? step * 2 : WAIT_STEP_S;
        }
    }
}

static int mode_of(const char *m) {
    return !strcmp(m, "translate") ? KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_TRANSLATE
         : !strcmp(m, "reprefill") ? KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_REPREFILL
                                   : KVLINGO__V1__SWITCH_MODE__SWITCH_MODE_NONE;
}

/* The stored result of a turn already applied: its tokens streamed again, its summary. */
static kvl_status replay(kvr_router *r, const kvr_turn_req *req, const kvr_turn_found *f,
                         kvr_emit_fn emit, void *arg, kvr_turn_out *out) {
    if (!f->tokens)
        return kvl__errorf(KVL_ERR_MISMATCH, "session '%s': request '%s' was applied as turn %d, but the "
                          "session has ended since", req->sid, req->request_id, f->idx);
    if (f->n_user != req->n_user || memcmp(f->tokens, req->user, sizeof(int32_t) * (size_t)req->n_user))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "session '%s': request id '%s' was used by turn %d with "
                          "other input (%d tokens); a request id names one turn", req->sid,
                          req->request_id, f->idx, f->n_user);
    snprintf(out->model, sizeof out->model, "%s", f->model);
    snprintf(out->node, sizeof out->node, "%s", f->node);
    out->mode = mode_of(f->mode);
    out->span_tokens = (unsigned)f->span;
    out->turn = (unsigned)f->idx;
    out->context_tokens = (unsigned)(f->t0 + f->n_user + f->n_gen);
    out->user_tokens = (unsigned)f->n_user;
    out->ttft_s = f->ttft_s;
    out->tps = f->tps;
    out->mean_entropy = (float)f->entropy;
    snprintf(out->fallback, sizeof out->fallback, "%s", f->fallback);
    snprintf(out->finish_reason, sizeof out->finish_reason, "%s", f->finish);
    snprintf(out->policy_reason, sizeof out->policy_reason,
             "replayed: request '%s' was applied as turn %d; its stored result is returned",
             req->request_id, f->idx);
    kvl_detok *d = NULL;
    kvl_status s = kvl_detok_create(r->tok, &d);
    size_t cap = kvl_detok_push_capacity(r->tok);
    char *buf = s ? NULL : malloc(cap + 1);
    if (!s && !buf) s = kvl__errorf(KVL_ERR_NOMEM, "replay");
    for (int i = 0; !s && i < f->n_gen; i++) {
        size_t n = 0;
        int32_t tok = f->tokens[f->n_user + i];
        s = kvl_detok_push(d, tok, buf, cap, &n);
        if (s) break;
        buf[n] = 0;
        out->n_generated++;
        if (emit(arg, tok, buf, 0.0f)) {
            s = kvl__errorf(KVL_ERR_CANCELLED, "client cancelled the replay");
            break;
        }
    }
    free(buf);
    kvl_detok_free(d);
    return s;
}

kvl_status kvr_turn_run(kvr_router *r, const kvr_turn_req *req, kvr_emit_fn emit, void *arg,
                        kvr_turn_out *out) {
    memset(out, 0, sizeof *out);
    const char *rid = req->request_id && req->request_id[0] ? req->request_id : NULL;
    if (rid && !kvr_session_id_valid(rid))
        return kvr_id_refuse("request_id", rid);
    /* tokens per minute: refused before anything runs while the tenant's bucket is empty; the
     * turn reserves its most (prompt + max_tokens) now, so that concurrent turns of one tenant
     * see it, and gives back what it did not generate at the end */
    double wait_s = 0;
    const long reserved = (long)req->n_user + (long)req->max_tokens;
    if (req->tenant && !kvr_tenants_admit(r->tenants, req->tenant, reserved, kvr_wall_now(), &wait_s)) {
        kvr_quota_refused(r, req->tenant, "tokens_per_minute");
        return kvl__errorf(KVL_ERR_NOMEM, "quota: tenant '%s' used its tokens_per_minute; retry in %.1f s",
                          req->tenant, wait_s);
    }
    /* concurrent turns: the router's places are shared by every tenant */
    long running = 0;
    if (req->tenant && !kvr_tenants_turn_begin(r->tenants, req->tenant, &running)) {
        kvr_tenants_charge(r->tenants, req->tenant, -reserved, kvr_wall_now());
        kvr_quota_refused(r, req->tenant, "max_concurrent_turns");
        return kvl__errorf(KVL_ERR_NOMEM, "quota: tenant '%s' has %ld turns running (max_concurrent_turns); "
                          "retry when one ends", req->tenant, running);
    }
    kvl_status s = kvr_leases_add(r->leases, req->sid);
    kvr_lease lease;
    if (!s && (s = kvr_turn_lease_take(r, req->sid, &lease))) kvr_leases_drop(r->leases, req->sid);
    if (s) {   /* refused before it ran (busy elsewhere, closed, expired): nothing is charged */
        if (req->tenant) {
            kvr_tenants_charge(r->tenants, req->tenant, -reserved, kvr_wall_now());
            kvr_tenants_turn_end(r->tenants, req->tenant);
        }
        return s;
    }
    kvr_leases_bind(r->leases, req->sid, lease.gen);
    if (lease.took_over) {
        kvr_metrics_inc(r->metrics, "kvlingo_router_lease_takeovers_total", "", 1);
        kvl__svc_log_text("warn", "session %s: took over the expired lease of replica %s (generation %lld)",
                          req->sid, lease.prev_owner, (long long)lease.gen);
    }
    kvr_turn_found f;
    int replayed = 0;
    if (rid) {
        s = kvr_ledger_turn_find(r->ledger, req->sid, rid, &f);
        if (!s) {
            replayed = 1;
            s = replay(r, req, &f, emit, arg, out);
            kvr_turn_found_clear(&f);
            if (!s) {
                kvr_metrics_inc(r->metrics, "kvlingo_router_turns_replayed_total", "", 1);
                kvl__svc_log_text("info", "session %s: request %s was applied as turn %u: replayed",
                                  req->sid, rid, out->turn);
            }
        } else if (s == KVL_ERR_NOT_FOUND) {
            s = KVL_OK;
        }
    }
    if (!s && !replayed) {
        kvr_fence fence = {.owner = kvr_leases_owner(r->leases), .gen = lease.gen, .request_id = rid};
        kvr_turn_req fenced = *req;
        fenced.fence = &fence;
        s = kvr_turn_run_once(r, &fenced, emit, arg, out);
    }
    if (kvr_leases_drop(r->leases, req->sid))
        kvl__svc_log_text("warn", "session %s: the lease was lost while the turn ran", req->sid);
    /* a replay costs nothing (its turn was charged when it ran); else the unused reply goes back */
    if (req->tenant) {
        kvr_tenants_charge(r->tenants, req->tenant,
                           replayed ? -reserved : (long)out->n_generated - (long)req->max_tokens,
                           kvr_wall_now());
        kvr_tenants_turn_end(r->tenants, req->tenant);
    }
    return s;
}
