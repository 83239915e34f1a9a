/* transport/spanbuf.c: the span payload buffer cache (see spanbuf.h). */
#include "spanbuf.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define SPANBUF_MAX_SLOTS 64

typedef struct slot {
    uint8_t *buf;
    size_t cap;
    int busy;
} slot;

struct kvl__spanbufs {
    pthread_mutex_t mu;
    slot slots[SPANBUF_MAX_SLOTS];
    int max_buffers;
    size_t max_bytes, bytes;      /* bytes: of every buffer in slots[], taken or not */
    int loose;                    /* buffers taken outside the slots (none free, or too big) */
    int closed;                   /* freed: buffers given back are freed, not kept */
};

kvl_status kvl__spanbufs_create(int max_buffers, size_t max_bytes, kvl__spanbufs **out) {
    *out = NULL;
    if (max_buffers < 1 || max_buffers > SPANBUF_MAX_SLOTS)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "span buffers: max_buffers %d outside [1, %d]",
                          max_buffers, SPANBUF_MAX_SLOTS);
    kvl__spanbufs *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "span buffers");
    pthread_mutex_init(&p->mu, NULL);
    p->max_buffers = max_buffers;
    p->max_bytes = max_bytes;
    *out = p;
    return KVL_OK;
}

/* A slot is one of: empty (no buffer, not busy); reserved (busy, buf still NULL: a take is
 * allocating it outside the lock); taken (busy, buf set); idle (buf set, not busy). */
static int all_idle_freed(kvl__spanbufs *p) {   /* mu held; 1 when no buffer is taken or reserved */
    int busy = 0;
    for (int i = 0; i < p->max_buffers; i++) {
        slot *s = &p->slots[i];
        if (s->buf && !s->busy) {
            free(s->buf);
            p->bytes -= s->cap;
            memset(s, 0, sizeof *s);
        }
        busy += s->busy;
    }
    return busy == 0 && p->loose == 0;
}

void kvl__spanbufs_free(kvl__spanbufs *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    int done = all_idle_freed(p);
    pthread_mutex_unlock(&p->mu);
    if (!done) return;   /* the last give frees the table */
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static uint8_t *fresh(size_t len) {
    size_t cap = (len + 63) & ~(size_t)63;
    return aligned_alloc(64, cap ? cap : 64);
}

uint8_t *kvl__spanbuf_take(kvl__spanbufs *p, size_t len) {
    if (!p) return fresh(len);
    size_t cap = (len + 63) & ~(size_t)63;
    if (!cap) cap = 64;
    pthread_mutex_lock(&p->mu);
    int best = -1, empty = -1;
    for (int i = 0; i < p->max_buffers; i++) {
        slot *s = &p->slots[i];
        if (!s->buf && !s->busy) {   /* a reserved slot is not empty: its take is allocating */
            if (empty < 0) empty = i;
        } else if (s->buf && !s->busy && s->cap >= cap && (best < 0 || s->cap < p->slots[best].cap)) {
            best = i;
        }
    }
    if (best >= 0) {
        p->slots[best].busy = 1;
        uint8_t *b = p->slots[best].buf;
        pthread_mutex_unlock(&p->mu);
        return b;
    }
    /* none fits: make room by freeing idle buffers too small for this span */
    for (int i = 0; i < p->max_buffers && (empty < 0 || p->bytes + cap > p->max_bytes); i++) {
        slot *s = &p->slots[i];
        if (s->buf && !s->busy) {
            free(s->buf);
            p->bytes -= s->cap;
            memset(s, 0, sizeof *s);
            if (empty < 0) empty = i;
        }
    }
    int keep = !p->closed && empty >= 0 && p->bytes + cap <= p->max_bytes;
    if (keep) {
        p->slots[empty] = (slot){.buf = NULL, .cap = cap, .busy = 1};
        p->bytes += cap;
    } else {
        p->loose++;   /* the table lives until this one is given back too */
    }
    pthread_mutex_unlock(&p->mu);
    uint8_t *b = aligned_alloc(64, cap);
    {
        pthread_mutex_lock(&p->mu);
        if (keep && b) {
            p->slots[empty].buf = b;
        } else if (keep) {
            p->bytes -= cap;
            memset(&p->slots[empty], 0, sizeof p->slots[empty]);
        } else if (!b) {
            p->loose--;
        }
        /* freed while this take allocated (kvl__spanbufs_free saw the reservation): the table
         * goes with the last buffer given back, which may be this one, or none when it failed */
        int gone = !b && p->closed && all_idle_freed(p);
        pthread_mutex_unlock(&p->mu);
        if (gone) {
            pthread_mutex_destroy(&p->mu);
            free(p);
        }
    }
    return b;
}

void kvl__spanbuf_give(kvl__spanbufs *p, uint8_t *buf) {
    if (!buf) return;
    if (!p) {
        free(buf);
        return;
    }
    pthread_mutex_lock(&p->mu);
    int found = 0;
    for (int i = 0; i < p->max_buffers && !found; i++)
        if (p->slots[i].buf == buf) {
            p->slots[i].busy = 0;
            found = 1;
        }
    if (!found) {   /* one taken outside the slots */
        free(buf);
        p->loose--;
    }
    int gone = p->closed && all_idle_freed(p);
    pthread_mutex_unlock(&p->mu);
    if (gone) {
        pthread_mutex_destroy(&p->mu);
        free(p);
    }
}

void kvl__spanbufs_stats(kvl__spanbufs *p, int *kept, size_t *bytes) {
    int n = 0;
    size_t b = 0;
    if (p) {
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < p->max_buffers; i++) n += p->slots[i].buf != NULL;
        b = p->bytes;
        pthread_mutex_unlock(&p->mu);
    }
    if (kept) *kept = n;
    if (bytes) *bytes = b;
}
