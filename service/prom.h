/* service/prom.h: a bounded, thread-safe registry of Prometheus series rendered as the text
 * exposition format 0.0.4.  A program declares its metric families once (name, help, type,
 * buckets: the definitions stay in daemon/metrics.c and router/metrics.c); series of a family
 * are told apart by their labels and created on first use, up to a fixed total, so a label
 * explosion costs a bounded amount of memory.  Updates take one mutex: they come a few per
 * request or per forward pass, so contention is negligible. */
#ifndef KVL_SVC_PROM_H
#define KVL_SVC_PROM_H

#include <stddef.h>

#include "kvlingo/status.h"

#define KVL_SVC_MAX_BUCKETS 16   /* finite upper bounds of one histogram (+Inf is implied) */

typedef enum kvl__svc_kind { KVL_SVC_COUNTER, KVL_SVC_GAUGE, KVL_SVC_HISTOGRAM } kvl__svc_kind;

/* One metric family.  Strings and `bounds` are borrowed: they must outlive the registry
 * (static tables).  `bounds`: ascending finite bucket upper bounds of a histogram (at most
 * KVL_SVC_MAX_BUCKETS), NULL / 0 for counters and gauges. */
typedef struct kvl__svc_metric_def {
    const char *name;          /* kvlingo_<what>_<unit>                                      */
    const char *help;          /* one line; NULL: no # HELP line                             */
    kvl__svc_kind kind;
    const double *bounds;
    int n_bounds;
} kvl__svc_metric_def;

/* A growing text buffer (the scrape body).  Zero-initialise; the owner frees `data`.  After
 * an allocation failure `oom` is set and further appends are ignored. */
typedef struct kvl__svc_text {
    char *data;
    size_t len, cap;
    int oom;
} kvl__svc_text;

/* Append printf-style text to b (keeps b->data NUL-terminated). */
void kvl__svc_text_printf(kvl__svc_text *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

typedef struct kvl__svc_prom kvl__svc_prom;

/* Create a registry of `n_defs` families (defs borrowed, see above) holding at most
 * `max_series` series in all.  Errors: KVL_ERR_INVALID_ARG (a histogram with more than
 * KVL_SVC_MAX_BUCKETS bounds, max_series < 1), KVL_ERR_NOMEM.  Free with kvl__svc_prom_free. */
kvl_status kvl__svc_prom_create(const kvl__svc_metric_def *defs, int n_defs, int max_series,
                                kvl__svc_prom **out);
void kvl__svc_prom_free(kvl__svc_prom *p);   /* NULL is a no-op */

/* Index of the family called `name`, or -1. */
int kvl__svc_prom_family(const kvl__svc_prom *p, const char *name);

/* Series updates.  `family` indexes the defs given to create (out of range: ignored); `labels`
 * is the inside of the braces, already escaped ("source=\"a\",target=\"b\""), NULL or "" for
 * none, at most 191 bytes (longer is cut).  A series is created on first use (an add of 0
 * makes it render at 0); when the registry is full a new series is silently not recorded.
 * A NULL registry is a no-op.  Safe from any thread. */
void kvl__svc_prom_add(kvl__svc_prom *p, int family, const char *labels, double delta);
void kvl__svc_prom_set(kvl__svc_prom *p, int family, const char *labels, double v);
void kvl__svc_prom_observe(kvl__svc_prom *p, int family, const char *labels, double v);

/* Series computed at scrape time: `fn` appends its own exposition text (with its # HELP and
 * # TYPE lines) after the registry's series; `arg` is borrowed and must stay valid while the
 * registry can be scraped.  fn runs on the scraping thread, without the registry's lock. */
void kvl__svc_prom_on_scrape(kvl__svc_prom *p, void (*fn)(void *arg, kvl__svc_text *b),
                             void *arg);

/* Append the exposition text to b: families in definition order (families without a series
 * are left out), series of a family in creation order, the scrape callback's text, then the
 * process_* series (kvl__svc_process_render). */
void kvl__svc_prom_render(kvl__svc_prom *p, kvl__svc_text *b);

/* The standard process metrics of this process, read from /proc (service/process.c):
 * process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
 * process_open_fds, process_max_fds, process_start_time_seconds. */
void kvl__svc_process_render(kvl__svc_text *b);

/* A Prometheus label value of v in dst[cap]: backslash, quote and newline escaped (cut to fit). */
void kvl__svc_prom_label_value(char *dst, size_t cap, const char *v);

#endif
