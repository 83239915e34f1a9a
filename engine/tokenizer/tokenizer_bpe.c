/* engine/tokenizer/tokenizer_bpe.c: the BPE model: one pre-token -> ids.
 *
 * Same result as tokenizers' BPE::merge_word + Word::merge_all: start from one symbol per
 * character (per byte for byte-level), then repeatedly merge the adjacent pair with the lowest
 * merge rank, leftmost first among equal ranks.  A binary heap of candidate pairs (rank, position)
 * with lazy invalidation keeps this O(n log n).  Results are memoised in a sharded, mutex-guarded
 * cache keyed by the pre-token bytes. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer_internal.h"

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next;   /* -1 at the ends */
    int32_t alive;
} bpe_sym;

typedef struct bpe_cand {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
} bpe_cand;

static inline int cand_less(const bpe_cand *a, const bpe_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n) {
    bpe_cand top = h[0];
    bpe_cand last = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m) break;
        size_t c = (l + 1 < m && cand_less(&h[l + 1], &h[l])) ? l + 1 : l;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = last;
    return top;
}

static void try_pair(const kvl_tokenizer *t, const bpe_sym *s, int32_t pos, bpe_cand *h, size_t *hn) {
    int32_t nx = s[pos].next;
    if (nx < 0) return;
    const kvl__merge_slot *m = kvl__mergemap_get(&t->merges, s[pos].id, s[nx].id);
    if (!m) return;
    bpe_cand c = {m->rank, pos, m->new_id};
    heap_push(h, hn, c);
}

/* Merge loop on syms[0..n) (linked in order); appends the surviving ids to out. */
static kvl_status bpe_merge(const kvl_tokenizer *t, bpe_sym *s, size_t n, bpe_cand *h,
                            kvl__idvec *out) {
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, s, (int32_t)i, h, &hn);
    while (hn) {
        bpe_cand c = heap_pop(h, &hn);
        bpe_sym *a = &s[c.pos];
        if (!a->alive || a->next < 0) continue;
        bpe_sym *b = &s[a->next];
        const kvl__merge_slot *m = kvl__mergemap_get(&t->merges, a->id, b->id);
        if (!m || m->new_id != c.new_id) continue;   /* stale candidate */
        a->id = c.new_id;
        b->alive = 0;
        a->next = b->next;
        if (b->next >= 0) s[b->next].prev = c.pos;
        if (a->prev >= 0) try_pair(t, s, a->prev, h, &hn);
        try_pair(t, s, c.pos, h, &hn);
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = s[i].next) {
        kvl_status st = kvl__idvec_push(out, s[i].id);
        if (st) return st;
    }
    return KVL_OK;
}

static int cache_get(const kvl_tokenizer *t, uint64_t h, const char *w, size_t len, kvl__idvec *out) {
    kvl__tokcache_shard *sh = (kvl__tokcache_shard *)&t->cache[h % KVL_TOKCACHE_SHARDS];
    int32_t ids[8];
    int n = -1;
    pthread_mutex_lock(&sh->lock);
    size_t j = (h >> 8) & (sh->cap - 1);
    for (;;) {
        kvl__tokcache_entry *e = &sh->slots[j];
        if (!e->klen) break;
        if (e->hash == h && e->klen == len && memcmp(e->key, w, len) == 0) {
            n = e->nids;
            memcpy(ids, e->ids, (size_t)n * sizeof(int32_t));
            break;
        }
        j = (j + 1) & (sh->cap - 1);
    }
    pthread_mutex_unlock(&sh->lock);
    if (n < 0) return 0;
    for (int i = 0; i < n; i++)
        if (kvl__idvec_push(out, ids[i])) return -1;
    return 1;
}

static void cache_put(const kvl_tokenizer *t, uint64_t h, const char *w, size_t len,
                      const int32_t *ids, size_t n) {
    kvl__tokcache_shard *sh = (kvl__tokcache_shard *)&t->cache[h % KVL_TOKCACHE_SHARDS];
    pthread_mutex_lock(&sh->lock);
    if ((sh->count + 1) * 4 > sh->cap * 3) {   /* full: start over (keeps lookups short) */
        memset(sh->slots, 0, sh->cap * sizeof *sh->slots);
        sh->count = 0;
    }
    size_t j = (h >> 8) & (sh->cap - 1);
    for (;;) {
        kvl__tokcache_entry *e = &sh->slots[j];
        if (!e->klen) {
            e->hash = h;
            e->klen = (uint8_t)len;
            e->nids = (uint8_t)n;
            memcpy(e->key, w, len);
            memcpy(e->ids, ids, n * sizeof(int32_t));
            sh->count++;
            break;
        }
        if (e->hash == h && e->klen == len && memcmp(e->key, w, len) == 0) break;
        j = (j + 1) & (sh->cap - 1);
    }
    pthread_mutex_unlock(&sh->lock);
}

kvl_status kvl__bpe_encode_word(const kvl_tokenizer *t, const char *w, size_t len, kvl__idvec *out) {
    if (len == 0) return KVL_OK;
    if (t->ignore_merges) {
        int32_t id = kvl__strmap_get(&t->vocab_bytes, w, len);
        if (id >= 0) return kvl__idvec_push(out, id);
    }
    if (t->byte_level && len == 1 && t->byte_id[(uint8_t)w[0]] >= 0)
        return kvl__idvec_push(out, t->byte_id[(uint8_t)w[0]]);

    uint64_t h = 0;
    int cacheable = t->cache_ready && len <= KVL_TOKCACHE_MAX_KEY;
    if (cacheable) {
        h = kvl__tok_hash(w, len);
        int r = cache_get(t, h, w, len, out);
        if (r < 0) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (ids)");
        if (r > 0) return KVL_OK;
    }

    enum { STACK_SYMS = 128 };
    bpe_sym stack_syms[STACK_SYMS];
    bpe_cand stack_heap[STACK_SYMS * 3];
    bpe_sym *s = stack_syms;
    bpe_cand *heap = stack_heap;
    /* The heap holds at most (n-1) initial + 2 per merge (n-1 merges) candidates. */
    if (len > STACK_SYMS) {
        s = malloc(len * sizeof *s);
        heap = malloc(len * 3 * sizeof *heap);
        if (!s || !heap) {
            free(s == stack_syms ? NULL : s);
            free(heap == stack_heap ? NULL : heap);
            return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (BPE word of %zu bytes)", len);
        }
    }

    /* one symbol per character (per byte when byte-level); unknown ones per tokenizers' rules */
    size_t n = 0;
    int32_t unk_pending = 0;   /* 1 when an unk symbol is pending (fuse/flush) */
    const uint8_t *p = (const uint8_t *)w;
    size_t i = 0;
    while (i < len) {
        size_t cl;
        int32_t id;
        if (t->byte_level) {
            cl = 1;
            id = t->byte_id[p[i]];
        } else {
            uint32_t cp;
            cl = kvl__utf8_decode(p + i, len - i, &cp);
            if (cl == 0) cl = 1;   /* cannot happen: input validated */
            id = kvl__strmap_get(&t->vocab_bytes, w + i, cl);
        }
        i += cl;
        if (id >= 0) {
            if (unk_pending) { s[n++].id = t->unk_id; unk_pending = 0; }
            s[n++].id = id;
        } else if (t->unk_id >= 0) {
            if (unk_pending && !t->fuse_unk) s[n++].id = t->unk_id;
            unk_pending = 1;
        }
        /* else: tokenizers drops a character with no token when there is no unk_token */
    }
    if (unk_pending) s[n++].id = t->unk_id;
    for (size_t k = 0; k < n; k++) {
        s[k].prev = (int32_t)k - 1;
        s[k].next = k + 1 < n ? (int32_t)k + 1 : -1;
        s[k].alive = 1;
    }
    size_t start = out->n;
    kvl_status st = bpe_merge(t, s, n, heap, out);
    if (s != stack_syms) free(s);
    if (heap != stack_heap) free(heap);
    if (st) return st;
    size_t produced = out->n - start;
    /* produced == 0 leaves out->v possibly NULL: nothing to cache then */
    if (cacheable && produced > 0 && produced <= 8) cache_put(t, h, w, len, out->v + start, produced);
    return KVL_OK;
}
