/* daemon/session.h: the node's sessions.  A session holds a token ledger (every token the node
 * was told about, [n_ledger]) and a KV cache of a prefix of it ([0, n_cached)); `logits` are the
 * next-token logits after the cached tokens when logits_valid.  One operation at a time owns a
 * session (state != IDLE); its fields are then touched only by that operation (and by the
 * scheduler on its behalf), so no per-session lock is needed. */
#ifndef KVLD_SESSION_H
#define KVLD_SESSION_H

#include <stdint.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/status.h"

#define KVLD_ID_MAX 128

typedef enum kvld_state {
    KVLD_IDLE = 0, KVLD_PREFILL, KVLD_DECODE, KVLD_IMPORT, KVLD_EXPORT
} kvld_state;

const char *kvld_state_name(kvld_state s);

typedef struct kvld_session {
    char id[KVLD_ID_MAX];
    kvl_cache *cache;
    int32_t *ledger;             /* [max_context] */
    int n_ledger;
    int max_context;
    float *logits;               /* [vocab] */
    int logits_valid;
    int n_imported;              /* tokens whose K/V came from translated spans */
    /* guarded by the table's mutex */
    int snap_cached;             /* cache figures as of the last release, for readers of a */
    size_t snap_bytes;           /* busy session (its owner may be changing the cache)     */
    kvld_state state;
    int refs;
    int dropped;
    double last_used;            /* monotonic s: last acquire or release (idle TTL) */
} kvld_session;

typedef struct kvld_sessions kvld_sessions;

kvl_status kvld_sessions_create(const kvl_model *model, int max_sessions, int max_context,
                                kvld_sessions **out);
void kvld_sessions_free(kvld_sessions *t);

/* Open a session named `id` (empty: a fresh "s-<n>" name, written to id_out).  KVL_ERR_RANGE
 * when max_sessions are open, KVL_ERR_INVALID_ARG for an existing or ill-formed id. */
kvl_status kvld_sessions_open(kvld_sessions *t, const char *id, int max_context,
                              char id_out[KVLD_ID_MAX]);

/* Take exclusive ownership of session `id` for an operation (`state`).  With `create`, a
 * missing session is opened first (*created = 1; `created` may be NULL).  KVL_ERR_NOT_FOUND (unknown id), KVL_ERR_MISMATCH (busy:
 * the message names what it is doing). */
kvl_status kvld_session_acquire(kvld_sessions *t, const char *id, kvld_state state, int create,
                                kvld_session **out, int *created);
void kvld_session_release(kvld_sessions *t, kvld_session *s);
/* Release s and remove it from the table in one step (under the table's lock), so that no other
 * request acquires it in between and then finds it dropped under it: what a failed import into
 * a session it created, or a session found holding other ids, does.  s is freed once its last
 * holder releases it. */
void kvld_session_release_drop(kvld_sessions *t, kvld_session *s);

/* Remove `id`; a busy session is freed when its operation releases it. */
kvl_status kvld_sessions_drop(kvld_sessions *t, const char *id);
/* Remove `id` only while it is idle and nobody holds it, checked under the table's lock (a
 * decision taken on an earlier kvld_sessions_info may be stale): KVL_ERR_MISMATCH when another
 * request took it meanwhile (nothing removed), KVL_ERR_NOT_FOUND when it is gone. */
kvl_status kvld_sessions_drop_idle(kvld_sessions *t, const char *id);

typedef struct kvld_session_info {
    int n_ledger, n_cached, max_context, n_imported;
    size_t cache_bytes;
    kvld_state state;
    char tokens_sha256[65];      /* SHA-256 (hex) of the ledger's ids, little-endian int32 */
} kvld_session_info;

kvl_status kvld_sessions_info(kvld_sessions *t, const char *id, kvld_session_info *out);
int kvld_sessions_count(kvld_sessions *t);

/* Drop every idle session unused (no operation) for more than ttl_s seconds; returns how many
 * went.  ttl_s <= 0: none. */
int kvld_sessions_expire(kvld_sessions *t, double ttl_s);
size_t kvld_sessions_cache_bytes(kvld_sessions *t);

/* Replace a session's cache (import with replace); the old one is freed.  Under the table's
 * mutex, because SessionInfo reads the cache of busy sessions. */
void kvld_session_swap_cache(kvld_sessions *t, kvld_session *s, kvl_cache *fresh);

#endif
