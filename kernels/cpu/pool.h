/* kernels/cpu/pool.h: a small persistent thread pool for the CPU backend's own kernels (the bf16
 * matmuls).  OpenBLAS threads its GEMMs itself; kernels of ours that stream weights split their
 * rows over this pool instead, so one decode step does not pay a thread start per matmul (a
 * 1.5B-parameter model runs ~200 matmuls of 0.1-1 ms per token).
 *
 * Workers spin briefly after each job (matmuls of one forward pass come back to back), then
 * sleep on a condition variable, so an idle model costs no CPU.  Private to kernels/cpu. */
#ifndef KVL_KERNELS_CPU_POOL_H
#define KVL_KERNELS_CPU_POOL_H

#include "kvlingo/status.h"

typedef struct kvl__pool kvl__pool;

/* fn(ctx, part, n_parts) is called once for every part in [0, n_parts), each part on one thread;
 * which thread runs which part, and whether parts overlap in time, is not fixed (one thread may
 * run several parts one after another), so a fn must not wait for another part. */
typedef void (*kvl__pool_fn)(void *ctx, int part, int n_parts);

/* A pool running jobs on n_threads threads in all: the caller and n_threads - 1 workers
 * (n_threads >= 1; 1 runs everything in the caller).  KVL_ERR_NOMEM / KVL_ERR_IO (thread start). */
kvl_status kvl__pool_create(int n_threads, kvl__pool **out);
/* The same with workers that wait spin_us microseconds for the next job before they sleep
 * (kvl__pool_create: 100).  0: they sleep at once, for a pool whose spinning would take a core
 * from other threads (OpenBLAS's, when it threads its GEMMs).  A sleeping worker costs each job
 * a wake-up, which on a virtual machine can be a millisecond or more when its vCPU has halted. */
kvl_status kvl__pool_create_spin(int n_threads, int spin_us, kvl__pool **out);
int kvl__pool_spin_us(const kvl__pool *pool);
void kvl__pool_free(kvl__pool *pool);
int kvl__pool_threads(const kvl__pool *pool);

/* Run fn over n_threads parts and return when all are done: part 0 on the caller, the others on
 * whichever thread claims them first (the caller too, once its part is done, so a descheduled
 * worker delays the job by at most one part).  Calls on one pool must not overlap (the backend
 * serialises forward calls per model). */
void kvl__pool_run(kvl__pool *pool, kvl__pool_fn fn, void *ctx);

/* Rows [*a, *b) of part `part` of n_parts over n rows, in multiples of 16 (a cache line of
 * float outputs per part boundary, so two parts never write one line); later parts may be
 * empty (*a == *b). */
static inline void kvl__pool_part_rows(int n, int part, int n_parts, int *a, int *b) {
    int per = ((n + n_parts - 1) / n_parts + 15) & ~15;
    *a = part * per < n ? part * per : n;
    *b = (part + 1) * per < n ? (part + 1) * per : n;
}

#endif
