/* router/metrics.h: the router's Prometheus series (definitions in metrics.c, on the shared
 * registry of service/prom.h) and the /metrics + /healthz endpoint (service/http.h).
 *
 * Series (names carry their unit):
 *   kvlingo_router_sessions_open                       gauge
 *   kvlingo_router_turns_total{model,mode}             counter
 *   kvlingo_router_switches_total{source,target,mode}  counter (mode translate / reprefill)
 *   kvlingo_router_fallbacks_total{reason}             counter (a translation that did not happen)
 *   kvlingo_router_switch_ttft_seconds{mode}           histogram (turns that moved the context)
 *   kvlingo_router_turn_ttft_seconds                   histogram (every turn)
 *   kvlingo_router_shadow_kl_nats{source,target}       histogram (guardrail samples)
 *   kvlingo_router_pair_moving_kl_nats{source,target}  gauge
 *   kvlingo_router_pairs_disabled                      gauge (pairs the guardrail turned off)
 *   kvlingo_router_ledger_write_seconds                histogram
 *   kvlingo_router_ledger_seconds{backend,op}          histogram (every ledger call)
 *   kvlingo_router_leases_held                         gauge (sessions this replica drives)
 *   kvlingo_router_lease_takeovers_total               counter (expired leases taken over)
 *   kvlingo_router_lease_conflicts_total               counter (ABORTED: another replica's lease)
 *   kvlingo_router_lease_renew_failures_total          counter
 *   kvlingo_router_turns_replayed_total                counter (retries answered from the ledger)
 *   kvlingo_router_replica_info{replica,backend}       gauge 1
 *   kvlingo_router_nodes_healthy                       gauge
 *   kvlingo_router_turns_in_flight                     gauge
 *   kvlingo_router_errors_total{code}                  counter (turns that ended in an error)
 *   kvlingo_router_shadow_dropped_total                counter
 *   kvlingo_router_model_failovers_total{from,to,mode} counter (chosen model had no healthy node)
 *   kvlingo_router_push_ahead_total{result}            counter (background span pushes, push_ahead.h)
 *   kvlingo_router_push_ahead_seconds                  histogram (a push's export + translate)
 *   kvlingo_router_auth_refused_total{reason}          counter (missing, unknown, forbidden key)
 *   kvlingo_router_quota_refused_total{tenant,quota}   counter (max_sessions, tokens_per_minute)
 *   process_*                                          the process (service/process.c)
 * The gauges are computed at scrape time (kvr_router_gauges in router.c).  Every labelled
 * family is declared at zero for the label sets known at start (kvr_metrics_declare), so
 * dashboards see 0 rather than no data before the first event.
 */
#ifndef KVR_METRICS_H
#define KVR_METRICS_H

#include <stddef.h>

#include "kvlingo/status.h"
#include "prom.h"

typedef struct kvr_metrics kvr_metrics;

kvl_status kvr_metrics_create(kvr_metrics **out);
void kvr_metrics_free(kvr_metrics *m);

/* Gauges computed at scrape time (sessions open, pairs, ...), appended by `fn`. */
void kvr_metrics_set_gauges(kvr_metrics *m, void (*fn)(void *arg, kvl__svc_text *b), void *arg);

/* counter `name`{labels} += delta.  `labels` is the inside of the braces, already escaped
 * ("source=\"a\",target=\"b\""), or "" for none.  A name metrics.c does not define is ignored. */
void kvr_metrics_inc(kvr_metrics *m, const char *name, const char *labels, double delta);
/* histogram `name`{labels} observes v (buckets as metrics.c defines them for the name). */
void kvr_metrics_observe(kvr_metrics *m, const char *name, const char *labels, double v);

/* Create, at zero, the series of every known label set: the models given (turns by mode; for
 * fleets of at most 16 models every ordered pair's switches and failovers), every fallback
 * reason and error code, the histograms. */
void kvr_metrics_declare(kvr_metrics *m, const char *const *models, int n_models);
/* The ledger's series at zero: every call of `backend`, leases, replays. */
void kvr_metrics_declare_ledger(kvr_metrics *m, const char *backend);
/* Create histogram `name`{labels} with no observation (renders at zero). */
void kvr_metrics_observe_zero(kvr_metrics *m, const char *name, const char *labels);

/* Render everything (caller frees b->data). */
void kvr_metrics_render(kvr_metrics *m, kvl__svc_text *b);

/* Serve /metrics and /healthz on "host:port" (libmicrohttpd internal thread). */
kvl_status kvr_metrics_serve(kvr_metrics *m, const char *listen);
int kvr_metrics_port(const kvr_metrics *m);

#endif
