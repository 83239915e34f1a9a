/* transport/transport_internal.h: the function table behind kvl_transport (one per kind). */
#ifndef KVL_TRANSPORT_INTERNAL_H
#define KVL_TRANSPORT_INTERNAL_H

#include "transport.h"

typedef struct kvl_transport_ops {
    const char *kind;
    void (*free)(kvl_transport *t);
    void (*address)(const kvl_transport *t, const uint8_t **addr, size_t *len);
    kvl_status (*recv_post)(kvl_transport *t, uint64_t tag, void *buf, size_t len,
                            kvl_transport_recv **out);
    kvl_status (*recv_wait)(kvl_transport *t, kvl_transport_recv *r, int64_t timeout_ms,
                            const volatile int *cancel, size_t *received);
    void (*recv_free)(kvl_transport *t, kvl_transport_recv *r);
    kvl_status (*send)(kvl_transport *t, const uint8_t *addr, size_t addr_len, uint64_t tag,
                       const void *buf, size_t len, int64_t timeout_ms,
                       const volatile int *cancel);
} kvl_transport_ops;

/* Every implementation's struct starts with this. */
struct kvl_transport {
    const kvl_transport_ops *ops;
    uint64_t next_tag;   /* atomic */
};

kvl_status kvl_transport_ucx_create(kvl_transport **out);

#endif
