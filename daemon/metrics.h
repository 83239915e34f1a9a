/* daemon/metrics.h: kvld's Prometheus metrics (text exposition format 0.0.4) and the HTTP
 * endpoint serving them (service/http.h): GET /metrics, GET /healthz (200 "ok", 503 "draining").
 * Counters are updated from any thread; names follow kvlingo_<what>_<unit>. */
#ifndef KVLD_METRICS_H
#define KVLD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/status.h"
#include "span.h"

typedef struct kvld_metrics kvld_metrics;

kvl_status kvld_metrics_create(kvld_metrics **out);
void kvld_metrics_free(kvld_metrics *m);

/* Serve /metrics and /healthz on "host:port" (own thread).  `draining` is read for /healthz. */
kvl_status kvld_metrics_serve(kvld_metrics *m, const char *addr, const volatile int *draining);

typedef enum kvld_counter {
    KVLD_C_SESSIONS_OPENED,       /* kvlingo_sessions_opened_total                           */
    KVLD_C_TOKENS_PREFILLED,      /* kvlingo_tokens_prefilled_total                          */
    KVLD_C_TOKENS_DECODED,        /* kvlingo_tokens_decoded_total                            */
    KVLD_C_FORWARD_PASSES,        /* kvlingo_forward_passes_total                            */
    KVLD_C_PREFILL_CHUNKS,        /* kvlingo_prefill_chunks_total                            */
    KVLD_C_SPANS_SENT,            /* kvlingo_spans_sent_total                                */
    KVLD_C_SPANS_RECEIVED,        /* kvlingo_spans_received_total (imported)                 */
    KVLD_C_SPAN_BYTES_SENT,       /* kvlingo_span_bytes_sent_total                           */
    KVLD_C_SPAN_BYTES_RECEIVED,   /* kvlingo_span_bytes_received_total                       */
    KVLD_C_REQUESTS,              /* kvlingo_requests_total                                  */
    KVLD_C_REQUEST_ERRORS,        /* kvlingo_request_errors_total                            */
    KVLD_C_PEERS_CONNECTED,       /* kvlingo_peers_connected_total                           */
    KVLD_C_UCX_UNMATCHED_DROPPED, /* kvlingo_ucx_unmatched_dropped_total                     */
    KVLD_C_UCX_RECV_ABANDONED,    /* kvlingo_ucx_receives_abandoned_total                    */
    KVLD_C_UCX_SEND_KEPT,         /* kvlingo_ucx_sends_kept_total                            */
    KVLD_C_UCX_EP_EVICTED,        /* kvlingo_ucx_endpoints_evicted_total                     */
    KVLD_C_N
} kvld_counter;

typedef enum kvld_gauge {
    KVLD_G_SESSIONS,              /* kvlingo_sessions                                        */
    KVLD_G_ACTIVE_JOBS,           /* kvlingo_scheduler_jobs                                  */
    KVLD_G_CACHE_BYTES,           /* kvlingo_cache_bytes                                     */
    KVLD_G_DRAINING,              /* kvlingo_draining                                        */
    KVLD_G_UCX_ENDPOINTS,         /* kvlingo_ucx_endpoints                                   */
    KVLD_G_N
} kvld_gauge;

typedef enum kvld_hist {
    KVLD_H_DECODE_BATCH,          /* kvlingo_decode_batch_size (sequences per forward)       */
    KVLD_H_FORWARD_SECONDS,       /* kvlingo_forward_seconds                                 */
    KVLD_H_TRANSFER_SECONDS,      /* kvlingo_span_transfer_seconds                           */
    KVLD_H_TRANSLATE_SECONDS,     /* kvlingo_span_translate_seconds                          */
    KVLD_H_INTER_TOKEN_SECONDS,   /* kvlingo_decode_inter_token_seconds (per session)        */
    KVLD_H_QUEUE_SECONDS,         /* kvlingo_scheduler_queue_seconds (job to first forward)  */
    KVLD_H_N
} kvld_hist;

void kvld_metrics_add(kvld_metrics *m, kvld_counter c, uint64_t v);
void kvld_metrics_set(kvld_metrics *m, kvld_gauge g, double v);
void kvld_metrics_observe(kvld_metrics *m, kvld_hist h, double v);
void kvld_metrics_reject(kvld_metrics *m, kvl__span_reject why);   /* spans_rejected_total{reason} */

/* What the node refused or dropped to protect itself or a session: kvlingo_refusals_total{reason}. */
typedef enum kvld_refusal {
    KVLD_R_TICKET_MISSING,        /* a span move without a ticket (a ticket key is set)      */
    KVLD_R_TICKET_INVALID,        /* malformed, bad MAC or expired                           */
    KVLD_R_TICKET_MISMATCH,       /* names another node, session, range or replace flag      */
    KVLD_R_TICKET_REPLAYED,       /* its nonce was used before                               */
    KVLD_R_PEER_NOT_MEMBER,       /* ExportSpan to an address outside --peers                */
    KVLD_R_PEER_TABLE_FULL,       /* more distinct peers than the table holds                */
    KVLD_R_IMPORT_TIMEOUT,        /* an announced span never arrived (import_timeout_ms)     */
    KVLD_R_SESSION_EXPIRED,       /* a session idle longer than session_idle_ttl_s, dropped  */
    KVLD_R_STREAM_PAUSED,         /* a Generate stream paused: its reader fell behind        */
    KVLD_R_N
} kvld_refusal;
void kvld_metrics_refuse(kvld_metrics *m, kvld_refusal why);
const char *kvld_refusal_name(kvld_refusal why);

/* Render the exposition text (malloc'ed, caller frees). */
char *kvld_metrics_render(kvld_metrics *m, size_t *len);

/* kvlingo_node_info{model, device, backend} = 1: what this node serves and computes on
 * (device as configured, e.g. "cuda:0"; backend the table's name).  Call once after load. */
void kvld_metrics_node_info(kvld_metrics *m, const char *model, const char *device,
                            const char *backend);

#endif
