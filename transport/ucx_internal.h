/* transport/ucx_internal.h: what the UCX transport's files share (ucx.c: the worker, its
 * progress and the operations; ucx_peers.c: the table of endpoints to peers).  Private to
 * transport/. */
#ifndef KVL_TRANSPORT_UCX_INTERNAL_H
#define KVL_TRANSPORT_UCX_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "transport_internal.h"

typedef struct ucx_op {
    int done;
    ucs_status_t status;
    size_t length;
    void *req;
} ucx_op;

struct kvl__transport_recv {
    ucx_op op;
};

typedef struct ucx_peer {
    uint8_t *addr;
    size_t len;
    ucp_ep_h ep;
    uint64_t id;          /* unique per endpoint made: a peer_op that waited (mu released) may
                           * find its peer dropped and another made for the same address, at
                           * the same heap address, and must not close that one */
    int failed;
    int busy;             /* peer_ops on it now (mu released while they wait): not evicted  */
    uint64_t last_use;    /* the transport's use count at its last use: the least recently    */
                          /* used idle one goes first (a clock's ticks could tie)             */
    struct ucx_peer *next;
} ucx_peer;

/* Endpoints kept at most.  Peers are fleet members, but a member that restarts comes back
 * with a new worker address, and its old endpoint would otherwise stay for the process's life
 * (with what UCX holds for it: a mapping of the peer's shared-memory segments); past the bound
 * the least recently used endpoint with no operation in flight is closed.  A send to it later
 * makes a new one.  KVL_UCX_MAX_PEERS in the environment sets another bound (at least 1). */
#define KVL_UCX_MAX_PEERS_DEFAULT 128

typedef struct ucx_transport {
    kvl__transport base;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int err_mode_peer;
    pthread_mutex_t mu;   /* guards every ucp call and the fields below */
    pthread_cond_t cv;    /* an op completed */
    pthread_t progress;
    int progress_started;
    int stop;
    int outstanding;
    int waiters;          /* threads in wait_op, driving the worker themselves */
    ucx_peer *peers;
    int n_peers, max_peers;
    uint64_t uses;        /* endpoint uses so far: ucx_peer.last_use */
    uint64_t next_peer_id;
    struct op_with_t *orphans;   /* sends abandoned on a stalled peer (see ucx_send), receives
                                  * abandoned mid-message (ucx_recv_free) */
    int n_orphans;               /* of outstanding: a receive whose sender died never completes,
                                  * so the progress loop does not count them as work due */
    uint8_t *scratch;            /* where unexpected messages are received to be dropped */
    int drains;                  /* such receives in flight (a stuck one no longer counts)  */
    struct drain_op *drain_list; /* every drain not completed yet, stuck ones included      */
    int n_stuck;                 /* of outstanding: drains whose sender died mid-message     */
} ucx_transport;

#define KVL_UCX_ADDR_PAD 1024   /* zeros behind a peer's address copy (see kvl__ucx_get_peer) */

/* ---- the endpoint table (ucx_peers.c); every function with u->mu held ---------------------- */

/* Find or create the endpoint for addr (failed ones are replaced; past u->max_peers the least
 * recently used idle one is closed first). */
kvl_status kvl__ucx_get_peer(ucx_transport *u, const uint8_t *addr, size_t len, ucx_peer **out);
/* The peer made with `id` (ucx_peer.id), if still listed, ends an operation. */
void kvl__ucx_peer_idle(ucx_transport *u, uint64_t id);
/* Drop the peer made with `id` whose endpoint failed or stalled, if still listed. */
void kvl__ucx_drop_peer(ucx_transport *u, uint64_t id);
/* Close every endpoint (the transport's end). */
void kvl__ucx_drop_all_peers(ucx_transport *u);

#endif
