/* router/config.h: the fleet configuration of kvlingo-router (fleet.yaml, libyaml).
 *
 * Example (every key, with defaults where optional):
 *
 *   listen: 127.0.0.1:7000          # Router gRPC address (required)
 *   metrics: 127.0.0.1:7001         # /metrics and /healthz (optional; absent = off)
 *   ledger: router.db               # SQLite file (relative paths are relative to this file)
 *   tokenizer: ../models/qwen3-a    # tokenizer.json or a model directory (required)
 *   session_ttl_seconds: 3600       # idle sessions expire (nodes are told to drop them)
 *   max_input_tokens: 4096          # one turn's input
 *   max_new_tokens: 1024            # one turn's max_tokens
 *   default_max_tokens: 32
 *   max_busy_sessions: 1024         # turns running at once (router memory bound)
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
 *   transfer:
 *     base_timeout_ms: 2000         # deadline = base + bytes / bytes_per_second
 *     bytes_per_second: 1.0e8       # pessimistic bandwidth for deadline sizing
 *     retries: 1
 *     node_timeout_ms: 5000         # unary calls to nodes (Info, Append, ...)
 *
 * Every error names the file, the line and the key.  Unknown keys are errors (a typo must
 * not silently fall back to a default).
 */
#ifndef KVR_CONFIG_H
#define KVR_CONFIG_H

#include <stddef.h>

#include "kvlingo/status.h"

/* A flat list of `key: value` pairs of one YAML mapping (a sequence value is joined with
 * commas), with the line of each key, so that a consumer (a policy) can validate its own keys
 * and still report lines. */
typedef struct kvr_kv {
    char *key;
    char *value;
    int line;
    int used;
} kvr_kv;

typedef struct kvr_kvlist {
    kvr_kv *items;
    int n;
    char *file;       /* for messages */
    char *section;    /* "policy", "guardrail", ... */
    int line;         /* line of the section */
} kvr_kvlist;

/* Lookups: absent -> dflt, KVL_OK.  Malformed or out of [lo, hi] -> KVL_ERR_FORMAT naming
 * "file:line: key 'section.key': ...". */
kvl_status kvr_kv_double(kvr_kvlist *l, const char *key, double dflt, double lo, double hi,
                         double *out);
kvl_status kvr_kv_int(kvr_kvlist *l, const char *key, long dflt, long lo, long hi, long *out);
kvl_status kvr_kv_bool(kvr_kvlist *l, const char *key, int dflt, int *out);
/* String value (owned by the list) or dflt. */
const char *kvr_kv_str(kvr_kvlist *l, const char *key, const char *dflt);
/* Line of a key (or of the section when absent), for messages. */
int kvr_kv_line(const kvr_kvlist *l, const char *key);
/* After all lookups: the first key never looked up is an error naming it and its line. */
kvl_status kvr_kv_check_unused(const kvr_kvlist *l);
void kvr_kvlist_clear(kvr_kvlist *l);

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
    char *ledger;             /* resolved path */
    char *tokenizer;          /* resolved path */
    double session_ttl_s;
    long max_input_tokens;
    long max_new_tokens;
    long default_max_tokens;
    long max_busy_sessions;
    kvr_node_cfg *nodes;
    int n_nodes;
    char *policy_name;
    kvr_kvlist policy;        /* the policy section minus `name` */
    double shadow_fraction;
    double kl_budget;
    double kl_alpha;
    long kl_min_samples;
    double transfer_base_ms;
    double transfer_bytes_per_s;
    long transfer_retries;
    double node_timeout_ms;
} kvr_config;

/* Parse `path`.  The policy name is checked against the known policies, and the policy's own
 * keys are validated by creating it (so `kvlingo-router --config` fails at start, and SIGHUP
 * keeps the old policy, on any error).  Free with kvr_config_free. */
kvl_status kvr_config_load(const char *path, kvr_config **out);
/* Same, from a string (for tests); `name` is used in messages and to resolve relative paths. */
kvl_status kvr_config_parse(const char *text, size_t len, const char *name, kvr_config **out);
void kvr_config_free(kvr_config *cfg);

#endif
