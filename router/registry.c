/* router/registry.c: fleet state (see registry.h). */
#include "registry.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "nodecall.h"

/* EMA weight of a new rate measurement: smooth enough that one slow turn (another process
 * stealing the CPU) does not flip the cost policy. */
#define RATE_ALPHA 0.3

kvl_status kvr_registry_create(const kvr_config *cfg, const kvl__rpc_tls *tls, kvr_registry **out) {
    *out = NULL;
    if (cfg->n_nodes > KVR_MAX_NODES)
        return kvl__errorf(KVL_ERR_RANGE, "%s: %d nodes, at most %d", cfg->path, cfg->n_nodes,
                          KVR_MAX_NODES);
    kvr_registry *r = calloc(1, sizeof *r);
    if (!r) return kvl__errorf(KVL_ERR_NOMEM, "registry: out of memory");
    if (pthread_mutex_init(&r->mu, NULL)) { free(r); return kvl__errorf(KVL_ERR_INTERNAL, "registry mutex"); }
    r->node_timeout_ms = (int64_t)cfg->node_timeout_ms;
    for (int i = 0; i < cfg->n_nodes; i++) {
        kvr_node *n = &r->nodes[i];
        if (strlen(cfg->nodes[i].name) >= sizeof n->name || strlen(cfg->nodes[i].address) >= sizeof n->address ||
            strlen(cfg->nodes[i].model) >= sizeof n->model) {
            kvr_registry_free(r);
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: node name, address or model too long",
                              cfg->path, cfg->nodes[i].line);
        }
        snprintf(n->name, sizeof n->name, "%s", cfg->nodes[i].name);
        snprintf(n->address, sizeof n->address, "%s", cfg->nodes[i].address);
        snprintf(n->model, sizeof n->model, "%s", cfg->nodes[i].model);
        snprintf(n->error, sizeof n->error, "not probed yet");
        /* seeds the cost policy plans with until measured (typical small-model CPU figures,
         * README benchmarks); ListNodes reports them as unmeasured */
        n->prefill_tps = 5000;
        n->decode_tps = 400;
        n->translate_tps = 200000;
        kvl_status s = kvl__rpc_client_create(n->address, 0, tls, &n->cli);
        r->n = i + 1;
        if (s) { kvr_registry_free(r); return s; }
    }
    *out = r;
    return KVL_OK;
}

void kvr_registry_free(kvr_registry *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) kvl__rpc_client_free(r->nodes[i].cli);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

int kvr_registry_find(const kvr_registry *r, const char *name) {
    for (int i = 0; name && i < r->n; i++)
        if (!strcmp(r->nodes[i].name, name)) return i;
    return -1;
}

int kvr_registry_model_known(const kvr_registry *r, const char *model) {
    for (int i = 0; model && i < r->n; i++)
        if (!strcmp(r->nodes[i].model, model)) return 1;
    return 0;
}

void kvr_registry_models(const kvr_registry *r, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < r->n; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= !strcmp(r->nodes[j].model, r->nodes[i].model);
        if (dup) continue;
        int w = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", r->nodes[i].model);
        if (w < 0 || (size_t)w >= cap - len) break;
        len += (size_t)w;
    }
}

/* Hash of `model` as reported by a probed node serving it ("" when none probed). */
static const char *model_hash_locked(kvr_registry *r, const char *model) {
    for (int i = 0; i < r->n; i++)
        if (r->nodes[i].probed && !strcmp(r->nodes[i].model, model)) return r->nodes[i].hash;
    return "";
}

/* Re-check every node's translators against the hashes known now (a source node probed later
 * can validate a translator discovered earlier). */
static void check_translators_locked(kvr_registry *r, int i, const Kvlingo__V1__InfoResponse *info) {
    kvr_node *n = &r->nodes[i];
    n->n_tr_from = 0;
    n->n_tr_bad = 0;
    for (size_t t = 0; t < info->n_translators; t++) {
        const Kvlingo__V1__TranslatorInfo *ti = info->translators[t];
        const char *src = ti->source && ti->source->name ? ti->source->name : "";
        const char *src_hash = ti->source && ti->source->hash ? ti->source->hash : "";
        const char *dst = ti->target && ti->target->name ? ti->target->name : "";
        const char *dst_hash = ti->target && ti->target->hash ? ti->target->hash : "";
        char why[120] = "";
        if (strcmp(dst, n->model))
            snprintf(why, sizeof why, "target '%s' is not this node's model", dst);
        else if (dst_hash[0] && n->hash[0] && strcmp(dst_hash, n->hash))
            snprintf(why, sizeof why, "target hash %s != node's %s", dst_hash, n->hash);
        else if (!kvr_registry_model_known(r, src))
            snprintf(why, sizeof why, "source model '%s' is not in the fleet", src);
        else {
            const char *h = model_hash_locked(r, src);
            if (src_hash[0] && h[0] && strcmp(src_hash, h))
                snprintf(why, sizeof why, "source hash %s != fleet's %s", src_hash, h);
        }
        if (why[0]) {
            if (n->n_tr_bad < KVR_MAX_TR) {
                snprintf(n->tr_bad[n->n_tr_bad].src, sizeof n->tr_bad[0].src, "%s", src);
                snprintf(n->tr_bad[n->n_tr_bad].why, sizeof n->tr_bad[0].why, "%s", why);
                n->n_tr_bad++;
            }
        } else if (n->n_tr_from < KVR_MAX_TR) {
            snprintf(n->tr_from[n->n_tr_from++], sizeof n->tr_from[0], "%s", src);
        }
    }
}

int kvr_registry_refresh(kvr_registry *r, int only_unhealthy, int64_t timeout_ms) {
    Kvlingo__V1__InfoResponse *infos[KVR_MAX_NODES] = {0};
    /* RPCs without the lock: a dead node must not stall turns on the others */
    for (int i = 0; i < r->n; i++) {
        kvr_node *n = &r->nodes[i];
        pthread_mutex_lock(&r->mu);
        int skip = only_unhealthy && n->healthy;
        pthread_mutex_unlock(&r->mu);
        if (skip) continue;
        grpc_status_code code;
        kvl_status s = kvr_node_info(n, timeout_ms, &infos[i], &code);
        if (s) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s", kvl_last_error());
            pthread_mutex_lock(&r->mu);
            /* a closed socket or a failed handshake at the first call is most often a router
             * and a node that disagree about TLS (or about the CA) */
            const int tls_like = !n->probed && (strstr(msg, "Socket closed") || strstr(msg, "andshake") ||
                                                 strstr(msg, "SSL") || strstr(msg, "ssl"));
            if (!n->down_logged)
                kvl__svc_log_text("warn", "node %s (%s) does not answer: %s%s", n->name, n->address, msg,
                                  tls_like ? " (if it runs: the router and its nodes must both run TLS with "
                                             "certificates of one fleet CA, or both --insecure)" : "");
            n->down_logged = 1;
            n->healthy = 0;
            snprintf(n->error, sizeof n->error, "%s", msg);
            pthread_mutex_unlock(&r->mu);
            continue;
        }
        const char *name = infos[i]->model && infos[i]->model->name ? infos[i]->model->name : "";
        const Kvlingo__V1__InfoResponse *in = infos[i];
        /* the geometry sizes transfers and their deadlines here: a node answering absurd values
         * (a bug, a wrong build) is not used, rather than given deadlines of years */
        const int geometry_ok = in->n_layers >= 1 && in->n_layers <= 1024 && in->n_kv_heads >= 1 &&
                                in->n_kv_heads <= 1024 && in->head_dim >= 1 && in->head_dim <= 4096 &&
                                in->vocab_size >= 1 && in->vocab_size <= (1u << 24);   /* the span codec's limits */
        pthread_mutex_lock(&r->mu);
        if (!geometry_ok) {
            snprintf(n->error, sizeof n->error, "answers an impossible geometry (layers %u, kv heads %u, head_dim "
                     "%u, vocab %u)", in->n_layers, in->n_kv_heads, in->head_dim, in->vocab_size);
            if (n->healthy || !n->probed) kvl__svc_log_text("warn", "node %s: %s", n->name, n->error);
            n->healthy = 0;
            n->probed = 1;
            pthread_mutex_unlock(&r->mu);
            continue;
        }
        if (strcmp(name, n->model)) {
            snprintf(n->error, sizeof n->error, "serves model '%s', config says '%s'", name, n->model);
            if (n->healthy || !n->probed) kvl__svc_log_text("warn", "node %s: %s", n->name, n->error);
            n->healthy = 0;
            n->probed = 1;
            pthread_mutex_unlock(&r->mu);
            continue;
        }
        if (!n->healthy) kvl__svc_log_text("info", "node %s (%s) serving %s", n->name, n->address, name);
        n->healthy = 1;
        n->down_logged = 0;
        n->probed = 1;
        n->error[0] = 0;
        snprintf(n->hash, sizeof n->hash, "%s", infos[i]->model->hash ? infos[i]->model->hash : "");
        n->n_layers = infos[i]->n_layers;
        n->n_kv_heads = infos[i]->n_kv_heads;
        n->head_dim = infos[i]->head_dim;
        n->max_context = infos[i]->max_context;
        n->one_call = infos[i]->continue_rpc;
        n->pull_only = infos[i]->continue_pull_only;
        n->vocab = infos[i]->vocab_size;
        n->sessions = infos[i]->sessions;
        /* a node with a ticket key other than the router's (or with one where the router has
         * none) refuses the router's tickets, so a span it must ship falls back to re-prefill:
         * said once, at the first Info, not at each switch.  A node without a key takes spans
         * unticketed. */
        const char *kid = in->ticket_key_id ? in->ticket_key_id : "";
        if (kid[0] && strcmp(kid, r->ticket_key_id)) {
            if (!n->key_warned || strcmp(kid, n->key_id))
                kvl__svc_log_text("warn", "node %s (%s): its transfer-ticket key is not the router's (key id %s, "
                                  "the router's %s): it refuses the router's transfer tickets, so a switch that "
                                  "needs a span from it re-prefills; give the router and every node the "
                                  "fleet's one ticket_key_file",
                                  n->name, n->address, kid[0] ? kid : "none", r->ticket_key_id[0] ? r->ticket_key_id : "none");
            n->key_warned = 1;
        } else {
            n->key_warned = 0;
        }
        snprintf(n->key_id, sizeof n->key_id, "%s", kid);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_lock(&r->mu);
    int healthy = 0;
    for (int i = 0; i < r->n; i++) {
        if (infos[i] && r->nodes[i].healthy) check_translators_locked(r, i, infos[i]);
        healthy += r->nodes[i].healthy;
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->n; i++)
        if (infos[i]) protobuf_c_message_free_unpacked(&infos[i]->base, NULL);
    return healthy;
}

void kvr_registry_mark(kvr_registry *r, int i, int healthy, const char *err) {
    pthread_mutex_lock(&r->mu);
    kvr_node *n = &r->nodes[i];
    if (!healthy && n->healthy) {
        kvl__svc_log_text("warn", "node %s marked unhealthy: %s", n->name, err ? err : "");
        n->down_logged = 1;
    }
    n->healthy = healthy;
    if (err) snprintf(n->error, sizeof n->error, "%s", err);
    pthread_mutex_unlock(&r->mu);
}

int kvr_registry_can_translate(kvr_registry *r, const char *src_model, int i) {
    pthread_mutex_lock(&r->mu);
    int ok = 0;
    kvr_node *n = &r->nodes[i];
    for (int t = 0; n->healthy && t < n->n_tr_from; t++) ok |= !strcmp(n->tr_from[t], src_model);
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void kvr_registry_geometry(kvr_registry *r, int i, unsigned *layers, unsigned *kv_heads,
                           unsigned *head_dim, unsigned *vocab) {
    pthread_mutex_lock(&r->mu);
    *layers = r->nodes[i].n_layers;
    *kv_heads = r->nodes[i].n_kv_heads;
    *head_dim = r->nodes[i].head_dim;
    if (vocab) *vocab = r->nodes[i].vocab;
    pthread_mutex_unlock(&r->mu);
}

void kvr_registry_turn_begin(kvr_registry *r, int i) {
    pthread_mutex_lock(&r->mu);
    r->nodes[i].active++;
    pthread_mutex_unlock(&r->mu);
}

void kvr_registry_turn_end(kvr_registry *r, int i) {
    pthread_mutex_lock(&r->mu);
    if (r->nodes[i].active > 0) r->nodes[i].active--;
    pthread_mutex_unlock(&r->mu);
}

/* Rates a measurement may report, tokens per second: what a node's answer yields outside them
 * (a clock that jumped, a node that answers garbage) is not a measurement, and one such value
 * would skew the cost policy and every later turn deadline of the node (4000 / 1e-300 ms). */
#define KVR_RATE_MIN 0.01
#define KVR_RATE_MAX 1e9

/* The first measurement replaces the seed; later ones move the average. */
static void ema(double *v, unsigned *n, double x) {
    if (!(x >= KVR_RATE_MIN && x <= KVR_RATE_MAX)) return;   /* NaN too */
    *v = *n ? (1 - RATE_ALPHA) * *v + RATE_ALPHA * x : x;
    ++*n;
}

void kvr_registry_observe(kvr_registry *r, int i, double prefill_tps, double decode_tps,
                          double translate_tps) {
    pthread_mutex_lock(&r->mu);
    ema(&r->nodes[i].prefill_tps, &r->nodes[i].n_prefill_samples, prefill_tps);
    ema(&r->nodes[i].decode_tps, &r->nodes[i].n_decode_samples, decode_tps);
    ema(&r->nodes[i].translate_tps, &r->nodes[i].n_translate_samples, translate_tps);
    pthread_mutex_unlock(&r->mu);
}

void kvr_registry_views(kvr_registry *r, const kvr_session *s, int current,
                        int (*pair_ok)(void *arg, const char *src, const char *dst), void *arg,
                        kvr_node_view *views) {
    const char *cur_model = current >= 0 ? r->nodes[current].model : NULL;
    int can[KVR_MAX_NODES] = {0};
    for (int i = 0; cur_model && i < r->n; i++)
        can[i] = i != current && kvr_registry_can_translate(r, cur_model, i) &&
                 (!pair_ok || pair_ok(arg, cur_model, r->nodes[i].model));
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        kvr_node *n = &r->nodes[i];
        kvr_node_view *v = &views[i];
        v->name = n->name;
        v->model = n->model;
        v->healthy = n->healthy;
        v->load = n->active;
        v->held = s ? kvr_session_held(s, n->name) : 0;
        v->can_translate = can[i];
        v->prefill_tps = n->prefill_tps;
        v->decode_tps = n->decode_tps;
        v->translate_tps = n->translate_tps;
    }
    pthread_mutex_unlock(&r->mu);
}

void kvr_registry_copy(kvr_registry *r, int i, kvr_node *out) {
    pthread_mutex_lock(&r->mu);
    *out = r->nodes[i];
    pthread_mutex_unlock(&r->mu);
}

/* Length of an IPv4 address (with its ":port" if one follows) at s, else 0. */
static size_t ipv4_at(const char *s) {
    size_t i = 0;
    for (int part = 0; part < 4; part++) {
        size_t d = 0;
        while (d < 3 && s[i + d] >= '0' && s[i + d] <= '9') d++;
        if (!d || (s[i + d] >= '0' && s[i + d] <= '9')) return 0;
        i += d;
        if (part < 3) {
            if (s[i] != '.') return 0;
            i++;
        }
    }
    if (s[i] == ':' && s[i + 1] >= '0' && s[i + 1] <= '9')
        for (i++; s[i] >= '0' && s[i] <= '9'; i++) {}
    return i;
}

/* Length of a bracketed IPv6 address ("[...]" with its ":port") at s, else 0; the brackets
 * also as gRPC writes them in peer strings, percent-encoded ("ipv6:%5Bfd00::5%5D:7100"). */
static size_t ipv6_at(const char *s) {
    size_t i;
    if (s[0] == '[') i = 1;
    else if (s[0] == '%' && s[1] == '5' && (s[2] == 'B' || s[2] == 'b')) i = 3;
    else return 0;
    const size_t open = i;
    int zone = 0, colons = 0;   /* past '%': an interface name ("fe80::1%eth0") */
    for (; s[i] && i < 80; i++) {
        const char c = s[i];
        if (c == ']' || (c == '%' && s[i + 1] == '5' && (s[i + 2] == 'D' || s[i + 2] == 'd'))) break;
        const int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        const int alnum = hex || (c >= 'g' && c <= 'z') || (c >= 'G' && c <= 'Z') || c == '_' || c == '-';
        if (c == '%' && !zone) zone = 1;
        else if (!(zone ? alnum || c == '.' : hex || c == ':' || c == '.')) return 0;
        colons += c == ':' && !zone;
    }
    if (i - open < 2 || colons < 1) return 0;   /* "[2048]" is not an address */
    if (s[i] == ']') i++;
    else if (s[i] == '%') i += 3;
    else return 0;
    if (s[i] == ':' && s[i + 1] >= '0' && s[i + 1] <= '9')
        for (i++; s[i] >= '0' && s[i] <= '9'; i++) {}
    return i;
}

/* 13 when s starts a session key's tenant tag ("<12 lower-case hex>/", ledger.h), else 0. */
static size_t tenant_tag_at(const char *s) {
    for (int i = 0; i < 12; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return s[12] == '/' ? 13 : 0;
}

void kvr_registry_redact(const kvr_registry *r, const char *in, char *out, size_t cap) {
    if (!cap) return;
    size_t o = 0;
    const char *p = in ? in : "";
    while (*p && o + 1 < cap) {
        const char *put = NULL;
        size_t skip = 0;
        for (int i = 0; r && i < r->n && !put; i++) {   /* immutable after create: no lock */
            const size_t al = strlen(r->nodes[i].address);
            if (al && !strncmp(p, r->nodes[i].address, al)) {
                put = r->nodes[i].name;
                skip = al;
            }
        }
        /* an address starts a token: "10.1.2.3" inside "v10.1.2.3" is left alone */
        const int starts = p == in || !((p[-1] >= '0' && p[-1] <= '9') || (p[-1] >= 'a' && p[-1] <= 'z') ||
                                        (p[-1] >= 'A' && p[-1] <= 'Z') || p[-1] == '.' || p[-1] == '_');
        if (!put && starts && ((skip = ipv4_at(p)) || (skip = ipv6_at(p)))) put = "<address>";
        if (!put && starts && (skip = tenant_tag_at(p))) put = "";   /* the client's own id */
        if (put) {
            for (const char *q = put; *q && o + 1 < cap; q++) out[o++] = *q;
            p += skip;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = 0;
}
