/* service/yamlcfg.c: YAML documents, mapping walks and key/value lists (yamlcfg.h). */
#include "yamlcfg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "file.h"

#define MAX_FILE_BYTES (16u << 20)

/* ---- documents -------------------------------------------------------------------------- */

/* Strict YAML, pass 1 (events): anchors, aliases and merge keys are refused, so what a file
 * says is what it reads as (an alias silently shares a value; a merge key hides where a key
 * came from). */
static kvl_status refuse_aliases(const char *text, size_t len, const char *name) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return kvl__errorf(KVL_ERR_NOMEM, "config: yaml parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    kvl_status s = KVL_OK;
    for (int done = 0; !done && s == KVL_OK;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) break;   /* the load reports syntax errors */
        int line = (int)ev.start_mark.line + 1;
        const unsigned char *anchor = NULL;
        if (ev.type == YAML_ALIAS_EVENT)
            s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: YAML alias '*%s' refused: aliases and anchors are "
                           "not allowed in a configuration (write the value out)", name, line,
                           (const char *)ev.data.alias.anchor);
        else if (ev.type == YAML_SCALAR_EVENT) anchor = ev.data.scalar.anchor;
        else if (ev.type == YAML_SEQUENCE_START_EVENT) anchor = ev.data.sequence_start.anchor;
        else if (ev.type == YAML_MAPPING_START_EVENT) anchor = ev.data.mapping_start.anchor;
        if (s == KVL_OK && anchor)
            s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: YAML anchor '&%s' refused: aliases and anchors are "
                           "not allowed in a configuration (write the value out)", name, line,
                           (const char *)anchor);
        if (s == KVL_OK && ev.type == YAML_SCALAR_EVENT && ev.data.scalar.plain_implicit &&
            !strcmp((const char *)ev.data.scalar.value, "<<"))
            s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: YAML merge key '<<' refused (write the keys out)",
                           name, line);
        done = ev.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return s;
}

/* Strict YAML, pass 2 (document): a key given twice in any mapping is an error naming both
 * lines (libyaml keeps both pairs and readers would silently take one). */
static kvl_status refuse_duplicates(kvl__svc_yaml *y) {
    for (yaml_node_t *m = y->doc.nodes.start; m < y->doc.nodes.top; m++) {
        if (m->type != YAML_MAPPING_NODE) continue;
        for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
            yaml_node_t *k = kvl__svc_yaml_node(y, p->key);
            const char *ks = kvl__svc_yaml_scalar(k);
            for (yaml_node_pair_t *q = m->data.mapping.pairs.start; ks && q < p; q++) {
                yaml_node_t *kq = kvl__svc_yaml_node(y, q->key);
                const char *qs = kvl__svc_yaml_scalar(kq);
                if (qs && !strcmp(qs, ks))
                    return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s' given twice (first on line %d)",
                                      y->file, kvl__svc_yaml_line(k), ks, kvl__svc_yaml_line(kq));
            }
        }
    }
    return KVL_OK;
}

kvl_status kvl__svc_yaml_parse(const char *text, size_t len, const char *name, kvl__svc_yaml *y) {
    memset(y, 0, sizeof *y);
    y->file = strdup(name);
    if (!y->file) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        kvl__svc_yaml_free(y);
        return kvl__errorf(KVL_ERR_NOMEM, "config: yaml parser");
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    kvl_status s = KVL_OK;
    if (!yaml_parser_load(&parser, &y->doc)) {
        s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: YAML error: %s", name,
                       (int)parser.problem_mark.line + 1,
                       parser.problem ? parser.problem : "malformed");
        kvl__svc_yaml_free(y);
    } else {
        y->loaded = 1;
    }
    yaml_parser_delete(&parser);
    if (s == KVL_OK) s = refuse_aliases(text, len, name);
    if (s == KVL_OK) s = refuse_duplicates(y);
    if (s != KVL_OK) kvl__svc_yaml_free(y);
    return s;
}

kvl_status kvl__svc_yaml_read(const char *path, kvl__svc_yaml *y) {
    memset(y, 0, sizeof *y);
    char *buf = NULL;
    size_t len = 0;
    kvl_status s = kvl__file_read(path, MAX_FILE_BYTES, 0, &buf, &len);
    if (s == KVL_ERR_RANGE) return kvl__errorf(KVL_ERR_RANGE, "%s: larger than 16 MiB", path);
    if (s) return s;
    s = kvl__svc_yaml_parse(buf, len, path, y);
    free(buf);
    return s;
}

void kvl__svc_yaml_free(kvl__svc_yaml *y) {
    if (!y) return;
    if (y->loaded) yaml_document_delete(&y->doc);
    free(y->file);
    memset(y, 0, sizeof *y);
}

yaml_node_t *kvl__svc_yaml_root(kvl__svc_yaml *y) {
    return y->loaded ? yaml_document_get_root_node(&y->doc) : NULL;
}

yaml_node_t *kvl__svc_yaml_node(kvl__svc_yaml *y, int id) {
    return y->loaded ? yaml_document_get_node(&y->doc, id) : NULL;
}

int kvl__svc_yaml_line(const yaml_node_t *n) { return n ? (int)n->start_mark.line + 1 : 0; }

const char *kvl__svc_yaml_scalar(const yaml_node_t *n) {
    return (n && n->type == YAML_SCALAR_NODE) ? (const char *)n->data.scalar.value : NULL;
}

kvl_status kvl__svc_yaml_each(kvl__svc_yaml *y, yaml_node_t *m, kvl__svc_yaml_pair_fn fn,
                              void *arg) {
    if (!m || m->type != YAML_MAPPING_NODE) return KVL_OK;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = kvl__svc_yaml_node(y, p->key);
        kvl_status s = fn(arg, kvl__svc_yaml_scalar(k), kvl__svc_yaml_node(y, p->value),
                          kvl__svc_yaml_line(k));
        if (s) return s;
    }
    return KVL_OK;
}

/* Flatten a scalar, or a sequence of scalars joined with ',', into a malloc'ed string. */
kvl_status kvl__svc_yaml_flat(kvl__svc_yaml *y, yaml_node_t *v, const char *key, char **out) {
    *out = NULL;
    if (v->type == YAML_SCALAR_NODE) {
        *out = strdup(kvl__svc_yaml_scalar(v));
    } else if (v->type == YAML_SEQUENCE_NODE) {
        size_t cap = 1;
        for (yaml_node_item_t *it = v->data.sequence.items.start;
             it < v->data.sequence.items.top; it++) {
            const char *s = kvl__svc_yaml_scalar(kvl__svc_yaml_node(y, *it));
            if (!s)
                return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': expected a list of scalars",
                                  y->file, kvl__svc_yaml_line(v), key);
            cap += strlen(s) + 1;
        }
        char *buf = calloc(1, cap);
        if (!buf) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        for (yaml_node_item_t *it = v->data.sequence.items.start;
             it < v->data.sequence.items.top; it++) {
            if (buf[0]) strcat(buf, ",");
            strcat(buf, kvl__svc_yaml_scalar(kvl__svc_yaml_node(y, *it)));
        }
        *out = buf;
    } else {
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': expected a value, got a mapping",
                          y->file, kvl__svc_yaml_line(v), key);
    }
    return *out ? KVL_OK : kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
}

kvl_status kvl__svc_yaml_map_to_list(kvl__svc_yaml *y, yaml_node_t *m, const char *section,
                                     kvl__svc_kvlist *out) {
    memset(out, 0, sizeof *out);
    out->file = strdup(y->file);
    out->section = strdup(section);
    out->line = kvl__svc_yaml_line(m);
    if (!out->file || !out->section) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    if (m->type != YAML_MAPPING_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': expected a mapping", y->file,
                          kvl__svc_yaml_line(m), section);
    int n = (int)(m->data.mapping.pairs.top - m->data.mapping.pairs.start);
    out->items = calloc(n ? (size_t)n : 1, sizeof *out->items);
    if (!out->items) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = kvl__svc_yaml_node(y, p->key);
        yaml_node_t *v = kvl__svc_yaml_node(y, p->value);
        const char *ks = kvl__svc_yaml_scalar(k);
        if (!ks)
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: section '%s': keys must be scalars",
                              y->file, kvl__svc_yaml_line(k), section);
        for (int i = 0; i < out->n; i++)
            if (!strcmp(out->items[i].key, ks))
                return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.%s' given twice", y->file,
                                  kvl__svc_yaml_line(k), section, ks);
        kvl__svc_kv *kv = &out->items[out->n];
        kv->key = strdup(ks);
        kv->line = kvl__svc_yaml_line(k);
        if (!kv->key) return kvl__errorf(KVL_ERR_NOMEM, "config: out of memory");
        out->n++;
        char full[160];
        snprintf(full, sizeof full, "%s.%s", section, ks);
        kvl_status s = kvl__svc_yaml_flat(y, v, full, &kv->value);
        if (s) return s;
    }
    return KVL_OK;
}

/* ---- key/value lists -------------------------------------------------------------------- */

/* "section.key", or "key" at the top level, for messages */
static const char *qual(const kvl__svc_kvlist *l, const char *key, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s%s", l->section && l->section[0] ? l->section : "",
             l->section && l->section[0] ? "." : "", key);
    return buf;
}

static kvl__svc_kv *kv_find(kvl__svc_kvlist *l, const char *key) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].key, key)) { l->items[i].used = 1; return &l->items[i]; }
    return NULL;
}

int kvl__svc_kv_line(const kvl__svc_kvlist *l, const char *key) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].key, key)) return l->items[i].line;
    return l->line;
}

kvl_status kvl__svc_kv_double(kvl__svc_kvlist *l, const char *key, double dflt, double lo,
                              double hi, double *out) {
    char q[160];
    kvl__svc_kv *kv = kv_find(l, key);
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

kvl_status kvl__svc_kv_int(kvl__svc_kvlist *l, const char *key, long dflt, long lo, long hi,
                           long *out) {
    char q[160];
    kvl__svc_kv *kv = kv_find(l, key);
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

kvl_status kvl__svc_kv_bool(kvl__svc_kvlist *l, const char *key, int dflt, int *out) {
    char q[160];
    kvl__svc_kv *kv = kv_find(l, key);
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

const char *kvl__svc_kv_str(kvl__svc_kvlist *l, const char *key, const char *dflt) {
    kvl__svc_kv *kv = kv_find(l, key);
    return kv ? kv->value : dflt;
}

kvl_status kvl__svc_kv_check_unused(const kvl__svc_kvlist *l) {
    char q[160];
    for (int i = 0; i < l->n; i++)
        if (!l->items[i].used)
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: unknown key '%s'", l->file,
                              l->items[i].line, qual(l, l->items[i].key, q, sizeof q));
    return KVL_OK;
}

void kvl__svc_kvlist_clear(kvl__svc_kvlist *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) { free(l->items[i].key); free(l->items[i].value); }
    free(l->items);
    free(l->file);
    free(l->section);
    memset(l, 0, sizeof *l);
}

kvl_status kvl__svc_check_hostport(const char *what, const char *addr, int allow_port0) {
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    /* "[::1]" alone has its last ':' inside the brackets: no port */
    if (!colon || colon == addr || (addr[0] == '[' && colon[-1] != ']'))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "%s '%s': expected HOST:PORT", what, addr ? addr : "");
    long port = -1;
    const char *d = colon + 1;
    if (*d && strspn(d, "0123456789") == strlen(d) && strlen(d) <= 5) port = strtol(d, NULL, 10);
    if (port < (allow_port0 ? 0 : 1) || port > 65535)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "%s '%s': the port must be a number in [%d, 65535]", what,
                          addr, allow_port0 ? 0 : 1);
    return KVL_OK;
}
