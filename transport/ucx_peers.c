/* transport/ucx_peers.c: the UCX transport's endpoints to peers (ucx_internal.h), one per
 * peer worker address, made on first use and kept (within u->max_peers) for the next span. */
#include "ucx_internal.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"

/* Runs inside ucp_worker_progress (mu held).  Found by its endpoint, not by a pointer kept in
 * the handler's argument: the peer may have been dropped and freed meanwhile. */
static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
    ucx_transport *u = arg;
    for (ucx_peer *p = u->peers; p; p = p->next)
        if (p->ep == ep) p->failed = 1;   /* the endpoint is closed (forced) and re-created on next use */
}

static void close_ep(ucx_transport *u, ucp_ep_h ep, int force) {
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
    if (r == NULL || UCS_PTR_IS_ERR(r)) return;
    int64_t until = kvl__now_ms() + 1000;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && kvl__now_ms() < until)
        ucp_worker_progress(u->worker);
    ucp_request_free(r);
}

/* mu held: unlink and close one listed peer. */
static void remove_peer(ucx_transport *u, ucx_peer **pp, int force) {
    ucx_peer *p = *pp;
    *pp = p->next;
    u->n_peers--;
    __atomic_store_n(&u->base.peers_open, (uint64_t)u->n_peers, __ATOMIC_RELAXED);
    close_ep(u, p->ep, force);
    free(p->addr);
    free(p);
}

/* mu held: make room for one more endpoint by closing the least recently used idle one (none
 * when every endpoint has an operation in flight: the list then grows past the bound for as
 * long as they last, which the callers' own bounds limit). */
static void evict_lru(ucx_transport *u) {
    ucx_peer **victim = NULL;
    for (ucx_peer **pp = &u->peers; *pp; pp = &(*pp)->next)
        if (!(*pp)->busy && (!victim || (*pp)->last_use < (*victim)->last_use)) victim = pp;
    if (victim) {
        __atomic_add_fetch(&u->base.peers_evicted, 1, __ATOMIC_RELAXED);
        remove_peer(u, victim, 1);   /* nothing in flight: a dead peer's close must not wait */
    }
}

kvl_status kvl__ucx_get_peer(ucx_transport *u, const uint8_t *addr, size_t len, ucx_peer **out) {
    ucx_peer **pp = &u->peers;
    while (*pp) {
        ucx_peer *p = *pp;
        if (p->len == len && memcmp(p->addr, addr, len) == 0) {
            if (!p->failed) {
                p->last_use = ++u->uses;
                *out = p;
                return KVL_OK;
            }
            remove_peer(u, pp, 1);
            break;
        }
        pp = &p->next;
    }
    while (u->n_peers >= u->max_peers) {
        int before = u->n_peers;
        evict_lru(u);
        if (u->n_peers == before) break;
    }
    /* ucp_ep_create takes no length: UCX reads the lengths packed inside the address, so a
     * short or damaged one (from a peer's reply) is copied in front of zeros: a parse that runs
     * past its end reads them rather than the heap beyond (valgrind showed such reads) */
    ucx_peer *p = calloc(1, sizeof *p);
    if (!p || !(p->addr = calloc(1, len + KVL_UCX_ADDR_PAD))) {
        free(p);
        return kvl__errorf(KVL_ERR_NOMEM, "transport: peer");
    }
    memcpy(p->addr, addr, len);
    p->len = len;
    p->id = ++u->next_peer_id;
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = (const ucp_address_t *)p->addr;
    if (u->err_mode_peer) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = ep_err_cb;
        ep.err_handler.arg = u;
    }
    ucs_status_t s = ucp_ep_create(u->worker, &ep, &p->ep);
    if (s != UCS_OK) {
        free(p->addr);
        free(p);
        return kvl__errorf(KVL_ERR_IO, "transport: cannot reach peer (ucp_ep_create: %s)",
                          ucs_status_string(s));
    }
    p->last_use = ++u->uses;
    p->next = u->peers;
    u->peers = p;
    u->n_peers++;
    __atomic_store_n(&u->base.peers_open, (uint64_t)u->n_peers, __ATOMIC_RELAXED);
    *out = p;
    return KVL_OK;
}

void kvl__ucx_peer_idle(ucx_transport *u, uint64_t id) {
    for (ucx_peer *p = u->peers; p; p = p->next)
        if (p->id == id && p->busy > 0) p->busy--;
}

/* mu held: drop the peer made with `id` (ucx_peer.id) whose endpoint failed or stalled, if it
 * is still listed, force-closing the endpoint so that requests still on it complete
 * (UCS_ERR_CANCELED).  By id, not by pointer: the caller's pointer may be stale. */
void kvl__ucx_drop_peer(ucx_transport *u, uint64_t id) {
    for (ucx_peer **pp = &u->peers; *pp; pp = &(*pp)->next) {
        if ((*pp)->id != id) continue;
        remove_peer(u, pp, 1);
        return;
    }
}

void kvl__ucx_drop_all_peers(ucx_transport *u) {
    while (u->peers) remove_peer(u, &u->peers, 1);
}
