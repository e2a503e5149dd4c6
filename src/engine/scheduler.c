/* scheduler.c — bounded FIFO of waiting records and the engine thread that
 * packs them into forwards.  See scheduler.h. */
#include "engine/scheduler.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/timer.h"

/* One waiting submission.  A blocking one (clef_scheduler_submit) lives on
 * the submitter's stack until `done`; an asynchronous one is heap-allocated,
 * owns its err, and is freed by the engine thread after its callback. */
typedef struct ticket {
    clef_job *job;
    clef_err *err;
    int done;
    pthread_cond_t cond;
    clef_scheduler_done_fn on_done; /* NULL = blocking: wake the submitter instead */
    void *ctx;
    clef_err own_err;
    struct ticket *next;
} ticket;

struct clef_scheduler {
    clef_engine *engine;
    clef_scheduler_options opt;
    pthread_mutex_t lock;
    pthread_cond_t work;  /* signalled when a ticket arrives or on stop */
    ticket *head, *tail;  /* FIFO of waiting tickets */
    size_t depth;
    int stopping;
    int joined; /* the engine thread has been (or is being) joined */
    pthread_t thread;
};

/* Take the waiting tickets that fit the token budget (always at least one),
 * in arrival order.  Called with the lock held and the queue non-empty. */
static size_t take_batch(clef_scheduler *s, ticket ***batch, size_t *cap) {
    size_t n = 0, tokens = 0;
    while (s->head) {
        size_t t = s->head->job->rec.n_ids;
        if (n > 0 && tokens + t > s->opt.max_batch_tokens) break;
        if (n == *cap) {
            *cap = *cap ? 2 * *cap : 16;
            *batch = clef_xrealloc(*batch, *cap * sizeof **batch);
        }
        (*batch)[n++] = s->head;
        tokens += t;
        s->head = s->head->next;
        s->depth--;
    }
    if (!s->head) s->tail = NULL;
    return n;
}

/* Run one batch outside the lock, then wake its submitters. */
static void run_batch(clef_scheduler *s, ticket **batch, size_t n, clef_job ***jobs, clef_err **errs, size_t *cap) {
    if (n > *cap) {
        *cap = n;
        *jobs = clef_xrealloc(*jobs, n * sizeof **jobs);
        *errs = clef_xrealloc(*errs, n * sizeof **errs);
    }
    size_t tokens = 0;
    for (size_t i = 0; i < n; i++) {
        (*jobs)[i] = batch[i]->job;
        tokens += batch[i]->job->rec.n_ids;
    }
    double t0 = clef_now();
    clef_engine_run(s->engine, *jobs, n, *errs);
    double seconds = clef_now() - t0;
    if (s->opt.on_batch) s->opt.on_batch(s->opt.ctx, n, tokens, seconds);
    /* Callbacks first, outside the lock (they may take other locks). */
    for (size_t i = 0; i < n; i++) {
        ticket *t = batch[i];
        if (!t->on_done) continue;
        t->own_err = (*errs)[i];
        t->on_done(t->ctx, t->job, &t->own_err);
        free(t);
        batch[i] = NULL;
    }
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < n; i++) {
        if (!batch[i]) continue;
        *batch[i]->err = (*errs)[i];
        batch[i]->done = 1;
        pthread_cond_signal(&batch[i]->cond);
    }
    pthread_mutex_unlock(&s->lock);
}

static void *engine_thread(void *arg) {
    clef_scheduler *s = arg;
    ticket **batch = NULL;
    size_t batch_cap = 0, run_cap = 0;
    clef_job **jobs = NULL;
    clef_err *errs = NULL;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stopping) pthread_cond_wait(&s->work, &s->lock);
        if (!s->head) break; /* stopping and drained */
        size_t n = take_batch(s, &batch, &batch_cap);
        pthread_mutex_unlock(&s->lock);
        run_batch(s, batch, n, &jobs, &errs, &run_cap);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    free(batch);
    free(jobs);
    free(errs);
    return NULL;
}

clef_scheduler *clef_scheduler_start(clef_engine *e, const clef_scheduler_options *opt, clef_err *err) {
    clef_scheduler *s = clef_xcalloc(1, sizeof *s);
    s->engine = e;
    if (opt) s->opt = *opt;
    if (!s->opt.max_queue) s->opt.max_queue = CLEF_SCHED_DEFAULT_MAX_QUEUE;
    if (!s->opt.max_batch_tokens) s->opt.max_batch_tokens = CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work, NULL);
    if (pthread_create(&s->thread, NULL, engine_thread, s) != 0) {
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->lock);
        free(s);
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot start the engine thread");
        return NULL;
    }
    return s;
}

/* Queue `t` unless the scheduler stops or the queue is full (then -1 + err,
 * 503).  Called with the lock held. */
static int enqueue_locked(clef_scheduler *s, ticket *t, clef_err *err) {
    if (s->stopping) return clef_fail(err, 503, CLEF_E_OVERLOADED, NULL, "the server is shutting down");
    if (s->depth >= s->opt.max_queue)
        return clef_fail(err, 503, CLEF_E_OVERLOADED, NULL, "the request queue is full (%zu records waiting); retry later",
                         s->depth);
    if (s->tail) s->tail->next = t;
    else s->head = t;
    s->tail = t;
    s->depth++;
    pthread_cond_signal(&s->work);
    return 0;
}

int clef_scheduler_submit(clef_scheduler *s, clef_job *job, clef_err *err) {
    ticket t = {.job = job, .err = err};
    pthread_cond_init(&t.cond, NULL);
    pthread_mutex_lock(&s->lock);
    if (enqueue_locked(s, &t, err) != 0) {
        pthread_mutex_unlock(&s->lock);
        pthread_cond_destroy(&t.cond);
        return -1;
    }
    while (!t.done) pthread_cond_wait(&t.cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
    pthread_cond_destroy(&t.cond);
    return err->status ? -1 : 0;
}

int clef_scheduler_submit_async(clef_scheduler *s, clef_job *job, clef_scheduler_done_fn on_done, void *ctx,
                                clef_err *err) {
    ticket *t = clef_xcalloc(1, sizeof *t);
    t->job = job;
    t->err = &t->own_err;
    t->on_done = on_done;
    t->ctx = ctx;
    pthread_mutex_lock(&s->lock);
    int rc = enqueue_locked(s, t, err);
    pthread_mutex_unlock(&s->lock);
    if (rc != 0) free(t);
    return rc;
}

size_t clef_scheduler_queue_depth(clef_scheduler *s) {
    pthread_mutex_lock(&s->lock);
    size_t d = s->depth;
    pthread_mutex_unlock(&s->lock);
    return d;
}

void clef_scheduler_stop(clef_scheduler *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    int joined = s->joined;
    s->stopping = 1;
    s->joined = 1;
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->lock);
    if (!joined) pthread_join(s->thread, NULL);
}

void clef_scheduler_free(clef_scheduler *s) {
    if (!s) return;
    clef_scheduler_stop(s);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
