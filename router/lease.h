/* router/lease.h: the session leases this replica holds while its turns run.
 *
 * A turn takes its session's lease in the ledger (kvr_ledger_lease_acquire) and registers it
 * here; a keeper thread renews every registered lease each third of the lease time, so a turn
 * longer than the lease keeps it, and a replica that dies stops renewing: another replica
 * takes the session over once the lease has expired.  The table is bounded (the busy-session
 * limit); it also answers "does this replica already drive the session?" for front doors
 * that have no busy table of their own. */
#ifndef KVR_LEASE_H
#define KVR_LEASE_H

#include <stdint.h>

#include "kvlingo/status.h"
#include "ledger.h"

typedef struct kvr_leases kvr_leases;

/* Start the keeper for `owner` on `ledger` (not owned): leases of ttl_s seconds, at most
 * `max` held at once. */
kvl_status kvr_leases_create(kvr_ledger *ledger, const char *owner, double ttl_s, int max,
                             kvr_leases **out);
/* Stop the keeper (leases still registered are released in the ledger). */
void kvr_leases_free(kvr_leases *k);

/* Reserve the session before its lease is taken in the ledger, so two turns of this replica
 * never both take it.  KVL_ERR_MISMATCH "is busy" when this replica already drives the
 * session; KVL_ERR_NOMEM when the table is full. */
kvl_status kvr_leases_add(kvr_leases *k, const char *id);
/* The lease taken for a reserved session: from now on the keeper renews it. */
void kvr_leases_bind(kvr_leases *k, const char *id, int64_t gen);
/* Unregister; a bound lease is released in the ledger.  Returns 1 when the keeper found the
 * lease lost (its renewal failed: another replica took the session over), else 0. */
int kvr_leases_drop(kvr_leases *k, const char *id);

int kvr_leases_held(kvr_leases *k);
long kvr_leases_renew_failures(kvr_leases *k);
const char *kvr_leases_owner(const kvr_leases *k);
double kvr_leases_ttl(const kvr_leases *k);

#endif
