/* service/yamlcfg.h: reading the YAML configuration files of kvld and kvlingo-router
 * (libyaml's document API, which gives every node its line, so each error can name
 * file:line and the key an operator has to fix).
 *
 * Two ways to consume a mapping:
 *   kvl__svc_yaml_each         walk its pairs with a callback (kvld: a flat key: value file);
 *   kvl__svc_yaml_map_to_list  flatten it into a kvl__svc_kvlist and look keys up with typed
 *                              getters, then reject leftovers (the router's sections, policies).
 * Not named yaml.h: the folder is on consumers' include path, and <yaml.h> is libyaml's. */
#ifndef KVL_SVC_YAMLCFG_H
#define KVL_SVC_YAMLCFG_H

#include <stddef.h>

#include <yaml.h>

#include "kvlingo/status.h"

/* ---- documents -------------------------------------------------------------------------- */

/* A parsed document and the name its messages use.  Owned by the caller (usually on the
 * stack); release with kvl__svc_yaml_free. */
typedef struct kvl__svc_yaml {
    yaml_document_t doc;
    char *file;
    int loaded;
} kvl__svc_yaml;

/* Parse `len` bytes of `text` (borrowed); `name` (copied) names the document in messages.
 * Strict: anchors, aliases and merge keys are refused, and so is a key given twice in any
 * mapping ("NAME:LINE: key 'K' given twice (first on line L)").
 * Errors: KVL_ERR_FORMAT "NAME:LINE: YAML error: ...", KVL_ERR_NOMEM.  On error *y needs no
 * free (kvl__svc_yaml_free is harmless). */
kvl_status kvl__svc_yaml_parse(const char *text, size_t len, const char *name, kvl__svc_yaml *y);

/* Read and parse the file at `path` (at most 16 MiB).  Errors: KVL_ERR_IO "PATH: cannot
 * open: ..." / "PATH: read error: ...", KVL_ERR_RANGE "PATH: larger than 16 MiB", and those of
 * kvl__svc_yaml_parse. */
kvl_status kvl__svc_yaml_read(const char *path, kvl__svc_yaml *y);

void kvl__svc_yaml_free(kvl__svc_yaml *y);

/* The root node (NULL for an empty document); nodes belong to y. */
yaml_node_t *kvl__svc_yaml_root(kvl__svc_yaml *y);
/* The node with document id `id` (a mapping pair's key or value, a sequence item). */
yaml_node_t *kvl__svc_yaml_node(kvl__svc_yaml *y, int id);
/* 1-based line where `n` starts (0 for NULL). */
int kvl__svc_yaml_line(const yaml_node_t *n);
/* The text of a scalar node (owned by the document), NULL for other nodes. */
const char *kvl__svc_yaml_scalar(const yaml_node_t *n);

/* Call fn for each pair of mapping `m`, in file order: `key` is the key's scalar text (NULL
 * when the key is not a scalar), `value` the value node, `line` the key's line.  Stops at the
 * first non-OK status fn returns and returns it.  (Duplicate keys were refused by the parse.) */
typedef kvl_status (*kvl__svc_yaml_pair_fn)(void *arg, const char *key, yaml_node_t *value,
                                            int line);
kvl_status kvl__svc_yaml_each(kvl__svc_yaml *y, yaml_node_t *m, kvl__svc_yaml_pair_fn fn,
                              void *arg);

/* A scalar, or a sequence of scalars joined with ',', as a malloc'ed string (*out, caller
 * frees).  `key` names the value in messages.  Errors: KVL_ERR_FORMAT "FILE:LINE: key 'KEY':
 * expected a list of scalars" / "expected a value, got a mapping", KVL_ERR_NOMEM. */
kvl_status kvl__svc_yaml_flat(kvl__svc_yaml *y, yaml_node_t *v, const char *key, char **out);

/* ---- key/value lists -------------------------------------------------------------------- */

/* A flat list of `key: value` pairs of one YAML mapping (a sequence value is joined with
 * commas), with the line of each key, so that a consumer (a policy) can validate its own keys
 * and still report lines.  All strings are owned by the list. */
typedef struct kvl__svc_kv {
    char *key;
    char *value;
    int line;
    int used;         /* set by the getters; kvl__svc_kv_check_unused reports the others */
} kvl__svc_kv;

typedef struct kvl__svc_kvlist {
    kvl__svc_kv *items;
    int n;
    char *file;       /* for messages */
    char *section;    /* "policy", "guardrail", ... ("" at the top level) */
    int line;         /* line of the section */
} kvl__svc_kvlist;

/* Mapping `m` -> *out (zeroed first; clear it with kvl__svc_kvlist_clear even on error).
 * Errors: KVL_ERR_FORMAT "FILE:LINE: key 'SECTION': expected a mapping" / "section 'SECTION':
 * keys must be scalars" / "key 'SECTION.KEY' given twice", those of kvl__svc_yaml_flat,
 * KVL_ERR_NOMEM. */
kvl_status kvl__svc_yaml_map_to_list(kvl__svc_yaml *y, yaml_node_t *m, const char *section,
                                     kvl__svc_kvlist *out);

/* Lookups mark the key used.  Absent -> dflt, KVL_OK.  Malformed or outside [lo, hi] ->
 * KVL_ERR_FORMAT naming "file:line: key 'section.key': ...". */
kvl_status kvl__svc_kv_double(kvl__svc_kvlist *l, const char *key, double dflt, double lo,
                              double hi, double *out);
kvl_status kvl__svc_kv_int(kvl__svc_kvlist *l, const char *key, long dflt, long lo, long hi,
                           long *out);
/* true/yes/1 or false/no/0 (case-insensitive words). */
kvl_status kvl__svc_kv_bool(kvl__svc_kvlist *l, const char *key, int dflt, int *out);
/* String value (owned by the list) or dflt. */
const char *kvl__svc_kv_str(kvl__svc_kvlist *l, const char *key, const char *dflt);
/* Line of a key (or of the section when absent), for messages.  Does not mark it used. */
int kvl__svc_kv_line(const kvl__svc_kvlist *l, const char *key);
/* After all lookups: the first key never looked up is KVL_ERR_FORMAT "FILE:LINE: unknown key
 * 'SECTION.KEY'" (a typo must not silently fall back to a default). */
kvl_status kvl__svc_kv_check_unused(const kvl__svc_kvlist *l);
/* Free what the list owns and zero it (NULL is a no-op). */
void kvl__svc_kvlist_clear(kvl__svc_kvlist *l);

/* ---- addresses -------------------------------------------------------------------------- */

/* Check a gRPC address "HOST:PORT" (HOST a name, an IPv4 address or a bracketed IPv6 one) as
 * written in a flag or key `what`: a non-empty host and a port of digits in [1, 65535], or 0
 * where allow_port0 (a listening address: any free port).  gRPC itself takes a port past 65535
 * modulo 65536 and a missing one as 443, so a typo would otherwise listen or dial elsewhere.
 * KVL_ERR_INVALID_ARG "WHAT 'ADDR': expected HOST:PORT" / "WHAT 'ADDR': the port must be a
 * number in [1, 65535]" (or [0, 65535]). */
kvl_status kvl__svc_check_hostport(const char *what, const char *addr, int allow_port0);

#endif
