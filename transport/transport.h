/* transport/transport.h: moving cache-span payloads between nodes (one interface; UCX today,
 * NCCL later).  The header of a span travels over gRPC (ImportSpan); only the payload bytes
 * travel here, as one tagged message:
 *   receiver: tag = kvl__transport_new_tag(); kvl__transport_recv_post(tag, buf, len);
 *             publish kvl__transport_address() + tag to the sender (ImportSpan reply);
 *             kvl__transport_recv_wait() ... kvl__transport_recv_free()
 *   sender:   kvl__transport_send(peer_address, tag, buf, len)
 * (A pull in push mode also sends the header behind the payload in the same message: the
 * trailer of span.h.)
 * A message longer than the posted buffer fails the receive (KVL_ERR_RANGE: "payload larger
 * than announced"); a shorter one completes with *received < len, which the caller rejects as
 * truncated.  Large messages go by rendezvous (UCX: zero-copy get/put over shared memory, CMA
 * or TCP as UCX selects).
 *
 * Thread safety: all functions may be called from any thread; a transport runs its own
 * progress thread.
 */
#ifndef KVL_TRANSPORT_H
#define KVL_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvl__transport kvl__transport;
typedef struct kvl__transport_recv kvl__transport_recv;

/* Create a transport of `kind` ("ucx"; NULL = "ucx").  KVL_ERR_UNSUPPORTED for an unknown
 * kind, KVL_ERR_IO when the library cannot initialise (message names the UCX error).  Free with
 * kvl__transport_free. */
kvl_status kvl__transport_create(const char *kind, kvl__transport **out);
void kvl__transport_free(kvl__transport *t);

const char *kvl__transport_kind(const kvl__transport *t);

/* Opaque address peers send to (UCX worker address), owned by t. */
void kvl__transport_address(const kvl__transport *t, const uint8_t **addr, size_t *len);

/* A fresh random 64-bit tag (never 0) for one receive: a sender learns it only from the
 * receiver's reply, so nobody else can aim a message at that receive. */
uint64_t kvl__transport_new_tag(kvl__transport *t);

/* Messages that arrived for no posted receive (a guessed tag, a transfer whose import had
 * already ended): each is received into scratch memory and dropped, so they never pile up. */
uint64_t kvl__transport_unmatched_dropped(const kvl__transport *t);

/* Post a receive of up to `len` bytes with exactly `tag` into `buf` (caller-owned; must stay
 * valid until kvl__transport_recv_free returns).  Free the handle with kvl__transport_recv_free. */
kvl_status kvl__transport_recv_post(kvl__transport *t, uint64_t tag, void *buf, size_t len,
                                   kvl__transport_recv **out);

/* Wait for a posted receive.  Returns KVL_OK with *received = bytes that arrived, or
 * KVL_ERR_CANCELLED when *cancel became nonzero (checked every millisecond; cancel may be
 * NULL), KVL_ERR_IO on timeout (timeout_ms <= 0: none) or a transport error, KVL_ERR_RANGE when
 * the message was larger than the buffer.  After an error the receive is cancelled. */
kvl_status kvl__transport_recv_wait(kvl__transport *t, kvl__transport_recv *r, int64_t timeout_ms,
                                   const volatile int *cancel, size_t *received);

/* Wait up to wait_us microseconds for a posted receive without ending it: 1 once it has
 * completed (kvl__transport_recv_wait then returns its result at once), 0 while it is still
 * pending (1 for a NULL t or r: nothing to wait for).  wait_us 0: one look (a pass of the
 * transport's progress).  For a caller that watches something else too (a node waiting for a
 * span's bytes and for the source's answer, whichever comes first). */
int kvl__transport_recv_poll(kvl__transport *t, kvl__transport_recv *r, int64_t wait_us);

/* What takes back a buffer that a send or receive still uses after its call returned (see
 * kvl__transport_send, kvl__transport_recv_free): called once with `arg` and the buffer, from
 * whichever thread drives the transport when the operation finally ends, or from
 * kvl__transport_free.  It must not call into the transport. */
typedef void (*kvl__transport_release_fn)(void *arg, void *buf);

/* Cancel if still pending and release.  Returns 1 when the receive's buffer is the caller's
 * again (NULL: a no-op, 1).  Returns 0 when the receive had already matched a message whose
 * sender stopped mid-way (killed during a transfer), so that it could be neither cancelled nor
 * completed within 2 s: the transport keeps the handle and the buffer, which may still be
 * written; it gives the buffer to release(release_arg, buf) when the receive ends or at
 * kvl__transport_free (release NULL: the buffer must then outlive the transport).  Counted by
 * kvl__transport_receives_abandoned. */
int kvl__transport_recv_free(kvl__transport *t, kvl__transport_recv *r, kvl__transport_release_fn release,
                             void *release_arg);
uint64_t kvl__transport_receives_abandoned(const kvl__transport *t);

/* Send buf[0..len) to the peer at `addr` with `tag`; blocks until the data has left `buf`
 * (the peer took it).  Endpoints are created on first use and cached.  KVL_ERR_IO on a peer
 * failure (peer gone, unreachable) or timeout (timeout_ms <= 0: none), KVL_ERR_CANCELLED when
 * *cancel became nonzero (cancel may be NULL; already nonzero at the call: nothing is sent);
 * after a failure the endpoint is closed and the next send to that address makes a new one.
 * *kept (may be NULL) is set to 1 when the send outlived the call: a peer that stopped taking
 * data (a frozen process) may still take the rest later, so the transport keeps reading buf
 * and gives it to release(release_arg, buf) once the send ends; the caller must then neither
 * free nor reuse buf (release NULL: buf must outlive the transport).  Else *kept is 0 and buf
 * is the caller's again. */
kvl_status kvl__transport_send(kvl__transport *t, const uint8_t *addr, size_t addr_len,
                              uint64_t tag, const void *buf, size_t len, int64_t timeout_ms,
                              const volatile int *cancel, kvl__transport_release_fn release,
                              void *release_arg, int *kept);
/* Sends whose buffer the transport kept past their call (a stalled peer), since it started. */
uint64_t kvl__transport_sends_kept(const kvl__transport *t);
/* Endpoints to peers kept now, and idle ones closed since the start to keep them within the
 * transport's bound (a peer that restarted with a new address leaves its old one behind). */
uint64_t kvl__transport_peers_open(const kvl__transport *t);
uint64_t kvl__transport_peers_evicted(const kvl__transport *t);

/* Set up (and cache) the endpoint to the peer at `addr` ahead of the first send, and wait until
 * it is wired up, so that the first span to that peer pays no connection set-up.  KVL_ERR_IO on
 * an unreachable peer or timeout (timeout_ms <= 0: none); the next send then starts afresh. */
kvl_status kvl__transport_connect(kvl__transport *t, const uint8_t *addr, size_t addr_len,
                                 int64_t timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
