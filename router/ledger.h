/* router/ledger.h: the router's session ledger in SQLite (WAL).
 *
 * The ledger is the router's source of truth: every session's token ids (user input and
 * generated), its turns, its policy state and which node holds which prefix of it.  The router
 * keeps nothing of a session in memory between turns (a turn loads the session, runs, commits in
 * one transaction), so router memory stays bounded by the turns in flight, and a restarted router
 * continues every open session from the file.
 *
 * Tables: sessions(id, state, created, last_used, n_turns, n_tokens, current_node, model,
 * pol_level, pol_calm), chunks(session, t0, ids BLOB of int32 little-endian), turns(...),
 * holdings(session, node, n_tokens).  Times are Unix seconds (double).
 *
 * Thread-safe: one connection behind a mutex (turn commits are small and short).
 */
#ifndef KVR_LEDGER_H
#define KVR_LEDGER_H

#include <stdint.h>

#include "kvlingo/status.h"

#define KVR_ID_MAX 72          /* session ids: 1..64 bytes of [A-Za-z0-9._:-]                */
#define KVR_NAME_MAX 64
#define KVR_MAX_HOLDINGS 32

typedef enum kvr_session_state {
    KVR_SESSION_OPEN = 0,
    KVR_SESSION_CLOSED = 1,
    KVR_SESSION_EXPIRED = 2,
} kvr_session_state;

typedef struct kvr_holding {
    char node[KVR_NAME_MAX];
    int n_tokens;              /* the node holds ledger tokens [0, n_tokens)                  */
} kvr_holding;

typedef struct kvr_session {
    char id[KVR_ID_MAX];
    kvr_session_state state;
    double created, last_used;
    int n_turns;
    int n_tokens;
    char current_node[KVR_NAME_MAX];   /* "" before the first turn                           */
    char model[KVR_NAME_MAX];          /* CreateSession's model, "" when none                */
    int pol_level, pol_calm;
    int32_t *tokens;                   /* [n_tokens] when loaded with tokens, else NULL       */
    kvr_holding holdings[KVR_MAX_HOLDINGS];
    int n_holdings;
} kvr_session;

typedef struct kvr_turn_rec {
    int idx;
    const char *node, *model, *mode, *fallback;
    int t0;                    /* ledger length before the turn                              */
    int n_user, n_gen, span;
    double ttft_s, tps, entropy;
} kvr_turn_rec;

typedef struct kvr_ledger kvr_ledger;

/* Open (create) the ledger at `path` (":memory:" works for tests).  WAL mode, synchronous
 * NORMAL.  KVL_ERR_IO naming the path and SQLite's message on failure. */
kvl_status kvr_ledger_open(const char *path, kvr_ledger **out);
void kvr_ledger_free(kvr_ledger *l);

/* Called after every write transaction with its duration (seconds), for the metric. */
void kvr_ledger_set_observer(kvr_ledger *l, void (*fn)(void *arg, double seconds), void *arg);

/* 1 when `id` is a valid session id (length and characters). */
int kvr_session_id_valid(const char *id);

/* New open session.  KVL_ERR_INVALID_ARG when `id` exists already. */
kvl_status kvr_ledger_session_create(kvr_ledger *l, const char *id, const char *model, double now);

/* Load a session (any state); tokens only when with_tokens.  KVL_ERR_NOT_FOUND when unknown.
 * Release with kvr_session_clear. */
kvl_status kvr_ledger_session_load(kvr_ledger *l, const char *id, int with_tokens,
                                   kvr_session *out);
void kvr_session_clear(kvr_session *s);
/* Holding of `node` in a loaded session (0 when none). */
int kvr_session_held(const kvr_session *s, const char *node);

/* Commit one turn atomically: append tokens[0..n) at ledger position t0 (must equal the
 * session's n_tokens, else KVL_ERR_MISMATCH: two writers or an off-by-one), insert the turn row,
 * set current node, policy state, last_used, and replace the holdings with the given ones. */
kvl_status kvr_ledger_turn_commit(kvr_ledger *l, const char *id, const int32_t *tokens, int t0,
                                  int n, const kvr_turn_rec *turn, const char *current_node,
                                  int pol_level, int pol_calm, const kvr_holding *holdings,
                                  int n_holdings, double now);

/* Set (n > 0) or remove (n == 0) one node's holding. */
kvl_status kvr_ledger_holding_set(kvr_ledger *l, const char *id, const char *node, int n);

/* End a session (CLOSED or EXPIRED): its tokens and holdings are deleted, the row and turns
 * stay (GetSession says why it is gone) until kvr_ledger_purge.  KVL_ERR_NOT_FOUND if unknown. */
kvl_status kvr_ledger_session_end(kvr_ledger *l, const char *id, kvr_session_state state,
                                  double now);

/* Open sessions whose last_used < before: up to `max` ids into ids[]. */
kvl_status kvr_ledger_idle(kvr_ledger *l, double before, char (*ids)[KVR_ID_MAX], int max,
                           int *n);

/* Open sessions (but `exclude`) that `node` holds a prefix of, least recently used first: up
 * to `max` ids (to free a place on a node whose session table is full). */
kvl_status kvr_ledger_lru_on_node(kvr_ledger *l, const char *node, const char *exclude,
                                  char (*ids)[KVR_ID_MAX], int max, int *n);

/* Delete ended sessions (and their turns) that ended before `before`: bounded disk. */
kvl_status kvr_ledger_purge(kvr_ledger *l, double before);

kvl_status kvr_ledger_count_open(kvr_ledger *l, long *n);

#endif
