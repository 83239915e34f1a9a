/* kernels/cpu/block_pool.c: the KV block pool of kv_blocks.h, blocks carved from huge-page slabs.
 *
 * Why slabs: decode attention reads every block of every session each step, a 16-token block
 * being 8 KB per (layer, plane) at qwen3-b's geometry, in a scattered order.  With each block
 * its own malloc (4 KB pages), 16 sessions of 528 tokens touched ~13k pages a step, far more
 * than the TLB holds, and the step's attention ran 14% slower than from blocks in 2 MB pages
 * (bench_batch --sessions 16 --prompt 512 --tokens 32: p50 inter-token 7.3-7.5 ms against
 * 6.4-6.5, interleaved).  Blocks here come from slabs of whole 2 MB huge pages
 * (kvl__bigalloc: advice only; where the kernel declines, ordinary pages as before).
 *
 * A slab holds per_slab blocks; its free blocks are a stack of indices.  Slabs with free blocks
 * are on the `avail` list; all slabs are in `slabs`, sorted by address, so a returned block
 * finds its slab by binary search.  Memory goes back to the system a whole slab at a time: when
 * every block of a slab is free and the pool's free bytes exceed max_idle_bytes. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bigalloc.h"
#include "error.h"
#include "kv_blocks.h"

#define KVL_SLAB_UNIT ((size_t)2 << 20)   /* a huge page */
#define KVL_SLAB_MAX_UNITS 8

typedef struct block_slab {
    char *base;                /* per_slab blocks of block_bytes each (kvl__bigalloc)   */
    int n_free;                /* entries of free_idx in use                             */
    int *free_idx;             /* [per_slab] indices of free blocks, a stack             */
    struct block_slab *next;   /* the avail list (slabs with n_free > 0)                 */
    int on_avail;
} block_slab;

struct kvl__block_pool {
    pthread_mutex_t mu;
    size_t block_bytes, stride, slab_bytes, max_idle_bytes;   /* stride: block_bytes rounded up to 64 */
    int per_slab, refs;
    size_t n_free;             /* free blocks over all slabs                             */
    block_slab **slabs;        /* [n_slabs], sorted by base                              */
    int n_slabs, cap_slabs;
    block_slab *avail;
};

/* The slab size for a block size: the fewest huge pages (up to KVL_SLAB_MAX_UNITS) whose
 * unused tail is at most 1/16 of the slab, else the one with the smallest tail fraction. */
static void slab_geometry(size_t block_bytes, size_t *slab_bytes, int *per_slab) {
    size_t best = 0;
    double best_waste = 2.0;
    for (size_t u = 1; u <= KVL_SLAB_MAX_UNITS; u++) {
        const size_t s = u * KVL_SLAB_UNIT;
        if (s < block_bytes) continue;
        const double waste = (double)(s % block_bytes) / (double)s;
        if (waste < best_waste) best_waste = waste, best = s;
        if (waste <= 1.0 / 16) break;
    }
    if (!best) best = (block_bytes + KVL_SLAB_UNIT - 1) / KVL_SLAB_UNIT * KVL_SLAB_UNIT;   /* huge blocks */
    *slab_bytes = best;
    *per_slab = (int)(best / block_bytes);
}

kvl_status kvl__block_pool_create(size_t block_bytes, size_t max_idle_bytes, kvl__block_pool **out) {
    if (block_bytes == 0) return kvl__errorf(KVL_ERR_INVALID_ARG, "block pool: block size 0");
    kvl__block_pool *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "out of memory for a block pool");
    if (pthread_mutex_init(&p->mu, NULL)) {
        free(p);
        return kvl__errorf(KVL_ERR_NOMEM, "block pool: cannot create its lock");
    }
    p->block_bytes = block_bytes;
    p->stride = (block_bytes + 63) & ~(size_t)63;
    p->max_idle_bytes = max_idle_bytes;
    slab_geometry(p->stride, &p->slab_bytes, &p->per_slab);
    p->refs = 1;
    *out = p;
    return KVL_OK;
}

static void slab_free(block_slab *s) {
    free(s->base);
    free(s->free_idx);
    free(s);
}

void kvl__block_pool_ref(kvl__block_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->refs++;
    pthread_mutex_unlock(&p->mu);
}

void kvl__block_pool_unref(kvl__block_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    int last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (!last) return;
    /* no cache holds a reference, so no block is in use */
    for (int i = 0; i < p->n_slabs; i++) slab_free(p->slabs[i]);
    free(p->slabs);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* The slab holding b, or -1 (a block from elsewhere). */
static int slab_of(const kvl__block_pool *p, const void *b) {
    int lo = 0, hi = p->n_slabs - 1;
    const uintptr_t a = (uintptr_t)b;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        const uintptr_t base = (uintptr_t)p->slabs[mid]->base;
        if (a < base) hi = mid - 1;
        else if (a >= base + p->slab_bytes) lo = mid + 1;
        else return mid;
    }
    return -1;
}

/* A new slab, inserted into `slabs` and put on `avail` with every block free; NULL when out
 * of memory. */
static block_slab *slab_new(kvl__block_pool *p) {
    if (p->n_slabs == p->cap_slabs) {
        const int cap = p->cap_slabs ? 2 * p->cap_slabs : 16;
        block_slab **s = realloc(p->slabs, sizeof *s * (size_t)cap);
        if (!s) return NULL;
        p->slabs = s;
        p->cap_slabs = cap;
    }
    block_slab *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->free_idx = malloc(sizeof *s->free_idx * (size_t)p->per_slab);
    s->base = kvl__bigalloc(p->slab_bytes);
    if (!s->free_idx || !s->base) {
        slab_free(s);
        return NULL;
    }
    for (int i = 0; i < p->per_slab; i++) s->free_idx[i] = p->per_slab - 1 - i;   /* block 0 on top */
    s->n_free = p->per_slab;
    int at = p->n_slabs;
    while (at > 0 && (uintptr_t)p->slabs[at - 1]->base > (uintptr_t)s->base) at--;
    memmove(p->slabs + at + 1, p->slabs + at, sizeof *p->slabs * (size_t)(p->n_slabs - at));
    p->slabs[at] = s;
    p->n_slabs++;
    s->next = p->avail, p->avail = s, s->on_avail = 1;
    p->n_free += (size_t)p->per_slab;
    return s;
}

void *kvl__block_pool_take(kvl__block_pool *p) {
    pthread_mutex_lock(&p->mu);
    block_slab *s = p->avail ? p->avail : slab_new(p);
    void *b = NULL;
    if (s) {
        b = s->base + (size_t)s->free_idx[--s->n_free] * p->stride;
        p->n_free--;
        if (s->n_free == 0) p->avail = s->next, s->on_avail = 0, s->next = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* Drop slab i (all of its blocks free) from `slabs` and `avail`, and free it. */
static void slab_release(kvl__block_pool *p, int i) {
    block_slab *s = p->slabs[i];
    for (block_slab **l = &p->avail; *l; l = &(*l)->next)
        if (*l == s) {
            *l = s->next;
            break;
        }
    memmove(p->slabs + i, p->slabs + i + 1, sizeof *p->slabs * (size_t)(p->n_slabs - i - 1));
    p->n_slabs--;
    p->n_free -= (size_t)p->per_slab;
    slab_free(s);
}

int kvl__block_pool_give(kvl__block_pool *p, void *b) {
    pthread_mutex_lock(&p->mu);
    const int i = slab_of(p, b);
    if (i >= 0) {
        block_slab *s = p->slabs[i];
        s->free_idx[s->n_free++] = (int)((size_t)((char *)b - s->base) / p->stride);
        p->n_free++;
        if (!s->on_avail) s->next = p->avail, p->avail = s, s->on_avail = 1;
        if (s->n_free == p->per_slab && p->n_free * p->block_bytes > p->max_idle_bytes) slab_release(p, i);
    }
    pthread_mutex_unlock(&p->mu);
    return i >= 0;
}

void kvl__block_pool_stats(kvl__block_pool *p, int *slabs, size_t *free_blocks, int *per_slab) {
    pthread_mutex_lock(&p->mu);
    if (slabs) *slabs = p->n_slabs;
    if (free_blocks) *free_blocks = p->n_free;
    if (per_slab) *per_slab = p->per_slab;
    pthread_mutex_unlock(&p->mu);
}

size_t kvl__block_pool_block_bytes(const kvl__block_pool *p) { return p->block_bytes; }
