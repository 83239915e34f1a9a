/* service/ticket.h: transfer tickets.  A span moves between nodes only on a ticket the router
 * issued for exactly that move: the session ids on both sides, the token range, the replace
 * flag, the source and target nodes (their fleet addresses, as the router names them), an
 * expiry and a random nonce, authenticated by HMAC-SHA256 under the fleet's ticket key.  The
 * source node checks it before exporting and forwards it in the import; the target checks it
 * again and refuses a nonce it has seen (kvl__ticket_replay) until the ticket expires.
 *
 * Wire form (little-endian), what kvl__ticket_encode writes and kvl__ticket_verify reads:
 *   "KVT1" | u8 flags (bit 0: replace, bit 1: window) | u64 expiry (Unix ms) | nonce[16] | u32 t0 | u32 t1 |
 *   4 strings, each u16 length + bytes: source session, target session, source node,
 *   target node | HMAC-SHA256(key, every byte before it)[32]
 */
#ifndef KVL_TICKET_H
#define KVL_TICKET_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvlingo/status.h"

#define KVL_TICKET_KEY_MIN 32        /* bytes a ticket key file must hold at least            */
#define KVL_TICKET_KEY_MAX 1024      /* bytes read from it at most                            */
#define KVL_TICKET_NONCE 16
#define KVL_TICKET_MAC 32
#define KVL_TICKET_STR_MAX 256       /* bytes of one string field, NUL included              */
#define KVL_TICKET_MAX 1200          /* bytes of an encoded ticket at most                    */
#define KVL_TICKET_MAX_LIFETIME_MS (10 * 60 * 1000)   /* a later expiry is refused          */

typedef struct kvl__ticket_key {
    uint8_t key[KVL_TICKET_KEY_MAX];
    size_t len;
} kvl__ticket_key;

typedef struct kvl__ticket {
    char src_session[KVL_TICKET_STR_MAX];
    char dst_session[KVL_TICKET_STR_MAX];
    char source[KVL_TICKET_STR_MAX];     /* exporting node's fleet address "host:port"       */
    char target[KVL_TICKET_STR_MAX];     /* importing node's                                 */
    uint32_t t0, t1;                     /* tokens [t0, t1)                                   */
    int replace;
    int window;                          /* 1: any range inside [t0, t1) (the nodes settle it) */
    uint64_t expiry_ms;                  /* Unix time in ms                                   */
    uint8_t nonce[KVL_TICKET_NONCE];
} kvl__ticket;

/* Read the key file (its bytes, a trailing newline stripped).  Errors name the file: missing
 * or unreadable (KVL_ERR_IO), shorter than KVL_TICKET_KEY_MIN bytes (KVL_ERR_RANGE). */
kvl_status kvl__ticket_key_load(const char *path, kvl__ticket_key *out);

/* The key's public name: the first 8 bytes of HMAC-SHA256(key, "kvlingo ticket key id v1") in
 * hex (16 characters and a NUL into out[17]), which says whether two fleet members hold the
 * same key without telling anything of it (HMAC is a pseudo-random function of the key).
 * KVL_ERR_INTERNAL when HMAC fails (out is then ""). */
kvl_status kvl__ticket_key_id(const kvl__ticket_key *key, char out[17]);

/* Unix time in milliseconds (the clock tickets' expiry is measured on). */
uint64_t kvl__ticket_now_ms(void);

/* Fill t->nonce from the system's random source (RAND_bytes). */
kvl_status kvl__ticket_new_nonce(kvl__ticket *t);

/* Make and verify one throwaway ticket under key, at start: libcrypto's first random draw and
 * first HMAC set up its random generator and look up its algorithms (about 0.5-1 ms here),
 * which would otherwise land on the fleet's first switch.  Errors are those of
 * kvl__ticket_new_nonce / _encode / _verify (a key that cannot MAC fails here, not later). */
kvl_status kvl__ticket_warmup(const kvl__ticket_key *key);

/* Encode and MAC t into out[cap]; *len the bytes written.  KVL_ERR_RANGE when a string is too
 * long or cap too small. */
kvl_status kvl__ticket_encode(const kvl__ticket_key *key, const kvl__ticket *t, uint8_t *out,
                              size_t cap, size_t *len);

/* Parse buf[len] without checking the MAC (the fuzz target's entry; callers use verify).
 * KVL_ERR_FORMAT naming what is malformed. */
kvl_status kvl__ticket_parse(const uint8_t *buf, size_t len, kvl__ticket *out);

/* Parse, check the MAC (constant time) and the expiry against now_ms (expired, or further than
 * KVL_TICKET_MAX_LIFETIME_MS ahead).  KVL_ERR_FORMAT (malformed), KVL_ERR_MISMATCH (bad MAC:
 * "ticket MAC does not verify"), KVL_ERR_RANGE (expired / too far ahead). */
kvl_status kvl__ticket_verify(const kvl__ticket_key *key, const uint8_t *buf, size_t len,
                              uint64_t now_ms, kvl__ticket *out);

/* What the checking side expects; a NULL string or a negative number is not checked. */
typedef struct kvl__ticket_expect {
    const char *src_session, *dst_session, *source, *target;
    int64_t t0, t1;
    int replace;                         /* -1: not checked */
} kvl__ticket_expect;

/* KVL_OK when t names what e expects, else KVL_ERR_MISMATCH naming the field and both values. */
kvl_status kvl__ticket_match(const kvl__ticket *t, const kvl__ticket_expect *e);

/* Nonces seen, each kept until its ticket's expiry: a bounded table (a full table of live
 * nonces refuses new tickets rather than forgetting one). */
typedef struct kvl__ticket_replay {
    pthread_mutex_t mu;
    struct kvl__replay_entry {
        uint8_t nonce[KVL_TICKET_NONCE];
        uint64_t expiry_ms;     /* the ticket's, on the wall clock                          */
        int64_t mono_until_ms;  /* the same moment on the monotonic clock, as seen when kept */
    } *items;
    int cap, n;
} kvl__ticket_replay;

kvl_status kvl__ticket_replay_init(kvl__ticket_replay *r, int cap);
void kvl__ticket_replay_free(kvl__ticket_replay *r);
/* Record t's nonce.  KVL_ERR_MISMATCH "ticket replayed" when it is there already,
 * KVL_ERR_RANGE when the table holds cap live nonces.  now_ms: the wall clock (Unix ms, what
 * the ticket's expiry is on); mono_ms: a monotonic clock (kvl__now_ms).  A nonce is forgotten
 * only once both clocks say its ticket expired: a wall-clock step forward then back cannot
 * forget a nonce while verify still takes its ticket. */
kvl_status kvl__ticket_replay_check(kvl__ticket_replay *r, const kvl__ticket *t, uint64_t now_ms,
                                    int64_t mono_ms);

/* SHA-256 of ids[0, n) as little-endian int32s, as 64 lower-case hex digits + NUL: what a node
 * holds, compared by the router instead of a count. */
void kvl__tokens_sha256_hex(const int32_t *ids, size_t n, char out[65]);

#endif
