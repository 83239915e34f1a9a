/* router/ledger.h: the router's session ledger, behind one interface with two backends:
 * SQLite (WAL, an embedded file: the default) and PostgreSQL (libpq: one database shared by
 * any number of router replicas).  `ledger:` in fleet.yaml picks the backend by its form
 * (kvr_ledger_open).  Both run the same versioned schema, migrated at open.
 *
 * The ledger is the router's source of truth: every session's token ids (user input and
 * generated), its turns, its policy state and which node holds which prefix of it.  The router
 * keeps nothing of a session in memory between turns (a turn loads the session, runs, commits in
 * one transaction), so router memory stays bounded by the turns in flight, and a restarted router
 * continues every open session from the file.
 *
 * Tables: sessions(id, state, created, last_used, n_turns, n_tokens, current_node, model,
 * pol_level, pol_calm), chunks(session, t0, ids BLOB of int32 little-endian), turns(...),
 * holdings(session, node, n_tokens), schema_version(version).  Times are Unix seconds (double).
 * Schema 2 adds the session lease (sessions.lease_owner, lease_gen, lease_expiry) and the
 * idempotency key of a turn (turns.request_id, unique per session when not empty).  Schema 3
 * adds sessions.tenant (the API-key tenant a session belongs to; "default" for sessions made
 * before, and for every session of a router without a key file).
 *
 * Leases: a session is driven by one replica at a time.  A lease is taken by compare-and-set
 * on lease_gen (the row's generation: every take increments it), renewed while the turn runs,
 * and checked again inside the commit's transaction, so a replica that lost its lease (paused
 * past the expiry, then resumed) cannot commit over the replica that took over.  Nothing is
 * locked across the network between statements.  Expiry compares the replicas' wall clocks:
 * they must agree to well within the lease time (NTP).
 *
 * Thread-safe: one connection behind a mutex per ledger (turn commits are small and short).
 */
#ifndef KVR_LEDGER_H
#define KVR_LEDGER_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/status.h"

#define KVR_ID_MAX 80          /* session keys: a client's id (1..64 bytes of [A-Za-z0-9._:-])
                                * behind its tenant's tag (kvr_session_key)                     */
#define KVR_NAME_MAX 64
#define KVR_MAX_HOLDINGS 32

/* The most tokens a session's ledger holds (the loaders' bound on what they read back). */
#define KVR_LEDGER_MAX_TOKENS (1 << 28)

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
    char tenant[KVR_NAME_MAX];         /* the tenant it belongs to ("default" without keys)  */
    int pol_level, pol_calm;
    int32_t *tokens;                   /* [n_tokens] when loaded with tokens, else NULL       */
    kvr_holding holdings[KVR_MAX_HOLDINGS];
    int n_holdings;
} kvr_session;

/* The lease a turn runs under and its idempotency key; a commit with a fence succeeds only
 * while the lease is still (owner, gen). */
typedef struct kvr_fence {
    const char *owner;         /* replica id                                                 */
    int64_t gen;               /* lease generation returned by kvr_ledger_lease_acquire       */
    const char *request_id;    /* "" or NULL: none                                           */
} kvr_fence;

typedef struct kvr_turn_rec {
    int idx;
    const char *node, *model, *mode, *fallback;
    int t0;                    /* ledger length before the turn                              */
    int n_user, n_gen, span;
    double ttft_s, tps, entropy;
    const char *finish;        /* finish reason ("" when none)                               */
    const kvr_fence *fence;    /* NULL: no lease check, no request id                        */
} kvr_turn_rec;

/* A committed turn found by its request id (kvr_ledger_turn_find). */
typedef struct kvr_turn_found {
    int idx, t0, n_user, n_gen, span;
    char node[KVR_NAME_MAX], model[KVR_NAME_MAX], mode[16], fallback[160], finish[32];
    double ttft_s, tps, entropy;
    int32_t *tokens;           /* [n_user + n_gen]: the turn's input then its output, or NULL
                                * when the session has ended (its tokens are gone); free()   */
} kvr_turn_found;

typedef struct kvr_lease {
    char owner[KVR_NAME_MAX];  /* who holds it after the call                                */
    int64_t gen;
    double expiry;
    int took_over;             /* 1: an expired lease of another replica was taken            */
    char prev_owner[KVR_NAME_MAX];
} kvr_lease;

typedef struct kvr_ledger kvr_ledger;

/* Open the ledger `conn` and migrate its schema:
 *   "postgresql://..." or "postgres://..."   PostgreSQL (a libpq URI, secrets included)
 *   "sqlite:PATH" or a plain PATH             SQLite file (":memory:" works for tests), WAL mode,
 *                                             synchronous NORMAL
 * KVL_ERR_IO naming the ledger (a PostgreSQL URI without its password) and the database's
 * message; KVL_ERR_UNSUPPORTED for PostgreSQL in a build without libpq, or a schema newer
 * than this program knows. */
kvl_status kvr_ledger_open(const char *conn, kvr_ledger **out);
void kvr_ledger_free(kvr_ledger *l);

/* "sqlite" or "postgresql". */
const char *kvr_ledger_backend(const kvr_ledger *l);
/* 1 when `conn` names a PostgreSQL ledger. */
int kvr_ledger_is_postgres(const char *conn);
/* `conn` for messages and logs: a URI's password replaced by "***". */
void kvr_ledger_shown(const char *conn, char *buf, size_t cap);
/* Schema version of the open ledger (KVR_LEDGER_SCHEMA after a successful open). */
int kvr_ledger_schema(const kvr_ledger *l);
#define KVR_LEDGER_SCHEMA 3

/* Called after every ledger call with its name ("load", "commit", "lease", ...), whether it
 * wrote, and its duration (seconds), for the metrics. */
void kvr_ledger_set_observer(kvr_ledger *l,
                             void (*fn)(void *arg, const char *op, int write, double seconds),
                             void *arg);

/* 1 when `id` is a valid session id as a client names it (length and characters). */
int kvr_session_id_valid(const char *id);

/* Session ids are per tenant: the ledger, the nodes and the logs know a session by its key,
 * the client's id behind a tag of its tenant, "<12 hex of sha256(tenant)>/<id>", so that two
 * tenants naming a session alike get two sessions, and one tenant learns nothing of another's
 * ids (creating an id another tenant holds succeeds; a name squatted in advance is another
 * session).  Tenant "default" (a router without API keys, where every client is that one
 * tenant) keeps the id as it is, as do sessions made before keys were per tenant.
 *   kvr_session_key:       out (KVR_ID_MAX bytes) = the key of `id` (valid) for `tenant`
 *   kvr_session_key_valid: 1 for a client id or such a key
 *   kvr_session_client_id: the client's id within a key (a pointer into it) */
void kvr_session_key(const char *tenant, const char *id, char out[KVR_ID_MAX]);
int kvr_session_key_valid(const char *key);
const char *kvr_session_client_id(const char *key);
/* KVL_ERR_INVALID_ARG naming `what` ("session_id", "request_id"), the id's first 64 characters,
 * its length and the rule: "session_id 'x...' (65 characters) is invalid (1-64 of A-Za-z0-9._:-)".
 * Always returns that status (for `return kvr_id_refuse(...)`). */
kvl_status kvr_id_refuse(const char *what, const char *id);

/* New open session of tenant "default".  KVL_ERR_INVALID_ARG when `id` exists already. */
kvl_status kvr_ledger_session_create(kvr_ledger *l, const char *id, const char *model, double now);
/* New open session of `tenant`; with max_open > 0, refused (KVL_ERR_NOMEM "quota: ...") when
 * the tenant has max_open open sessions already (checked and inserted in one statement). */
kvl_status kvr_ledger_session_create_for(kvr_ledger *l, const char *id, const char *model,
                                         const char *tenant, long max_open, double now);

/* Load a session (any state); tokens only when with_tokens.  KVL_ERR_NOT_FOUND when unknown;
 * KVL_ERR_INVALID_ARG when `id` is no session id (1-64 of A-Za-z0-9._:-).  Release with
 * kvr_session_clear. */
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
 * stay (GetSession says why it is gone) until kvr_ledger_purge.  KVL_ERR_NOT_FOUND if unknown;
 * KVL_ERR_INVALID_ARG when `id` is no session id. */
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

/* Take the lease of open session `id` for `owner` until now + ttl_s: granted when it is free,
 * already `owner`'s, or expired (out->took_over then says whose it was).  A compare-and-set on
 * the generation: of two replicas racing, one wins.  KVL_ERR_MISMATCH "is busy" naming the
 * holder and the time left when another replica holds it; KVL_ERR_NOT_FOUND when unknown;
 * KVL_ERR_MISMATCH "no longer open" for an ended session; KVL_ERR_INVALID_ARG when `id` is no
 * session id or `owner` is empty. */
kvl_status kvr_ledger_lease_acquire(kvr_ledger *l, const char *id, const char *owner, double now,
                                    double ttl_s, kvr_lease *out);
/* Extend a held lease to now + ttl_s.  KVL_ERR_MISMATCH when it is no longer (owner, gen). */
kvl_status kvr_ledger_lease_renew(kvr_ledger *l, const char *id, const char *owner, int64_t gen,
                                  double now, double ttl_s);
/* Give a held lease back (no-op when it is no longer (owner, gen)). */
kvl_status kvr_ledger_lease_release(kvr_ledger *l, const char *id, const char *owner, int64_t gen);

/* The turn of session `id` committed with `request_id`.  KVL_ERR_NOT_FOUND when none;
 * KVL_ERR_INVALID_ARG when either is no id (1-64 of A-Za-z0-9._:-).  Release with
 * kvr_turn_found_clear. */
kvl_status kvr_ledger_turn_find(kvr_ledger *l, const char *id, const char *request_id,
                                kvr_turn_found *out);
void kvr_turn_found_clear(kvr_turn_found *f);

#endif
