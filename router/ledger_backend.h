/* router/ledger_backend.h: the table of functions a ledger backend implements (ledger_sqlite.c,
 * ledger_pg.c).  ledger.c owns the dispatch, the argument checks shared by every backend and
 * the timing of each call; a backend only talks to its database.  Each function has the
 * contract of the kvr_ledger_* function of the same name in ledger.h (arguments already
 * checked: ids valid, pointers non-NULL). */
#ifndef KVR_LEDGER_BACKEND_H
#define KVR_LEDGER_BACKEND_H

#include "ledger.h"

typedef struct kvr_ledger_commit {
    const char *id;
    const int32_t *tokens;
    int t0, n;
    const kvr_turn_rec *turn;
    const char *current_node;
    int pol_level, pol_calm;
    const kvr_holding *holdings;
    int n_holdings;
    double now;
} kvr_ledger_commit;

typedef struct kvr_ledger_ops {
    const char *name;
    /* `conn` is what follows the scheme for SQLite (a path) and the whole URI for PostgreSQL;
     * `shown` is its printable form for messages.  Creates and migrates the schema; sets
     * *schema to the version found after migrating. */
    kvl_status (*open)(const char *conn, const char *shown, void **impl, int *schema);
    void (*close)(void *impl);
    /* refused with KVL_ERR_NOMEM "quota: ..." when max_open > 0 and `tenant` has that many
     * open sessions already */
    kvl_status (*session_create)(void *impl, const char *id, const char *model, const char *tenant,
                                 long max_open, double now);
    kvl_status (*session_load)(void *impl, const char *id, int with_tokens, kvr_session *out);
    kvl_status (*turn_commit)(void *impl, const kvr_ledger_commit *c);
    kvl_status (*holding_set)(void *impl, const char *id, const char *node, int n);
    kvl_status (*session_end)(void *impl, const char *id, kvr_session_state state, double now);
    kvl_status (*idle)(void *impl, double before, char (*ids)[KVR_ID_MAX], int max, int *n);
    /* open sessions (but `exclude`) holding a prefix on `node`, not under a live lease at wall
     * time `now`, least recently used first */
    kvl_status (*lru_on_node)(void *impl, const char *node, const char *exclude, double now,
                              char (*ids)[KVR_ID_MAX], int max, int *n);
    kvl_status (*purge)(void *impl, double before);
    kvl_status (*count_open)(void *impl, long *n);
    kvl_status (*lease_acquire)(void *impl, const char *id, const char *owner, double now,
                                double ttl_s, kvr_lease *out);
    kvl_status (*lease_renew)(void *impl, const char *id, const char *owner, int64_t gen,
                              double now, double ttl_s);
    kvl_status (*lease_release)(void *impl, const char *id, const char *owner, int64_t gen);
    kvl_status (*turn_find)(void *impl, const char *id, const char *request_id,
                            kvr_turn_found *out);
} kvr_ledger_ops;

extern const kvr_ledger_ops kvr_ledger_sqlite_ops;
#ifdef KVR_HAVE_LIBPQ
extern const kvr_ledger_ops kvr_ledger_pg_ops;
#endif

/* Shared by the backends: the "is busy" refusal of a lease held by another replica, and the
 * check that chunks tile [0, n_tokens) while a session's tokens are assembled. */
kvl_status kvr__ledger_busy(const char *id, const char *holder, double expiry, double now);
kvl_status kvr__ledger_lost(const char *id, const char *owner_now, int64_t gen_now,
                            int64_t gen_had);
/* A turn (or lease) on an ended session: "session 'x' is closed" / "is expired". */
kvl_status kvr__ledger_ended(const char *id, int state);
/* Copy the turn's tokens [t0, t0 + n_user + n_gen) out of a loaded session into f->tokens. */
kvl_status kvr__ledger_found_tokens(const kvr_session *s, kvr_turn_found *f);

#endif
