/* router/config.c: fleet.yaml -> kvr_config, on the YAML reading of service/yamlcfg.h (every
 * node has its line, so each error names file:line and the key, as operators need to fix a
 * fleet file without guessing).  Policies are not consulted here: the policy section is kept
 * as a key list for the policy to validate (policy.h, kvr_policy_check). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "yamlcfg.h"

/* Resolve `p` relative to the directory of `file` unless absolute. */
static char *resolve_path(const char *file, const char *p) {
    if (p[0] == '/' || !strchr(file, '/')) return strdup(p);
    const char *slash = strrchr(file, '/');
    size_t dl = (size_t)(slash - file);
    char *r = malloc(dl + 1 + strlen(p) + 1);
    if (!r) return NULL;
    memcpy(r, file, dl);
    r[dl] = '/';
    strcpy(r + dl + 1, p);
    return r;
}

static kvl_status need_str(kvl__svc_kvlist *l, const char *key, char **out) {
    const char *v = kvl__svc_kv_str(l, key, NULL);
    if (!v || !v[0])
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s%s%s' is required", l->file, l->line,
                          l->section[0] ? l->section : "", l->section[0] ? "." : "", key);
    *out = strdup(v);
    return *out ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
}

/* A node's address takes a port in [1, 65535]; a listening one may also say 0 (any free port) */
static kvl_status check_address(const char *file, int line, const char *key, const char *a, int port0) {
    kvl_status st = kvl__svc_check_hostport("", a, port0);
    if (st != KVL_OK)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': '%s' is not host:port (a port in [%d, 65535])",
                          file, line, key, a, port0 ? 0 : 1);
    return KVL_OK;
}

static kvl_status parse_nodes(kvl__svc_yaml *y, kvr_config *c, yaml_node_t *seq) {
    if (seq->type != YAML_SEQUENCE_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'nodes': expected a list", y->file,
                          kvl__svc_yaml_line(seq));
    int n = (int)(seq->data.sequence.items.top - seq->data.sequence.items.start);
    if (n < 1)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'nodes': at least one node is required",
                          y->file, kvl__svc_yaml_line(seq));
    if (n > KVR_CFG_MAX_NODES)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'nodes': %d nodes, at most %d", y->file,
                          kvl__svc_yaml_line(seq), n, KVR_CFG_MAX_NODES);
    c->nodes = calloc((size_t)n, sizeof *c->nodes);
    if (!c->nodes) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    for (int i = 0; i < n; i++) {
        yaml_node_t *m = kvl__svc_yaml_node(y, seq->data.sequence.items.start[i]);
        kvl__svc_kvlist l;
        char sect[32];
        snprintf(sect, sizeof sect, "nodes[%d]", i);
        kvl_status s = kvl__svc_yaml_map_to_list(y, m, sect, &l);
        kvr_node_cfg *nc = &c->nodes[c->n_nodes];
        nc->line = kvl__svc_yaml_line(m);
        if (!s) s = need_str(&l, "name", &nc->name);
        if (!s) s = need_str(&l, "address", &nc->address);
        if (!s) s = need_str(&l, "model", &nc->model);
        if (!s) s = kvl__svc_kv_check_unused(&l);
        static const char *const lk[] = {"name", "model", "address"};
        for (int k = 0; k < 3 && !s; k++) {
            const char *v = k == 0 ? nc->name : k == 1 ? nc->model : nc->address;
            size_t cap = k == 2 ? KVR_CFG_ADDRESS_MAX : KVR_CFG_NAME_MAX;
            if (strlen(v) >= cap)
                s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.%s': %zu characters, at most %zu",
                               y->file, kvl__svc_kv_line(&l, lk[k]), sect, lk[k], strlen(v), cap - 1);
        }
        if (!s) {
            char key[48];
            snprintf(key, sizeof key, "%s.address", sect);
            s = check_address(y->file, kvl__svc_kv_line(&l, "address"), key, nc->address, 0);
        }
        c->n_nodes++;
        for (int j = 0; !s && j < i; j++)
            if (!strcmp(c->nodes[j].name, nc->name))
                s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.name': node '%s' named twice",
                               y->file, kvl__svc_kv_line(&l, "name"), sect, nc->name);
            else if (!strcmp(c->nodes[j].address, nc->address))   /* one kvld serves one model */
                s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.address': %s is node '%s''s address too",
                               y->file, kvl__svc_kv_line(&l, "address"), sect, nc->address, c->nodes[j].name);
        kvl__svc_kvlist_clear(&l);
        if (s) return s;
    }
    return KVL_OK;
}

/* `ledger:` is a PostgreSQL URI (kept as given), "sqlite:PATH" or a plain path (both resolved
 * relative to the file, like every path of the file), or env:NAME holding one of those. */
static kvl_status ledger_value(const char *file, int line, const char *v, char **out) {
    if (!v[0]) return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'ledger' is empty", file, line);
    /* env:NAME: the connection string comes from the environment (a Kubernetes Secret), so
     * that a database password never sits in the configuration file */
    if (!strncmp(v, "env:", 4)) {
        const char *name = v + 4, *e = name[0] ? getenv(name) : NULL;
        if (!e || !e[0])
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'ledger': environment variable '%.64s' "
                              "(ledger: %.80s) is %s", file, line, name, v, name[0] ? "not set or empty" : "not named");
        if (!strncmp(e, "env:", 4))
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'ledger': '%s' names another variable", file, line, name);
        v = e;
    }
    if (!strncmp(v, "postgresql://", 13) || !strncmp(v, "postgres://", 11)) *out = strdup(v);
    else if (!strncmp(v, "sqlite:", 7)) {
        const char *path = v + 7;
        if (!strncmp(path, "//", 2)) path += 2;
        if (!path[0]) return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'ledger': no path after 'sqlite:'", file, line);
        char *r = resolve_path(file, path);
        *out = r ? malloc(strlen(r) + 8) : NULL;
        if (*out) snprintf(*out, strlen(r) + 8, "sqlite:%s", r);
        free(r);
    } else if (strstr(v, "://")) {
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'ledger': '%.40s...' is neither a path, sqlite:PATH "
                          "nor a postgresql:// URI", file, line, v);
    } else {
        *out = resolve_path(file, v);
    }
    return *out ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
}

/* replica_id: given, or hostname:port of `listen` (unique per pod, and a restarted router on
 * the same host and port reclaims its own leases at once). */
static kvl_status replica_value(kvl__svc_kvlist *top, kvr_config *c) {
    const char *v = kvl__svc_kv_str(top, "replica_id", NULL);
    char buf[KVR_CFG_NAME_MAX + 8];
    if (v) {
        size_t n = strlen(v);
        int ok = n > 0 && n < KVR_CFG_NAME_MAX;
        for (size_t i = 0; ok && i < n; i++) ok = v[i] > ' ' && v[i] < 127 && v[i] != '\'' && v[i] != '"';
        if (!ok)
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'replica_id': '%.80s' must be 1-%d printable "
                              "characters without spaces or quotes", top->file,
                              kvl__svc_kv_line(top, "replica_id"), v, KVR_CFG_NAME_MAX - 1);
        c->replica_id = strdup(v);
    } else {
        char host[KVR_CFG_NAME_MAX] = "";
        if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "router");
        host[sizeof host - 1] = 0;
        const char *colon = strrchr(c->listen, ':');
        snprintf(buf, sizeof buf, "%.40s:%.10s", host, colon ? colon + 1 : "0");
        c->replica_id = strdup(buf);
    }
    return c->replica_id ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
}

static kvl_status parse_root(kvl__svc_yaml *y, kvr_config *c, const char *name) {
    yaml_node_t *root = kvl__svc_yaml_root(y);
    if (!root) return kvl__errorf(KVL_ERR_FORMAT, "%s: empty configuration", name);
    if (root->type != YAML_MAPPING_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: expected a mapping at the top level", name,
                          kvl__svc_yaml_line(root));
    yaml_node_t *nodes = NULL, *policy = NULL, *guard = NULL, *transfer = NULL;
    kvl__svc_kvlist top;
    memset(&top, 0, sizeof top);
    top.file = strdup(name);
    top.section = strdup("");
    top.line = kvl__svc_yaml_line(root);
    int n = (int)(root->data.mapping.pairs.top - root->data.mapping.pairs.start);
    top.items = calloc((size_t)n + 1, sizeof *top.items);
    kvl_status s = (top.file && top.section && top.items) ? KVL_OK
                                                           : kvl__errorf(KVL_ERR_NOMEM, "config");
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
         !s && p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *k = kvl__svc_yaml_node(y, p->key);
        yaml_node_t *v = kvl__svc_yaml_node(y, p->value);
        const char *ks = kvl__svc_yaml_scalar(k);
        if (!ks) { s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: keys must be scalars", name, kvl__svc_yaml_line(k)); break; }
        for (yaml_node_pair_t *q = root->data.mapping.pairs.start; q < p; q++) {
            const char *qs = kvl__svc_yaml_scalar(kvl__svc_yaml_node(y, q->key));
            if (qs && !strcmp(qs, ks)) {
                s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s' given twice", name, kvl__svc_yaml_line(k), ks);
                break;
            }
        }
        if (s) break;
        if (!strcmp(ks, "nodes")) { nodes = v; continue; }
        if (!strcmp(ks, "policy")) { policy = v; continue; }
        if (!strcmp(ks, "guardrail")) { guard = v; continue; }
        if (!strcmp(ks, "transfer")) { transfer = v; continue; }
        kvl__svc_kv *kv = &top.items[top.n++];
        kv->line = kvl__svc_yaml_line(k);
        kv->key = strdup(ks);
        if (!kv->key) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        if (!s) s = kvl__svc_yaml_flat(y, v, ks, &kv->value);
    }
    /* the top-level list has an empty section: messages read "key 'listen'" */
    const char *tmp;
    if (!s) s = need_str(&top, "listen", &c->listen);
    if (!s) s = check_address(name, kvl__svc_kv_line(&top, "listen"), "listen", c->listen, 1);
    if (!s && (tmp = kvl__svc_kv_str(&top, "metrics", NULL)) && tmp[0]) {
        c->metrics = strdup(tmp);
        if (!c->metrics) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        if (!s) s = check_address(name, kvl__svc_kv_line(&top, "metrics"), "metrics", c->metrics, 1);
    }
    if (!s && (tmp = kvl__svc_kv_str(&top, "http_listen", NULL)) && tmp[0]) {
        c->http_listen = strdup(tmp);
        if (!c->http_listen) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        if (!s) s = check_address(name, kvl__svc_kv_line(&top, "http_listen"), "http_listen", c->http_listen, 1);
    }
    if (!s && (tmp = kvl__svc_kv_str(&top, "health_listen", NULL)) && tmp[0]) {
        c->health_listen = strdup(tmp);
        if (!c->health_listen) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        if (!s) s = check_address(name, kvl__svc_kv_line(&top, "health_listen"), "health_listen", c->health_listen, 1);
    }
    if (!s && (tmp = kvl__svc_kv_str(&top, "api_keys", NULL))) {
        c->api_keys_line = kvl__svc_kv_line(&top, "api_keys");
        if (!tmp[0]) s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'api_keys' is empty", name, c->api_keys_line);
        else if (!(c->api_keys = resolve_path(name, tmp))) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    }
    if (!s) s = kvl__svc_kv_double(&top, "api_keys_reload_seconds", 10, 0, 86400, &c->api_keys_reload_s);
    if (!s) s = kvl__svc_kv_int(&top, "http_max_body_bytes", 1 << 20, 1024, 1 << 28, &c->http_max_body);
    if (!s) s = kvl__svc_kv_int(&top, "http_max_connections", 64, 1, 4096, &c->http_max_conn);
    if (!s) s = kvl__svc_kv_int(&top, "http_max_connections_per_ip", 16, 0, 4096, &c->http_max_conn_per_ip);
    if (!s) s = kvl__svc_kv_int(&top, "http_idle_timeout_seconds", 30, 1, 3600, &c->http_idle_timeout_s);
    if (!s) s = kvl__svc_kv_int(&top, "prefix_index_blocks", 65536, 16, 1 << 24, &c->prefix_blocks);
    if (!s) {
        tmp = kvl__svc_kv_str(&top, "ledger", "router.db");
        c->ledger_line = kvl__svc_kv_line(&top, "ledger");
        s = ledger_value(name, c->ledger_line, tmp, &c->ledger);
    }
    if (!s) s = replica_value(&top, c);
    if (!s) s = kvl__svc_kv_double(&top, "lease_ms", 10000, 100, 3.6e6, &c->lease_ms);
    if (!s) s = kvl__svc_kv_double(&top, "lease_wait_ms", 2000, 0, 3.6e6, &c->lease_wait_ms);
    if (!s) {
        char *t = NULL;
        s = need_str(&top, "tokenizer", &t);
        if (!s) {
            c->tokenizer = resolve_path(name, t);
            c->tokenizer_given = t;
            t = NULL;
            c->tokenizer_line = kvl__svc_kv_line(&top, "tokenizer");
            if (!c->tokenizer) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        }
        free(t);
    }
    if (!s) s = kvl__svc_kv_double(&top, "session_ttl_seconds", 3600, 1, 1e9, &c->session_ttl_s);
    if (!s) s = kvl__svc_kv_int(&top, "max_input_tokens", 4096, 1, 1 << 24, &c->max_input_tokens);
    if (!s) s = kvl__svc_kv_int(&top, "max_new_tokens", 1024, 1, 1 << 24, &c->max_new_tokens);
    /* a request naming no max_tokens gets no more than any may ask for: the default follows a
     * smaller max_new_tokens, and a larger value given is refused */
    if (!s) s = kvl__svc_kv_int(&top, "default_max_tokens", c->max_new_tokens < 32 ? c->max_new_tokens : 32, 1,
                                1 << 24, &c->default_max_tokens);
    if (!s && c->default_max_tokens > c->max_new_tokens)
        s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'default_max_tokens': %ld exceeds max_new_tokens (%ld)", c->path,
                        kvl__svc_kv_line(&top, "default_max_tokens"), (long)c->default_max_tokens,
                        (long)c->max_new_tokens);
    if (!s) s = kvl__svc_kv_int(&top, "max_busy_sessions", 1024, 1, 1 << 20, &c->max_busy_sessions);
    if (!s) s = kvl__svc_kv_int(&top, "push_ahead_queue", 64, 0, 4096, &c->push_ahead_queue);
    if (!s) s = kvl__svc_kv_int(&top, "push_ahead_workers", 1, 1, 4, &c->push_ahead_workers);
    if (!s) s = kvl__svc_kv_int(&top, "push_ahead_max_tokens", 32768, 1, 1 << 24, &c->push_ahead_max_tokens);
    if (!s && (tmp = kvl__svc_kv_str(&top, "ticket_key_file", NULL)) && tmp[0]) {
        c->ticket_key_file = resolve_path(name, tmp);
        c->ticket_key_line = kvl__svc_kv_line(&top, "ticket_key_file");
        if (!c->ticket_key_file) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    }
    if (!s) s = kvl__svc_kv_bool(&top, "insecure", 0, &c->insecure);
    static const char *const tls_keys[] = {"tls_cert", "tls_key", "tls_ca"};
    for (int i = 0; i < 3 && !s; i++) {
        tmp = kvl__svc_kv_str(&top, tls_keys[i], NULL);
        if (!tmp) continue;
        if (!tmp[0]) {
            s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s' is empty", name,
                           kvl__svc_kv_line(&top, tls_keys[i]), tls_keys[i]);
            break;
        }
        char **dst = i == 0 ? &c->tls_cert : i == 1 ? &c->tls_key : &c->tls_ca;
        *dst = resolve_path(name, tmp);
        if (!*dst) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    }
    if (!s) s = kvl__svc_kv_check_unused(&top);
    kvl__svc_kvlist_clear(&top);
    if (s) return s;

    if (!nodes) return kvl__errorf(KVL_ERR_FORMAT, "%s: key 'nodes' is required", name);
    if ((s = parse_nodes(y, c, nodes))) return s;

    if (!policy) return kvl__errorf(KVL_ERR_FORMAT, "%s: key 'policy' is required", name);
    if ((s = kvl__svc_yaml_map_to_list(y, policy, "policy", &c->policy))) return s;
    {
        const char *pn = kvl__svc_kv_str(&c->policy, "name", NULL);
        if (!pn)
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'policy.name' is required", name,
                              c->policy.line);
        c->policy_name = strdup(pn);
        if (!c->policy_name) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    }

    kvl__svc_kvlist l;
    memset(&l, 0, sizeof l);
    if (guard) { if ((s = kvl__svc_yaml_map_to_list(y, guard, "guardrail", &l))) { kvl__svc_kvlist_clear(&l); return s; } }
    else { l.file = strdup(name); l.section = strdup("guardrail"); }
    if (!s) s = kvl__svc_kv_double(&l, "shadow_fraction", 0.1, 0, 1, &c->shadow_fraction);
    if (!s) s = kvl__svc_kv_double(&l, "kl_budget", 1.0, 0, 1e6, &c->kl_budget);
    if (!s) s = kvl__svc_kv_double(&l, "kl_alpha", 0.2, 1e-6, 1, &c->kl_alpha);
    if (!s) s = kvl__svc_kv_int(&l, "min_samples", 3, 1, 1000000, &c->kl_min_samples);
    if (!s) s = kvl__svc_kv_double(&l, "retry_seconds", 600, 0, 1e7, &c->kl_retry_s);
    if (!s) s = kvl__svc_kv_check_unused(&l);
    kvl__svc_kvlist_clear(&l);
    if (s) return s;

    if (transfer) { if ((s = kvl__svc_yaml_map_to_list(y, transfer, "transfer", &l))) { kvl__svc_kvlist_clear(&l); return s; } }
    else { l.file = strdup(name); l.section = strdup("transfer"); }
    if (!s) s = kvl__svc_kv_double(&l, "base_timeout_ms", 2000, 1, 3.6e6, &c->transfer_base_ms);
    if (!s) s = kvl__svc_kv_double(&l, "bytes_per_second", 1e8, 1e3, 1e13, &c->transfer_bytes_per_s);
    if (!s) s = kvl__svc_kv_int(&l, "retries", 1, 0, 10, &c->transfer_retries);
    if (!s) s = kvl__svc_kv_bool(&l, "one_call", 1, &c->transfer_one_call);
    if (!s) s = kvl__svc_kv_double(&l, "node_timeout_ms", 5000, 10, 3.6e6, &c->node_timeout_ms);
    if (!s) s = kvl__svc_kv_check_unused(&l);
    kvl__svc_kvlist_clear(&l);
    if (s) return s;

    return KVL_OK;
}

/* Document -> *out (freed here on error). */
static kvl_status from_doc(kvl__svc_yaml *y, const char *name, kvr_config **out) {
    kvr_config *c = calloc(1, sizeof *c);
    kvl_status s = c ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    if (!s && !(c->path = strdup(name))) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    if (!s) s = parse_root(y, c, name);
    kvl__svc_yaml_free(y);
    if (s) {
        kvr_config_free(c);
        return s;
    }
    *out = c;
    return KVL_OK;
}

kvl_status kvr_config_parse(const char *text, size_t len, const char *name, kvr_config **out) {
    *out = NULL;
    kvl__svc_yaml y;
    kvl_status s = kvl__svc_yaml_parse(text, len, name, &y);
    return s ? s : from_doc(&y, name, out);
}

kvl_status kvr_config_load(const char *path, kvr_config **out) {
    *out = NULL;
    kvl__svc_yaml y;
    kvl_status s = kvl__svc_yaml_read(path, &y);
    return s ? s : from_doc(&y, path, out);
}

void kvr_config_free(kvr_config *c) {
    if (!c) return;
    free(c->path);
    free(c->listen);
    free(c->metrics);
    free(c->http_listen);
    free(c->api_keys);
    free(c->ledger);
    free(c->replica_id);
    free(c->tokenizer);
    free(c->tokenizer_given);
    free(c->health_listen);
    free(c->tls_cert);
    free(c->tls_key);
    free(c->tls_ca);
    free(c->ticket_key_file);
    for (int i = 0; i < c->n_nodes; i++) {
        free(c->nodes[i].name);
        free(c->nodes[i].address);
        free(c->nodes[i].model);
    }
    free(c->nodes);
    free(c->policy_name);
    kvl__svc_kvlist_clear(&c->policy);
    free(c);
}
