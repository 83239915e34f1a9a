/* router/config.c: fleet.yaml -> kvr_config.  libyaml's document API gives every node its line
 * (start_mark), so each error names file:line and the key, as operators need to fix a fleet
 * file without guessing. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <yaml.h>

#include "error.h"
#include "policy.h"

/* ---- key/value lists ----------------------------------------------------------------------- */

/* "section.key", or "key" at the top level, for messages */
static const char *qual(const kvr_kvlist *l, const char *key, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s%s", l->section && l->section[0] ? l->section : "",
             l->section && l->section[0] ? "." : "", key);
    return buf;
}

static kvr_kv *kv_find(kvr_kvlist *l, const char *key) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].key, key)) { l->items[i].used = 1; return &l->items[i]; }
    return NULL;
}

int kvr_kv_line(const kvr_kvlist *l, const char *key) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].key, key)) return l->items[i].line;
    return l->line;
}

kvl_status kvr_kv_double(kvr_kvlist *l, const char *key, double dflt, double lo, double hi,
                         double *out) {
    char q[160];
    kvr_kv *kv = kv_find(l, key);
    *out = dflt;
    if (!kv) return KVL_OK;
    char *end = NULL;
    errno = 0;
    double v = strtod(kv->value, &end);
    if (errno || end == kv->value || *end || !isfinite(v))
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': expected a number, got '%s'",
                          l->file, kv->line, qual(l, key, q, sizeof q), kv->value);
    if (v < lo || v > hi)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': %g is outside [%g, %g]", l->file,
                          kv->line, qual(l, key, q, sizeof q), v, lo, hi);
    *out = v;
    return KVL_OK;
}

kvl_status kvr_kv_int(kvr_kvlist *l, const char *key, long dflt, long lo, long hi, long *out) {
    char q[160];
    kvr_kv *kv = kv_find(l, key);
    *out = dflt;
    if (!kv) return KVL_OK;
    char *end = NULL;
    errno = 0;
    long v = strtol(kv->value, &end, 10);
    if (errno || end == kv->value || *end)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': expected an integer, got '%s'",
                          l->file, kv->line, qual(l, key, q, sizeof q), kv->value);
    if (v < lo || v > hi)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': %ld is outside [%ld, %ld]",
                          l->file, kv->line, qual(l, key, q, sizeof q), v, lo, hi);
    *out = v;
    return KVL_OK;
}

kvl_status kvr_kv_bool(kvr_kvlist *l, const char *key, int dflt, int *out) {
    char q[160];
    kvr_kv *kv = kv_find(l, key);
    *out = dflt;
    if (!kv) return KVL_OK;
    if (!strcasecmp(kv->value, "true") || !strcasecmp(kv->value, "yes") || !strcmp(kv->value, "1"))
        *out = 1;
    else if (!strcasecmp(kv->value, "false") || !strcasecmp(kv->value, "no") ||
             !strcmp(kv->value, "0"))
        *out = 0;
    else
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': expected true or false, got '%s'",
                          l->file, kv->line, qual(l, key, q, sizeof q), kv->value);
    return KVL_OK;
}

const char *kvr_kv_str(kvr_kvlist *l, const char *key, const char *dflt) {
    kvr_kv *kv = kv_find(l, key);
    return kv ? kv->value : dflt;
}

kvl_status kvr_kv_check_unused(const kvr_kvlist *l) {
    char q[160];
    for (int i = 0; i < l->n; i++)
        if (!l->items[i].used)
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: unknown key '%s'", l->file,
                              l->items[i].line, qual(l, l->items[i].key, q, sizeof q));
    return KVL_OK;
}

void kvr_kvlist_clear(kvr_kvlist *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) { free(l->items[i].key); free(l->items[i].value); }
    free(l->items);
    free(l->file);
    free(l->section);
    memset(l, 0, sizeof *l);
}

/* ---- YAML helpers -------------------------------------------------------------------------- */

typedef struct yctx {
    yaml_document_t doc;
    const char *file;
} yctx;

static int yline(const yaml_node_t *n) { return n ? (int)n->start_mark.line + 1 : 0; }

static const char *yscalar(const yaml_node_t *n) {
    return (n && n->type == YAML_SCALAR_NODE) ? (const char *)n->data.scalar.value : NULL;
}

/* Flatten a scalar, or a sequence of scalars joined with ',', into a malloc'ed string. */
static kvl_status yflat(yctx *y, yaml_node_t *v, const char *key, char **out) {
    *out = NULL;
    if (v->type == YAML_SCALAR_NODE) {
        *out = strdup(yscalar(v));
    } else if (v->type == YAML_SEQUENCE_NODE) {
        size_t cap = 1;
        for (yaml_node_item_t *it = v->data.sequence.items.start;
             it < v->data.sequence.items.top; it++) {
            const char *s = yscalar(yaml_document_get_node(&y->doc, *it));
            if (!s)
                return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': expected a list of scalars",
                                  y->file, yline(v), key);
            cap += strlen(s) + 1;
        }
        char *buf = calloc(1, cap);
        if (!buf) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        for (yaml_node_item_t *it = v->data.sequence.items.start;
             it < v->data.sequence.items.top; it++) {
            if (buf[0]) strcat(buf, ",");
            strcat(buf, yscalar(yaml_document_get_node(&y->doc, *it)));
        }
        *out = buf;
    } else {
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': expected a value, got a mapping",
                          y->file, yline(v), key);
    }
    return *out ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
}

/* Mapping -> kvr_kvlist (values flattened). */
static kvl_status ymap_to_list(yctx *y, yaml_node_t *m, const char *section, kvr_kvlist *out) {
    memset(out, 0, sizeof *out);
    out->file = strdup(y->file);
    out->section = strdup(section);
    out->line = yline(m);
    if (!out->file || !out->section) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    if (m->type != YAML_MAPPING_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': expected a mapping", y->file,
                          yline(m), section);
    int n = (int)(m->data.mapping.pairs.top - m->data.mapping.pairs.start);
    out->items = calloc(n ? (size_t)n : 1, sizeof *out->items);
    if (!out->items) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(&y->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&y->doc, p->value);
        const char *ks = yscalar(k);
        if (!ks)
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: section '%s': keys must be scalars",
                              y->file, yline(k), section);
        for (int i = 0; i < out->n; i++)
            if (!strcmp(out->items[i].key, ks))
                return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.%s' given twice", y->file,
                                  yline(k), section, ks);
        kvr_kv *kv = &out->items[out->n];
        kv->key = strdup(ks);
        kv->line = yline(k);
        if (!kv->key) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        out->n++;
        char full[160];
        snprintf(full, sizeof full, "%s.%s", section, ks);
        kvl_status s = yflat(y, v, full, &kv->value);
        if (s) return s;
    }
    return KVL_OK;
}

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

static kvl_status need_str(kvr_kvlist *l, const char *key, char **out) {
    const char *v = kvr_kv_str(l, key, NULL);
    if (!v || !v[0])
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s%s%s' is required", l->file, l->line,
                          l->section[0] ? l->section : "", l->section[0] ? "." : "", key);
    *out = strdup(v);
    return *out ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
}

static kvl_status check_address(const char *file, int line, const char *key, const char *a) {
    const char *colon = strrchr(a, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == a || !end || *end || port < 0 || port > 65535)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': '%s' is not host:port", file, line,
                          key, a);
    return KVL_OK;
}

static kvl_status parse_nodes(yctx *y, kvr_config *c, yaml_node_t *seq) {
    if (seq->type != YAML_SEQUENCE_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'nodes': expected a list", y->file,
                          yline(seq));
    int n = (int)(seq->data.sequence.items.top - seq->data.sequence.items.start);
    if (n < 1)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'nodes': at least one node is required",
                          y->file, yline(seq));
    c->nodes = calloc((size_t)n, sizeof *c->nodes);
    if (!c->nodes) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    for (int i = 0; i < n; i++) {
        yaml_node_t *m = yaml_document_get_node(&y->doc, seq->data.sequence.items.start[i]);
        kvr_kvlist l;
        char sect[32];
        snprintf(sect, sizeof sect, "nodes[%d]", i);
        kvl_status s = ymap_to_list(y, m, sect, &l);
        kvr_node_cfg *nc = &c->nodes[c->n_nodes];
        nc->line = yline(m);
        if (!s) s = need_str(&l, "name", &nc->name);
        if (!s) s = need_str(&l, "address", &nc->address);
        if (!s) s = need_str(&l, "model", &nc->model);
        if (!s) s = kvr_kv_check_unused(&l);
        if (!s) {
            char key[48];
            snprintf(key, sizeof key, "%s.address", sect);
            s = check_address(y->file, kvr_kv_line(&l, "address"), key, nc->address);
        }
        c->n_nodes++;
        for (int j = 0; !s && j < i; j++)
            if (!strcmp(c->nodes[j].name, nc->name))
                s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.name': node '%s' named twice",
                               y->file, kvr_kv_line(&l, "name"), sect, nc->name);
        kvr_kvlist_clear(&l);
        if (s) return s;
    }
    return KVL_OK;
}

static kvl_status parse_root(yctx *y, kvr_config *c, const char *name) {
    yaml_node_t *root = yaml_document_get_root_node(&y->doc);
    if (!root) return kvl__errorf(KVL_ERR_FORMAT, "%s: empty configuration", name);
    if (root->type != YAML_MAPPING_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: expected a mapping at the top level", name,
                          yline(root));
    yaml_node_t *nodes = NULL, *policy = NULL, *guard = NULL, *transfer = NULL;
    kvr_kvlist top;
    memset(&top, 0, sizeof top);
    top.file = strdup(name);
    top.section = strdup("");
    top.line = yline(root);
    int n = (int)(root->data.mapping.pairs.top - root->data.mapping.pairs.start);
    top.items = calloc((size_t)n + 1, sizeof *top.items);
    kvl_status s = (top.file && top.section && top.items) ? KVL_OK
                                                           : kvl__errorf(KVL_ERR_NOMEM, "config");
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
         !s && p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(&y->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&y->doc, p->value);
        const char *ks = yscalar(k);
        if (!ks) { s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: keys must be scalars", name, yline(k)); break; }
        for (yaml_node_pair_t *q = root->data.mapping.pairs.start; q < p; q++) {
            const char *qs = yscalar(yaml_document_get_node(&y->doc, q->key));
            if (qs && !strcmp(qs, ks)) {
                s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s' given twice", name, yline(k), ks);
                break;
            }
        }
        if (s) break;
        if (!strcmp(ks, "nodes")) { nodes = v; continue; }
        if (!strcmp(ks, "policy")) { policy = v; continue; }
        if (!strcmp(ks, "guardrail")) { guard = v; continue; }
        if (!strcmp(ks, "transfer")) { transfer = v; continue; }
        kvr_kv *kv = &top.items[top.n++];
        kv->line = yline(k);
        kv->key = strdup(ks);
        if (!kv->key) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        if (!s) s = yflat(y, v, ks, &kv->value);
    }
    /* the top-level list has an empty section: messages read "key 'listen'" */
    const char *tmp;
    if (!s) s = need_str(&top, "listen", &c->listen);
    if (!s) s = check_address(name, kvr_kv_line(&top, "listen"), "listen", c->listen);
    if (!s && (tmp = kvr_kv_str(&top, "metrics", NULL)) && tmp[0]) {
        c->metrics = strdup(tmp);
        if (!c->metrics) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        if (!s) s = check_address(name, kvr_kv_line(&top, "metrics"), "metrics", c->metrics);
    }
    if (!s) {
        tmp = kvr_kv_str(&top, "ledger", "router.db");
        c->ledger = resolve_path(name, tmp);
        if (!c->ledger) s = kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    }
    if (!s) {
        char *t = NULL;
        s = need_str(&top, "tokenizer", &t);
        if (!s) { c->tokenizer = resolve_path(name, t); if (!c->tokenizer) s = KVL_ERR_NOMEM; }
        free(t);
    }
    if (!s) s = kvr_kv_double(&top, "session_ttl_seconds", 3600, 1, 1e9, &c->session_ttl_s);
    if (!s) s = kvr_kv_int(&top, "max_input_tokens", 4096, 1, 1 << 24, &c->max_input_tokens);
    if (!s) s = kvr_kv_int(&top, "max_new_tokens", 1024, 1, 1 << 24, &c->max_new_tokens);
    if (!s) s = kvr_kv_int(&top, "default_max_tokens", 32, 1, 1 << 24, &c->default_max_tokens);
    if (!s) s = kvr_kv_int(&top, "max_busy_sessions", 1024, 1, 1 << 20, &c->max_busy_sessions);
    if (!s) s = kvr_kv_check_unused(&top);
    kvr_kvlist_clear(&top);
    if (s) return s;

    if (!nodes) return kvl__errorf(KVL_ERR_FORMAT, "%s: key 'nodes' is required", name);
    if ((s = parse_nodes(y, c, nodes))) return s;

    if (!policy) return kvl__errorf(KVL_ERR_FORMAT, "%s: key 'policy' is required", name);
    if ((s = ymap_to_list(y, policy, "policy", &c->policy))) return s;
    {
        const char *pn = kvr_kv_str(&c->policy, "name", NULL);
        if (!pn)
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'policy.name' is required", name,
                              c->policy.line);
        if (!kvr_policy_find(pn))
            return kvl__errorf(KVL_ERR_FORMAT,
                              "%s:%d: key 'policy.name': unknown policy '%s' (known: %s)", name,
                              kvr_kv_line(&c->policy, "name"), pn, kvr_policy_names());
        c->policy_name = strdup(pn);
        if (!c->policy_name) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    }

    kvr_kvlist l;
    memset(&l, 0, sizeof l);
    if (guard) { if ((s = ymap_to_list(y, guard, "guardrail", &l))) { kvr_kvlist_clear(&l); return s; } }
    else { l.file = strdup(name); l.section = strdup("guardrail"); }
    if (!s) s = kvr_kv_double(&l, "shadow_fraction", 0.1, 0, 1, &c->shadow_fraction);
    if (!s) s = kvr_kv_double(&l, "kl_budget", 1.0, 0, 1e6, &c->kl_budget);
    if (!s) s = kvr_kv_double(&l, "kl_alpha", 0.2, 1e-6, 1, &c->kl_alpha);
    if (!s) s = kvr_kv_int(&l, "min_samples", 3, 1, 1000000, &c->kl_min_samples);
    if (!s) s = kvr_kv_check_unused(&l);
    kvr_kvlist_clear(&l);
    if (s) return s;

    if (transfer) { if ((s = ymap_to_list(y, transfer, "transfer", &l))) { kvr_kvlist_clear(&l); return s; } }
    else { l.file = strdup(name); l.section = strdup("transfer"); }
    if (!s) s = kvr_kv_double(&l, "base_timeout_ms", 2000, 1, 3.6e6, &c->transfer_base_ms);
    if (!s) s = kvr_kv_double(&l, "bytes_per_second", 1e8, 1e3, 1e13, &c->transfer_bytes_per_s);
    if (!s) s = kvr_kv_int(&l, "retries", 1, 0, 10, &c->transfer_retries);
    if (!s) s = kvr_kv_double(&l, "node_timeout_ms", 5000, 10, 3.6e6, &c->node_timeout_ms);
    if (!s) s = kvr_kv_check_unused(&l);
    kvr_kvlist_clear(&l);
    if (s) return s;

    /* validate the policy's own keys now: a bad key fails the load, not the first turn */
    kvr_policy *pol = NULL;
    s = kvr_policy_create(c, &pol);
    kvr_policy_free(pol);
    return s;
}

kvl_status kvr_config_parse(const char *text, size_t len, const char *name, kvr_config **out) {
    *out = NULL;
    kvr_config *c = calloc(1, sizeof *c);
    if (!c) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    c->path = strdup(name);
    if (!c->path) { free(c); return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory"); }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        kvr_config_free(c);
        return kvl__errorf(KVL_ERR_NOMEM, "config: yaml parser");
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    yctx y = {.file = name};
    kvl_status s = KVL_OK;
    if (!yaml_parser_load(&parser, &y.doc)) {
        s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: YAML error: %s", name,
                       (int)parser.problem_mark.line + 1,
                       parser.problem ? parser.problem : "malformed");
        yaml_parser_delete(&parser);
        kvr_config_free(c);
        return s;
    }
    s = parse_root(&y, c, name);
    yaml_document_delete(&y.doc);
    yaml_parser_delete(&parser);
    if (s) { kvr_config_free(c); return s; }
    *out = c;
    return KVL_OK;
}

kvl_status kvr_config_load(const char *path, kvr_config **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kvl__errorf(KVL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            if (cap > (1u << 24)) { fclose(f); free(buf); return kvl__errorf(KVL_ERR_RANGE, "%s: larger than 16 MiB", path); }
            char *nb = realloc(buf, cap * 2 + 8192);
            if (!nb) { fclose(f); free(buf); return kvl__errorf(KVL_ERR_NOMEM, "config"); }
            buf = nb;
            cap = cap * 2 + 8192;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) { free(buf); return kvl__errorf(KVL_ERR_IO, "%s: read error", path); }
    kvl_status s = kvr_config_parse(buf, len, path, out);
    free(buf);
    return s;
}

void kvr_config_free(kvr_config *c) {
    if (!c) return;
    free(c->path);
    free(c->listen);
    free(c->metrics);
    free(c->ledger);
    free(c->tokenizer);
    for (int i = 0; i < c->n_nodes; i++) {
        free(c->nodes[i].name);
        free(c->nodes[i].address);
        free(c->nodes[i].model);
    }
    free(c->nodes);
    free(c->policy_name);
    kvr_kvlist_clear(&c->policy);
    free(c);
}
