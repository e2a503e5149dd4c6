/* scheduler.h — admission queue and packing loop in front of an engine.
 *
 * Producers hand in encoded records (clef_job, see engine.h) and either wait
 * (clef_scheduler_submit) or are called back (clef_scheduler_submit_async,
 * the server's way: its worker threads never wait for a forward); one engine
 * thread takes every record waiting, in arrival order, up to a token budget,
 * and runs them as one packed forward (clef_engine_run).  A record longer than the budget runs
 * alone.  The queue is bounded: when it is full a submission is refused at
 * once (503 + retry) instead of piling up memory.
 *
 * Because clef_engine_run gives each record the logits of running it alone,
 * a record's answer never depends on what it was batched with.
 */
#ifndef CLEF_ENGINE_SCHEDULER_H
#define CLEF_ENGINE_SCHEDULER_H

#include <stddef.h>

#include "engine/engine.h"
#include "util/err.h"

#define CLEF_SCHED_DEFAULT_MAX_QUEUE 256
#define CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS 16384

typedef struct clef_scheduler_options {
    size_t max_queue;        /* records waiting (not counting the batch being run); 0 = CLEF_SCHED_DEFAULT_MAX_QUEUE */
    size_t max_batch_tokens; /* token budget of one packed forward; 0 = CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS */
    /* Called on the engine thread after every forward (may be NULL):
     * records in the batch, their total tokens, and the forward's wall time in seconds. */
    void (*on_batch)(void *ctx, size_t n_records, size_t n_tokens, double seconds);
    void *ctx;
} clef_scheduler_options;

typedef struct clef_scheduler clef_scheduler;

/* Start the engine thread over `e` (borrowed; must outlive the scheduler).
 * Returns NULL + err (500) if the thread cannot be created. */
clef_scheduler *clef_scheduler_start(clef_engine *e, const clef_scheduler_options *opt, clef_err *err);

/* Queue one encoded job and block until its forward is done.  Returns 0 with
 * job->logits filled, or -1 + err: 503 "overloaded" when the queue is full or
 * the scheduler is stopping (the caller should send Retry-After), or the
 * job's own forward error (422 capacity, 500 internal).  Thread-safe. */
int clef_scheduler_submit(clef_scheduler *s, clef_job *job, clef_err *err);

/* Called once per asynchronous submission, on the engine thread, after the
 * job's forward: `err` (borrowed, valid during the call) is cleared
 * (status 0) with job->logits filled, or the job's own forward error (422
 * capacity, 500 internal).  It must not block for long (the next forward
 * waits for it) and must not call back into the scheduler's stop or free. */
typedef void (*clef_scheduler_done_fn)(void *ctx, clef_job *job, const clef_err *err);

/* Queue one encoded job and return at once.  Returns 0 when queued: then
 * on_done(ctx, job, err) runs exactly once (also when a stop comes first:
 * clef_scheduler_stop finishes the queue), and `job` must stay valid and
 * untouched until it does.  Returns -1 + err when refused (503 "overloaded":
 * the queue is full or the scheduler is stopping); on_done is then never
 * called.  Thread-safe. */
int clef_scheduler_submit_async(clef_scheduler *s, clef_job *job, clef_scheduler_done_fn on_done, void *ctx,
                                clef_err *err);

/* Records waiting now (not counting the batch being run). */
size_t clef_scheduler_queue_depth(clef_scheduler *s);

/* Refuse new submissions (503 "the server is shutting down"), finish every
 * queued record and join the engine thread.  Submitting after stop is safe
 * (refused) until clef_scheduler_free.  Idempotent; NULL is ok. */
void clef_scheduler_stop(clef_scheduler *s);

/* Stop (if not yet) and free.  No submitter may still be inside
 * clef_scheduler_submit.  NULL is ok. */
void clef_scheduler_free(clef_scheduler *s);

/* A refusal because the queue is full or the server stops is 503
 * CLEF_E_OVERLOADED (util/err.h). */

#endif
