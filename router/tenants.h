/* router/tenants.h: API keys, tenants and per-tenant quotas of kvlingo-router.
 *
 * The key file (`api_keys:` in fleet.yaml, or --api-keys) maps keys to tenants:
 *
 *   tenants:
 *     - name: acme                   # 1-63 of [A-Za-z0-9._-]; a session belongs to its tenant
 *       keys: ["sk-acme-1"]          # raw keys (16-256 printable ASCII, no spaces or commas)
 *       key_sha256: [9f86d0...]      # and/or the keys' SHA-256 digests (64 hex digits), so
 *                                    #   the file need not hold raw keys
 *       max_sessions: 64             # open sessions at once (0: no limit; default 0)
 *       tokens_per_minute: 20000     # prompt + generated tokens (0: no limit; default 0)
 *       max_concurrent_turns: 8      # turns running at once on this router (0: no limit;
 *                                    #   default 0): the router's turn places are shared, and
 *                                    #   one tenant must not take them all
 *       admin: false                 # may call ListNodes (fleet internals); default false
 *
 * A presented key is hashed with SHA-256 (OpenSSL libcrypto) and its digest compared with
 * every digest of the table in constant time (CRYPTO_memcmp, no early exit), so neither the
 * raw keys nor the time a lookup takes say which key is close.  Bounded: at most
 * KVR_TENANTS_MAX tenants and KVR_TENANT_KEYS_MAX keys.
 *
 * Tokens per minute is a token bucket: capacity tokens_per_minute, refilled continuously at
 * tokens_per_minute / 60 per second.  A turn is admitted while the bucket holds at least one
 * token; its prompt is charged when it starts and its generated tokens when it ends, so the
 * bucket can go below zero (the debt is paid back by the refill before the next turn).  The
 * buckets live in this process: router replicas sharing a ledger each keep their own.
 *
 * Thread-safe (one mutex); kvr_tenants_replace swaps a reloaded table in, keeping the bucket
 * of every tenant whose name stays. */
#ifndef KVR_TENANTS_H
#define KVR_TENANTS_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/status.h"

#define KVR_TENANTS_MAX 256
#define KVR_TENANT_KEYS_MAX 1024          /* keys in the whole file                       */
#define KVR_TENANT_NAME_MAX 64            /* bytes including the NUL                      */
#define KVR_KEY_MIN 16
#define KVR_KEY_MAX 256
#define KVR_DEFAULT_TENANT "default"      /* anonymous clients (insecure, no key file) and
                                             sessions created before tenants existed       */

/* ---- token bucket (pure: unit-tested) ----------------------------------------------------- */

typedef struct kvr_bucket {
    double level;      /* tokens available now (may be negative: debt)                   */
    double cap;        /* tokens_per_minute                                              */
    double t;          /* time of `level`, seconds                                       */
} kvr_bucket;

/* Full bucket of `per_minute` tokens at time `now` (seconds). */
void kvr_bucket_init(kvr_bucket *b, double per_minute, double now);
/* Refill to `now`, then 1 when at least one token is there (the turn may start). */
int kvr_bucket_admit(kvr_bucket *b, double now);
/* Refill to `now`, then take n tokens (the level may go negative). */
void kvr_bucket_charge(kvr_bucket *b, double n, double now);
/* Seconds until the bucket holds one token again (0 when it does). */
double kvr_bucket_wait(const kvr_bucket *b, double now);

/* ---- the tenant table ------------------------------------------------------------------- */

typedef struct kvr_tenant_info {
    char name[KVR_TENANT_NAME_MAX];
    long max_sessions;            /* 0: no limit */
    long tokens_per_minute;       /* 0: no limit */
    long max_turns;               /* max_concurrent_turns; 0: no limit */
    int admin;
} kvr_tenant_info;

typedef struct kvr_tenants kvr_tenants;

/* Parse a key file from memory; `name` names it in messages ("FILE:LINE: key
 * 'tenants[2].keys': ...").  KVL_ERR_FORMAT naming file, line and field; KVL_ERR_NOMEM. */
kvl_status kvr_tenants_parse(const char *text, size_t len, const char *name, kvr_tenants **out);
/* Read and parse the file at `path` (the errors of kvl__svc_yaml_read, then those above). */
kvl_status kvr_tenants_load(const char *path, kvr_tenants **out);
/* The table of a router without a key file: anonymous clients are tenant "default" (admin,
 * no quotas).  kvr_tenants_open() tells the two apart. */
kvl_status kvr_tenants_anonymous(kvr_tenants **out);
void kvr_tenants_free(kvr_tenants *t);

/* 1 for the anonymous table (no keys: every client is "default"). */
int kvr_tenants_open(const kvr_tenants *t);
int kvr_tenants_count(const kvr_tenants *t);
int kvr_tenants_key_count(const kvr_tenants *t);
/* Name of tenant i (0 <= i < count), copied into buf. */
void kvr_tenants_name(kvr_tenants *t, int i, char *buf, size_t cap);

/* The tenant of `key` (len bytes; any bytes).  1 and *out filled when found, else 0. */
int kvr_tenants_lookup(kvr_tenants *t, const char *key, size_t len, kvr_tenant_info *out);
/* The tenant of an `authorization` value ("Bearer KEY", scheme case-insensitive).
 * Returns 1 (found, *out filled), 0 (a well-formed bearer key that is unknown), -1 (no value
 * or not "Bearer KEY"). */
int kvr_tenants_authorize(kvr_tenants *t, const char *value, kvr_tenant_info *out);

/* Move the keys and limits of `fresh` into `t` (fresh is freed); buckets of tenants in both
 * carry over (their capacity follows the new limit). */
void kvr_tenants_replace(kvr_tenants *t, kvr_tenants *fresh);

/* Token quota: 1 when tenant `name` may start a turn at `now` (no limit, or its bucket holds
 * a token), with `reserve` tokens (the turn's most: prompt + max_tokens) charged in the same
 * step; else 0, nothing charged, and *wait_s says when it may. */
int kvr_tenants_admit(kvr_tenants *t, const char *name, long reserve, double now, double *wait_s);
/* Charge n tokens to tenant `name` (unknown tenants, or no limit: nothing). */
void kvr_tenants_charge(kvr_tenants *t, const char *name, long n, double now);
/* Concurrent turns: 1 when tenant `name` may start one more (no limit, or fewer than its
 * max_concurrent_turns running in this process), counted until kvr_tenants_turn_end; else 0,
 * nothing counted, *running says how many run.  The counts carry over a reload. */
int kvr_tenants_turn_begin(kvr_tenants *t, const char *name, long *running);
void kvr_tenants_turn_end(kvr_tenants *t, const char *name);

/* Lower-case hex SHA-256 of `len` bytes (out: 65 bytes). */
void kvr_sha256_hex(const void *data, size_t len, char out[65]);

#endif
