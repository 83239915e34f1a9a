/* engine/tokenizer/tokenizer_util.c: hash maps, buffers, UTF-8 and GPT-2 byte-level helpers, and the
 * pre-token cache used by the tokenizer (see tokenizer_internal.h). */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "error.h"
#include "tokenizer_internal.h"

/* GPT-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the 68 others to
 * U+0100.. in ascending byte order. */
const uint16_t kvl__bytelevel_char[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10a, 0x10b, 0x10c, 0x10d, 0x10e, 0x10f,
    0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117, 0x118, 0x119, 0x11a, 0x11b, 0x11c, 0x11d, 0x11e, 0x11f,
    0x120, 0x021, 0x022, 0x023, 0x024, 0x025, 0x026, 0x027, 0x028, 0x029, 0x02a, 0x02b, 0x02c, 0x02d, 0x02e, 0x02f,
    0x030, 0x031, 0x032, 0x033, 0x034, 0x035, 0x036, 0x037, 0x038, 0x039, 0x03a, 0x03b, 0x03c, 0x03d, 0x03e, 0x03f,
    0x040, 0x041, 0x042, 0x043, 0x044, 0x045, 0x046, 0x047, 0x048, 0x049, 0x04a, 0x04b, 0x04c, 0x04d, 0x04e, 0x04f,
    0x050, 0x051, 0x052, 0x053, 0x054, 0x055, 0x056, 0x057, 0x058, 0x059, 0x05a, 0x05b, 0x05c, 0x05d, 0x05e, 0x05f,
    0x060, 0x061, 0x062, 0x063, 0x064, 0x065, 0x066, 0x067, 0x068, 0x069, 0x06a, 0x06b, 0x06c, 0x06d, 0x06e, 0x06f,
    0x070, 0x071, 0x072, 0x073, 0x074, 0x075, 0x076, 0x077, 0x078, 0x079, 0x07a, 0x07b, 0x07c, 0x07d, 0x07e, 0x121,
    0x122, 0x123, 0x124, 0x125, 0x126, 0x127, 0x128, 0x129, 0x12a, 0x12b, 0x12c, 0x12d, 0x12e, 0x12f, 0x130, 0x131,
    0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13a, 0x13b, 0x13c, 0x13d, 0x13e, 0x13f, 0x140, 0x141,
    0x142, 0x0a1, 0x0a2, 0x0a3, 0x0a4, 0x0a5, 0x0a6, 0x0a7, 0x0a8, 0x0a9, 0x0aa, 0x0ab, 0x0ac, 0x143, 0x0ae, 0x0af,
    0x0b0, 0x0b1, 0x0b2, 0x0b3, 0x0b4, 0x0b5, 0x0b6, 0x0b7, 0x0b8, 0x0b9, 0x0ba, 0x0bb, 0x0bc, 0x0bd, 0x0be, 0x0bf,
    0x0c0, 0x0c1, 0x0c2, 0x0c3, 0x0c4, 0x0c5, 0x0c6, 0x0c7, 0x0c8, 0x0c9, 0x0ca, 0x0cb, 0x0cc, 0x0cd, 0x0ce, 0x0cf,
    0x0d0, 0x0d1, 0x0d2, 0x0d3, 0x0d4, 0x0d5, 0x0d6, 0x0d7, 0x0d8, 0x0d9, 0x0da, 0x0db, 0x0dc, 0x0dd, 0x0de, 0x0df,
    0x0e0, 0x0e1, 0x0e2, 0x0e3, 0x0e4, 0x0e5, 0x0e6, 0x0e7, 0x0e8, 0x0e9, 0x0ea, 0x0eb, 0x0ec, 0x0ed, 0x0ee, 0x0ef,
    0x0f0, 0x0f1, 0x0f2, 0x0f3, 0x0f4, 0x0f5, 0x0f6, 0x0f7, 0x0f8, 0x0f9, 0x0fa, 0x0fb, 0x0fc, 0x0fd, 0x0fe, 0x0ff,
};

int kvl__bytelevel_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x143) {
        uint32_t k = cp - 0x100;
        if (k <= 32) return (int)k;          /* 0x00..0x20 */
        if (k <= 66) return (int)(0x7f + (k - 33)); /* 0x7f..0xa0 */
        return 0xad;
    }
    return -1;
}

size_t kvl__utf8_decode(const uint8_t *s, size_t len, uint32_t *cp) {
    if (len == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    size_t n;
    uint32_t v, min;
    if (c >= 0xc2 && c <= 0xdf) { n = 2; v = c & 0x1f; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { n = 3; v = c & 0x0f; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { n = 4; v = c & 0x07; min = 0x10000; }
    else return 0;
    if (len < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return n;
}

int kvl__utf8_valid(const char *s, size_t len) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) { i++; continue; }
        uint32_t cp;
        size_t n = kvl__utf8_decode(p + i, len - i, &cp);
        if (n == 0) return 0;
        i += n;
    }
    return 1;
}

uint64_t kvl__tok_hash(const void *data, size_t len) {
    uint64_t h = XXH3_64bits(data, len);
    return h ? h : 1;
}

/* ---- strmap --------------------------------------------------------------------------------- */

kvl_status kvl__strmap_init(kvl__strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < expected * 2 + 16) cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (hash map of %zu)", cap);
    m->cap = cap;
    return KVL_OK;
}

void kvl__strmap_free(kvl__strmap *m) {
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static kvl_status strmap_grow(kvl__strmap *m) {
    size_t ncap = m->cap * 2;
    kvl__strmap_entry *ns = calloc(ncap, sizeof *ns);
    if (!ns) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (hash map)");
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].used) continue;
        size_t j = m->slots[i].hash & (ncap - 1);
        while (ns[j].used) j = (j + 1) & (ncap - 1);
        ns[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return KVL_OK;
}

kvl_status kvl__strmap_put(kvl__strmap *m, const char *key, size_t len, int32_t value, int *existed) {
    if (existed) *existed = 0;
    if (len > UINT32_MAX / 2) return kvl__errorf(KVL_ERR_RANGE, "tokenizer: token too long");
    if ((m->count + 1) * 2 > m->cap) {
        kvl_status st = strmap_grow(m);
        if (st) return st;
    }
    uint64_t h = kvl__tok_hash(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].used) {
        kvl__strmap_entry *e = &m->slots[j];
        /* len 0 (an empty token) may come with key == NULL: no memcmp/memcpy on it */
        if (e->hash == h && e->len == len && (len == 0 || memcmp(m->arena + e->off, key, len) == 0)) {
            e->value = value;
            if (existed) *existed = 1;
            return KVL_OK;
        }
        j = (j + 1) & (m->cap - 1);
    }
    if (m->arena_len + len + 1 > m->arena_cap) {
        size_t ncap = m->arena_cap ? m->arena_cap * 2 : 4096;
        while (ncap < m->arena_len + len + 1) ncap *= 2;
        if (ncap > UINT32_MAX) return kvl__errorf(KVL_ERR_RANGE, "tokenizer: vocabulary text over 4 GiB");
        char *na = realloc(m->arena, ncap);
        if (!na) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (vocabulary text)");
        m->arena = na;
        m->arena_cap = ncap;
    }
    if (len) memcpy(m->arena + m->arena_len, key, len);
    m->arena[m->arena_len + len] = '\0';
    kvl__strmap_entry *e = &m->slots[j];
    e->hash = h;
    e->off = (uint32_t)m->arena_len;
    e->len = (uint32_t)len;
    e->value = value;
    e->used = 1;
    m->arena_len += len + 1;
    m->count++;
    return KVL_OK;
}

int32_t kvl__strmap_get(const kvl__strmap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    uint64_t h = kvl__tok_hash(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].used) {
        const kvl__strmap_entry *e = &m->slots[j];
        if (e->hash == h && e->len == len && (len == 0 || memcmp(m->arena + e->off, key, len) == 0)) return e->value;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

/* ---- mergemap ------------------------------------------------------------------------------- */

static inline uint64_t merge_key(int32_t a, int32_t b) {
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

static inline size_t merge_slot(uint64_t key, size_t cap) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (cap - 1);
}

kvl_status kvl__mergemap_init(kvl__mergemap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < expected * 2 + 16) cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (merge table)");
    m->cap = cap;
    return KVL_OK;
}

void kvl__mergemap_free(kvl__mergemap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

kvl_status kvl__mergemap_put(kvl__mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    if ((m->count + 1) * 2 > m->cap) {
        size_t ncap = m->cap * 2;
        kvl__merge_slot *ns = calloc(ncap, sizeof *ns);
        if (!ns) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (merge table)");
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->slots[i].key) continue;
            size_t j = merge_slot(m->slots[i].key, ncap);
            while (ns[j].key) j = (j + 1) & (ncap - 1);
            ns[j] = m->slots[i];
        }
        free(m->slots);
        m->slots = ns;
        m->cap = ncap;
    }
    uint64_t key = merge_key(a, b);
    size_t j = merge_slot(key, m->cap);
    while (m->slots[j].key && m->slots[j].key != key) j = (j + 1) & (m->cap - 1);
    if (!m->slots[j].key) m->count++;
    /* a repeated pair keeps its last rank, as tokenizers' HashMap collect does */
    m->slots[j].key = key;
    m->slots[j].rank = rank;
    m->slots[j].new_id = new_id;
    return KVL_OK;
}

const kvl__merge_slot *kvl__mergemap_get(const kvl__mergemap *m, int32_t a, int32_t b) {
    uint64_t key = merge_key(a, b);
    size_t j = merge_slot(key, m->cap);
    while (m->slots[j].key) {
        if (m->slots[j].key == key) return &m->slots[j];
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}

/* ---- vectors -------------------------------------------------------------------------------- */

kvl_status kvl__idvec_push(kvl__idvec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t ncap = v->cap ? v->cap * 2 : 64;
        int32_t *nv = realloc(v->v, ncap * sizeof *nv);
        if (!nv) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (ids)");
        v->v = nv;
        v->cap = ncap;
    }
    v->v[v->n++] = id;
    return KVL_OK;
}

kvl_status kvl__buf_append(kvl__buf *b, const void *data, size_t len) {
    if (b->n + len + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap * 2 : 256;
        while (ncap < b->n + len + 1) ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (text)");
        b->p = np;
        b->cap = ncap;
    }
    if (len) memcpy(b->p + b->n, data, len);
    b->n += len;
    b->p[b->n] = '\0';
    return KVL_OK;
}

/* ---- pre-token cache ------------------------------------------------------------------------ */

#define KVL_TOKCACHE_SHARD_CAP 4096

kvl_status kvl__tokcache_init(kvl_tokenizer *t) {
    for (int i = 0; i < KVL_TOKCACHE_SHARDS; i++) {
        kvl__tokcache_shard *s = &t->cache[i];
        s->slots = calloc(KVL_TOKCACHE_SHARD_CAP, sizeof *s->slots);
        if (!s->slots) {
            for (int k = 0; k < i; k++) {
                pthread_mutex_destroy(&t->cache[k].lock);
                free(t->cache[k].slots);
                t->cache[k].slots = NULL;
            }
            return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (cache)");
        }
        s->cap = KVL_TOKCACHE_SHARD_CAP;
        s->count = 0;
        pthread_mutex_init(&s->lock, NULL);
    }
    t->cache_ready = 1;
    return KVL_OK;
}

void kvl__tokcache_free(kvl_tokenizer *t) {
    if (!t->cache_ready) return;
    for (int i = 0; i < KVL_TOKCACHE_SHARDS; i++) {
        pthread_mutex_destroy(&t->cache[i].lock);
        free(t->cache[i].slots);
        t->cache[i].slots = NULL;
    }
    t->cache_ready = 0;
}
