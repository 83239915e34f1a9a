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
 * A slab holds per_slab blocks; its free blocks are a stack of indices, with a flag per block so
 * that a block given back twice, or a pointer that is not a block's start, is refused instead of
 * corrupting the stack.  Slabs with some blocks in use and some free are on the `partial` list,
 * slabs with every block free on the `empty` list; a block is taken from a partial slab first,
 * so that nearly empty slabs can drain.  All slabs are in `slabs`, sorted by address, so a
 * returned block finds its slab by binary search.  Memory goes back to the system a whole slab
 * at a time: whenever the pool's free bytes exceed max_idle_bytes, empty slabs are released
 * until they do not (a slab with one block in use stays). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bigalloc.h"
#include "error.h"
#include "kv_blocks.h"

#define KVL_SLAB_UNIT ((size_t)2 << 20)   /* a huge page */
#define KVL_SLAB_MAX_UNITS 8

enum { SLAB_FULL = 0, SLAB_PARTIAL = 1, SLAB_EMPTY = 2 };

typedef struct block_slab {
    char *base;                      /* per_slab blocks, stride bytes apart (kvl__bigalloc) */
    int n_free;                      /* entries of free_idx in use                          */
    int *free_idx;                   /* [per_slab] indices of free blocks, a stack          */
    uint8_t *is_free;                /* [per_slab] 1 where the block is on the stack        */
    int list;                        /* SLAB_FULL (on no list), SLAB_PARTIAL or SLAB_EMPTY  */
    struct block_slab *prev, *next;  /* on that list                                        */
} block_slab;

struct kvl__block_pool {
    pthread_mutex_t mu;
    size_t block_bytes, stride, slab_bytes, max_idle_bytes;   /* stride: block_bytes rounded up to 64 */
    int per_slab, refs;
    size_t n_free;             /* free blocks over all slabs                             */
    block_slab **slabs;        /* [n_slabs], sorted by base                              */
    int n_slabs, cap_slabs;
    block_slab *lists[3];      /* [SLAB_PARTIAL], [SLAB_EMPTY]; [SLAB_FULL] unused       */
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
    if (block_bytes == 0 || block_bytes > ((size_t)1 << 40))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "block pool: block size %zu", block_bytes);
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
    if (!s) return;
    free(s->base);
    free(s->free_idx);
    free(s->is_free);
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

/* Puts s on the list its free count calls for (none when no block is free). */
static void slab_relist(kvl__block_pool *p, block_slab *s) {
    const int want = s->n_free == 0 ? SLAB_FULL : s->n_free == p->per_slab ? SLAB_EMPTY : SLAB_PARTIAL;
    if (want == s->list) return;
    if (s->list != SLAB_FULL) {
        if (s->prev) s->prev->next = s->next;
        else p->lists[s->list] = s->next;
        if (s->next) s->next->prev = s->prev;
    }
    s->prev = s->next = NULL;
    s->list = want;
    if (want != SLAB_FULL) {
        s->next = p->lists[want];
        if (s->next) s->next->prev = s;
        p->lists[want] = s;
    }
}

/* The slab holding address b, or -1 (memory from elsewhere). */
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

/* A new slab with every block free, made without the pool's lock (the allocation and the
 * kernel's advice take time); NULL when out of memory. */
static block_slab *slab_make(size_t slab_bytes, int per_slab) {
    block_slab *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->free_idx = malloc(sizeof *s->free_idx * (size_t)per_slab);
    s->is_free = malloc((size_t)per_slab);
    s->base = kvl__bigalloc(slab_bytes);
    if (!s->free_idx || !s->is_free || !s->base) {
        slab_free(s);
        return NULL;
    }
    for (int i = 0; i < per_slab; i++) s->free_idx[i] = per_slab - 1 - i;   /* block 0 on top */
    memset(s->is_free, 1, (size_t)per_slab);
    s->n_free = per_slab;
    s->list = SLAB_FULL;   /* on no list until inserted */
    return s;
}

/* Inserts a slab from slab_make into `slabs` and the empty list; 0 when the table cannot grow. */
static int slab_insert(kvl__block_pool *p, block_slab *s) {
    if (p->n_slabs == p->cap_slabs) {
        const int cap = p->cap_slabs ? 2 * p->cap_slabs : 16;
        block_slab **t = realloc(p->slabs, sizeof *t * (size_t)cap);
        if (!t) return 0;
        p->slabs = t;
        p->cap_slabs = cap;
    }
    int at = p->n_slabs;
    while (at > 0 && (uintptr_t)p->slabs[at - 1]->base > (uintptr_t)s->base) at--;
    memmove(p->slabs + at + 1, p->slabs + at, sizeof *p->slabs * (size_t)(p->n_slabs - at));
    p->slabs[at] = s;
    p->n_slabs++;
    p->n_free += (size_t)p->per_slab;
    slab_relist(p, s);
    return 1;
}

/* One block from a partial slab, else an empty one; NULL when there is none.  Under the lock. */
static void *take_locked(kvl__block_pool *p) {
    block_slab *s = p->lists[SLAB_PARTIAL] ? p->lists[SLAB_PARTIAL] : p->lists[SLAB_EMPTY];
    if (!s) return NULL;
    const int i = s->free_idx[--s->n_free];
    s->is_free[i] = 0;
    p->n_free--;
    slab_relist(p, s);
    return s->base + (size_t)i * p->stride;
}

void *kvl__block_pool_take(kvl__block_pool *p) {
    pthread_mutex_lock(&p->mu);
    void *b = take_locked(p);
    const size_t slab_bytes = p->slab_bytes;
    const int per_slab = p->per_slab;
    pthread_mutex_unlock(&p->mu);
    if (b) return b;
    block_slab *s = slab_make(slab_bytes, per_slab);
    if (!s) return NULL;
    pthread_mutex_lock(&p->mu);
    if (!slab_insert(p, s)) {
        pthread_mutex_unlock(&p->mu);
        slab_free(s);
        return NULL;
    }
    b = take_locked(p);   /* the new slab's, or one another thread gave back meanwhile */
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* Drop empty slab s from `slabs` and its list, and free it.  Under the lock. */
static void slab_release(kvl__block_pool *p, block_slab *s) {
    const int i = slab_of(p, s->base);
    s->n_free = 0;
    slab_relist(p, s);   /* off the empty list */
    memmove(p->slabs + i, p->slabs + i + 1, sizeof *p->slabs * (size_t)(p->n_slabs - i - 1));
    p->n_slabs--;
    p->n_free -= (size_t)p->per_slab;
    slab_free(s);
}

int kvl__block_pool_give(kvl__block_pool *p, void *b) {
    pthread_mutex_lock(&p->mu);
    const int si = slab_of(p, b);
    int ok = 0;
    if (si >= 0) {
        block_slab *s = p->slabs[si];
        const size_t off = (size_t)((char *)b - s->base);
        const size_t i = off / p->stride;
        /* a block's start, inside the slab's blocks, not already free */
        if (off % p->stride == 0 && i < (size_t)p->per_slab && !s->is_free[i]) {
            s->is_free[i] = 1;
            s->free_idx[s->n_free++] = (int)i;
            p->n_free++;
            slab_relist(p, s);
            ok = 1;
            while (p->n_free * p->block_bytes > p->max_idle_bytes && p->lists[SLAB_EMPTY])
                slab_release(p, p->lists[SLAB_EMPTY]);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return ok;
}

void kvl__block_pool_stats(kvl__block_pool *p, int *slabs, size_t *free_blocks, int *per_slab) {
    pthread_mutex_lock(&p->mu);
    if (slabs) *slabs = p->n_slabs;
    if (free_blocks) *free_blocks = p->n_free;
    if (per_slab) *per_slab = p->per_slab;
    pthread_mutex_unlock(&p->mu);
}

size_t kvl__block_pool_block_bytes(const kvl__block_pool *p) { return p->block_bytes; }
