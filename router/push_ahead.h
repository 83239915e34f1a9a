/* router/push_ahead.h: span push-ahead.  When the router can tell which model is likely to
 * answer a session's next turn, it ships the new part of the session's KV span to a node of
 * that model right after the turn ends, off the critical path, so the next switch there moves
 * only the tokens after the push (often none: a 0-token translated switch).
 *
 * Predictions, after a committed turn:
 *   - the request's hint (SendRequest.prefetch_model: "after this turn, prepare that model");
 *   - else the policy's predict op (cascade: the rung observe() moved the session to).
 * `push_ahead: false` in the policy block turns both off; `push_ahead_queue: 0` turns the
 * feature off router-wide (config.h).
 *
 * A push runs on a worker thread, under the session's ledger lease taken with its own owner
 * name ("REPLICA/push"), so no turn of any replica runs while it moves the span (a turn arriving
 * meanwhile waits for the lease, at most the push's deadlines, which together stay under
 * lease_wait_ms: the export gets half of it, each node call an eighth).  A push whose
 * session is busy or has moved on is skipped: the next turn switches by itself.  The push
 * checks the source holds exactly the ledger's tokens (count, idle, SHA-256), ships [what the
 * target caches, what the source caches) with a transfer ticket, verifies the imported range
 * and the target's token hash, and only then records the target's holding.  Any failure
 * leaves the ledger saying nothing the nodes do not hold: a wrong guess or a failed push costs
 * background work, never a wrong answer.
 *
 * Metrics: kvlingo_router_push_ahead_total{result} (shipped, used, unused, skipped_busy,
 * skipped, dropped_full, failed) and kvlingo_router_push_ahead_seconds (export + translate).
 * A replica remembers the pushes it made (bounded), to report in the next turn's summary how
 * many tokens were pushed ahead; a turn answered by another replica reports 0 (the push still
 * saved the work).
 */
#ifndef KVR_PUSH_AHEAD_H
#define KVR_PUSH_AHEAD_H

#include "kvlingo/status.h"

struct kvr_router;
struct kvr_turn_req;
struct kvr_turn_out;
struct kvr_policy_input;
struct kvr_policy_state;

typedef struct kvr_push_ahead kvr_push_ahead;

/* Start the workers for router `r` (not owned; its cfg, registry, ledger, metrics, policy and
 * busy table must outlive the object).  *out = NULL (and KVL_OK) when push_ahead_queue is 0 or
 * lease_wait_ms is 0 (a turn could not wait for a push).  KVL_ERR_NOMEM / KVL_ERR_INTERNAL
 * (thread start) otherwise. */
kvl_status kvr_push_ahead_create(struct kvr_router *r, kvr_push_ahead **out);
/* Stop the workers (a push in flight ends at its deadline); queued pushes are dropped. */
void kvr_push_ahead_free(kvr_push_ahead *p);

/* Called by the turn right after its commit succeeded (the session is still reserved), with
 * the answering node's index, the policy input of the turn and the state observe() left.
 * Fills out->pushed_ahead_tokens when this turn used a push of the previous one, and queues a
 * push to the predicted node (never blocks: a full queue drops it), unless node_dropped: the
 * answering node's copy was dropped after the commit (it held other than the ledger), so
 * there is nothing to push from.  p == NULL: no-op. */
void kvr_push_ahead_after_turn(kvr_push_ahead *p, const struct kvr_turn_req *req, int node, int node_dropped,
                               const struct kvr_policy_input *in,
                               const struct kvr_policy_state *st, struct kvr_turn_out *out);

/* A turn that found the session's lease busy: when a push of this replica holds it, wait until
 * that push releases it (or timeout_s passes) and return 1; else return 0 at once (the holder
 * is another replica, or a push not yet marked: the caller backs off and tries again).  Lets
 * the turn that follows a push start when the push ends instead of at its next poll.
 * p == NULL: 0. */
int kvr_push_ahead_wait(kvr_push_ahead *p, const char *sid, double timeout_s);

#endif
