/* kernels/cpu/backend_cpu_internal.h: what backend_cpu.c and translate_cpu.c share.  Private to
 * kernels/cpu. */
#ifndef KVL_KERNELS_CPU_BACKEND_CPU_INTERNAL_H
#define KVL_KERNELS_CPU_BACKEND_CPU_INTERNAL_H

#include <pthread.h>
#include <stddef.h>

#include "kvlingo/backend.h"
#include "pool.h"

/* A pool held for one parallel job, with working memory that lives as long as the pool. */
typedef struct kvl__cpu_exec {
    pthread_mutex_t *lock;   /* held from the take until the job ends */
    kvl__pool *pool;
    float **buf;             /* grown by the holder; freed with the pool's owner */
    size_t *floats;
} kvl__cpu_exec;

/* Try to take a CPU model's pool (backend_cpu.c): its thread count with ex->lock held, or 1 with
 * nothing held when a forward (or another translation) has it or it has one thread. */
int kvl__cpu_model_exec_take(void *model, kvl__cpu_exec *ex);

/* The table's translate-apply entries (translate_cpu.c; kvlingo/backend.h). */
kvl_status kvl__cpu_translate_prepare(void *model, const kvl_translate_params *params, void **out);
void kvl__cpu_translate_release(void *prepared);
kvl_status kvl__cpu_translate_apply(void *prepared, const float *k_src, const float *v_src, int t0,
                                    int n, void *cache);

#endif
