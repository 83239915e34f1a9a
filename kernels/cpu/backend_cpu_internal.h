/* kernels/cpu/backend_cpu_internal.h: what backend_cpu.c shares with the files that hold the
 * table's other entries (translate_cpu.c, cache_cpu.c).  Private to kernels/cpu. */
#ifndef KVL_KERNELS_CPU_BACKEND_CPU_INTERNAL_H
#define KVL_KERNELS_CPU_BACKEND_CPU_INTERNAL_H

#include <pthread.h>
#include <stddef.h>

#include "kvlingo/backend.h"
#include "ops.h"
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

/* A CPU model's RoPE tables of its first positions (ops.h kvl__rope_cache; read-only). */
const kvl__rope_cache *kvl__cpu_model_rope(const void *model);

/* The table's cache entries but cache_create (cache_cpu.c; kvlingo/backend.h, where each is
 * documented; the cache is a kvl__kv_blocks). */
void kvl__cpu_cache_free(void *c);
size_t kvl__cpu_cache_bytes(const void *c);
kvl_status kvl__cpu_cache_truncate(void *c, int n_held, int n);
kvl_status kvl__cpu_cache_write(void *pc, int t0, int n, const float *k_post, const float *v,
                                const float *k_pre);
kvl_status kvl__cpu_cache_read(const void *pc, int layer, kvl_cache_plane plane, int t0, int t1,
                               float *out);
kvl_status kvl__cpu_cache_export_prenorm(const void *pc, int layer, int t0, int t1, float *k_out,
                                         float *v_out);

kvl_status kvl__cpu_cache_export_prenorm_bf16(void *model, const void *cache, int t0, int t1,
                                              uint16_t *k_out, uint16_t *v_out);

/* The table's translate-apply entries (translate_cpu.c; kvlingo/backend.h). */
kvl_status kvl__cpu_translate_prepare(void *model, const kvl_translate_params *params, void **out);
void kvl__cpu_translate_release(void *prepared);
kvl_status kvl__cpu_translate_apply(void *prepared, const float *k_src, const float *v_src, int t0,
                                    int n, void *cache);
kvl_status kvl__cpu_translate_apply_bf16(void *prepared, const uint16_t *k_src16,
                                         const uint16_t *v_src16, int t0, int n, void *cache);

#endif
