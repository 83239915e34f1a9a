/* daemon/node.c: building and tearing down the node context, the peer client cache, and the
 * per-request log/metrics helpers. */
#include "node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "kvlingo/backend.h"
#include "kvlingo/v1/node.pb-c.h"
#include "log.h"
#include "peers.h"

kvl_status kvld_node_create(const kvld_config *cfg, kvld_node **out) {
    *out = NULL;
    kvld_node *n = calloc(1, sizeof *n);
    if (!n) return kvl__errorf(KVL_ERR_NOMEM, "node");
    n->cfg = *cfg;
    pthread_mutex_init(&n->peers_mu, NULL);
    {   /* the back-off waits on the monotonic clock (a wall-clock step cannot stretch it) */
        pthread_condattr_t ca;
        n->peers_cv_clock = CLOCK_REALTIME;
        if (pthread_condattr_init(&ca) == 0) {
            if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0) n->peers_cv_clock = CLOCK_MONOTONIC;
            if (pthread_cond_init(&n->peers_cv, &ca) != 0) n->peers_cv_clock = -1;
            pthread_condattr_destroy(&ca);
        } else {
            n->peers_cv_clock = -1;
        }
        if (n->peers_cv_clock == (clockid_t)-1) {   /* the default condvar: the wall clock */
            n->peers_cv_clock = CLOCK_REALTIME;
            pthread_cond_init(&n->peers_cv, NULL);
        }
    }
    /* TLS first: a wrong certificate should fail in a second, not after the weights load */
    kvl_status st = kvld_config_tls(cfg, &n->tls);
    if (st != KVL_OK) goto fail;
    if (cfg->insecure) {
        n->server_tls = n->client_tls = (kvl__rpc_tls){.insecure = 1};
        kvl__svc_log("warn", "msg=plaintext note=\"insecure: the Node API and the channels to peers "
                     "run without TLS; callers are not authenticated\"");
    } else {
        n->server_tls = (kvl__rpc_tls){.cert_pem = n->tls.cert_pem, .key_pem = n->tls.key_pem,
                                       .ca_pem = n->tls.ca_pem, .require_client_cert = 1};
        n->client_tls = (kvl__rpc_tls){.cert_pem = n->tls.cert_pem, .key_pem = n->tls.key_pem,
                                       .ca_pem = n->tls.ca_pem};
        kvl__svc_log("info", "msg=tls cert=\"%s\" subject=\"%s\" not_after=\"%s\" ca=\"%s\" "
                     "client_certs=required", cfg->tls_cert, n->tls.subject, n->tls.not_after, cfg->tls_ca);
    }
    kvl_model_params mp = kvl_model_default_params();
    mp.n_threads = cfg->threads;
    st = kvl_device_parse(cfg->device, &mp.device, &mp.device_index);
    if (st == KVL_OK && cfg->weights_dtype[0]) st = kvl_weights_dtype_parse(cfg->weights_dtype, &mp.weights_dtype);
    if (st == KVL_OK && cfg->kv_dtype[0]) st = kvl_kv_dtype_parse(cfg->kv_dtype, &mp.kv_dtype);
    if (st == KVL_OK) st = kvl_model_load(cfg->model, &mp, &n->model);
    if (st != KVL_OK) {
        kvl__error_prefix(st, "loading the model");
        goto fail;
    }
    if (kvl_tokenizer_load_dir(cfg->model, &n->tok) != KVL_OK) {
        kvl__svc_log("warn", "msg=no_tokenizer model=\"%s\" err=\"%s\" note=\"text requests refused\"",
                 cfg->model, kvl_last_error());
        n->tok = NULL;
    }
    const kvl_model_config *mc = kvl_model_config_get(n->model);
    n->max_context = cfg->max_context > 0 ? cfg->max_context : mc->max_position_embeddings;
    if (n->max_context <= 0) n->max_context = 4096;
    if ((st = kvld_metrics_create(&n->metrics)) != KVL_OK) goto fail;
    kvld_metrics_node_info(n->metrics, kvl_model_name(n->model), cfg->device,
                           kvl_model_backend(n->model)->name);
    if ((st = kvld_translators_load(cfg->translators, n->model, &n->translators)) != KVL_OK)
        goto fail;
    /* span payloads: a few buffers kept, faulted in, for the next switch (spanbuf.h) */
    if ((st = kvl__spanbufs_create(KVLD_SPANBUFS, KVLD_SPANBUF_BYTES, &n->spanbufs))) goto fail;
    if ((st = kvld_sessions_create(n->model, cfg->max_sessions, n->max_context, &n->sessions)))
        goto fail;
    kvld_sched_params sp = {.max_batch = cfg->max_batch, .prefill_chunk = cfg->prefill_chunk,
                            .decode_stretch = cfg->decode_stretch,
                            .stream_backlog_bytes = (size_t)cfg->stream_backlog_kb << 10,
                            .node_buffer_bytes = (size_t)cfg->stream_buffer_mb << 20};
    if ((st = kvld_sched_create(n->model, n->metrics, &sp, &n->sched)) != KVL_OK) goto fail;
    if ((st = kvld_peers_parse(cfg->peers, n->fleet, KVLD_MAX_PEERS, &n->n_fleet)) != KVL_OK) goto fail;
    if (cfg->ticket_key_file[0]) {
        if ((st = kvl__ticket_key_load(cfg->ticket_key_file, &n->ticket_key)) != KVL_OK) goto fail;
        if ((st = kvl__ticket_warmup(&n->ticket_key)) != KVL_OK) goto fail;
        if ((st = kvl__ticket_key_id(&n->ticket_key, n->ticket_key_id)) != KVL_OK) goto fail;
        n->tickets = 1;
    }
    if ((st = kvl__ticket_replay_init(&n->replay, KVLD_REPLAY_CAP)) != KVL_OK) goto fail;
    snprintf(n->self, sizeof n->self, "%s", cfg->advertise[0] ? cfg->advertise : cfg->listen);
    if (strcmp(cfg->transport, "none") != 0 &&
        (st = kvl__transport_create(cfg->transport, &n->transport)) != KVL_OK)
        goto fail;
    *out = n;
    return KVL_OK;
fail:
    {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kvl_last_error());
        kvld_node_free(n);
        return kvl__errorf(st, "%s", msg);
    }
}

kvl_status kvld_node_serve(kvld_node *n) {
    kvl__rpc_server_params p = kvl__rpc_server_default_params();
    p.listen = n->cfg.listen;
    p.tls = &n->server_tls;
    p.send_stall_ms = n->cfg.stream_stall_ms;
    kvl_status st = kvl__rpc_server_create(&p, &n->rpc);
    if (st != KVL_OK) return st;
    static const struct {
        const char *path;
        kvl__rpc_kind kind;
        kvl__rpc_handler fn;
    } methods[] = {
        {"/kvlingo.v1.Node/Info", KVL_RPC_UNARY, kvld_rpc_info},
        {"/kvlingo.v1.Node/OpenSession", KVL_RPC_UNARY, kvld_rpc_open_session},
        {"/kvlingo.v1.Node/Append", KVL_RPC_UNARY, kvld_rpc_append},
        {"/kvlingo.v1.Node/Generate", KVL_RPC_SERVER_STREAM, kvld_rpc_generate},
        {"/kvlingo.v1.Node/ExportSpan", KVL_RPC_UNARY, kvld_rpc_export_span},
        {"/kvlingo.v1.Node/ImportSpan", KVL_RPC_SERVER_STREAM, kvld_rpc_import_span},
        {"/kvlingo.v1.Node/DropSession", KVL_RPC_UNARY, kvld_rpc_drop_session},
        {"/kvlingo.v1.Node/SessionInfo", KVL_RPC_UNARY, kvld_rpc_session_info},
        {"/kvlingo.v1.Node/ContinueTurn", KVL_RPC_SERVER_STREAM, kvld_rpc_continue},
    };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if ((st = kvl__rpc_server_add_method(n->rpc, methods[i].path, methods[i].kind,
                                            methods[i].fn, n)) != KVL_OK)
            return st;
    if ((st = kvl__rpc_server_set_health(n->rpc, "kvlingo.v1.Node", 1)) != KVL_OK) return st;
    if (n->cfg.health_listen[0]) {
        /* probes that cannot speak TLS read the Node API's health here, and nothing else */
        static const kvl__rpc_tls plain = {.insecure = 1};
        kvl__rpc_server_params hp = kvl__rpc_server_default_params();
        hp.listen = n->cfg.health_listen;
        hp.tls = &plain;
        hp.max_calls = 4;
        hp.health_of = n->rpc;
        if ((st = kvl__rpc_server_create(&hp, &n->health_rpc)) != KVL_OK) return kvl__error_prefix(st, "health_listen");
        if ((st = kvl__rpc_server_start(n->health_rpc)) != KVL_OK) return st;
    }
    if (!n->cfg.advertise[0]) {   /* "host:0" named the port the server picked */
        const char *colon = strrchr(n->cfg.listen, ':');
        if (colon && !strcmp(colon, ":0"))
            snprintf(n->self, sizeof n->self, "%.*s:%d", (int)(colon - n->cfg.listen), n->cfg.listen,
                     kvl__rpc_server_port(n->rpc));
    }
    if (n->cfg.metrics[0] &&
        (st = kvld_metrics_serve(n->metrics, n->cfg.metrics, &n->draining)) != KVL_OK)
        return st;
    return kvl__rpc_server_start(n->rpc);
}

void kvld_node_free(kvld_node *n) {
    if (!n) return;
    /* order: stop taking calls, then the scheduler (fails queued jobs), then the rest */
    kvld_peers_stop(n);
    kvl__rpc_server_free(n->health_rpc);   /* it reads n->rpc's health: goes first */
    n->health_rpc = NULL;
    if (n->rpc) kvl__rpc_server_shutdown(n->rpc, 0);
    kvld_sched_free(n->sched);
    kvl__rpc_server_free(n->rpc);
    for (int i = 0; i < n->n_peers; i++) kvl__rpc_client_free(n->peers[i].cli);
    free(n->peers);
    kvl__transport_free(n->transport);
    kvl__spanbufs_free(n->spanbufs);
    kvld_sessions_free(n->sessions);
    kvld_translators_free(&n->translators);
    kvld_metrics_free(n->metrics);
    kvl_tokenizer_free(n->tok);
    kvl_model_free(n->model);
    kvl__svc_tls_free(&n->tls);
    kvl__ticket_replay_free(&n->replay);
    memset(&n->ticket_key, 0, sizeof n->ticket_key);
    pthread_cond_destroy(&n->peers_cv);
    pthread_mutex_destroy(&n->peers_mu);
    free(n);
}

/* mu held: the entry for target, or a new one (a free place, else the place of an entry that
 * is no longer a fleet member and that nobody uses). */
static kvl_status peer_entry_locked(kvld_node *n, const char *target, kvld_peer **out) {
    for (int i = 0; i < n->n_peers; i++)
        if (strcmp(n->peers[i].target, target) == 0) {
            *out = &n->peers[i];
            return KVL_OK;
        }
    if (strlen(target) >= sizeof n->peers[0].target) return kvl__errorf(KVL_ERR_INVALID_ARG, "peer address too long");
    if (!n->peers && !(n->peers = calloc(KVLD_MAX_PEERS, sizeof *n->peers)))
        return kvl__errorf(KVL_ERR_NOMEM, "peer table");
    kvld_peer *p = NULL;
    if (n->n_peers < KVLD_MAX_PEERS) {
        p = &n->peers[n->n_peers];
    } else {
        /* full: members come and go (reloads, pods with new addresses), so the place of one
         * that left goes to the new one */
        for (int i = 0; i < n->n_peers && !p; i++) {
            int member = 0;
            for (int j = 0; j < n->n_fleet && !member; j++) member = !strcmp(n->fleet[j], n->peers[i].target);
            if (!member && n->peers[i].refs == 0) p = &n->peers[i];
        }
        if (!p) {
            kvld_metrics_refuse(n->metrics, KVLD_R_PEER_TABLE_FULL);
            return kvl__errorf(KVL_ERR_RANGE, "peer table full (%d peers in use or members): '%s' refused",
                               KVLD_MAX_PEERS, target);
        }
        kvl__rpc_client_free(p->cli);
    }
    memset(p, 0, sizeof *p);
    snprintf(p->target, sizeof p->target, "%s", target);
    kvl_status st = kvl__rpc_client_create(target, 0, &n->client_tls, &p->cli);
    if (st != KVL_OK) {
        p->target[0] = 0;   /* a free place again (if it was past n_peers, n_peers did not move) */
        return st;
    }
    if (p == &n->peers[n->n_peers]) n->n_peers++;
    *out = p;
    return KVL_OK;
}

/* Info of target into its entry; the caller holds a reference (refs) on it. */
static kvl_status peer_fetch_info(kvld_node *n, kvl__rpc_client *cli, const char *target, int64_t timeout_ms) {
    Kvlingo__V1__InfoRequest rq = KVLINGO__V1__INFO_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    kvl__rpc_result res;
    kvl_status st = kvl__rpc_client_unary_pb(cli, "/kvlingo.v1.Node/Info", &rq.base,
                                             &kvlingo__v1__info_response__descriptor, timeout_ms, &resp, &res);
    if (st != KVL_OK) return st;
    if (res.code != GRPC_STATUS_OK) {
        st = kvl__errorf(KVL_ERR_IO, "peer %s unreachable: Info: %s: %s", target, kvl__rpc_status_name(res.code),
                        res.message);
        kvl__rpc_result_clear(&res);
        return st;
    }
    Kvlingo__V1__InfoResponse *info = (Kvlingo__V1__InfoResponse *)resp;
    pthread_mutex_lock(&n->peers_mu);
    for (int i = 0; i < n->n_peers; i++) {
        kvld_peer *p = &n->peers[i];
        if (strcmp(p->target, target)) continue;
        if (info->model) {
            snprintf(p->model_hash, sizeof p->model_hash, "%s", info->model->hash ? info->model->hash : "");
            snprintf(p->model_name, sizeof p->model_name, "%s", info->model->name ? info->model->name : "");
        }
        if (info->transport_address.len && info->transport_address.len <= sizeof p->transport_address) {
            memcpy(p->transport_address, info->transport_address.data, info->transport_address.len);
            p->transport_len = info->transport_address.len;
        }
        p->span_push = info->span_push;
        p->stale = 0;
    }
    pthread_mutex_unlock(&n->peers_mu);
    protobuf_c_message_free_unpacked(resp, NULL);
    kvl__rpc_result_clear(&res);
    return KVL_OK;
}

/* The entry for target, held (refs) until kvld_node_peer_release; *need_info: its Info is
 * missing or stale. */
static kvl_status peer_take(kvld_node *n, const char *target, kvld_peer **out, kvl__rpc_client **cli,
                            int *need_info) {
    pthread_mutex_lock(&n->peers_mu);
    kvl_status st = peer_entry_locked(n, target, out);
    if (st == KVL_OK) {
        (*out)->refs++;
        *cli = (*out)->cli;
        *need_info = !(*out)->model_name[0] || (*out)->stale;
    }
    pthread_mutex_unlock(&n->peers_mu);
    return st;
}

kvl_status kvld_node_peer(kvld_node *n, const char *target, int64_t timeout_ms,
                          kvl__rpc_client **out, kvld_peer_model *model) {
    kvld_peer *p = NULL;
    kvl__rpc_client *cli = NULL;
    int need_info = 0;
    kvl_status pst = peer_take(n, target, &p, &cli, &need_info);
    if (pst != KVL_OK) return pst;
    if (need_info) {
        kvl_status st = peer_fetch_info(n, cli, target, timeout_ms);
        if (st != KVL_OK) {
            kvld_node_peer_release(n, target);
            return st;
        }
    }
    pthread_mutex_lock(&n->peers_mu);
    snprintf(model->name, sizeof model->name, "%s", p->model_name);
    snprintf(model->hash, sizeof model->hash, "%s", p->model_hash);
    pthread_mutex_unlock(&n->peers_mu);
    *out = cli;
    return KVL_OK;
}

void kvld_node_peer_release(kvld_node *n, const char *target) {
    pthread_mutex_lock(&n->peers_mu);
    for (int i = 0; i < n->n_peers; i++)
        if (!strcmp(n->peers[i].target, target) && n->peers[i].refs > 0) n->peers[i].refs--;
    pthread_mutex_unlock(&n->peers_mu);
}

void kvld_node_peer_forget(kvld_node *n, const char *target) {
    pthread_mutex_lock(&n->peers_mu);
    for (int i = 0; i < n->n_peers; i++)
        if (!strcmp(n->peers[i].target, target)) n->peers[i].stale = 1;
    pthread_mutex_unlock(&n->peers_mu);
}

kvl_status kvld_node_peer_refresh(kvld_node *n, const char *target, int64_t timeout_ms) {
    kvld_peer *p = NULL;
    kvl__rpc_client *cli = NULL;
    int need_info = 0;
    kvl_status pst = peer_take(n, target, &p, &cli, &need_info);
    if (pst != KVL_OK) return pst;
    /* asked because the peer showed it is (back) up: a channel still waiting out its reconnect
     * back-off from the outage would fail this Info at once (seen: the first pull after a
     * member's restart fell back, the channel refused 'Connection refused' 50 ms after the
     * member had called this node) */
    kvl__rpc_client_reconnect_now(cli);
    kvl_status st = peer_fetch_info(n, cli, target, timeout_ms);
    kvld_node_peer_release(n, target);
    return st;
}

kvl_status kvld_node_peer_transport(kvld_node *n, const char *target, uint8_t *addr, size_t cap,
                                    size_t *len, int *span_push) {
    kvl_status st = kvl__errorf(KVL_ERR_NOT_FOUND, "peer %s: no transport address known", target);
    pthread_mutex_lock(&n->peers_mu);
    for (int i = 0; i < n->n_peers; i++) {
        const kvld_peer *p = &n->peers[i];
        if (strcmp(p->target, target) || !p->transport_len || p->transport_len > cap) continue;
        memcpy(addr, p->transport_address, p->transport_len);
        *len = p->transport_len;
        if (span_push) *span_push = p->span_push;
        kvl_clear_error();
        st = KVL_OK;
    }
    pthread_mutex_unlock(&n->peers_mu);
    return st;
}

int kvld_node_peer_allowed(kvld_node *n, const char *target) {
    pthread_mutex_lock(&n->peers_mu);
    int ok = n->n_fleet == 0 && !n->tickets;
    for (int i = 0; i < n->n_fleet && !ok; i++) ok = !strcmp(n->fleet[i], target);
    pthread_mutex_unlock(&n->peers_mu);
    return ok;
}

grpc_status_code kvld_node_check_ticket(kvld_node *n, const uint8_t *ticket, size_t len,
                                        const kvl__ticket_expect *e, char *msg, size_t cap) {
    if (!n->tickets) return GRPC_STATUS_OK;
    if (!ticket || !len) {
        kvld_metrics_refuse(n->metrics, KVLD_R_TICKET_MISSING);
        snprintf(msg, cap, "transfer ticket required: spans move only on a ticket the router issued");
        return GRPC_STATUS_PERMISSION_DENIED;
    }
    kvl__ticket t;
    uint64_t now = kvl__ticket_now_ms();
    kvld_refusal why = KVLD_R_TICKET_INVALID;
    kvl_status st = kvl__ticket_verify(&n->ticket_key, ticket, len, now, &t);
    if (st == KVL_OK) {
        why = KVLD_R_TICKET_MISMATCH;
        st = kvl__ticket_match(&t, e);
    }
    if (st == KVL_OK) {
        why = KVLD_R_TICKET_REPLAYED;
        st = kvl__ticket_replay_check(&n->replay, &t, now, kvl__now_ms());
    }
    if (st == KVL_OK) return GRPC_STATUS_OK;
    kvld_metrics_refuse(n->metrics, why);
    snprintf(msg, cap, "transfer ticket refused: %s", kvl_last_error());
    return GRPC_STATUS_PERMISSION_DENIED;
}

/* ---- per-request helpers --------------------------------------------------------------------- */

void kvld_req_begin(kvld_req *r, kvld_node *node, kvl__rpc_call *call, const char *method) {
    memset(r, 0, sizeof *r);
    r->node = node;
    r->call = call;
    r->method = method;
    r->t0 = kvl__now_s();
    kvld_metrics_add(node->metrics, KVLD_C_REQUESTS, 1);
}

int kvld_req_refuse_if_draining(kvld_req *r) {
    if (!r->node->draining) {
        __atomic_add_fetch(&r->node->work_in_flight, 1, __ATOMIC_SEQ_CST);
        r->counted_work = 1;
        /* re-check: SIGTERM may have arrived between the test and the count */
        if (!r->node->draining) return 0;
    }
    kvld_req_end(r, GRPC_STATUS_UNAVAILABLE, "node is draining (SIGTERM): no new work accepted",
                 NULL);
    return 1;
}

void kvld_req_end(kvld_req *r, grpc_status_code code, const char *msg, const char *extra) {
    if (code != GRPC_STATUS_OK) {
        kvl__rpc_call_finish(r->call, code, "%s", msg ? msg : "");
        kvld_metrics_add(r->node->metrics, KVLD_C_REQUEST_ERRORS, 1);
    }
    if (r->counted_work) {
        __atomic_sub_fetch(&r->node->work_in_flight, 1, __ATOMIC_SEQ_CST);
        r->counted_work = 0;
    }
    if (r->node->cfg.quiet) return;
    char q[600], cn[128], cnq[160];
    /* who called, by certificate (mutual TLS): the fleet member behind the address */
    size_t cnl = kvl__rpc_call_peer_cn(r->call, cn, sizeof cn);
    if (cnl == 0 || cnl == SIZE_MAX) snprintf(cn, sizeof cn, "-");
    kvl__svc_log(code == GRPC_STATUS_OK ? "info" : "warn",
             "msg=request method=%s session=%s code=%s ms=%.3f peer=%s cn=%s%s%s%s", r->method,
             r->session[0] ? r->session : "-", kvl__rpc_status_name(code),
             (kvl__now_s() - r->t0) * 1e3, kvl__rpc_call_peer(r->call),
             cn[0] == '-' && !cn[1] ? "-" : kvl__svc_log_q(cnq, sizeof cnq, cn),
             code != GRPC_STATUS_OK ? " err=" : "",
             code != GRPC_STATUS_OK ? kvl__svc_log_q(q, sizeof q, msg ? msg : "") : "",
             extra ? extra : "");
}

void kvld_req_fail(kvld_req *r, kvl_status st, const char *extra) {
    char msg[1024];
    const char *e = kvl_last_error();
    snprintf(msg, sizeof msg, "%s", e && e[0] ? e : kvl_strerror(st));
    kvld_req_end(r, kvl__rpc_status_from_kvl(st), msg, extra);
}
