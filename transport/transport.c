/* transport/transport.c: kind dispatch of the transport interface. */
#include "transport_internal.h"

#include <string.h>
#include <sys/random.h>

#include "error.h"

kvl_status kvl__transport_create(const char *kind, kvl__transport **out) {
    if (!out) return kvl__errorf(KVL_ERR_INVALID_ARG, "transport: NULL out");
    *out = NULL;
    if (!kind || strcmp(kind, "ucx") == 0) return kvl__transport_ucx_create(out);
    return kvl__errorf(KVL_ERR_UNSUPPORTED, "transport: unknown kind '%s' (supported: ucx)", kind);
}

void kvl__transport_free(kvl__transport *t) {
    if (t) t->ops->free(t);
}

const char *kvl__transport_kind(const kvl__transport *t) { return t ? t->ops->kind : ""; }

void kvl__transport_address(const kvl__transport *t, const uint8_t **addr, size_t *len) {
    t->ops->address(t, addr, len);
}

uint64_t kvl__transport_new_tag(kvl__transport *t) {
    /* random, so that whoever can reach the transport cannot aim messages at a receive it
     * does not know the tag of; the counter only backs a failed random source (never in
     * practice on Linux, where getrandom waits for the pool once at boot) */
    uint64_t tag = 0;
    for (int i = 0; i < 4 && tag == 0; i++)
        if (getrandom(&tag, sizeof tag, 0) != (ssize_t)sizeof tag) tag = 0;
    if (tag == 0) tag = __atomic_add_fetch(&t->next_tag, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull;
    return tag ? tag : 1;
}

uint64_t kvl__transport_unmatched_dropped(const kvl__transport *t) {
    return t ? __atomic_load_n(&t->unmatched_dropped, __ATOMIC_RELAXED) : 0;
}

kvl_status kvl__transport_recv_post(kvl__transport *t, uint64_t tag, void *buf, size_t len,
                                   kvl__transport_recv **out) {
    if (!t || !out || (!buf && len))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "transport: recv_post: NULL argument");
    return t->ops->recv_post(t, tag, buf, len, out);
}

kvl_status kvl__transport_recv_wait(kvl__transport *t, kvl__transport_recv *r, int64_t timeout_ms,
                                   const volatile int *cancel, size_t *received) {
    if (!t || !r || !received) return kvl__errorf(KVL_ERR_INVALID_ARG, "transport: recv_wait: NULL");
    return t->ops->recv_wait(t, r, timeout_ms, cancel, received);
}

int kvl__transport_recv_poll(kvl__transport *t, kvl__transport_recv *r, int64_t wait_us) {
    if (!t || !r) return 1;
    return t->ops->recv_poll(t, r, wait_us);
}

int kvl__transport_recv_free(kvl__transport *t, kvl__transport_recv *r, kvl__transport_release_fn release,
                             void *release_arg) {
    return t && r ? t->ops->recv_free(t, r, release, release_arg) : 1;
}

uint64_t kvl__transport_sends_kept(const kvl__transport *t) {
    return t ? __atomic_load_n(&t->sends_kept, __ATOMIC_RELAXED) : 0;
}

uint64_t kvl__transport_peers_open(const kvl__transport *t) {
    return t ? __atomic_load_n(&t->peers_open, __ATOMIC_RELAXED) : 0;
}

uint64_t kvl__transport_peers_evicted(const kvl__transport *t) {
    return t ? __atomic_load_n(&t->peers_evicted, __ATOMIC_RELAXED) : 0;
}

uint64_t kvl__transport_receives_abandoned(const kvl__transport *t) {
    return t ? __atomic_load_n(&t->receives_abandoned, __ATOMIC_RELAXED) : 0;
}

kvl_status kvl__transport_send(kvl__transport *t, const uint8_t *addr, size_t addr_len,
                              uint64_t tag, const void *buf, size_t len, int64_t timeout_ms,
                              const volatile int *cancel, kvl__transport_release_fn release,
                              void *release_arg, int *kept) {
    if (kept) *kept = 0;
    if (!t || !addr || !addr_len || (!buf && len))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "transport: send: NULL argument");
    return t->ops->send(t, addr, addr_len, tag, buf, len, timeout_ms, cancel, release, release_arg, kept);
}

kvl_status kvl__transport_connect(kvl__transport *t, const uint8_t *addr, size_t addr_len,
                                 int64_t timeout_ms) {
    if (!t || !addr || !addr_len)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "transport connect: no peer address");
    return t->ops->connect ? t->ops->connect(t, addr, addr_len, timeout_ms) : KVL_OK;
}
