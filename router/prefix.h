/* router/prefix.h: a bounded, in-memory index from token prefixes to sessions.
 *
 * OpenAI-style clients are stateless: every request carries the whole conversation.  To find
 * the session whose ledger a rendered prompt extends, the router hashes the prompt's token ids
 * in blocks of KVR_PREFIX_BLOCK; the hash of block i chains the hash of block i-1, so one entry
 * names a whole prefix [0, (i+1) * KVR_PREFIX_BLOCK).  Entries map that hash to the session that
 * last committed the prefix.  The table has a fixed capacity; the least recently used entry is
 * evicted when it is full.  An answer is only a candidate: the caller checks it against the
 * ledger (a hash collision, a session that ended or moved on are all caught there).
 * Thread-safe (one mutex). */
#ifndef KVR_PREFIX_H
#define KVR_PREFIX_H

#include <stdint.h>

#include "kvlingo/status.h"
#include "ledger.h"

#define KVR_PREFIX_BLOCK 16
#define KVR_PREFIX_MAX_CANDIDATES 4

typedef struct kvr_prefix kvr_prefix;

/* `capacity` entries (blocks), at least 16.  KVL_ERR_NOMEM. */
kvl_status kvr_prefix_create(int capacity, kvr_prefix **out);
void kvr_prefix_free(kvr_prefix *p);

/* Record that session `sid` holds tokens[0, n): every full block of it points at `sid` (an
 * entry another session held is taken over: the newest holder answers). */
void kvr_prefix_insert(kvr_prefix *p, const char *sid, const int32_t *tokens, int n);

/* Sessions that may hold a prefix of tokens[0, n), longest match first: up to `max` distinct
 * ids into ids[], with the matched length in tokens in lens[].  Returns the count. */
int kvr_prefix_lookup(kvr_prefix *p, const int32_t *tokens, int n, char (*ids)[KVR_ID_MAX],
                      int *lens, int max);

/* The same within tenant `tenant`'s own chain of hashes (NULL: the chain of the two calls
 * above): a lookup never proposes another tenant's session, and one tenant's insert never
 * takes over another's entry. */
void kvr_prefix_insert_for(kvr_prefix *p, const char *tenant, const char *sid, const int32_t *tokens,
                           int n);
int kvr_prefix_lookup_for(kvr_prefix *p, const char *tenant, const int32_t *tokens, int n,
                          char (*ids)[KVR_ID_MAX], int *lens, int max);

/* Entries in use (for tests and metrics). */
int kvr_prefix_size(kvr_prefix *p);

#endif
