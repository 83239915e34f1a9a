/* kernels/cpu/pool.c: the CPU backend's thread pool (see pool.h).
 *
 * Hand-off: the caller publishes (fn, ctx, pending = n - 1), resets `next` to 1, bumps `gen` and
 * wakes sleepers; the caller runs part 0, and then every thread, the caller included, claims
 * parts 1..n-1 from `next` until none is left, decrementing `pending` after each; the caller
 * returns at pending == 0.  A part goes to whoever claims it first, so a worker that is
 * descheduled, asleep, or sharing the caller's core costs the job at most its own part's time
 * once, not a wait for its time slice: seen on a 2-core host, where the kernel woke the worker
 * onto the caller's core for whole forward passes, each of ~44 hand-offs waiting ~150 us (a
 * 2.4 ms 9-token forward took 8-10 ms).  gen and sleepers are sequentially consistent atomics,
 * so either the caller sees a worker about to sleep (and broadcasts) or that worker sees the
 * new generation (and does not sleep).  `next` only reaches below n again when the caller
 * starts the next job, after every part of this one is done, so a claim below n always names a
 * part of the job whose fn and ctx were published before it. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "clock.h"
#include "error.h"

/* How long a worker waits for the next job before it sleeps (kvl__pool_create): longer than
 * the gap between two matmuls of a decode step.  The caller yields after KVL_POOL_SPIN pauses. */
#define KVL_POOL_SPIN_US 100
#define KVL_POOL_SPIN 4096
#define KVL_POOL_YIELD_AFTER_US 20   /* a spinning worker yields its core after this long idle */

struct kvl__pool {
    int n_threads;
    int spin_us;              /* how long a worker waits for the next job before sleeping */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvl__pool_fn fn;
    void *ctx;
    atomic_uint gen;
    atomic_int pending;
    atomic_int next;          /* the next unclaimed part; >= n_threads: all claimed */
    atomic_int sleepers;
    atomic_int stop;
    int n_started;
};

typedef struct worker_arg {
    kvl__pool *pool;
    int id;   /* 1..n_threads-1, for the thread's name */
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claims and runs parts of the current job until none is left. */
static void run_parts(kvl__pool *p) {
    for (int part; (part = atomic_fetch_add(&p->next, 1)) < p->n_threads;) {
        p->fn(p->ctx, part, p->n_threads);
        atomic_fetch_sub(&p->pending, 1);
    }
}

static void *worker_main(void *pa) {
    worker_arg *wa = pa;
    kvl__pool *p = wa->pool;
    const int id = wa->id;
    free(wa);
    char name[16];
    snprintf(name, sizeof name, "kvl-pool-%d", id);
    pthread_setname_np(pthread_self(), name);
    unsigned seen = 0;   /* the generation at creation: a job posted before this thread ran is not missed */
    for (;;) {
        if (p->spin_us > 0) {
            /* the clock read every 256 pauses (a pause costs 10-150 cycles by processor); past
             * the gap between two matmuls of a step, the core offered to any other runnable
             * thread at each read: a thread woken meanwhile (a session's reader, the
             * scheduler) would otherwise wait for a spinning worker's time slice to end,
             * milliseconds on a loaded core.  Not sooner: a yield in the way of the next
             * matmul's hand-off costs it a system call. */
            const double t0 = kvl__now_s(), polite = t0 + KVL_POOL_YIELD_AFTER_US * 1e-6;
            const double until = t0 + p->spin_us * 1e-6;
            for (int spins = 1; atomic_load(&p->gen) == seen && !atomic_load(&p->stop); spins++) {
                cpu_relax();
                if ((spins & 255) == 0) {
                    const double now = kvl__now_s();
                    if (now >= until) break;
                    if (now >= polite) sched_yield();
                }
            }
        }
        if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->gen);
        run_parts(p);
    }
}

kvl_status kvl__pool_create(int n_threads, kvl__pool **out) {
    return kvl__pool_create_spin(n_threads, KVL_POOL_SPIN_US, out);
}

int kvl__pool_spin_us(const kvl__pool *p) { return p->spin_us; }

kvl_status kvl__pool_create_spin(int n_threads, int spin_us, kvl__pool **out) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    kvl__pool *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    p->n_threads = n_threads;
    p->spin_us = spin_us < 0 ? 0 : spin_us;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->next, n_threads);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    if (n_threads > 1 && !(p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads))) {
        kvl__pool_free(p);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { kvl__pool_free(p); return kvl__errorf(KVL_ERR_NOMEM, "out of memory"); }
        *wa = (worker_arg){p, i};
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            kvl__pool_free(p);
            return kvl__errorf(KVL_ERR_IO, "thread pool: cannot start thread %d of %d", i, n_threads);
        }
        p->n_started++;
    }
    *out = p;
    return KVL_OK;
}

void kvl__pool_free(kvl__pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int kvl__pool_threads(const kvl__pool *p) { return p->n_threads; }

void kvl__pool_run(kvl__pool *p, kvl__pool_fn fn, void *ctx) {
    if (p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_store(&p->next, 1);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n_threads);
    run_parts(p);
    /* parts a worker claimed and is still running; it may be descheduled on a loaded machine:
     * yield rather than burn its core */
    for (int spins = 0; atomic_load(&p->pending) > 0; spins++) {
        if (spins < KVL_POOL_SPIN) cpu_relax();
        else sched_yield();
    }
}
