/* daemon/session.c: the session table (array + linear search: a node holds at most a few
 * thousand sessions and lookups are per request, not per token). */
#include "session.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "ticket.h"

struct kvld_sessions {
    pthread_mutex_t mu;
    const kvl_model *model;
    int max_sessions, max_context;
    kvld_session **items;
    int n;
    uint64_t next_id;
};

const char *kvld_state_name(kvld_state s) {
    switch (s) {
    case KVLD_IDLE: return "idle";
    case KVLD_PREFILL: return "prefill";
    case KVLD_DECODE: return "decode";
    case KVLD_IMPORT: return "import";
    case KVLD_EXPORT: return "export";
    }
    return "?";
}

kvl_status kvld_sessions_create(const kvl_model *model, int max_sessions, int max_context,
                                kvld_sessions **out) {
    kvld_sessions *t = calloc(1, sizeof *t);
    if (t) t->items = calloc((size_t)max_sessions, sizeof *t->items);
    if (!t || !t->items) {
        free(t);
        return kvl__errorf(KVL_ERR_NOMEM, "session table");
    }
    pthread_mutex_init(&t->mu, NULL);
    t->model = model;
    t->max_sessions = max_sessions;
    t->max_context = max_context;
    *out = t;
    return KVL_OK;
}

static void session_free(kvld_session *s) {
    if (!s) return;
    kvl_cache_free(s->cache);
    free(s->ledger);
    free(s->logits);
    free(s);
}

void kvld_sessions_free(kvld_sessions *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) session_free(t->items[i]);
    free(t->items);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static int find(kvld_sessions *t, const char *id) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->items[i]->id, id) == 0) return i;
    return -1;
}

static int valid_id(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n >= KVLD_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c <= ' ' || c == '"' || c == '\\' || c >= 0x7f) return 0;
    }
    return 1;
}

/* mu held */
static kvl_status open_locked(kvld_sessions *t, const char *id, int max_context,
                              kvld_session **out) {
    if (t->n >= t->max_sessions)
        return kvl__errorf(KVL_ERR_RANGE, "node holds its maximum of %d sessions", t->max_sessions);
    char gen[KVLD_ID_MAX];
    if (!id || !id[0]) {
        do snprintf(gen, sizeof gen, "s-%llu", (unsigned long long)++t->next_id);
        while (find(t, gen) >= 0);
        id = gen;
    } else if (!valid_id(id)) {
        return kvl__errorf(KVL_ERR_INVALID_ARG,
                          "session id must be 1-%d printable characters without spaces or quotes",
                          KVLD_ID_MAX - 1);
    } else if (find(t, id) >= 0) {
        return kvl__errorf(KVL_ERR_INVALID_ARG, "session '%s' already exists", id);
    }
    int ctx = max_context > 0 && max_context < t->max_context ? max_context : t->max_context;
    const kvl_model_config *cfg = kvl_model_config_get(t->model);
    kvld_session *s = calloc(1, sizeof *s);
    if (!s) return kvl__errorf(KVL_ERR_NOMEM, "session");
    snprintf(s->id, sizeof s->id, "%s", id);
    s->max_context = ctx;
    s->last_used = kvl__now_s();
    s->ledger = malloc(sizeof(int32_t) * (size_t)ctx);
    s->logits = malloc(sizeof(float) * (size_t)cfg->vocab_size);
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = ctx;
    kvl_status st = (!s->ledger || !s->logits) ? kvl__errorf(KVL_ERR_NOMEM, "session buffers")
                                               : kvl_model_cache_create(t->model, &cp, &s->cache);
    if (st != KVL_OK) {
        session_free(s);
        return st;
    }
    t->items[t->n++] = s;
    *out = s;
    return KVL_OK;
}

kvl_status kvld_sessions_open(kvld_sessions *t, const char *id, int max_context,
                              char id_out[KVLD_ID_MAX]) {
    pthread_mutex_lock(&t->mu);
    kvld_session *s;
    kvl_status st = open_locked(t, id, max_context, &s);
    if (st == KVL_OK) snprintf(id_out, KVLD_ID_MAX, "%s", s->id);
    pthread_mutex_unlock(&t->mu);
    return st;
}

kvl_status kvld_session_acquire(kvld_sessions *t, const char *id, kvld_state state, int create,
                                kvld_session **out, int *created) {
    *out = NULL;
    if (created) *created = 0;
    if (!id || !id[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "session_id is required");
    pthread_mutex_lock(&t->mu);
    kvl_status st = KVL_OK;
    int i = find(t, id);
    kvld_session *s = NULL;
    if (i < 0) {
        if (create) {
            st = open_locked(t, id, 0, &s);
            if (st == KVL_OK && created) *created = 1;
        }
        else st = kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%s'", id);
    } else {
        s = t->items[i];
        if (s->state != KVLD_IDLE)
            st = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is busy (%s)", id,
                            kvld_state_name(s->state));
    }
    if (st == KVL_OK) {
        s->state = state;
        s->refs++;
        s->last_used = kvl__now_s();
        *out = s;
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

void kvld_session_release(kvld_sessions *t, kvld_session *s) {
    if (!s) return;
    pthread_mutex_lock(&t->mu);
    s->snap_cached = kvl_cache_n_tokens(s->cache);
    s->snap_bytes = kvl_cache_bytes(s->cache);
    s->state = KVLD_IDLE;
    s->last_used = kvl__now_s();
    int gone = --s->refs == 0 && s->dropped;
    pthread_mutex_unlock(&t->mu);
    if (gone) session_free(s);
}

void kvld_session_release_drop(kvld_sessions *t, kvld_session *s) {
    if (!s) return;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n; i++)
        if (t->items[i] == s) {
            t->items[i] = t->items[--t->n];
            break;
        }
    s->dropped = 1;
    s->state = KVLD_IDLE;
    int gone = --s->refs == 0;
    pthread_mutex_unlock(&t->mu);
    if (gone) session_free(s);
}

/* Remove `id` from the table; only_idle: only while idle and unheld (else KVL_ERR_MISMATCH). */
static kvl_status drop(kvld_sessions *t, const char *id, int only_idle) {
    pthread_mutex_lock(&t->mu);
    int i = id ? find(t, id) : -1;
    if (i < 0) {
        pthread_mutex_unlock(&t->mu);
        return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%s'", id ? id : "");
    }
    kvld_session *s = t->items[i];
    if (only_idle && (s->state != KVLD_IDLE || s->refs != 0)) {
        pthread_mutex_unlock(&t->mu);
        return kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is %s", id, kvld_state_name(s->state));
    }
    t->items[i] = t->items[--t->n];
    int now = s->refs == 0;   /* a busy one is freed when its operation releases it */
    s->dropped = 1;
    pthread_mutex_unlock(&t->mu);
    if (now) session_free(s);
    return KVL_OK;
}

kvl_status kvld_sessions_drop(kvld_sessions *t, const char *id) { return drop(t, id, 0); }

kvl_status kvld_sessions_drop_idle(kvld_sessions *t, const char *id) { return drop(t, id, 1); }

kvl_status kvld_sessions_info(kvld_sessions *t, const char *id, kvld_session_info *out) {
    pthread_mutex_lock(&t->mu);
    int i = id ? find(t, id) : -1;
    if (i < 0) {
        pthread_mutex_unlock(&t->mu);
        return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown session '%s'", id ? id : "");
    }
    kvld_session *s = t->items[i];
    /* an idle session's cache is not changing; a busy one's owner may be appending to it, so
     * report the figures of its last release */
    int idle = s->state == KVLD_IDLE;
    out->n_ledger = __atomic_load_n(&s->n_ledger, __ATOMIC_RELAXED);
    out->n_cached = idle ? kvl_cache_n_tokens(s->cache) : s->snap_cached;
    out->max_context = s->max_context;
    out->n_imported = s->n_imported;
    out->cache_bytes = idle ? kvl_cache_bytes(s->cache) : s->snap_bytes;
    out->state = s->state;
    /* the ledger below n_ledger changes only under its owner's import or truncate; the router
     * trusts the hash of idle sessions only */
    kvl__tokens_sha256_hex(s->ledger, (size_t)(out->n_ledger > 0 ? out->n_ledger : 0), out->tokens_sha256);
    pthread_mutex_unlock(&t->mu);
    return KVL_OK;
}

int kvld_sessions_expire(kvld_sessions *t, double ttl_s) {
    if (ttl_s <= 0) return 0;
    double now = kvl__now_s();
    kvld_session *gone[64];
    int n_gone = 0;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n && n_gone < 64;) {
        kvld_session *s = t->items[i];
        if (s->state == KVLD_IDLE && s->refs == 0 && now - s->last_used > ttl_s) {
            t->items[i] = t->items[--t->n];
            s->dropped = 1;
            gone[n_gone++] = s;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < n_gone; i++) session_free(gone[i]);
    return n_gone;
}

int kvld_sessions_count(kvld_sessions *t) {
    pthread_mutex_lock(&t->mu);
    int n = t->n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t kvld_sessions_cache_bytes(kvld_sessions *t) {
    size_t b = 0;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n; i++) {
        kvld_session *s = t->items[i];
        b += s->state == KVLD_IDLE ? kvl_cache_bytes(s->cache) : s->snap_bytes;
    }
    pthread_mutex_unlock(&t->mu);
    return b;
}

void kvld_session_swap_cache(kvld_sessions *t, kvld_session *s, kvl_cache *fresh) {
    pthread_mutex_lock(&t->mu);
    kvl_cache *old = s->cache;
    s->cache = fresh;
    pthread_mutex_unlock(&t->mu);
    kvl_cache_free(old);
}
