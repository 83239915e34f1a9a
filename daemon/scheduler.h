/* daemon/scheduler.h: the scheduler, which owns every forward pass of the node's model: its
 * thread runs the steps, except a job's first step on an idle node, which the submitting
 * thread runs itself (it waits for that step's token anyway; a wake-up each way saved).  One
 * thread steps at a time.
 *
 * Continuous batching: each step gathers (1) one decode token for every generating session,
 * up to max_batch sequences, and (2) prefill chunks of at most prefill_chunk tokens in total,
 * and runs them as ONE kvl_model_forward (projections and MLP are one GEMM over all tokens).
 * A long prefill thus advances chunk by chunk while decoding sessions keep getting a token per
 * step.  Jobs join and leave between steps.  A job owns its session (acquired by the caller)
 * until it finishes. */
#ifndef KVLD_SCHEDULER_H
#define KVLD_SCHEDULER_H

#include <stdint.h>

#include "kvlingo/model.h"
#include "kvlingo/sampling.h"
#include "metrics.h"
#include "session.h"

typedef struct kvld_sched kvld_sched;
typedef struct kvld_job kvld_job;

typedef struct kvld_sched_params {
    int max_batch;        /* sequences per forward                       */
    int prefill_chunk;    /* prefill tokens per forward (all sessions)   */
    /* While sessions decode, a step that also carries prefill may take at most this many times
     * a decode-only step (measured as the node runs): the prefill chunk shrinks to fit, down to
     * KVLD_MIN_PREFILL_CHUNK tokens, so a long prompt stretches the decoders' inter-token time
     * by this factor, not by the chunk's whole cost.  0 (or < 1): always prefill_chunk. */
    double decode_stretch;
    /* Backpressure: a generate job whose reader (the gRPC stream) has not taken this many bytes
     * of output pauses until it does; so do all jobs with unread output while the node's total
     * exceeds node_buffer_bytes.  0: defaults (1 MiB, 64 MiB). */
    size_t stream_backlog_bytes;
    size_t node_buffer_bytes;
} kvld_sched_params;

/* Defaults of kvld_sched_params (kvld's config uses the same). */
#define KVLD_DEFAULT_DECODE_STRETCH 2.0
/* Fewest prefill tokens a step carries next to decoding sessions.  Measured with
 * bench_batch --long-prefill 2048 (qwen3-b, float32, 2 threads): a chunk of 16 tokens late in
 * a 2k prompt cost 4-7 ms against a 0.6 ms decode step, so one decoding session's p99
 * inter-token time was 10-13x its p50 alone; with 4 it is 2.3-3.2x, and 16 sessions are not
 * slowed (their budget is above the minimum). */
#define KVLD_MIN_PREFILL_CHUNK 4

kvl_status kvld_sched_create(kvl_model *model, kvld_metrics *metrics,
                             const kvld_sched_params *p, kvld_sched **out);
/* Stops the thread; jobs still queued finish with KVL_ERR_CANCELLED. */
void kvld_sched_free(kvld_sched *s);

/* Jobs queued or running. */
int kvld_sched_active(kvld_sched *s);

/* Bytes of generated output no reader has taken yet, over all jobs. */
size_t kvld_sched_buffered(kvld_sched *s);

/* Bring the session's cache up to its ledger (chunked prefill; logits of the last token kept).
 * Blocks.  `cancel` (may be NULL) aborts between steps. */
kvl_status kvld_sched_prefill(kvld_sched *s, kvld_session *sess, const volatile int *cancel);

#define KVLD_MAX_STOP_IDS 8

typedef struct kvld_gen_params {
    int max_tokens;           /* >= 1 */
    int stop_at_eos;
    int32_t stop_ids[KVLD_MAX_STOP_IDS];   /* further ids that end the job ("stop") */
    int n_stop;
    int want_logprobs;        /* full log-softmax per token */
    /* NULL, or a flag the caller sets (e.g. from its call's cancel callback) that ends the job
     * as cancelled at the next step; it must outlive the job.  Set before the job exists, it
     * covers the first step, which kvld_sched_generate may run before returning the job to
     * kvld_job_cancel. */
    const volatile int *cancel;
    kvl_sampler_params sampler;
} kvld_gen_params;

/* One generated token; logprobs (when asked) is [vocab]: kvld_job_next hands it to the reader,
 * who frees it (free()) once sent. */
typedef struct kvld_token {
    int32_t id;
    float logprob;
    float *logprobs;
} kvld_token;

/* Start generating on `sess` (whose ledger must be non-empty).  On an idle node it returns
 * after the job's first step, which it runs on the calling thread (for a prompt within
 * prefill_chunk the first token is then ready for kvld_job_next; a session already prefilled
 * gets it without a forward pass). */
kvl_status kvld_sched_generate(kvld_sched *s, kvld_session *sess, const kvld_gen_params *p,
                               kvld_job **out);

/* Wait for the next token: 1 and *tok filled; 0 when the job has finished (all tokens read). */
int kvld_job_next(kvld_job *j, kvld_token *tok);

/* After kvld_job_next returned 0: the job's status (message in *err), finish reason
 * ("length", "eos", "context", "cancelled", "error"), time to first token (s). */
kvl_status kvld_job_result(kvld_job *j, const char **err, const char **finish_reason,
                           double *ttft);

/* Ask the job to stop (thread-safe; used from gRPC cancel callbacks). */
void kvld_job_cancel(kvld_job *j);

/* Release a job; cancels and waits for it first when it has not finished. */
void kvld_job_free(kvld_job *j);

#endif
