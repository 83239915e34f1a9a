/* daemon/peers.c: the fleet's other nodes (--peers), connected ahead of the first span.
 *
 * A switch's first span to a peer would otherwise pay, on its critical path, a gRPC channel to
 * the peer, an Info call for its model identity and transport address, and the transport
 * endpoint's wire-up.  A background thread does all three at start for every configured peer,
 * retrying (with back-off) while a peer is not up yet, so a fleet whose nodes start in any
 * order is connected a moment after the last one is. */
#include "peers.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "error.h"
#include "log.h"
#include "node.h"
#include "yamlcfg.h"

kvl_status kvld_peers_parse(const char *list, char (*out)[KVLD_PEER_ADDR_MAX], int max, int *n) {
    *n = 0;
    const char *p = list;
    while (p && *p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        size_t len = strcspn(p, ", ");
        if (len >= KVLD_PEER_ADDR_MAX)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "peers: entry %d is longer than %d bytes", *n + 1,
                              KVLD_PEER_ADDR_MAX - 1);
        char entry[KVLD_PEER_ADDR_MAX];
        memcpy(entry, p, len);
        entry[len] = 0;
        kvl_status st = kvl__svc_check_hostport("peers: entry", entry, 0);
        if (st != KVL_OK) return st;
        if (*n >= max)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "peers: more than %d entries", max);
        memcpy(out[*n], p, len);
        out[*n][len] = 0;
        (*n)++;
        p += len;
    }
    return KVL_OK;
}

/* Sleep up to ms, waking early when the node stops or a kick comes (kvld_peers_kick); 1 when a
 * kick ended it.  At least KVLD_PEER_KICK_GAP_MS, so a stream of kicks (Info calls) cannot make
 * the retries faster than that. */
#define KVLD_PEER_KICK_GAP_MS 50
static int nap(kvld_node *n, int ms) {
    usleep(KVLD_PEER_KICK_GAP_MS * 1000);
    struct timespec ts;
    clock_gettime(n->peers_cv_clock, &ts);
    long long ns = (long long)ts.tv_nsec +
                   (long long)(ms > KVLD_PEER_KICK_GAP_MS ? ms - KVLD_PEER_KICK_GAP_MS : 0) * 1000000LL;
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    pthread_mutex_lock(&n->peers_mu);
    while (!n->peers_stop && !n->peers_kick)
        if (pthread_cond_timedwait(&n->peers_cv, &n->peers_mu, &ts) != 0) break;
    int woken = n->peers_kick;
    n->peers_kick = 0;
    pthread_mutex_unlock(&n->peers_mu);
    return woken;
}

void kvld_peers_kick(kvld_node *n) {
    if (!__atomic_load_n(&n->peers_pending, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&n->peers_mu);
    n->peers_kick = 1;
    pthread_cond_signal(&n->peers_cv);
    pthread_mutex_unlock(&n->peers_mu);
}

/* Does anything accept TCP connections at "host:port" (or "[v6]:port") within timeout_ms?  The
 * gRPC channel to a peer is made only once it does: a channel made while the peer is down
 * backs off its reconnects for a second or more, and the first span would meet that back-off. */
static int tcp_reachable(const char *target, int timeout_ms) {
    char host[KVLD_PEER_ADDR_MAX];
    const char *colon = strrchr(target, ':');
    size_t hl = (size_t)(colon - target);
    memcpy(host, target, hl);
    host[hl] = 0;
    char *h = host;
    if (h[0] == '[' && hl > 1 && h[hl - 1] == ']') {
        h[hl - 1] = 0;
        h++;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(h, colon + 1, &hints, &res) != 0) return 0;
    int ok = 0;
    for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r == 0) {
            ok = 1;
        } else if (errno == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t el = sizeof err;
            if (poll(&pf, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && !err)
                ok = 1;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return ok;
}

/* Channel + Info + transport endpoint to one peer.  KVL_OK once all three are up. */
static kvl_status connect_one(kvld_node *n, const char *target) {
    if (!tcp_reachable(target, 500)) return kvl__errorf(KVL_ERR_IO, "peer %s: nothing listens there yet", target);
    kvl__rpc_client *cli;
    kvld_peer_model pm;
    kvl_status st = kvld_node_peer(n, target, 1000, &cli, &pm);
    if (st != KVL_OK) return st;
    kvld_node_peer_release(n, target);
    if (!n->transport) return KVL_OK;
    uint8_t addr[KVLD_PEER_TRANSPORT_MAX];
    size_t alen = 0;
    if (kvld_node_peer_transport(n, target, addr, sizeof addr, &alen, NULL) != KVL_OK)
        return kvl__errorf(KVL_ERR_IO, "peer %s has no transport address (transport none?)", target);
    return kvl__transport_connect(n->transport, addr, alen, 2000);
}

static void *peers_main(void *arg) {
    kvld_node *n = arg;
    pthread_setname_np(pthread_self(), "kvld-peers");
    char list[KVLD_MAX_PEERS][KVLD_PEER_ADDR_MAX];
    int count = 0, done[KVLD_MAX_PEERS] = {0}, left;
    pthread_mutex_lock(&n->peers_mu);
    count = n->n_fleet;
    memcpy(list, n->fleet, sizeof list[0] * (size_t)count);
    n->peers_kick = 0;   /* a kick meant for the thread before a reload */
    pthread_mutex_unlock(&n->peers_mu);
    double t0 = kvl__now_s();
    int backoff = 100, woken = 0;   /* woken: the last nap was ended by a kick */
    __atomic_store_n(&n->peers_pending, count, __ATOMIC_RELAXED);
    do {
        left = 0;
        for (int i = 0; i < count && !n->peers_stop; i++) {
            if (done[i]) continue;
            if (connect_one(n, list[i]) == KVL_OK) {
                done[i] = 1;
                kvld_metrics_add(n->metrics, KVLD_C_PEERS_CONNECTED, 1);
                kvl__svc_log("info", "msg=peer_ready peer=%s ms=%.1f woken=%d", list[i],
                             (kvl__now_s() - t0) * 1e3, woken);
            } else {
                left++;
                if (kvl__now_s() - t0 > KVLD_PEER_GIVE_UP_S) {
                    kvl__svc_log("warn", "msg=peer_unreachable peer=%s err=\"%s\" note=\"set up on the "
                                 "first span instead\"", list[i], kvl_last_error());
                    done[i] = 1;
                    left--;
                }
            }
        }
        __atomic_store_n(&n->peers_pending, left, __ATOMIC_RELAXED);
        if (left && !n->peers_stop) {
            woken = nap(n, backoff);
            backoff = backoff >= 1000 ? 2000 : backoff * 2;   /* 100, 200, 400, 800, then 2 s */
        }
    } while (left && !n->peers_stop);
    __atomic_store_n(&n->peers_pending, 0, __ATOMIC_RELAXED);
    /* then every KVLD_PEER_REFRESH_S: each member's Info again, in the background, so that a
     * peer that restarted (a new transport address, perhaps another model) is known before the
     * next span to it, not after that span fails */
    int down = 0;   /* members that did not answer the last round: asked again in a second */
    while (!n->peers_stop) {
        nap(n, down ? 1000 : (int)(KVLD_PEER_REFRESH_S * 1000));
        down = 0;
        for (int i = 0; i < count && !n->peers_stop; i++) {
            uint8_t before[KVLD_PEER_TRANSPORT_MAX], after[KVLD_PEER_TRANSPORT_MAX];
            size_t lb = 0, la = 0;
            if (kvld_node_peer_transport(n, list[i], before, sizeof before, &lb, NULL) != KVL_OK) lb = 0;
            if (kvld_node_peer_refresh(n, list[i], 1000) != KVL_OK) {   /* down: kept as it was */
                down++;
                continue;
            }
            if (kvld_node_peer_transport(n, list[i], after, sizeof after, &la, NULL) != KVL_OK) la = 0;
            if (la && (la != lb || memcmp(before, after, la))) {
                kvl__svc_log("info", "msg=peer_changed peer=%s note=\"a new transport address: connecting\"",
                             list[i]);
                if (n->transport) kvl__transport_connect(n->transport, after, la, 2000);
            }
        }
    }
    return NULL;
}

kvl_status kvld_peers_start(kvld_node *n) {
    pthread_mutex_lock(&n->peers_mu);
    int none = n->n_fleet == 0;
    pthread_mutex_unlock(&n->peers_mu);
    if (none) return KVL_OK;
    if (pthread_create(&n->peers_thread, NULL, peers_main, n) != 0)
        return kvl__errorf(KVL_ERR_INTERNAL, "cannot start the peer connection thread");
    n->peers_started = 1;
    return KVL_OK;
}

void kvld_peers_stop(kvld_node *n) {
    if (!n->peers_started) return;
    pthread_mutex_lock(&n->peers_mu);
    n->peers_stop = 1;
    pthread_cond_broadcast(&n->peers_cv);
    pthread_mutex_unlock(&n->peers_mu);
    pthread_join(n->peers_thread, NULL);
    n->peers_started = 0;
}

kvl_status kvld_peers_reload(kvld_node *n, const char *list) {
    char (*next)[KVLD_PEER_ADDR_MAX] = malloc(sizeof *next * KVLD_MAX_PEERS);
    if (!next) return kvl__errorf(KVL_ERR_NOMEM, "peers: out of memory");
    int count = 0;
    kvl_status st = kvld_peers_parse(list, next, KVLD_MAX_PEERS, &count);
    if (st != KVL_OK) {
        free(next);
        return st;
    }
    /* the connecting thread works from the old list: end it, then start one on the new */
    kvld_peers_stop(n);
    int added = 0, removed = 0;
    pthread_mutex_lock(&n->peers_mu);
    for (int i = 0; i < count; i++) {
        int had = 0;
        for (int j = 0; j < n->n_fleet && !had; j++) had = !strcmp(next[i], n->fleet[j]);
        added += !had;
    }
    for (int j = 0; j < n->n_fleet; j++) {
        int kept = 0;
        for (int i = 0; i < count && !kept; i++) kept = !strcmp(next[i], n->fleet[j]);
        removed += !kept;
    }
    memcpy(n->fleet, next, sizeof *next * (size_t)count);
    n->n_fleet = count;
    snprintf(n->cfg.peers, sizeof n->cfg.peers, "%s", list);
    pthread_mutex_unlock(&n->peers_mu);
    free(next);
    n->peers_stop = 0;
    kvl__svc_log("info", "msg=peers_reloaded members=%d added=%d removed=%d", count, added, removed);
    return kvld_peers_start(n);
}
