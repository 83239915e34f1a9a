/* service/loop.c: the libuv main loop (loop.h). */
#include "loop.h"

#include <signal.h>
#include <string.h>

#include <uv.h>

#include "clock.h"
#include "error.h"

typedef struct loop_state {
    const kvl__svc_loop_cfg *cfg;
    uv_loop_t loop;
    uv_signal_t sigterm, sigint, sighup;
    uv_timer_t drain;
    uv_timer_t timers[KVL_SVC_MAX_TIMERS];
    int draining;
    double drain_started;
} loop_state;

static void check_drain(loop_state *st) {
    const kvl__svc_loop_cfg *c = st->cfg;
    double waited = kvl__now_s() - st->drain_started;
    int timed_out = c->drain_timeout_ms >= 0 && waited * 1000 > c->drain_timeout_ms;
    int done = !c->drain_check || c->drain_check(c->arg, waited, timed_out);
    if (done || timed_out) uv_stop(&st->loop);
}

static void on_drain_timer(uv_timer_t *t) { check_drain(t->data); }

static void on_stop_signal(uv_signal_t *h, int signum) {
    loop_state *st = h->data;
    if (st->draining) return;
    st->draining = 1;
    st->drain_started = kvl__now_s();
    if (st->cfg->on_drain) st->cfg->on_drain(st->cfg->arg, signum);
    unsigned poll = st->cfg->drain_poll_ms ? st->cfg->drain_poll_ms : 200;
    if (uv_timer_start(&st->drain, on_drain_timer, poll, poll)) {
        uv_stop(&st->loop);   /* cannot poll the drain: stop rather than hang */
        return;
    }
    check_drain(st);
}

static void on_hup_signal(uv_signal_t *h, int signum) {
    loop_state *st = h->data;
    (void)signum;
    st->cfg->on_hup(st->cfg->arg);
}

static void on_timer(uv_timer_t *t) {
    const kvl__svc_timer *tm = t->data;
    loop_state *st = uv_handle_get_loop((uv_handle_t *)t)->data;
    tm->fn(st->cfg->arg);
}

kvl_status kvl__svc_loop_run(const kvl__svc_loop_cfg *cfg) {
    loop_state st;
    memset(&st, 0, sizeof st);   /* a handle never initialised keeps loop == NULL: not closed */
    st.cfg = cfg;
    int rc = uv_loop_init(&st.loop);
    if (rc) return kvl__errorf(KVL_ERR_IO, "libuv: uv_loop_init: %s", uv_strerror(rc));
    st.loop.data = &st;
    st.sigterm.data = st.sigint.data = st.sighup.data = st.drain.data = &st;
    if (!rc) rc = uv_signal_init(&st.loop, &st.sigterm);
    if (!rc) rc = uv_signal_init(&st.loop, &st.sigint);
    if (!rc) rc = uv_timer_init(&st.loop, &st.drain);
    if (!rc) rc = uv_signal_start(&st.sigterm, on_stop_signal, SIGTERM);
    if (!rc) rc = uv_signal_start(&st.sigint, on_stop_signal, SIGINT);
    if (!rc && cfg->on_hup) rc = uv_signal_init(&st.loop, &st.sighup);
    if (!rc && cfg->on_hup) rc = uv_signal_start(&st.sighup, on_hup_signal, SIGHUP);
    for (int i = 0; !rc && i < KVL_SVC_MAX_TIMERS; i++) {
        const kvl__svc_timer *tm = &cfg->timers[i];
        if (!tm->period_ms || !tm->fn) continue;
        st.timers[i].data = (void *)tm;
        rc = uv_timer_init(&st.loop, &st.timers[i]);
        if (!rc) rc = uv_timer_start(&st.timers[i], on_timer, tm->period_ms, tm->period_ms);
    }
    kvl_status s = KVL_OK;
    if (rc)
        s = kvl__errorf(KVL_ERR_IO, "libuv: %s", uv_strerror(rc));
    else {
        if (cfg->on_start) cfg->on_start(cfg->arg);
        uv_run(&st.loop, UV_RUN_DEFAULT);
    }

    /* Stopping the signal handles restores the default disposition; a repeated SIGTERM/SIGINT
     * must not kill the process during the caller's teardown, so ignore them from here on
     * (after the stop: a later uv_close of a stopped handle leaves the disposition alone). */
    uv_signal_t *sigs[] = {&st.sigterm, &st.sigint, &st.sighup};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        if (sigs[i]->loop == &st.loop) uv_signal_stop(sigs[i]);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    uv_handle_t *hs[3 + 1 + KVL_SVC_MAX_TIMERS] = {
        (uv_handle_t *)&st.sigterm, (uv_handle_t *)&st.sigint, (uv_handle_t *)&st.sighup,
        (uv_handle_t *)&st.drain};
    for (int i = 0; i < KVL_SVC_MAX_TIMERS; i++) hs[4 + i] = (uv_handle_t *)&st.timers[i];
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (hs[i]->loop == &st.loop && !uv_is_closing(hs[i])) uv_close(hs[i], NULL);
    uv_run(&st.loop, UV_RUN_DEFAULT);   /* let the close callbacks run */
    uv_loop_close(&st.loop);
    return s;
}
