/* router/guard.h: the quality guardrail.
 *
 * Translation is approximate; the guardrail watches how far it drifts from the target's native
 * behaviour, per translator pair (source model -> target model).  For a configurable fraction of
 * translated switches the target's first-token distribution on the translated cache is kept, and
 * off the critical path (a worker thread) the target re-prefills the same tokens natively in a
 * scratch session and yields its native distribution.  KL(native || translated) feeds an
 * exponential moving average per pair; when that exceeds the pair's budget (after min_samples
 * samples) the pair is disabled: the router re-prefills instead of translating for it, says so in
 * the log, in kvlingo_router_pairs_disabled and in ListNodes.  After retry_seconds it is back on
 * probation (reason "probation"): translated, every switch shadowed, until min_samples fresh
 * samples pass it (enabled) or fail it (disabled again, for twice as long, up to a day).  With
 * retry_seconds 0 it stays disabled until the router restarts or SIGHUP raises the budget above
 * its moving KL.  Only the guardrail's own samples count: a client's compare_reprefill KL is
 * reported to that client and never recorded here (a tenant could otherwise switch a pair off
 * for everyone with inputs chosen to score badly).
 */
#ifndef KVR_GUARD_H
#define KVR_GUARD_H

#include <stdint.h>

#include "metrics.h"
#include "registry.h"

typedef struct kvr_guard kvr_guard;

typedef struct kvr_pair_status {
    char source[KVR_NAME_MAX], target[KVR_NAME_MAX];
    int enabled;
    char reason[64];
    double moving_kl, budget;
    unsigned samples;
    unsigned long long switches;
} kvr_pair_status;

kvl_status kvr_guard_create(const kvr_config *cfg, kvr_registry *reg, kvr_metrics *m,
                            kvr_guard **out);
/* Stops the worker (pending samples are dropped) and frees. */
void kvr_guard_free(kvr_guard *g);
/* New fraction/budget/alpha/min_samples (SIGHUP); re-enables pairs now under budget. */
void kvr_guard_configure(kvr_guard *g, const kvr_config *cfg);

/* Pair filter for policies and the switch path: 0 when the guardrail disabled the pair. */
int kvr_guard_pair_ok(void *g, const char *src, const char *dst);
/* 1 when the pair's next counted switch will be shadowed (nothing counted): a caller that must
 * ask for logprobs before it knows whether its switch translates asks this first, and counts
 * with kvr_guard_count_switch once the switch did translate. */
int kvr_guard_shadow_due(kvr_guard *g, const char *src, const char *dst);
/* Count a translated switch of the pair; returns 1 when this one should be shadowed.
 * can_shadow 0: the caller has not the logprobs a shadow compares (it asked for them before
 * the pair was due), so a sample that falls due stays due for the pair's next switch. */
int kvr_guard_count_switch(kvr_guard *g, const char *src, const char *dst, int can_shadow);
/* Record one of the guardrail's own KL samples (never a client's compare_reprefill). */
void kvr_guard_record(kvr_guard *g, const char *src, const char *dst, double kl);
/* Every ordered pair of a full fleet's models (each node serves one): the pairs tracked. */
#define KVR_GUARD_MAX_PAIRS (KVR_MAX_NODES * (KVR_MAX_NODES - 1))
int kvr_guard_pairs(kvr_guard *g, kvr_pair_status *out, int max);
int kvr_guard_disabled_count(kvr_guard *g);

/* KL(p || q) in nats for two log-distributions of `n` entries. */
double kvr_kl_logprobs(const float *lp_p, const float *lp_q, int n);
/* Entropy (nats) of a log-distribution. */
double kvr_entropy_logprobs(const float *lp, int n);

/* Native re-prefill of tokens[0..n) on node `node` in a scratch session named
 * "<sid>.shadow.<k>": returns the first-token log-distribution (malloc'ed [*vocab], may be
 * NULL when not wanted) and the TTFT measured here (open + append + generate to first token).
 * The scratch session is always dropped. */
kvl_status kvr_shadow_run(kvr_node *node, const char *sid, const int32_t *tokens, int n,
                          int64_t timeout_ms, float **logprobs, int *vocab, double *ttft_s);

/* Queue an asynchronous guardrail sample: the worker runs kvr_shadow_run on node `ni` and
 * records KL(native || translated).  Takes ownership of tokens and translated (malloc'ed).
 * Dropped (and counted) when the queue is full. */
void kvr_guard_enqueue(kvr_guard *g, int ni, const char *sid, const char *src, const char *dst,
                       int32_t *tokens, int n, float *translated, int vocab);

#endif
