/* transport/transport_internal.h: the function table behind kvl__transport (one per kind). */
#ifndef KVL_TRANSPORT_INTERNAL_H
#define KVL_TRANSPORT_INTERNAL_H

#include "transport.h"

typedef struct kvl__transport_ops {
    const char *kind;
    void (*free)(kvl__transport *t);
    void (*address)(const kvl__transport *t, const uint8_t **addr, size_t *len);
    kvl_status (*recv_post)(kvl__transport *t, uint64_t tag, void *buf, size_t len,
                            kvl__transport_recv **out);
    kvl_status (*recv_wait)(kvl__transport *t, kvl__transport_recv *r, int64_t timeout_ms,
                            const volatile int *cancel, size_t *received);
    int (*recv_free)(kvl__transport *t, kvl__transport_recv *r, kvl__transport_release_fn release,
                     void *release_arg);   /* as kvl__transport_recv_free */
    int (*recv_poll)(kvl__transport *t, kvl__transport_recv *r, int64_t wait_us);   /* as kvl__transport_recv_poll */
    kvl_status (*send)(kvl__transport *t, const uint8_t *addr, size_t addr_len, uint64_t tag,
                       const void *buf, size_t len, int64_t timeout_ms,
                       const volatile int *cancel, kvl__transport_release_fn release,
                       void *release_arg, int *kept);   /* as kvl__transport_send */
    /* may be NULL: the kind needs no connection set-up */
    kvl_status (*connect)(kvl__transport *t, const uint8_t *addr, size_t addr_len, int64_t timeout_ms);
} kvl__transport_ops;

/* Every implementation's struct starts with this. */
struct kvl__transport {
    const kvl__transport_ops *ops;
    uint64_t next_tag;   /* atomic */
    uint64_t unmatched_dropped;   /* atomic: messages no posted receive expected, dropped */
    uint64_t receives_abandoned;  /* atomic: receives kvl__transport_recv_free could not take back */
    uint64_t sends_kept;          /* atomic: sends whose buffer outlived kvl__transport_send   */
    uint64_t peers_open;          /* atomic: endpoints kept now                                 */
    uint64_t peers_evicted;       /* atomic: idle endpoints closed to stay within the bound     */
};

kvl_status kvl__transport_ucx_create(kvl__transport **out);

#endif
