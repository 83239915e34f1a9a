/* router/prefix.c: the prefix index (see prefix.h): a chained hash table of fixed capacity with
 * an intrusive LRU list; every array is allocated once at create. */
#include "prefix.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "error.h"

typedef struct entry {
    uint64_t hash;
    char sid[KVR_ID_MAX];
    int next;            /* bucket chain, -1 ends                                             */
    int prev_lru, next_lru;
    int used;
} entry;

struct kvr_prefix {
    pthread_mutex_t mu;
    entry *e;
    int *bucket;
    int cap, n_buckets, n_used;
    int lru_head, lru_tail;   /* head: most recent                                             */
    int free_head;            /* free list through `next`                                      */
};

kvl_status kvr_prefix_create(int capacity, kvr_prefix **out) {
    *out = NULL;
    if (capacity < 16) capacity = 16;
    kvr_prefix *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "prefix index");
    p->cap = capacity;
    p->n_buckets = 1;
    while (p->n_buckets < capacity) p->n_buckets <<= 1;
    p->e = calloc((size_t)capacity, sizeof *p->e);
    p->bucket = malloc(sizeof(int) * (size_t)p->n_buckets);
    if (!p->e || !p->bucket) {
        free(p->e);
        free(p->bucket);
        free(p);
        return kvl__errorf(KVL_ERR_NOMEM, "prefix index of %d entries", capacity);
    }
    for (int i = 0; i < p->n_buckets; i++) p->bucket[i] = -1;
    for (int i = 0; i < capacity; i++) p->e[i].next = i + 1 < capacity ? i + 1 : -1;
    p->free_head = 0;
    p->lru_head = p->lru_tail = -1;
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return KVL_OK;
}

void kvr_prefix_free(kvr_prefix *p) {
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    free(p->e);
    free(p->bucket);
    free(p);
}

static void lru_unlink(kvr_prefix *p, int i) {
    entry *x = &p->e[i];
    if (x->prev_lru >= 0) p->e[x->prev_lru].next_lru = x->next_lru;
    else p->lru_head = x->next_lru;
    if (x->next_lru >= 0) p->e[x->next_lru].prev_lru = x->prev_lru;
    else p->lru_tail = x->prev_lru;
}

static void lru_push_front(kvr_prefix *p, int i) {
    entry *x = &p->e[i];
    x->prev_lru = -1;
    x->next_lru = p->lru_head;
    if (p->lru_head >= 0) p->e[p->lru_head].prev_lru = i;
    p->lru_head = i;
    if (p->lru_tail < 0) p->lru_tail = i;
}

static int find(kvr_prefix *p, uint64_t h) {
    for (int i = p->bucket[h & (uint64_t)(p->n_buckets - 1)]; i >= 0; i = p->e[i].next)
        if (p->e[i].hash == h) return i;
    return -1;
}

static void bucket_remove(kvr_prefix *p, int i) {
    int *link = &p->bucket[p->e[i].hash & (uint64_t)(p->n_buckets - 1)];
    while (*link >= 0 && *link != i) link = &p->e[*link].next;
    if (*link == i) *link = p->e[i].next;
}

/* Chained block hashes: h[b] covers tokens [0, (b+1) * BLOCK). */
static uint64_t block_hash(uint64_t prev, const int32_t *blk) {
    return XXH3_64bits_withSeed(blk, sizeof(int32_t) * KVR_PREFIX_BLOCK, prev);
}

/* The chain's start: one per tenant, so that tenants never share (or take over) an entry. */
static uint64_t chain_seed(const char *tenant) {
    uint64_t h = 0x6b766c696e676fULL;
    return tenant ? XXH3_64bits_withSeed(tenant, strlen(tenant), h) : h;
}

void kvr_prefix_insert(kvr_prefix *p, const char *sid, const int32_t *tokens, int n) {
    kvr_prefix_insert_for(p, NULL, sid, tokens, n);
}

int kvr_prefix_lookup(kvr_prefix *p, const int32_t *tokens, int n, char (*ids)[KVR_ID_MAX],
                      int *lens, int max) {
    return kvr_prefix_lookup_for(p, NULL, tokens, n, ids, lens, max);
}

void kvr_prefix_insert_for(kvr_prefix *p, const char *tenant, const char *sid, const int32_t *tokens,
                           int n) {
    if (!p || !sid || !tokens) return;
    pthread_mutex_lock(&p->mu);
    uint64_t h = chain_seed(tenant);
    for (int b = 0; (b + 1) * KVR_PREFIX_BLOCK <= n; b++) {
        h = block_hash(h, tokens + (size_t)b * KVR_PREFIX_BLOCK);
        int i = find(p, h);
        if (i >= 0) {
            lru_unlink(p, i);
        } else {
            if (p->free_head < 0) {   /* full: evict the least recently used entry */
                i = p->lru_tail;
                lru_unlink(p, i);
                bucket_remove(p, i);
                p->n_used--;
            } else {
                i = p->free_head;
                p->free_head = p->e[i].next;
            }
            p->e[i].hash = h;
            p->e[i].used = 1;
            int bk = (int)(h & (uint64_t)(p->n_buckets - 1));
            p->e[i].next = p->bucket[bk];
            p->bucket[bk] = i;
            p->n_used++;
        }
        snprintf(p->e[i].sid, sizeof p->e[i].sid, "%s", sid);
        lru_push_front(p, i);
    }
    pthread_mutex_unlock(&p->mu);
}

int kvr_prefix_lookup_for(kvr_prefix *p, const char *tenant, const int32_t *tokens, int n,
                          char (*ids)[KVR_ID_MAX], int *lens, int max) {
    if (!p || !tokens || max <= 0) return 0;
    int nb = n / KVR_PREFIX_BLOCK;
    if (nb == 0) return 0;
    uint64_t *hs = malloc(sizeof(uint64_t) * (size_t)nb);
    if (!hs) return 0;
    uint64_t h = chain_seed(tenant);
    for (int b = 0; b < nb; b++) hs[b] = h = block_hash(h, tokens + (size_t)b * KVR_PREFIX_BLOCK);
    int found = 0;
    pthread_mutex_lock(&p->mu);
    for (int b = nb - 1; b >= 0 && found < max; b--) {
        int i = find(p, hs[b]);
        if (i < 0) continue;
        int dup = 0;
        for (int k = 0; k < found && !dup; k++) dup = !strcmp(ids[k], p->e[i].sid);
        if (dup) continue;
        snprintf(ids[found], KVR_ID_MAX, "%s", p->e[i].sid);
        lens[found++] = (b + 1) * KVR_PREFIX_BLOCK;
        lru_unlink(p, i);
        lru_push_front(p, i);
    }
    pthread_mutex_unlock(&p->mu);
    free(hs);
    return found;
}

int kvr_prefix_size(kvr_prefix *p) {
    pthread_mutex_lock(&p->mu);
    int n = p->n_used;
    pthread_mutex_unlock(&p->mu);
    return n;
}
