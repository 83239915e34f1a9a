/* service/prom.c: the series table behind prom.h.  Lookup is a linear scan: a few hundred
 * series at most, updated a few times per request. */
#include "prom.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

typedef struct series {
    int family;
    char labels[192];
    double value;                                  /* counter, gauge                  */
    unsigned long long counts[KVL_SVC_MAX_BUCKETS]; /* histogram: cumulative per bound */
    double sum;
    unsigned long long count;
} series;

struct kvl__svc_prom {
    pthread_mutex_t mu;
    const kvl__svc_metric_def *defs;
    int n_defs;
    series *s;
    int n, cap;
    void (*scrape)(void *, kvl__svc_text *);
    void *scrape_arg;
};

void kvl__svc_text_printf(kvl__svc_text *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt,
                          ap);
        va_end(ap);
        if (w < 0) { b->oom = 1; return; }
        if (b->data && (size_t)w < b->cap - b->len) { b->len += (size_t)w; return; }
        size_t nc = (b->cap + (size_t)w + 1) * 2;
        char *nd = realloc(b->data, nc);
        if (!nd) { b->oom = 1; return; }
        b->data = nd;
        b->cap = nc;
    }
}

kvl_status kvl__svc_prom_create(const kvl__svc_metric_def *defs, int n_defs, int max_series,
                                kvl__svc_prom **out) {
    *out = NULL;
    if (max_series < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "metrics: max_series %d", max_series);
    for (int i = 0; i < n_defs; i++)
        if (defs[i].n_bounds < 0 || defs[i].n_bounds > KVL_SVC_MAX_BUCKETS)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "metrics: %s: %d buckets (at most %d)",
                              defs[i].name, defs[i].n_bounds, KVL_SVC_MAX_BUCKETS);
    kvl__svc_prom *p = calloc(1, sizeof *p);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "metrics");
    p->s = calloc((size_t)max_series, sizeof *p->s);
    if (!p->s || pthread_mutex_init(&p->mu, NULL)) {
        free(p->s);
        free(p);
        return kvl__errorf(KVL_ERR_NOMEM, "metrics");
    }
    p->defs = defs;
    p->n_defs = n_defs;
    p->cap = max_series;
    *out = p;
    return KVL_OK;
}

void kvl__svc_prom_free(kvl__svc_prom *p) {
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    free(p->s);
    free(p);
}

int kvl__svc_prom_family(const kvl__svc_prom *p, const char *name) {
    for (int i = 0; p && name && i < p->n_defs; i++)
        if (!strcmp(p->defs[i].name, name)) return i;
    return -1;
}

/* Find or add a series (mutex held); NULL when the table is full: new label sets are then not
 * recorded, since bounded memory beats an unbounded label explosion. */
static series *get_locked(kvl__svc_prom *p, int family, const char *labels) {
    if (!labels) labels = "";
    /* a label set too long to keep whole is not recorded: cut, it could end inside a quoted
     * value (a page no scraper parses) or merge with another set sharing its start */
    if (strlen(labels) >= sizeof p->s[0].labels) return NULL;
    for (int i = 0; i < p->n; i++)
        if (p->s[i].family == family && !strcmp(p->s[i].labels, labels)) return &p->s[i];
    if (p->n >= p->cap) return NULL;
    series *s = &p->s[p->n++];
    s->family = family;
    snprintf(s->labels, sizeof s->labels, "%s", labels);
    return s;
}

static int valid(const kvl__svc_prom *p, int family) {
    return p && family >= 0 && family < p->n_defs;
}

void kvl__svc_prom_add(kvl__svc_prom *p, int family, const char *labels, double delta) {
    if (!valid(p, family)) return;
    pthread_mutex_lock(&p->mu);
    series *s = get_locked(p, family, labels);
    if (s) s->value += delta;
    pthread_mutex_unlock(&p->mu);
}

void kvl__svc_prom_set(kvl__svc_prom *p, int family, const char *labels, double v) {
    if (!valid(p, family)) return;
    pthread_mutex_lock(&p->mu);
    series *s = get_locked(p, family, labels);
    if (s) s->value = v;
    pthread_mutex_unlock(&p->mu);
}

void kvl__svc_prom_observe(kvl__svc_prom *p, int family, const char *labels, double v) {
    if (!valid(p, family)) return;
    const kvl__svc_metric_def *d = &p->defs[family];
    pthread_mutex_lock(&p->mu);
    series *s = get_locked(p, family, labels);
    if (s) {
        for (int b = 0; b < d->n_bounds; b++)
            if (v <= d->bounds[b]) s->counts[b]++;
        s->sum += v;
        s->count++;
    }
    pthread_mutex_unlock(&p->mu);
}

void kvl__svc_prom_on_scrape(kvl__svc_prom *p, void (*fn)(void *, kvl__svc_text *), void *arg) {
    pthread_mutex_lock(&p->mu);
    p->scrape = fn;
    p->scrape_arg = arg;
    pthread_mutex_unlock(&p->mu);
}

static const char *kind_name(kvl__svc_kind k) {
    return k == KVL_SVC_COUNTER ? "counter" : k == KVL_SVC_GAUGE ? "gauge" : "histogram";
}

/* name{labels} or name: `l` is the label text, `extra` one more label (le) or NULL */
static void series_name(kvl__svc_text *b, const char *name, const char *suffix, const char *l,
                        const char *extra) {
    int braces = l[0] || extra;
    kvl__svc_text_printf(b, "%s%s%s%s%s%s%s", name, suffix, braces ? "{" : "", l,
                         l[0] && extra ? "," : "", extra ? extra : "", braces ? "}" : "");
}

static void render_series(kvl__svc_text *b, const kvl__svc_metric_def *d, const series *s) {
    if (d->kind != KVL_SVC_HISTOGRAM) {
        series_name(b, d->name, "", s->labels, NULL);
        kvl__svc_text_printf(b, " %.17g\n", s->value);
        return;
    }
    char le[48];
    for (int k = 0; k < d->n_bounds; k++) {
        snprintf(le, sizeof le, "le=\"%g\"", d->bounds[k]);
        series_name(b, d->name, "_bucket", s->labels, le);
        kvl__svc_text_printf(b, " %llu\n", s->counts[k]);
    }
    series_name(b, d->name, "_bucket", s->labels, "le=\"+Inf\"");
    kvl__svc_text_printf(b, " %llu\n", s->count);
    series_name(b, d->name, "_sum", s->labels, NULL);
    kvl__svc_text_printf(b, " %.17g\n", s->sum);
    series_name(b, d->name, "_count", s->labels, NULL);
    kvl__svc_text_printf(b, " %llu\n", s->count);
}

void kvl__svc_prom_render(kvl__svc_prom *p, kvl__svc_text *b) {
    pthread_mutex_lock(&p->mu);
    for (int f = 0; f < p->n_defs; f++) {
        const kvl__svc_metric_def *d = &p->defs[f];
        int header = 0;
        for (int i = 0; i < p->n; i++) {
            if (p->s[i].family != f) continue;
            if (!header) {
                if (d->help) kvl__svc_text_printf(b, "# HELP %s %s\n", d->name, d->help);
                kvl__svc_text_printf(b, "# TYPE %s %s\n", d->name, kind_name(d->kind));
                header = 1;
            }
            render_series(b, d, &p->s[i]);
        }
    }
    void (*fn)(void *, kvl__svc_text *) = p->scrape;
    void *arg = p->scrape_arg;
    pthread_mutex_unlock(&p->mu);
    if (fn) fn(arg, b);
    kvl__svc_process_render(b);
}

void kvl__svc_prom_label_value(char *dst, size_t cap, const char *v) {
    size_t o = 0;
    if (!cap) return;
    for (; v && *v && o + 3 < cap; v++) {
        if (*v == '\\' || *v == '"') dst[o++] = '\\';
        if (*v == '\n') { dst[o++] = '\\'; dst[o++] = 'n'; continue; }
        dst[o++] = *v;
    }
    dst[o] = '\0';
}
