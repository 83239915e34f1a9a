/* service/loop.h: the main loop of a server process (libuv, on the main thread): periodic
 * timers, SIGHUP, and SIGTERM/SIGINT, which begin a drain that ends when the program says its
 * work is done or after a timeout.  gRPC, the HTTP endpoint and worker threads run elsewhere;
 * the callbacks below run on the main thread, one at a time. */
#ifndef KVL_SVC_LOOP_H
#define KVL_SVC_LOOP_H

#include "kvlingo/status.h"

#define KVL_SVC_MAX_TIMERS 4

typedef struct kvl__svc_timer {
    unsigned period_ms;              /* first run one period after the start; 0: unused slot */
    void (*fn)(void *arg);
} kvl__svc_timer;

typedef struct kvl__svc_loop_cfg {
    void *arg;                       /* borrowed; passed to every callback                   */
    /* Once every handle is set up, before the first event: where a program announces that it
     * serves (a stop signal from then on drains instead of killing).  NULL: nothing. */
    void (*on_start)(void *arg);
    /* The first SIGTERM or SIGINT (signum says which).  Later ones are ignored, during the
     * drain and during the teardown after it (an orchestrator's second kill must not cut an
     * orderly shutdown short).  NULL: nothing to do but the drain. */
    void (*on_drain)(void *arg, int signum);
    /* While draining: called right after on_drain and then every drain_poll_ms with the
     * seconds since the signal; timed_out is set once drain_timeout_ms have passed.  Return
     * non-zero when the work is done.  The loop stops on a non-zero return or on the timeout.
     * NULL: the loop stops right after on_drain. */
    int (*drain_check)(void *arg, double waited_s, int timed_out);
    unsigned drain_poll_ms;          /* 0: 200                                               */
    int drain_timeout_ms;            /* < 0: no timeout                                      */
    void (*on_hup)(void *arg);       /* SIGHUP; NULL: SIGHUP keeps its default disposition   */
    kvl__svc_timer timers[KVL_SVC_MAX_TIMERS];
} kvl__svc_loop_cfg;

/* Run the loop until a drain ends, then close every handle (SIGTERM and SIGINT stay ignored
 * afterwards, for the rest of the process's teardown).  Returns KVL_OK after a drain;
 * KVL_ERR_IO "libuv: ..." when a handle cannot be set up (nothing ran; the caller decides the
 * exit code).  Call once per process (libuv signal handles are process-wide). */
kvl_status kvl__svc_loop_run(const kvl__svc_loop_cfg *cfg);

#endif
