/* router/config.h: the fleet configuration of kvlingo-router (fleet.yaml, libyaml).
 *
 * Example (every key, with defaults where optional):
 *
 *   listen: 127.0.0.1:7000          # Router gRPC address (required)
 *   metrics: 127.0.0.1:7001         # /metrics and /healthz (optional; absent = off)
 *   http_listen: 127.0.0.1:8000     # OpenAI-compatible HTTP API (optional; absent = off;
 *                                   #   --http-listen overrides it)
 *   api_keys: keys.yaml             # API keys -> tenants (router/tenants.h; relative to this
 *                                   #   file; --api-keys overrides; re-read on SIGHUP).  Absent:
 *                                   #   every client is tenant "default" (needs insecure)
 *   api_keys_reload_seconds: 10     # how often the key file is looked at (its inode, size,
 *                                   #   mtime: a Kubernetes Secret update swaps it); a changed
 *                                   #   file is reloaded as on SIGHUP.  0: on SIGHUP only
 *   http_max_body_bytes: 1048576    # a larger request body is refused (413)
 *   http_max_connections: 64        # HTTP connections at once (one thread each)
 *   http_max_connections_per_ip: 16 # of those, from one client address (0: no cap; behind a
 *                                   #   proxy every client has its address, so set 0 there and
 *                                   #   let the proxy bound slow clients)
 *   http_idle_timeout_seconds: 30   # a connection silent this long is closed (a request that
 *                                   #   trickles in byte by byte is bounded by the per-IP cap)
 *   prefix_index_blocks: 65536      # entries (16-token blocks) of the prefix index that maps a
 *                                   #   stateless request to the session it extends (LRU)
 *   ledger: router.db               # SQLite file (relative paths are relative to this file),
 *                                   # sqlite:PATH, or postgresql://user:pw@host:5432/db (libpq
 *                                   # URI: any number of replicas share one such ledger), or
 *                                   # env:NAME: one of those from environment variable NAME
 *   replica_id: r1                  # this router's name in session leases (default
 *                                   # hostname:listen-port; unique per replica)
 *   lease_ms: 10000                 # a session's lease while a turn runs (renewed every third)
 *   lease_wait_ms: 2000             # a turn whose session another replica drives waits this
 *                                   # long for the lease, then answers ABORTED
 *   tokenizer: ../models/qwen3-a    # tokenizer.json or a model directory (required)
 *   session_ttl_seconds: 3600       # idle sessions expire (nodes are told to drop them)
 *   max_input_tokens: 4096          # one turn's input
 *   max_new_tokens: 1024            # one turn's max_tokens
 *   default_max_tokens: 32
 *   max_busy_sessions: 1024         # turns running at once (router memory bound)
 *   push_ahead_queue: 64            # span pushes waiting for a worker (router/push_ahead.h); a
 *                                   #   full queue drops the push.  0: push-ahead off
 *   push_ahead_workers: 1           # background threads shipping pushed spans (1..4)
 *   push_ahead_max_tokens: 32768    # a longer span is not pushed (the next switch ships it)
 *   ticket_key_file: fleet.key      # the fleet's transfer-ticket key (>= 32 bytes; the nodes'
 *                                   #   --ticket-key-file): every span move gets a ticket
 *   tls_cert: router.pem            # the router's certificate: its server identity towards
 *                                   #   clients and its client certificate towards nodes
 *   tls_key: router-key.pem         # its private key (unencrypted PEM)
 *   tls_ca: ca.pem                  # the fleet CA: verifies the nodes' certificates (and is the
 *                                   #   CA clients use to verify the router)
 *   health_listen: 0.0.0.0:7002     # plaintext gRPC port serving only grpc.health.v1 (the
 *                                   #   Router API's health), for probes without TLS (optional)
 *   insecure: false                 # true: plaintext gRPC to clients and nodes (no TLS; then
 *                                   #   no tls_* key); --insecure sets it too.  Without TLS keys
 *                                   #   and without insecure the router refuses to start
 *   nodes:                          # at least one
 *     - {name: a0, address: 127.0.0.1:7100, model: qwen3-a}
 *   policy:                         # name + the policy's own keys (see router/policy_*.c)
 *     name: cascade
 *     models: [qwen3-a, qwen3-b]
 *   guardrail:
 *     shadow_fraction: 0.1          # fraction of translated switches also shadowed
 *     kl_budget: 1.0                # nats; pair disabled when its moving KL exceeds it
 *     kl_alpha: 0.2                 # EMA weight of a new sample
 *     min_samples: 3                # samples before a pair can be disabled
 *     retry_seconds: 600            # a disabled pair's probation after this (doubling each
 *                                   # failed one, up to a day); 0: disabled until SIGHUP
 *   transfer:
 *     base_timeout_ms: 2000         # deadline = base + bytes / bytes_per_second
 *     bytes_per_second: 1.0e8       # pessimistic bandwidth for deadline sizing
 *     retries: 1
 *     node_timeout_ms: 5000         # unary calls to nodes (Info, Append, ...)
 *
 * Every error names the file, the line and the key.  Unknown keys are errors (a typo must
 * not silently fall back to a default).  The key lists and typed getters come from
 * service/yamlcfg.h (kvl__svc_kvlist, kvl__svc_kv_*).
 */
#ifndef KVR_CONFIG_H
#define KVR_CONFIG_H

#include <stddef.h>

#include "kvlingo/status.h"
#include "yamlcfg.h"

/* Limits a start enforces, checked at parse time so --check refuses what start would. */
#define KVR_CFG_MAX_NODES 32      /* nodes in one fleet                                  */
#define KVR_CFG_NAME_MAX 64       /* node and model names, bytes including the NUL       */
#define KVR_CFG_ADDRESS_MAX 128   /* node addresses, bytes including the NUL             */

typedef struct kvr_node_cfg {
    char *name;
    char *address;
    char *model;
    int line;
} kvr_node_cfg;

typedef struct kvr_config {
    char *path;
    char *listen;
    char *metrics;            /* NULL: no metrics server */
    char *http_listen;        /* NULL: no OpenAI-compatible HTTP server */
    char *api_keys;           /* resolved path of the key file; NULL: no keys */
    int api_keys_line;
    double api_keys_reload_s; /* 0: reload on SIGHUP only */
    long http_max_body;
    long http_max_conn;
    long http_max_conn_per_ip;   /* 0: no per-address cap */
    long http_idle_timeout_s;
    long prefix_blocks;
    char *ledger;             /* resolved path */
    char *tokenizer;          /* resolved path */
    char *tokenizer_given;    /* as the file spells it */
    int tokenizer_line, ledger_line;
    char *replica_id;         /* never NULL after a load */
    double lease_ms, lease_wait_ms;
    double session_ttl_s;
    long max_input_tokens;
    long max_new_tokens;
    long default_max_tokens;
    long max_busy_sessions;
    long push_ahead_queue;    /* 0: push-ahead off router-wide */
    long push_ahead_workers;
    long push_ahead_max_tokens;
    char *ticket_key_file;    /* resolved path; NULL: none (--ticket-key-file overrides) */
    int ticket_key_line;
    kvr_node_cfg *nodes;
    int n_nodes;
    char *policy_name;
    kvl__svc_kvlist policy;        /* the policy section minus `name` */
    double shadow_fraction;
    double kl_budget;
    double kl_alpha;
    long kl_min_samples;
    double kl_retry_s;
    double transfer_base_ms;
    double transfer_bytes_per_s;
    long transfer_retries;
    int transfer_one_call;    /* 1: a turn is one ContinueTurn call on nodes that serve it */
    double node_timeout_ms;
    int insecure;             /* 1: plaintext gRPC (YAML insecure: true or --insecure) */
    char *tls_cert, *tls_key, *tls_ca;   /* resolved paths; NULL when not set */
    char *health_listen;      /* NULL: no plaintext health port */
} kvr_config;

/* Parse `path`.  Checks every key of the file but the policy's own (`policy.name` must be
 * present; whether it names a known policy, and the policy's keys, are checked by
 * kvr_policy_check in policy.h, which the router runs at start, on --check and on SIGHUP).
 * Errors: KVL_ERR_FORMAT naming file:line and the key, KVL_ERR_IO / KVL_ERR_RANGE for the file,
 * KVL_ERR_NOMEM.  *out is owned by the caller: free with kvr_config_free. */
kvl_status kvr_config_load(const char *path, kvr_config **out);
/* Same, from a string (for tests); `name` is used in messages and to resolve relative paths. */
kvl_status kvr_config_parse(const char *text, size_t len, const char *name, kvr_config **out);
void kvr_config_free(kvr_config *cfg);

#endif
