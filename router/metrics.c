/* router/metrics.c: the router's metric definitions (names, help, buckets) on the shared
 * registry of service/prom.h, served by service/http.h. */
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "http.h"

#define MAX_SERIES 4096  /* labelled by model, pair, reason, code: bounded by the fleet */
#define DECLARE_MAX_MODELS 16   /* per-pair series are declared up front for fleets this small */

static const double k_ttft_bounds[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                       0.1,    0.2,   0.5,   1,     2,    5};
static const double k_kl_bounds[] = {0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10};
static const double k_ledger_bounds[] = {5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                                         5e-3, 1e-2, 2.5e-2, 5e-2, 0.1};
#define BOUNDS(b) b, (int)(sizeof b / sizeof b[0])

static const kvl__svc_metric_def k_defs[] = {
    {"kvlingo_router_turns_total", "Turns answered, by model and switch mode.", KVL_SVC_COUNTER,
     NULL, 0},
    {"kvlingo_router_switches_total", "Turns that moved a session between models, by pair and mode.",
     KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_fallbacks_total", "Switches that re-prefilled instead of translating, by reason.",
     KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_switch_ttft_seconds", "Time to first token of turns that moved the context.",
     KVL_SVC_HISTOGRAM, BOUNDS(k_ttft_bounds)},
    {"kvlingo_router_turn_ttft_seconds", "Time to first token of every turn.", KVL_SVC_HISTOGRAM,
     BOUNDS(k_ttft_bounds)},
    {"kvlingo_router_switch_phase_seconds", "Where a translated switch's time to first token went, "
     "by phase: ledger (session read), export (source reads its cache), transfer (the wire), "
     "translate (translate-apply on the target), forward (the target's queue and forward pass).",
     KVL_SVC_HISTOGRAM, BOUNDS(k_ttft_bounds)},
    {"kvlingo_router_shadow_kl_nats", "Guardrail: KL(native || translated) of the first token.",
     KVL_SVC_HISTOGRAM, BOUNDS(k_kl_bounds)},
    {"kvlingo_router_ledger_write_seconds", "Duration of ledger write transactions.",
     KVL_SVC_HISTOGRAM, BOUNDS(k_ledger_bounds)},
    {"kvlingo_router_ledger_seconds", "Duration of ledger calls, by backend and call.",
     KVL_SVC_HISTOGRAM, BOUNDS(k_ledger_bounds)},
    {"kvlingo_router_lease_takeovers_total", "Expired session leases of another replica taken over.",
     KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_lease_conflicts_total", "Turns refused (ABORTED) because another replica held "
     "the session's lease past lease_wait_ms.", KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_turns_replayed_total", "Retried turns (same request id) answered from the ledger.",
     KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_errors_total", "Turns that ended in an error, by gRPC code.", KVL_SVC_COUNTER,
     NULL, 0},
    {"kvlingo_router_shadow_dropped_total", "Guardrail samples dropped (queue full).",
     KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_http_requests_total", "Requests to the OpenAI-compatible HTTP API, by endpoint "
     "and HTTP status.", KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_auth_refused_total", "Requests refused for their API key, by reason (missing, "
     "unknown, forbidden: the tenant lacks the right).", KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_quota_refused_total", "Requests refused for a tenant's quota, by tenant and quota "
     "(max_sessions, tokens_per_minute, max_concurrent_turns).", KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_push_ahead_total", "Span pushes after a turn to the node likely next, by result "
     "(shipped, used, unused, skipped_busy, skipped, dropped_full, failed).", KVL_SVC_COUNTER, NULL, 0},
    {"kvlingo_router_push_ahead_seconds", "Duration of a pushed span's export and translation.",
     KVL_SVC_HISTOGRAM, BOUNDS(k_ttft_bounds)},
    {"kvlingo_router_model_failovers_total", "Turns answered on another model because no healthy "
     "node served the chosen one, by chosen model, model used and switch mode.", KVL_SVC_COUNTER,
     NULL, 0},
};

struct kvr_metrics {
    kvl__svc_prom *prom;
    kvl__svc_http *http;
};

kvl_status kvr_metrics_create(kvr_metrics **out) {
    *out = NULL;
    kvr_metrics *m = calloc(1, sizeof *m);
    if (!m) return kvl__errorf(KVL_ERR_NOMEM, "metrics");
    kvl_status s = kvl__svc_prom_create(k_defs, (int)(sizeof k_defs / sizeof k_defs[0]),
                                        MAX_SERIES, &m->prom);
    if (s) {
        free(m);
        return s;
    }
    *out = m;
    return KVL_OK;
}

/* Fallback reasons turn.c reports (set_fallback), and the non-transient export refusals. */
static const char *const k_fallback_reasons[] = {
    "source_unavailable", "source_state", "source_behind", "range_mismatch", "export_deadline",
    "export_failed", "node_state", "forced", "rejected_invalid_argument",
    "rejected_failed_precondition", "rejected_resource_exhausted", "rejected_not_found",
    "rejected_data_loss", "rejected_internal", "rejected_unimplemented", "hash_mismatch",
    "rejected_permission_denied"};
/* gRPC codes a turn can end with (the names kvl__rpc_status_name gives) */
static const char *const k_error_codes[] = {
    "CANCELLED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED", "PERMISSION_DENIED"};
static const char *const k_modes[] = {"none", "translate", "reprefill"};
#define N_OF(a) (int)(sizeof a / sizeof a[0])

void kvr_metrics_declare(kvr_metrics *m, const char *const *models, int n_models) {
    if (!m) return;
    char lab[600], a[260], b[260];
    int fm = kvl__svc_prom_family(m->prom, "kvlingo_router_model_failovers_total");
    kvr_metrics_observe_zero(m, "kvlingo_router_turn_ttft_seconds", "");
    kvr_metrics_observe_zero(m, "kvlingo_router_ledger_write_seconds", "");
    kvr_metrics_inc(m, "kvlingo_router_shadow_dropped_total", "", 0);
    for (int k = 1; k < N_OF(k_modes); k++) {
        snprintf(lab, sizeof lab, "mode=\"%s\"", k_modes[k]);
        kvr_metrics_observe_zero(m, "kvlingo_router_switch_ttft_seconds", lab);
    }
    static const char *const phases[] = {"ledger", "export", "transfer", "translate", "forward"};
    for (int k = 0; k < N_OF(phases); k++) {
        snprintf(lab, sizeof lab, "phase=\"%s\"", phases[k]);
        kvr_metrics_observe_zero(m, "kvlingo_router_switch_phase_seconds", lab);
    }
    for (int i = 0; i < N_OF(k_fallback_reasons); i++) {
        snprintf(lab, sizeof lab, "reason=\"%s\"", k_fallback_reasons[i]);
        kvr_metrics_inc(m, "kvlingo_router_fallbacks_total", lab, 0);
    }
    for (int i = 0; i < N_OF(k_error_codes); i++) {
        snprintf(lab, sizeof lab, "code=\"%s\"", k_error_codes[i]);
        kvr_metrics_inc(m, "kvlingo_router_errors_total", lab, 0);
    }
    static const char *const endpoints[] = {"chat_completions", "completions", "models", "health", "ready",
                                            "other"};
    static const char *const statuses[] = {"200", "400", "401", "404", "405", "409", "413", "429", "500", "503",
                                            "504"};
    for (int i = 0; i < N_OF(endpoints); i++)
        for (int k = 0; k < N_OF(statuses); k++) {
            snprintf(lab, sizeof lab, "endpoint=\"%s\",status=\"%s\"", endpoints[i], statuses[k]);
            kvr_metrics_inc(m, "kvlingo_router_http_requests_total", lab, 0);
        }
    for (int i = 0; i < n_models; i++) {
        kvl__svc_prom_label_value(a, sizeof a, models[i]);
        for (int k = 0; k < N_OF(k_modes); k++) {
            snprintf(lab, sizeof lab, "model=\"%s\",mode=\"%s\"", a, k_modes[k]);
            kvr_metrics_inc(m, "kvlingo_router_turns_total", lab, 0);
        }
        if (n_models > DECLARE_MAX_MODELS) continue;
        for (int j = 0; j < n_models; j++) {
            if (j == i) continue;
            kvl__svc_prom_label_value(b, sizeof b, models[j]);
            for (int k = 1; k < N_OF(k_modes); k++) {
                snprintf(lab, sizeof lab, "source=\"%s\",target=\"%s\",mode=\"%s\"", a, b, k_modes[k]);
                kvr_metrics_inc(m, "kvlingo_router_switches_total", lab, 0);
                snprintf(lab, sizeof lab, "from=\"%s\",to=\"%s\",mode=\"%s\"", a, b, k_modes[k]);
                kvl__svc_prom_add(m->prom, fm, lab, 0);
            }
        }
    }
}

void kvr_metrics_declare_ledger(kvr_metrics *m, const char *backend) {
    static const char *const ops[] = {"create", "load", "commit", "holding", "end", "idle", "lru",
                                      "purge", "lease", "renew", "release", "find"};
    char lab[128], b[64];
    if (!m) return;
    kvl__svc_prom_label_value(b, sizeof b, backend);
    for (int i = 0; i < N_OF(ops); i++) {
        snprintf(lab, sizeof lab, "backend=\"%s\",op=\"%s\"", b, ops[i]);
        kvr_metrics_observe_zero(m, "kvlingo_router_ledger_seconds", lab);
    }
    kvr_metrics_inc(m, "kvlingo_router_lease_takeovers_total", "", 0);
    kvr_metrics_inc(m, "kvlingo_router_lease_conflicts_total", "", 0);
    kvr_metrics_inc(m, "kvlingo_router_turns_replayed_total", "", 0);
}

void kvr_metrics_observe_zero(kvr_metrics *m, const char *name, const char *labels) {
    /* an add of 0 creates a histogram series with empty buckets */
    if (m) kvl__svc_prom_add(m->prom, kvl__svc_prom_family(m->prom, name), labels, 0);
}

void kvr_metrics_free(kvr_metrics *m) {
    if (!m) return;
    kvl__svc_http_stop(m->http);   /* before the registry it scrapes goes */
    kvl__svc_prom_free(m->prom);
    free(m);
}

void kvr_metrics_set_gauges(kvr_metrics *m, void (*fn)(void *, kvl__svc_text *), void *arg) {
    kvl__svc_prom_on_scrape(m->prom, fn, arg);
}

void kvr_metrics_inc(kvr_metrics *m, const char *name, const char *labels, double delta) {
    if (m) kvl__svc_prom_add(m->prom, kvl__svc_prom_family(m->prom, name), labels, delta);
}

void kvr_metrics_observe(kvr_metrics *m, const char *name, const char *labels, double v) {
    if (m) kvl__svc_prom_observe(m->prom, kvl__svc_prom_family(m->prom, name), labels, v);
}

void kvr_metrics_render(kvr_metrics *m, kvl__svc_text *b) { kvl__svc_prom_render(m->prom, b); }

kvl_status kvr_metrics_serve(kvr_metrics *m, const char *listen) {
    return kvl__svc_http_start("metrics", listen, 1, m->prom, NULL, NULL, &m->http);
}

int kvr_metrics_port(const kvr_metrics *m) { return kvl__svc_http_port(m->http); }
